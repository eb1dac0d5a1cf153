"""The drift guard (loss.guard, losses.DriftGuard): each term against a hand-computed value, the frozen reference
outside the module tree (no gradient, not in checkpoints), and zero weights leaving training bit-identical."""
import math

import pytest
import torch
import yaml

from negft.losses import DriftGuard


def test_caption_and_option_distillation_is_one_minus_cosine():
    f = torch.tensor([[1.0, 0.0], [3.0, 0.0], [1.0, 1.0]])
    base = torch.tensor([[0.0, 2.0], [1.0, 0.0], [1.0, 0.0]])
    # 1 − cos per row: 1, 0, 1 − 1/√2 (features are normalised inside)
    want = (1 + 0 + (1 - 1 / math.sqrt(2))) / 3
    total, logs = DriftGuard(caption=2.0)(caption=(f, base))
    assert logs["guard_caption"].item() == pytest.approx(want, rel=1e-6)
    assert total.item() == pytest.approx(2 * want, rel=1e-6)
    total, logs = DriftGuard(options=0.5)(options=(f[:2], base[:2]))
    assert set(logs) == {"guard_options"} and total.item() == pytest.approx(0.5 * 0.5, rel=1e-6)


def test_kl_of_the_batch_softmax():
    # model: logits [1, 0]; base: logits [0, 1] → KL(p_base ‖ p_θ) = (e − 1) / (e + 1) = tanh(1/2)
    img = torch.tensor([[1.0, 0.0]])
    txt = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    txt_base = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    total, logs = DriftGuard(kl=3.0)(kl=(img, txt, torch.tensor(1.0), img, txt_base, torch.tensor(1.0)))
    assert logs["guard_kl"].item() == pytest.approx(math.tanh(0.5), rel=1e-6)
    assert total.item() == pytest.approx(3 * math.tanh(0.5), rel=1e-6)
    # the same distribution at the same scale: 0; two rows average
    same, _ = DriftGuard(kl=1.0)(kl=(img, txt, torch.tensor(4.0), img, txt, torch.tensor(4.0)))
    assert same.item() == pytest.approx(0.0, abs=1e-7)
    two = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    both, _ = DriftGuard(kl=1.0)(kl=(two, txt, torch.tensor(1.0), two, txt_base, torch.tensor(1.0)))
    assert both.item() == pytest.approx(math.tanh(0.5), rel=1e-6)


def test_l2sp_anchor_sums_squared_distances():
    a, b = torch.nn.Parameter(torch.tensor([1.0, 2.0])), torch.nn.Parameter(torch.tensor([[0.5]]))
    pairs = [(a, torch.zeros(2)), (b, torch.tensor([[1.5]]))]
    total, logs = DriftGuard(l2sp=0.1)(l2sp=pairs)
    assert logs["guard_l2sp"].item() == pytest.approx(5.0 + 1.0)
    assert total.item() == pytest.approx(0.6)
    total.backward()
    assert torch.allclose(a.grad, 0.1 * 2 * torch.tensor([1.0, 2.0]))


def test_zero_weights_and_missing_inputs_add_nothing():
    guard = DriftGuard()
    assert not guard.active
    f = torch.randn(3, 4)
    assert guard(caption=(f, f), options=(f, f)) == (None, {})
    assert DriftGuard(caption=1.0)(options=(f, f)) == (None, {})


def _batches(n_steps=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_steps):
        contrastive = {"images": torch.randn(4, 3, 64, 64, generator=g), "texts": torch.randint(1, 400, (4, 12), generator=g),
                       "captions": torch.randint(1, 400, (4, 12), generator=g),
                       "has_caption": torch.tensor([True, True, False, True])}
        mcq = {"images": torch.randn(3, 3, 64, 64, generator=g), "options": torch.randint(1, 400, (3, 4, 12), generator=g),
               "answers": torch.tensor([0, 2, 1]), "captions": torch.randint(1, 400, (3, 12), generator=g),
               "has_caption": torch.ones(3, dtype=torch.bool),
               "option_affirmative": torch.tensor([[True, False, False, False], [False, False, True, True],
                                                   [False] * 4])}
        out.append((contrastive, mcq))
    return out


def _tiny():
    from negft import models
    torch.manual_seed(0)
    clip = models.build("negft-tiny", "").model
    models.set_trainable(clip, "t", train_logit_scale=True)
    models.train_mode(clip, "t")
    return clip


def _task(guard=None, t2i=0.0, name="negfull", t2i_options=0.0, hard_negatives=0.0):
    from negft.losses import GuardCfg, LossCfg, MCQCfg, NegFullCfg
    from negft.train.task import build_task
    cfg = LossCfg(name=name, negfull=NegFullCfg(alpha=0.3, t2i=t2i, t2i_options=t2i_options,
                                                hard_negatives=hard_negatives),
                  mcq=MCQCfg(t2i=t2i, t2i_options=t2i_options), guard=GuardCfg(**(guard or {})))
    return build_task(_tiny(), cfg, tower="t")


def _train(guard=None, steps=3):
    task = _task(guard)
    opt = torch.optim.AdamW([p for p in task.parameters() if p.requires_grad], lr=1e-3)
    for contrastive, mcq in _batches(steps):
        loss, logs = task({"contrastive": contrastive, "mcq": mcq})
        opt.zero_grad()
        loss.backward()
        opt.step()
    return task, logs


def test_frozen_reference_gets_no_gradient_and_is_not_saved():
    plain = _task()
    task, logs = _train({"caption": 1.0, "options": 1.0, "kl": 1.0, "l2sp": 0.01})
    assert {"guard_caption", "guard_options", "guard_kl", "guard_l2sp"} <= set(logs)
    ref = task.term("guard").reference
    assert ref is not None and ref.visual is None        # tower=t: the text tower only
    assert all(p.grad is None and not p.requires_grad for p in ref.parameters())
    # outside the module tree: the same state_dict keys and parameters as the unguarded task
    assert set(task.state_dict()) == set(plain.state_dict())
    assert len(list(task.parameters())) == len(list(plain.parameters()))
    assert not any(p is q for p in task.parameters() for q in ref.parameters())
    # the reference still holds the base weights after training moved the model
    base = _tiny()
    for name, p in ref.named_parameters():
        torch.testing.assert_close(p, dict(base.named_parameters())[name], rtol=0, atol=0)
    moved = task.clip.token_embedding.weight
    assert not torch.equal(moved, base.token_embedding.weight)


@pytest.mark.parametrize("term", ["caption", "options", "kl"])
def test_each_feature_term_sends_a_gradient_to_the_text_tower(term):
    """The model's side of each term carries the gradient (only the reference's side is under no_grad): the
    guard term alone moves the text tower. (Features taken under no_grad would carry none: the term would be
    logged but never act.)"""
    from negft.train.task import Task
    task = _task({term: 1.0})
    contrastive, mcq = _batches(1)[0]
    # a step away from the base first, so that the term is not at its minimum (zero gradient there)
    with torch.no_grad():
        task.clip.token_embedding.weight.add_(0.05 * torch.randn_like(task.clip.token_embedding.weight))
    _, logs = task({"contrastive": contrastive, "mcq": mcq})
    assert logs[f"guard_{term}"] > 0
    guard_only = Task(task.clip, task.objective, [task.term("guard")])      # the guard alone
    loss, logs = guard_only({"contrastive": contrastive, "mcq": mcq})
    assert set(logs) == {f"guard_{term}", "logit_scale"}
    loss.backward()
    grad = task.clip.token_embedding.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_zero_weights_train_bit_identical_to_the_unguarded_loss():
    plain, _ = _train(None)
    zero, _ = _train({"caption": 0.0, "options": 0.0, "kl": 0.0, "l2sp": 0.0})
    assert zero.term("guard") is None and [t.name for t in zero.terms] == [t.name for t in plain.terms]
    for (k, a), (_, b) in zip(plain.state_dict().items(), zero.state_dict().items()):
        assert torch.equal(a, b), k
    guarded, _ = _train({"caption": 1.0})
    assert not torch.equal(guarded.clip.token_embedding.weight, plain.clip.token_embedding.weight)


def test_guard_config_defaults_to_zero_and_rejects_negative_weights_and_unread_blocks():
    from negft.config import ConfigError, load_config, to_yaml
    from negft.losses import build_terms

    def guard(loss):
        return next((t.loss for t in build_terms(loss) if t.name == "guard"), None)
    cfg = load_config(["recipe=negfull"])
    assert guard(cfg.loss) is None
    with pytest.raises(ConfigError, match="loss.guard.kl"):
        load_config(["recipe=negfull", "loss.guard.kl=-1"])
    with pytest.raises(ConfigError, match="loss.negfull.t2i"):
        load_config(["recipe=negfull", "loss.negfull.t2i=-1"])
    with pytest.raises(ConfigError, match="loss.negfull.hard_negatives"):
        load_config(["recipe=negfull", "loss.negfull.hard_negatives=-0.5"])
    assert "hard_negatives" not in [t.name for t in build_terms(cfg.loss)]
    guarded = load_config(["recipe=negfull", "loss.guard.caption=2", "loss.guard.l2sp=0.5"])
    assert guard(guarded.loss).w == {"caption": 2.0, "options": 0.0, "kl": 0.0, "l2sp": 0.5}
    assert "guard:" in to_yaml(guarded)
    # every objective takes the guard (a baseline's arm); a block the loss does not read is an error
    assert guard(load_config(["recipe=relcomp", "loss.guard.caption=1"]).loss).w["caption"] == 1.0
    with pytest.raises(ConfigError, match="loss.negfull.alpha"):
        load_config(["recipe=relcomp", "loss.negfull.alpha=0.5"])


def test_text_to_image_term_is_added_by_mcq_and_negfull():
    contrastive, mcq = _batches(1)[0]
    mcq = {**mcq, "answer_truth": torch.eye(3, dtype=torch.bool)}
    for name, batch in (("negfull", {"contrastive": contrastive, "mcq": mcq}), ("mcq", {"mcq": mcq})):
        plain, _ = _task(name=name)(batch)
        with_t2i, logs = _task(name=name, t2i=0.5)(batch)
        assert "t2i" in logs
        assert with_t2i.item() == pytest.approx(plain.item() + 0.5 * logs["t2i"].item(), rel=1e-5)
    # over every option: (M·C, M) truth, each option true of its own image exactly when it is the answer
    truth = torch.zeros(3, 4, 3, dtype=torch.bool)
    for i, a in enumerate(mcq["answers"].tolist()):
        truth[i, a, i] = True
    truth[:, :, 1] |= ~truth.any(-1)        # the wrong options are true of image 1 (as if it held their objects)
    mcq = {**mcq, "option_truth": truth.flatten(0, 1)}
    for name, batch in (("negfull", {"contrastive": contrastive, "mcq": mcq}), ("mcq", {"mcq": mcq})):
        plain, _ = _task(name=name)(batch)
        with_opts, logs = _task(name=name, t2i_options=2.0)(batch)
        assert logs["t2i_options"].item() > 0
        assert with_opts.item() == pytest.approx(plain.item() + 2.0 * logs["t2i_options"].item(), rel=1e-5)


def test_two_mcq_streams_concatenate_answer_truth_block_diagonally():
    from negft.train.loop import by_task
    a = {"images": torch.zeros(2, 1), "answer_truth": torch.ones(2, 2, dtype=torch.bool)}
    b = {"images": torch.zeros(3, 1), "answer_truth": torch.eye(3, dtype=torch.bool)}
    got = by_task({"x": a, "y": b}, {"x": "mcq", "y": "mcq"})["mcq"]
    assert got["images"].shape[0] == 5
    assert got["answer_truth"].tolist() == torch.block_diag(a["answer_truth"], b["answer_truth"]).tolist()


def test_fields_indexed_by_images_join_block_diagonally():
    """The terms declare which of their fields are indexed by the batch's images (Term.by_image); several streams'
    batches join those block-diagonally (a question is true of no image of another stream's batch), the rest
    stacked."""
    from negft.losses import BY_IMAGE, join_field
    assert BY_IMAGE == {"answer_truth", "option_truth", "negcap_hard_negatives"}
    a, b = torch.ones(2, 2, dtype=torch.bool), torch.eye(3, dtype=torch.bool)
    assert join_field("answer_truth", [a, b]).tolist() == torch.block_diag(a, b).tolist()
    opts = torch.ones(2 * 4, 2, dtype=torch.bool), torch.ones(3 * 4, 3, dtype=torch.bool)
    assert join_field("option_truth", list(opts)).shape == (20, 5)
    assert join_field("images", [torch.zeros(2, 1), torch.ones(3, 1)]).tolist() == [[0.0]] * 2 + [[1.0]] * 3


def test_base_cache_key_ignores_the_guard_at_default():
    from negft.config import load_config, world_dir
    from negft.train.world_base import base_key, base_recipe
    cfg = load_config(["recipe=demo"])
    pre = base_recipe(cfg)
    # the shards' digest given: the key's settings are what is tested, not the world this cache has drawn
    plain = base_key(pre, world_dir(cfg), shards="planted")
    pre.loss.guard.caption = 0.0
    assert base_key(pre, world_dir(cfg), shards="planted") == plain
    pre.loss.guard.caption = 1.0
    assert base_key(pre, world_dir(cfg), shards="planted") != plain


def test_guarded_streams_carry_the_affirmative_captions_and_the_same_batches(cache, bundle):
    """With the guard on, a NegCap / NegMCQ batch also carries its images' captions (and which options are
    affirmative); its images, texts and options are the unguarded stream's, draw for draw."""
    from negft.data.pipeline import EpochBatches, Stream, StreamSpec
    from negft.losses import GuardCfg, LossCfg
    from negft.train.task import stream_extras
    shards = sorted(str(p) for p in (cache / "world-s0-tiny" / "finetune").glob("*.tar"))

    def first(task, field, guard):
        loss = LossCfg(name="negfull", guard=GuardCfg(caption=1.0 if guard else 0.0))
        spec = StreamSpec(shards, task, field, batch_size=8, **stream_extras(loss, task))
        return next(EpochBatches(Stream(spec, bundle.preprocess_val, bundle.tokenizer, seed=0), workers=0).epoch(1, 1))

    for task, field, text_key in (("contrastive", "negcap", "texts"), ("mcq", "mcq", "options")):
        plain, guarded = first(task, field, False), first(task, field, True)
        assert "captions" not in plain and "option_affirmative" not in plain
        assert torch.equal(plain["images"], guarded["images"]) and torch.equal(plain[text_key], guarded[text_key])
        assert guarded["captions"].shape[0] == 8 and bool(guarded["has_caption"].all())
    assert guarded["option_affirmative"].shape == (8, 4) and guarded["option_affirmative"].dtype == torch.bool


def test_negation_weight_marks_the_negation_questions(cache, bundle):
    """loss.negation_weight = 3: an mcq batch carries weight 3 where the right answer is a negation, 1 elsewhere;
    at 1 it carries nothing, and its batches are the plain stream's."""
    import json
    import tarfile
    from negft.data.pipeline import EpochBatches, Stream, StreamSpec
    from negft.losses import LossCfg, MCQCfg
    from negft.train.task import stream_extras
    shards = sorted(str(p) for p in (cache / "world-s0-tiny" / "finetune").glob("*.tar"))

    def first(w):
        loss = LossCfg(name="mcq", mcq=MCQCfg(negation_weight=w))
        spec = StreamSpec(shards, "mcq", "mcq", batch_size=8, **stream_extras(loss, "mcq"))
        return next(EpochBatches(Stream(spec, bundle.preprocess_val, bundle.tokenizer, seed=0), workers=0).epoch(1, 1))

    plain, weighted = first(1.0), first(3.0)
    assert "mcq_weight" not in plain and torch.equal(plain["options"], weighted["options"])
    templates = {}
    for shard in shards:
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                if m.name.endswith(".json"):
                    meta = json.load(tar.extractfile(m))
                    templates[tuple(meta["mcq"]["options"])] = meta["mcq"]["answer_template"]
    texts = [bundle.tokenizer(list(opts))for opts in templates]
    keys = list(templates)
    for row, w in zip(weighted["options"], weighted["mcq_weight"].tolist()):
        k = next(i for i, t in enumerate(texts) if torch.equal(t, row))
        assert w == (3.0 if templates[keys[k]] == "negative" else 1.0)
    assert 3.0 in weighted["mcq_weight"].tolist() or "negative" not in templates.values()


def test_text_to_image_mcq_term_against_hand_values():
    from negft.losses import TextToImageMCQLoss
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    ans = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    img2 = img[:2]
    # answer 0 true of image 0 only; answer 1 true of images 0 and 1; scale 2
    truth = torch.tensor([[True, False], [True, True]])
    got = TextToImageMCQLoss()(img2, ans, truth, torch.tensor(2.0))
    row0 = math.log(math.exp(2) + 1) - 2          # −log softmax at the diagonal
    row1 = 0.0                                    # every image true: −log 1
    assert got.item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    del img


def test_answer_truth_reads_the_object_labels():
    from negft.losses import answer_truth

    def meta(pos, neg, answer):
        return {"objects": {"positive": pos, "negative": neg}, "mcq": {"options": [answer, "x", "y", "z"], "answer": 0}}

    metas = [meta(["square"], ["star", "ring"], "This image does not feature a star"),
             meta(["star", "heart"], ["ring"], "There is a heart but no ring in this image"),
             meta(["heart", "ring"], ["square"], "A picture with two hearts"),
             meta(["circle"], ["star"], "There is a circle in this image")]
    t = answer_truth(metas)
    # "no star": true of images without a star (0, 2, 3); "heart, no ring": image 1 only (2 has a ring);
    # "hearts": images with a heart (1, 2); "a circle": image 3
    assert t.tolist() == [[True, False, True, True], [False, True, False, False],
                          [False, True, True, False], [False, False, False, True]]
    # without labels the truth is unknown: an unlabelled question's row is all true and adds 0 to the term; an
    # unlabelled image is no labelled question's wrong pick ("no dog" must not be pushed off every other image)
    unlabelled = {"mcq": {"options": ["There is no dog in this image", "x", "y", "z"], "answer": 0}}
    t = answer_truth([metas[3], unlabelled])
    assert t.tolist() == [[True, True], [True, True]]
    from negft.losses import TextToImageMCQLoss
    feats = torch.nn.functional.normalize(torch.randn(2, 4), dim=-1)
    assert TextToImageMCQLoss()(feats, feats, t, torch.tensor(10.0)).item() == 0.0


def _negcap_meta(pos, neg, drawn=None):
    from negft.data import schema
    meta = {"negcap": [drawn or "x"]}
    if pos is not None:
        meta["objects"] = {"positive": pos, "negative": neg}
    if drawn is not None:
        meta[schema.DRAWN_NEGCAP] = drawn
    return meta


def test_negcap_hard_negatives_are_the_images_holding_the_negated_object():
    from negft.losses import negcap_hard_negatives
    metas = [_negcap_meta(["square"], ["star", "ring"], "a square, but no stars"),
             _negcap_meta(["star", "heart"], ["ring", "circle"], "a heart and no circle"),   # no image has a circle
             _negcap_meta(None, None, "a dog but no star"),            # unlabelled: its caption's row is empty
             _negcap_meta(["heart", "star"], ["square"], "a heart, and not a square"),
             _negcap_meta(["ring"], ["square"])]                       # no drawn caption: another stream's
    assert negcap_hard_negatives(metas).tolist() == [
        [False, True, False, True, False],      # "no stars": images 1 and 3 hold a star (the ring is not said)
        [False] * 5,
        [False] * 5,
        [True, False, False, False, False],     # "not a square": image 0 (image 2 is unlabelled: never one)
        [False] * 5]


def test_hard_negative_term_against_hand_values():
    from negft.losses import HardNegativeLoss
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(4, 5, generator=g), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(4, 5, generator=g), dim=-1)
    s = torch.tensor(7.0)
    hard = torch.zeros(4, 4, dtype=torch.bool)
    hard[0, 2] = hard[0, 3] = hard[2, 1] = True          # captions 1 and 3 have none
    dot = lambda i, j: 7.0 * sum(float(txt[i, k]) * float(img[j, k]) for k in range(5))
    row0 = -dot(0, 0) + math.log(sum(math.exp(dot(0, j)) for j in (0, 2, 3)))
    row2 = -dot(2, 2) + math.log(sum(math.exp(dot(2, j)) for j in (2, 1)))
    assert HardNegativeLoss()(img, txt, hard, s).item() == pytest.approx((row0 + row2) / 2, rel=1e-5)
    txt.requires_grad_(True)
    none = HardNegativeLoss()(img, txt, torch.zeros(4, 4, dtype=torch.bool), s)
    assert none.item() == 0.0 and none.requires_grad


def test_hard_negative_term_is_added_by_negfull_and_logs_the_share():
    contrastive, mcq = _batches(1)[0]
    hard = torch.zeros(4, 4, dtype=torch.bool)
    hard[1, 3] = True
    batch = {"contrastive": {**contrastive, "negcap_hard_negatives": hard}, "mcq": mcq}
    plain, _ = _task()(batch)
    with_hard, logs = _task(hard_negatives=0.5)(batch)
    assert logs["hard_negative_share"].item() == 0.25 and logs["hard_negatives"].item() > 0
    assert with_hard.item() == pytest.approx(plain.item() + 0.5 * logs["hard_negatives"].item(), rel=1e-5)


def test_a_negcap_stream_with_fields_records_the_caption_it_drew():
    import io
    import json
    import random
    from PIL import Image
    from negft.data import schema
    from negft.data.pipeline import StreamSpec, _example
    png = io.BytesIO()
    Image.new("RGB", (4, 4)).save(png, format="PNG")
    meta = {"caption": "a square", "negcap": ["a square, no star", "a square, no ring", "no heart, a square"],
            "objects": {"positive": ["square"], "negative": ["star", "ring", "heart"]}}
    sample = {"json": json.dumps(meta).encode(), "png": png.getvalue()}
    fields = {"negcap_hard_negatives": None}

    def example(field, fields, seed):
        return _example(sample, StreamSpec([], "contrastive", field, 4, fields=fields), lambda im: im, random.Random(seed))

    drawn = {seed: example("negcap", fields, seed) for seed in range(6)}
    for seed, (_, text, got) in drawn.items():
        assert text == random.Random(seed).choice(meta["negcap"]) and got[schema.DRAWN_NEGCAP] == text
        assert json.loads(sample["json"]) == {k: v for k, v in got.items() if k != schema.DRAWN_NEGCAP}
    assert len({text for _, text, _ in drawn.values()}) > 1
    assert len(example("negcap", {}, 0)) == 2                               # no fields: no json handed on
    assert schema.DRAWN_NEGCAP not in example("caption", fields, 0)[2]      # a caption stream draws none


def test_report_opens_with_the_grouped_headline_and_the_card_states_the_rule(tmp_path):
    import json
    from negft.release import _selection_rule
    from negft.train.ledger import write_report
    keys = ["mcq_neg/world/acc", "mcq_neg/world/acc_negation", "retrieval_neg/world/r5", "retrieval/world/r5",
            "zeroshot/world/top1"]
    lines = [{"epoch": 0, "metrics": dict.fromkeys(keys, 0.2), "ci95": {k: [0.1, 0.3] for k in keys}},
             {"epoch": 4, "metrics": dict.fromkeys(keys, 0.5), "ci95": {k: [0.4, 0.6] for k in keys},
              "paired_p": dict.fromkeys(keys, 0.01)}]
    (tmp_path / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    (tmp_path / "patch").mkdir()
    (tmp_path / "patch" / "selected.json").write_text(json.dumps({
        "alpha": 0.5, "tower": "t", "rule": "largest mean gain", "targets": ["mcq_neg/*/acc", "mcq_neg/*/acc_negation"],
        "test": {"metrics": dict.fromkeys(keys, 0.4)}}))
    report = write_report(tmp_path, "r").read_text().splitlines()
    bullets = [line for line in report[:12] if line.startswith("- **")]
    assert [b.split("**")[1] for b in bullets] == ["Gains", "Costs"]          # no composition metric written
    assert "(`mcq_neg/world/acc_negation`) 0.200 → 0.500 (+0.300 \\*) → 0.400 (+0.200)" in bullets[0]
    rule = _selection_rule(tmp_path / "patch" / "selected", {"patch": {"alpha": 0.5}})
    assert "`mcq_neg/*/acc_negation`" in rule


def test_the_card_states_the_objective_with_its_set_weights(tmp_path):
    """The model card's provenance names the loss and every weight the run set (zero weights, and blocks the loss
    does not read, left out)."""
    from negft.release import _objective_line
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"loss": {
        "name": "negfull", "negfull": {"alpha": 0.1, "t2i": 1.0, "t2i_options": 0.0, "negation_weight": 1.0},
        "mcq": {"t2i": 0.0}, "relcomp": {"margin": 0.2, "w_itm": 1.0, "w_clip": 1.0},
        "guard": {"caption": 3.0, "options": 0.0, "kl": 0.0, "l2sp": 0.0}}}))
    assert _objective_line(tmp_path) == ["- objective: `loss.name` = negfull (`loss.negfull.alpha` = 0.1, "
                                         "`loss.negfull.t2i` = 1.0, `loss.guard.caption` = 3.0)"]
    weighted = yaml.safe_load((tmp_path / "config.yaml").read_text())
    weighted["loss"]["negfull"]["negation_weight"] = 3.0
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(weighted))
    assert "`loss.negfull.negation_weight` = 3.0" in _objective_line(tmp_path)[0]
    assert _objective_line(tmp_path / "missing") == [] and _objective_line(None) == []


def test_the_demo_base_key_is_pinned(monkeypatch):
    """The demo base's key, pinned (shards aside). The key hashes every setting that shapes the base, so a key
    added to the config (outside ``world_base.BASE_KEY_IGNORES``) changes it, and every user's cached base is
    trained once more: if this fails, that is the change; make it knowingly (say so in the commit) and pin the
    new key, or add the key to ``BASE_KEY_IGNORES`` if it cannot change a finished base's weights."""
    from negft.train import world_base
    from negft.config import load_config, world_dir
    monkeypatch.setattr(world_base, "shards_digest", lambda *a: "shards")
    cfg = load_config(["recipe=demo"])
    pre = world_base.base_recipe(cfg)
    assert world_base.base_key(pre, world_dir(cfg)) == "bb003b9739b6"
    pre.model.lock_text_unlocked_layers = 2
    assert world_base.base_key(pre, world_dir(cfg)) != "bb003b9739b6"


def test_option_truth_reads_each_options_recorded_objects():
    from negft.losses import option_truth
    from negft.losses import TextToImageMCQLoss

    def meta(pos, option_objects):
        mcq = {"options": ["a", "b", "c", "d"], "answer": 0}
        if option_objects is not None:
            mcq["option_objects"] = option_objects
        return {"objects": {"positive": pos, "negative": []}, "mcq": mcq}

    # image 0 holds a star and a heart; its options: "no ring" (right), "a ring", "no star", "a ring but not a heart"
    q0 = [[None, "ring"], ["ring", None], [None, "star"], ["ring", "heart"]]
    metas = [meta(["star", "heart"], q0), meta(["ring"], None), meta(["ring", "star"], q0)]
    t = option_truth(metas).view(3, 4, 3)
    assert t[0].tolist() == [[True, False, False],     # no ring: image 0 only
                             [False, True, True],      # a ring: images 1, 2
                             [False, True, False],     # no star: image 1
                             [False, True, True]]      # a ring but not a heart: images 1, 2
    assert t[1].all(), "a question without option_objects is unknown (all true): it adds 0"
    # a row true of no image has nothing to pick and is left out; one with a true image counts, by hand:
    truth = torch.tensor([[False, False], [True, False]])
    img = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), dim=-1)
    txt = torch.nn.functional.normalize(torch.tensor([[1.0, 1.0], [0.6, 0.8]]), dim=-1)
    s = torch.tensor(3.0)
    logits = s * txt[1] @ img.T
    expect = torch.logsumexp(logits, 0) - logits[0]
    assert torch.allclose(TextToImageMCQLoss()(img, txt, truth, s), expect)
    assert TextToImageMCQLoss()(img, txt, torch.zeros(2, 2, dtype=torch.bool), s).item() == 0.0


def test_the_world_records_each_finetune_options_objects(cache):
    """The world's finetune MCQs carry ``option_objects``, and each option is true of its own image exactly when
    it is the answer (what ``loss.negfull.t2i_options`` reads)."""
    import json
    import tarfile
    from negft.losses import option_truth
    shard = sorted((cache / "world-s0-tiny" / "finetune").glob("*.tar"))[0]
    with tarfile.open(shard) as tar:
        metas = [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith(".json")][:20]
    for i, m in enumerate(metas):
        own = option_truth([m]).view(4).tolist()
        assert own == [c == m["mcq"]["answer"] for c in range(4)], (i, m["mcq"])


def test_frozen_image_features_are_kept_by_content_and_equal_a_fresh_encoding():
    """tower=t on unaugmented images: each image is encoded once; the features (and the loss) are the encoder's."""
    from negft.train.task import FrozenImageFeatures
    torch.manual_seed(0)
    task = _task(name="negfull", guard={"caption": 2.0})
    batch = {"contrastive": _batches(1)[0][0], "mcq": _batches(1)[0][1]}
    plain, _ = task(batch)
    calls = []
    encode = task.clip.encode_image
    task.clip.encode_image = lambda x: (calls.append(x.shape[0]), encode(x))[1]
    task.use_image_cache()
    first, _ = task(batch)
    again, _ = task(batch)
    assert calls == [7], "the first step encodes its 4 + 3 images, the second none"
    assert first.item() == pytest.approx(plain.item(), abs=1e-6) and again.item() == pytest.approx(plain.item(), abs=1e-6)
    cache = FrozenImageFeatures(limit=2)
    images = torch.randn(3, 3, 64, 64)
    got = cache(encode, images)
    assert torch.allclose(got, encode(images).float(), atol=1e-6) and len(cache.features) == 2
    half = images.to(torch.bfloat16)           # a bf16 run's pixels hash too
    assert torch.equal(FrozenImageFeatures()(lambda x: x.flatten(1)[:, :4], half), half.flatten(1)[:, :4].float())
