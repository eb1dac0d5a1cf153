"""The baseline methods as objectives (NegCLIP, CoN-CLIP, TripletCLIP, FSC-CLIP, CE-CLIP over a RelComp-format
stream): the step hands each loss class the features it would get from separately encoded inputs, and the
stream's batch fields are the records' own hard captions, drawn anew each epoch. Each loss class against its
authors' code: tests/test_loss_*.py and bench/parity/loss-*.md."""
import json

import pytest
import torch
import torch.nn.functional as F

from negft import models
from negft.data import schema
from negft.losses import (CECLIPLoss, CoNCLIPLoss, FSCCLIPLoss, LossCfg, NegCLIPLoss, TripletCLIPLoss,
                          ceclip_slots)
from negft.train.task import build_task, stream_extras
from tests.conftest import read_shards

B = 6
ROWS = torch.arange(B)[:, None]


@pytest.fixture(scope="module")
def records(cache):
    """caption → the relcomp records with that caption, of the tiny world's relcomp split."""
    out = {}
    for sample in read_shards(cache / "world-s0-tiny" / "relcomp").values():
        record = json.loads(sample["json"])[schema.RELCOMP]
        out.setdefault(record["caption"], []).append(record)
    return out


def _batch(cache, bundle, loss, epoch=1):
    from negft.data.pipeline import EpochBatches, Stream, StreamSpec
    shards = sorted(str(p) for p in (cache / "world-s0-tiny" / "relcomp").glob("*.tar"))
    spec = StreamSpec(shards, "itm", "relcomp", batch_size=B, **stream_extras(loss, "itm"))
    batch = next(EpochBatches(Stream(spec, bundle.preprocess_val, bundle.tokenizer, seed=0), workers=0).epoch(epoch, 1))
    return {k: v for k, v in batch.items() if k not in ("skipped", "tally")}


def _encoded(clip, batch):
    """Each input encoded on its own by open_clip's own encoders, normalised."""
    image = lambda x: F.normalize(clip.encode_image(x), dim=-1)
    text = lambda x: F.normalize(clip.encode_text(x), dim=-1)
    captioned = batch.get("negative_image_hard_captioned", batch.get("negative_image_captioned"))
    has = batch["has_negative_image"] & (batch["has_negative_image"] if captioned is None else captioned)
    return {"image": image(batch["images"]), "negative_image": image(batch["negative_images"]) *
            batch["has_negative_image"][:, None], "caption": text(batch["texts"]), "has": has,
            "negatives": text(batch["negatives"].flatten(0, 1)).view(B, schema.MAX_NEGATIVES, -1),
            **{f: text(batch[f]) for f in ("hard_caption", "negative_image_caption", "negative_image_hard_caption")
               if f in batch}}


@pytest.fixture(scope="module")
def clip():
    torch.manual_seed(0)
    return models.build("negft-tiny", "").model.eval()


def _want(name, e, b, scale):
    every = torch.ones(B, dtype=torch.bool)
    if name == "negclip":
        valid = torch.cat([every, e["has"]])
        return NegCLIPLoss()(torch.cat([e["image"], e["negative_image"]]),
                             torch.cat([e["caption"], e["negative_image_caption"]]),
                             torch.cat([e["hard_caption"], e["negative_image_hard_caption"]])[:, None], scale,
                             valid=valid, negative_mask=valid[:, None])
    if name == "conclip":
        return CoNCLIPLoss()(e["image"], e["caption"], e["negative_image_caption"], e["negative_image"], scale,
                             has_negated=e["has"], has_distractor=e["has"])
    if name == "tripletclip":
        return TripletCLIPLoss()(e["image"], e["caption"], e["negative_image"], e["negative_image_caption"], scale,
                                 has_negative=e["has"])
    if name == "fscclip":
        return FSCCLIPLoss(w_local=0.0)(scale, e["image"], e["caption"], e["negatives"], b["negative_mask"])[0]
    slots = b["ceclip_slots"]               # each type's negative: the world's (attribute, predicate, exchange)
    assert slots.tolist() == [[2, 0, 3, 1]] * B     # as (relation, adjective, noun: none, verb)
    return CECLIPLoss(n_types=len(schema.CECLIP_TYPES))(e["image"], e["caption"], e["negatives"][ROWS, slots],
                                                        b["negative_mask"][ROWS, slots], scale)[0]


@pytest.mark.parametrize("name", ["negclip", "conclip", "tripletclip", "fscclip", "ceclip"])
def test_each_objective_is_its_loss_on_separately_encoded_features(name, cache, bundle, clip):
    loss = LossCfg(name=name)
    if name == "fscclip":
        loss.fscclip.w_local = 0.0          # the token-patch term: test_fscclip_token_patch_term below
    batch = _batch(cache, bundle, loss)
    total, logs = build_task(clip, loss)({"itm": batch})
    with torch.no_grad():
        want = _want(name, _encoded(clip, batch), batch, clip.logit_scale.exp())
    for mask in ("negative_image_captioned", "negative_image_hard_captioned"):
        if mask in batch:                   # the negative images' terms are not empty
            assert batch[mask].any()
    assert total.item() == pytest.approx(want.item(), rel=1e-5)


def _typed(*kinds) -> dict:
    return {schema.RELCOMP: {"negatives": [{"text": f"a {kind} swap", "kind": kind} for kind in kinds]}}


def test_ceclip_puts_each_negative_in_its_types_slot():
    """A release's missing type is left out of the record (ceclip-coco's ``###``): the negatives after it keep their
    own types' slots, the missing one gets a padding position (masked); a kind without a type, or a type's second
    negative, takes the first free slot."""
    assert schema.CECLIP_TYPES == ("relation", "adjective", "noun", "verb")
    slots = ceclip_slots([_typed("relation", "adjective", "noun", "verb"), _typed("relation", "noun", "verb"),
                          _typed("verb", "adjective"), _typed("swap", "noun"), _typed("noun", "noun")])
    assert slots.tolist() == [[0, 1, 2, 3], [0, 3, 1, 2], [2, 1, 3, 0], [0, 2, 1, 3], [1, 2, 0, 3]]
    negatives = torch.arange(2 * 4 * 1.0).view(2, 4, 1)
    mask = torch.tensor([[True] * 3 + [False], [True] * 2 + [False] * 2])
    rows = torch.arange(2)[:, None]
    placed = negatives.gather(1, slots[1:3, :, None])           # what the term does on the device
    assert placed[..., 0].tolist() == [[0, 3, 1, 2], [6, 5, 7, 4]]
    assert mask[rows, slots[1:3]].tolist() == [[True, False, True, True], [False, True, False, True]]


def test_the_hard_captions_are_the_records_own_and_drawn_anew_each_epoch(cache, bundle, records):
    loss = LossCfg(name="negclip")
    tok = bundle.tokenizer
    drawn = []
    for epoch in (1, 2, 3):
        batch = _batch(cache, bundle, loss, epoch)
        for i in range(B):
            caption = next(c for c, recs in records.items() if torch.equal(tok([c])[0], batch["texts"][i]))
            rec = records[caption][0]
            negatives = [n["text"] for n in rec["negatives"]]
            assert any(torch.equal(tok([n])[0], batch["hard_caption"][i]) for n in negatives)
            has = rec.get("negative_image_caption") is not None
            assert bool(batch["negative_image_hard_captioned"][i]) == has
            if has:
                assert torch.equal(tok([rec["negative_image_caption"]])[0], batch["negative_image_caption"][i])
                assert any(torch.equal(tok([n])[0], batch["negative_image_hard_caption"][i])
                           for n in rec["negative_image_negatives"])
        drawn.append(batch["hard_caption"])
    assert not all(torch.equal(drawn[0], d) for d in drawn[1:]), "the same hard captions three epochs running"


def test_fscclip_token_patch_term_reads_the_towers_tokens(cache, bundle, clip):
    """The step's patch and token features are open_clip's own (its ViT's tokens after ln_post, projected; the text
    tower's every position after ln_final, projected), and their pooled rows its pooled features."""
    loss = LossCfg(name="fscclip")
    batch = _batch(cache, bundle, loss)
    total, logs = build_task(clip, loss)({"itm": batch})
    with torch.no_grad():
        pooled, patches = models.encode_image_tokens(clip, batch["images"])
        torch.testing.assert_close(pooled, clip.encode_image(batch["images"]), rtol=1e-4, atol=1e-5)
        clip.visual.output_tokens = True
        try:
            _, raw = clip.visual(batch["images"])
        finally:
            clip.visual.output_tokens = False
        torch.testing.assert_close(patches, raw @ clip.visual.proj)
        texts = torch.cat([batch["texts"], batch["negatives"].flatten(0, 1)])
        pooled_t, tokens, mask = models.encode_text_tokens(clip, texts)
        torch.testing.assert_close(pooled_t, clip.encode_text(texts), rtol=1e-4, atol=1e-5)
        n = tokens.shape[1]
        assert torch.equal(mask, (texts[:, :n] > 0) & (torch.arange(n) > 0))
        e = _encoded(clip, batch)
        want, parts = FSCCLIPLoss()(clip.logit_scale.exp(), e["image"], e["caption"], e["negatives"],
                                    batch["negative_mask"], tokens={
                                        "image_tokens": patches, "text_tokens": tokens[:B], "token_mask": mask[:B],
                                        "negative_tokens": tokens[B:].view(B, schema.MAX_NEGATIVES, n, -1),
                                        "negative_token_mask": mask[B:].view(B, schema.MAX_NEGATIVES, n)})
    assert parts["local_hn"] > 0 and logs["local_hn"].item() == pytest.approx(parts["local_hn"].item(), rel=1e-5)
    assert total.item() == pytest.approx(want.item(), rel=1e-5)


@pytest.mark.parametrize("recipe", ["negclip", "conclip", "negationclip", "tripletclip", "fscclip", "ceclip"])
def test_each_baseline_under_zero_and_bf16_resumes_as_it_would_have_gone_on(recipe, cache, micro_arch, tmp_path):
    """As for every recipe: DeepSpeed's ZeRO stage 1 with bf16 trains it, and a run resumed from its first epoch's
    checkpoint ends with the uninterrupted run's weights; CE-CLIP's thresholds (a loss term's own state) are in
    the checkpoint and carry on from it."""
    from safetensors.torch import load_file
    from negft.config import load_config
    from negft.models import WEIGHTS_FILE
    from tests.conftest import run_here
    # CE-CLIP's thresholds must move for the last check; a random negft-micro's mean gaps are below 0, where τ stays
    arch = "negft-tiny" if recipe == "ceclip" else micro_arch
    args = ["train.py", f"recipe={recipe}", "data=world", "world.size=tiny", f"world.cache={cache}",
            "model.world_pretrained=", f"model.world_arch={arch}", "eval.suite=none", "patch.sweep=false",
            "train.workers=0", "train.steps_per_epoch=1", "train.precision=bf16", "train.zero_stage=1", "epochs=2",
            *[f"streams.{s}.batch_size=4" for s in load_config([f"recipe={recipe}"]).streams]]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    proc = run_here([*args, f"out={full}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = run_here([*args, f"out={resumed}", f"resume={full / 'checkpoints' / 'epoch_1'}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    a = load_file(str(full / "checkpoints" / "epoch_2" / WEIGHTS_FILE))
    b = load_file(str(resumed / "checkpoints" / "epoch_2" / WEIGHTS_FILE))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
    states = [torch.load(next((run / "checkpoints" / "epoch_2" / "state").rglob("mp_rank_00_model_states.pt")),
                         weights_only=False)["negft_terms"] for run in (full, resumed)]
    assert states[0].keys() == states[1].keys() == ({"ceclip"} if recipe == "ceclip" else set())
    if recipe == "ceclip":
        torch.testing.assert_close(states[1]["ceclip"]["thresholds"], states[0]["ceclip"]["thresholds"], rtol=0,
                                   atol=0)
        assert states[0]["ceclip"]["thresholds"].abs().sum() > 0       # they moved: the test can tell them apart


@pytest.mark.parametrize("name", ["negclip", "conclip", "tripletclip", "fscclip", "ceclip"])
def test_each_baseline_takes_the_drift_guard_on_its_images_and_their_captions(name, cache, bundle):
    """The arm "a baseline with negft's drift guard": on an itm stream the guard reads each sample's affirmative
    ``caption`` and the batch's own images (not the negative images that follow them among the step's images),
    and adds exactly DriftGuard's value to the baseline's loss; at weight 0 the baseline is untouched."""
    from negft.losses import DriftGuard, GuardCfg
    torch.manual_seed(0)
    base = models.build("negft-tiny", "").model.eval()
    loss = LossCfg(name=name, guard=GuardCfg(caption=2.0, kl=3.0))
    if name == "fscclip":
        loss.fscclip.w_local = 0.0
    batch = _batch(cache, bundle, loss)
    assert batch["has_caption"].all() and batch["has_negative_image"].any()
    task = build_task(base, loss, tower="vt")           # freezes its reference: the base
    with torch.no_grad():                                # a step away from the base, so the terms are not 0
        for p in base.parameters():
            p.add_(0.02 * torch.randn_like(p))
    total, logs = task({"itm": batch})
    plain, _ = build_task(base, LossCfg(name=name, fscclip=loss.fscclip))({"itm": batch})
    ref = task.term("guard").reference
    with torch.no_grad():
        img, cap = base.encode_image(batch["images"]), base.encode_text(batch["captions"])
        img0, cap0 = ref.encode_image(batch["images"]), ref.encode_text(batch["captions"])
        want_caption = DriftGuard.distill(cap, cap0)
        want_kl = DriftGuard.kl_div(img, cap, base.logit_scale.exp(), img0, cap0, ref.logit_scale.exp())
    assert logs["guard_caption"].item() == pytest.approx(want_caption.item(), rel=1e-4)
    assert logs["guard_kl"].item() == pytest.approx(want_kl.item(), rel=1e-4, abs=1e-7)
    assert total.item() == pytest.approx(plain.item() + 2.0 * want_caption.item() + 3.0 * want_kl.item(), rel=1e-5)
