"""Each loss against a hand-computed value; the two-rank contrastive gradient against one process."""
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from negft.losses import ContrastiveLoss, ITMTripletLoss, MCQLoss, NegFullLoss, RelCompLoss


def _lse(xs):
    return math.log(sum(math.exp(x) for x in xs))


def test_mcq_loss_hand_computed():
    img = torch.tensor([[1.0, 0.0]])
    opts = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.6, 0.8]]])
    loss = MCQLoss()(img, opts, torch.tensor([3]), torch.tensor(10.0))
    logits = [10.0, 0.0, -10.0, 6.0]
    assert loss.item() == pytest.approx(_lse(logits) - 6.0, rel=1e-6)


def test_mcq_loss_weights_questions():
    """loss.negation_weight: a weighted mean of the questions' cross-entropies; weights of 1 are NegBench's mean."""
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    opts = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.6, 0.8]]] * 2)
    answers = torch.tensor([3, 1])
    ce = [_lse([10.0, 0.0, -10.0, 6.0]) - 6.0, _lse([0.0, 10.0, 0.0, 8.0]) - 10.0]
    got = MCQLoss()(img, opts, answers, torch.tensor(10.0), weights=torch.tensor([3.0, 1.0]))
    assert got.item() == pytest.approx((3 * ce[0] + ce[1]) / 4, rel=1e-6)
    ones = MCQLoss()(img, opts, answers, torch.tensor(10.0), weights=torch.ones(2))
    assert ones.item() == pytest.approx(MCQLoss()(img, opts, answers, torch.tensor(10.0)).item(), rel=1e-6)


def test_contrastive_loss_hand_computed():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    txt = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    # logits = img @ txt.T = [[1, .6], [0, .8]]
    rows = (_lse([1, 0.6]) - 1 + _lse([0, 0.8]) - 0.8) / 2
    cols = (_lse([1, 0]) - 1 + _lse([0.6, 0.8]) - 0.8) / 2
    loss = ContrastiveLoss()(img, txt, torch.tensor(1.0))
    assert loss.item() == pytest.approx((rows + cols) / 2, rel=1e-6)


def test_itm_triplet_loss_hand_computed():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    pos = torch.tensor([[0.8, 0.6], [0.0, 1.0]])                 # s(I, T+) = 0.8, 1.0
    negs = torch.tensor([[[1.0, 0.0], [0.0, 1.0]],              # s = 1.0, 0.0
                         [[0.6, 0.8], [-1.0, 0.0]]])            # s = 0.8, 0.0
    neg_img = torch.tensor([[0.6, 0.8], [1.0, 0.0]])             # s(I-, T+) = 0.96, 0.0
    m = 0.5
    image_term = (max(0, m - 0.8 + 1.0) + max(0, m - 0.8 + 0.0) + max(0, m - 1.0 + 0.8) + max(0, m - 1.0)) / 4
    text_term = max(0, m - 0.8 + 0.96)                            # only the first anchor has a negative image
    loss = ITMTripletLoss(margin=m)(img, pos, negs, neg_img, torch.tensor([True, False]))
    assert loss.item() == pytest.approx(image_term + text_term, rel=1e-6)
    assert ITMTripletLoss(margin=m)(img, pos, negs).item() == pytest.approx(image_term, rel=1e-6)
    # negatives far below the positive by more than the margin cost nothing
    assert ITMTripletLoss(margin=0.1)(img, img, -img.unsqueeze(1)).item() == 0.0


def test_itm_triplet_loss_masks_missing_negatives():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    pos = torch.tensor([[0.8, 0.6], [0.0, 1.0]])                 # s(I, T+) = 0.8, 1.0
    negs = torch.tensor([[[1.0, 0.0], [0.0, 1.0]],              # s = 1.0, 0.0
                         [[0.0, 1.0], [1.0, 0.0]]])             # s = 1.0, 0.0 (second one padding)
    mask = torch.tensor([[True, True], [True, False]])
    m = 0.5
    first = (max(0, m - 0.8 + 1.0) + max(0, m - 0.8 + 0.0)) / 2
    second = max(0, m - 1.0 + 1.0)                               # its padding negative is ignored
    loss = ITMTripletLoss(margin=m)(img, pos, negs, negative_mask=mask)
    assert loss.item() == pytest.approx((first + second) / 2, rel=1e-6)


def test_relcomp_weights_itm_and_contrastive_over_true_pairs():
    torch.manual_seed(0)
    n = lambda *shape: F.normalize(torch.randn(*shape), dim=-1)
    itm = {"image": n(4, 8), "positive": n(4, 8), "negatives": n(4, 3, 8), "negative_image": n(4, 8),
           "has_negative_image": torch.tensor([True, False, True, True]),
           "negative_mask": torch.ones(4, 3, dtype=torch.bool)}
    extra, scale = (n(2, 8), n(2, 8)), torch.tensor(5.0)
    triplet = ITMTripletLoss(0.3)(**itm)
    total, parts = RelCompLoss(0.3, w_itm=2.0, w_clip=0.5)(scale, itm=itm)
    clip = ContrastiveLoss()(itm["image"], itm["positive"], scale)
    assert total.item() == pytest.approx(2.0 * triplet.item() + 0.5 * clip.item(), rel=1e-6)
    # a contrastive stream's pairs join the same contrastive term
    total, _ = RelCompLoss(0.3, w_itm=2.0, w_clip=0.5)(scale, itm=itm, contrastive=extra)
    clip = ContrastiveLoss()(torch.cat([itm["image"], extra[0]]), torch.cat([itm["positive"], extra[1]]), scale)
    assert total.item() == pytest.approx(2.0 * triplet.item() + 0.5 * clip.item(), rel=1e-6)


def test_itm_task_encodes_negative_images_only_where_present():
    """The task's one-pass encoding and slicing give the loss of separately encoded features."""
    from negft import models
    from negft.losses import LossCfg, RelCompCfg
    from negft.train.task import build_task
    torch.manual_seed(0)
    clip = models.build("negft-tiny", "").model.eval()
    batch = {"images": torch.randn(3, 3, 64, 64), "texts": torch.randint(1, 400, (3, 32)),
             "negatives": torch.randint(1, 400, (3, 3, 32)), "negative_images": torch.randn(3, 3, 64, 64),
             "has_negative_image": torch.tensor([True, False, True]),
             "negative_mask": torch.tensor([[True, True, True], [True, True, False], [True, False, False]])}
    loss_fn = RelCompLoss(0.2, w_itm=1.0, w_clip=1.0)
    total, _ = build_task(clip, LossCfg(name="relcomp", relcomp=RelCompCfg(0.2, w_itm=1.0, w_clip=1.0)))({"itm": batch})
    with torch.no_grad():
        enc_i = lambda x: F.normalize(clip.encode_image(x), dim=-1)
        enc_t = lambda x: F.normalize(clip.encode_text(x), dim=-1)
        neg_img = enc_i(batch["negative_images"]) * batch["has_negative_image"][:, None]
        want, _ = loss_fn(clip.logit_scale.exp(), itm={
            "image": enc_i(batch["images"]), "positive": enc_t(batch["texts"]),
            "negatives": enc_t(batch["negatives"].flatten(0, 1)).view(3, 3, -1), "negative_image": neg_img,
            "has_negative_image": batch["has_negative_image"], "negative_mask": batch["negative_mask"]})
    assert total.item() == pytest.approx(want.item(), rel=1e-4)


def test_negfull_weights_the_two_losses():
    torch.manual_seed(0)
    img, txt = F.normalize(torch.randn(4, 8), dim=-1), F.normalize(torch.randn(4, 8), dim=-1)
    mimg, opts = F.normalize(torch.randn(3, 8), dim=-1), F.normalize(torch.randn(3, 4, 8), dim=-1)
    answers, scale = torch.tensor([0, 2, 1]), torch.tensor(5.0)
    c = ContrastiveLoss()(img, txt, scale)
    m = MCQLoss()(mimg, opts, answers, scale)
    total, parts = NegFullLoss(alpha=0.3)(scale, contrastive=(img, txt), mcq=(mimg, opts, answers))
    assert total.item() == pytest.approx(0.3 * c.item() + 0.7 * m.item(), rel=1e-6)
    assert set(parts) == {"contrastive", "mcq"}
    only, _ = NegFullLoss(alpha=0.3)(scale, mcq=(mimg, opts, answers))
    assert only.item() == pytest.approx(m.item(), rel=1e-6)


def test_mcq_loss_in_the_model_uses_cosine_not_raw_features():
    """Scaling the text projection changes raw dot products but not cosine similarities."""
    from negft import models
    from negft.losses import LossCfg
    from negft.train.task import build_task
    torch.manual_seed(0)
    bundle = models.build("negft-tiny", "")
    task = build_task(bundle.model, LossCfg(name="mcq")).eval()
    batch = {"images": torch.randn(2, 3, 64, 64), "options": torch.randint(1, 400, (2, 4, 32)),
             "answers": torch.tensor([1, 3])}
    before, _ = task({"mcq": batch})
    with torch.no_grad():
        bundle.model.text_projection.mul_(7.0)
    after, _ = task({"mcq": batch})
    assert after.item() == pytest.approx(before.item(), rel=1e-5)


def _encoder():
    torch.manual_seed(1)
    return torch.nn.Linear(6, 4), torch.nn.Linear(5, 4)


def _grads(vis, txt, x, t, rank, world):
    loss = ContrastiveLoss(rank, world)(F.normalize(vis(x), dim=-1), F.normalize(txt(t), dim=-1), torch.tensor(3.0))
    loss.backward()
    return [p.grad.clone() for p in list(vis.parameters()) + list(txt.parameters())]


def _contrastive_inputs():
    torch.manual_seed(0)
    return torch.randn(8, 6), torch.randn(8, 5)


def two_rank_case(rank, world):
    """This rank's half of the batch; the gradients averaged over the ranks, as DeepSpeed / DDP do."""
    x, t = _contrastive_inputs()
    vis, txt = _encoder()
    n = x.shape[0] // world
    grads = _grads(vis, txt, x[rank * n:(rank + 1) * n], t[rank * n:(rank + 1) * n], rank, world)
    for g in grads:
        dist.all_reduce(g)
        g /= world
    return grads


def test_two_rank_contrastive_gradient_equals_one_process(two_ranks):
    x, t = _contrastive_inputs()
    vis, txt = _encoder()
    expected = _grads(vis, txt, x, t, 0, 1)
    got = two_ranks["tests.test_losses:two_rank_case"][0]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_a_bf16_model_gets_its_loss_and_logit_scale_in_fp32():
    """DeepSpeed's bf16 engine casts the whole model; the task scores its features in fp32, so the loss is the
    fp32 loss of the bf16 features (not rounded to bf16) and the scale's clamp at 100 holds (in bf16, ln 100
    rounds to 4.594: a scale of 98.9)."""
    from negft import models
    from negft.losses import LossCfg, NegFullCfg
    from negft.train.task import build_task
    torch.manual_seed(0)
    clip = models.build("negft-tiny", "").model.eval().to(torch.bfloat16)
    with torch.no_grad():
        clip.logit_scale.fill_(5.0)
    contrastive = {"images": torch.randn(4, 3, 64, 64, dtype=torch.bfloat16), "texts": torch.randint(1, 400, (4, 32))}
    mcq = {"images": torch.randn(2, 3, 64, 64, dtype=torch.bfloat16), "options": torch.randint(1, 400, (2, 4, 32)),
           "answers": torch.tensor([1, 3])}
    loss_fn = NegFullLoss(alpha=0.3)
    total, logs = build_task(clip, LossCfg(name="negfull", negfull=NegFullCfg(alpha=0.3)))({"contrastive": contrastive,
                                                                                          "mcq": mcq})
    assert total.dtype == torch.float32 and logs["logit_scale"].item() == pytest.approx(100.0, rel=1e-6)
    # the same bf16 features (one pass per tower as the task encodes them, with gradients: without, attention
    # takes PyTorch's fused path and rounds differently in bf16), scored in fp32
    img = F.normalize(clip.encode_image(torch.cat([contrastive["images"], mcq["images"]])).detach().float(), dim=-1)
    txt = models.encode_text_grouped(clip, torch.cat([contrastive["texts"], mcq["options"].flatten(0, 1)]))
    txt = F.normalize(txt.detach().float(), dim=-1)
    with torch.no_grad():
        want, _ = loss_fn(torch.tensor(100.0), contrastive=(img[:4], txt[:4]),
                          mcq=(img[4:], txt[4:].view(2, 4, -1), mcq["answers"]))
    assert total.item() == pytest.approx(want.item(), rel=1e-6)
    total.backward()
    assert clip.logit_scale.grad is not None and clip.logit_scale.grad.dtype == torch.bfloat16


def _labelled(metas, tokenize):
    """A made-up batch field: how many objects each sample's image is labelled with."""
    return torch.tensor([len((m.get("objects") or {}).get("positive", [])) for m in metas])


def test_a_term_is_one_class_summed_logged_and_given_its_fields(cache, bundle, monkeypatch):
    """Adding a loss term is one class listed in an objective: the task adds its weighted value to the loss and
    logs it, and the streams of the recipe carry the batch fields it declares (here a made-up term on the clip
    objective: 2 × the mean squared norm of the normalised image features, i.e. 2, and a field of labels)."""
    from negft import models
    from negft.data.pipeline import EpochBatches, Stream, StreamSpec
    from negft.losses import OBJECTIVES, Contrastive, LossCfg, Objective, Term
    from negft.train.task import build_task, stream_extras

    class Norms(Term):
        name = "norms"

        def fields(self, task):
            return {"labelled": _labelled} if task == "contrastive" else {}

        def forward(self, step):
            value = (step.features["contrastive"][0] ** 2).sum(-1).mean()
            return 2 * value, {"norms": value.detach()}

    shards = sorted(str(p) for p in (cache / "world-s0-tiny" / "finetune").glob("*.tar"))

    def first(loss):
        spec = StreamSpec(shards, "contrastive", "caption", batch_size=4, **stream_extras(loss, "contrastive"))
        batch = next(EpochBatches(Stream(spec, bundle.preprocess_val, bundle.tokenizer, seed=0), workers=0).epoch(1, 1))
        return {k: v for k, v in batch.items() if k not in ("skipped", "tally")}

    torch.manual_seed(0)
    clip = models.build("negft-tiny", "").model.eval()
    plain_batch = first(LossCfg(name="clip"))
    plain, plain_logs = build_task(clip, LossCfg(name="clip"))({"contrastive": plain_batch})
    monkeypatch.setitem(OBJECTIVES, "clip", Objective("clip", (Contrastive, Norms)))
    batch = first(LossCfg(name="clip"))
    assert set(batch) == set(plain_batch) | {"labelled"} and batch["labelled"].shape == (4,)
    assert torch.equal(batch["images"], plain_batch["images"]) and torch.equal(batch["texts"], plain_batch["texts"])
    task = build_task(clip, LossCfg(name="clip"))
    assert [t.name for t in task.terms] == ["contrastive", "norms"]
    total, logs = task({"contrastive": batch})
    assert logs["norms"].item() == pytest.approx(1.0, rel=1e-5)
    assert logs["contrastive"].item() == plain_logs["contrastive"].item()
    assert total.item() == pytest.approx(plain.item() + 2.0, rel=1e-6)


def test_loss_settings_are_plain_classes_with_their_ranges_and_off_values():
    """Each ``loss.<block>`` is a dataclass written in negft/losses.py (found by grep), that is each of its terms'
    Settings; the ranges sit on the fields (negft.fields), and each term says which of its values mean off."""
    import dataclasses
    import inspect

    from negft import losses
    from negft.losses import (BLOCKS, OBJECTIVES, LossCfg, MCQCfg, NegCapHardNegatives, NegFullCfg, TextToImage,
                              TextToImageOptions, WeightedTerm, off_values, setting_errors)
    source = inspect.getsource(losses)
    for cls in (LossCfg, MCQCfg, NegFullCfg, losses.RelCompCfg, losses.GuardCfg):
        assert f"class {cls.__name__}" in source and dataclasses.is_dataclass(cls)
    for block, terms in BLOCKS.items():
        cfg = getattr(LossCfg(), block)
        for term in terms:
            assert isinstance(cfg, term.Settings)
            assert set(term.off) <= {f.name for f in dataclasses.fields(term.Settings)}
            for f in dataclasses.fields(term.Settings):
                assert ("range" in f.metadata or "choices" in f.metadata) and f.metadata["doc"], f"loss.{block}.{f.name}"
    assert off_values("negfull") == {"negation_weight": 1.0, "t2i": 0.0, "t2i_options": 0.0, "hard_negatives": 0.0}
    assert off_values("guard") == dict.fromkeys(("caption", "options", "kl", "l2sp"), 0.0)
    assert off_values("relcomp") == {}
    # every term at its off values is not built (the weights) or is NegBench's loss (negation_weight 1: no field)
    for name, objective in OBJECTIVES.items():
        cfg = LossCfg(name=name)
        for block in objective.blocks():
            for k, v in off_values(block).items():
                setattr(getattr(cfg, block), k, v)
        built = [t.name for t in losses.build_terms(cfg)]
        assert built == [objective.terms[0].name] and "mcq_weight" not in losses.batch_fields(cfg, "mcq")
    # the weight-only terms share one shape
    assert all(issubclass(t, WeightedTerm) for t in (TextToImage, TextToImageOptions, NegCapHardNegatives))
    bad = LossCfg(name="negfull", negfull=NegFullCfg(alpha=1.5, hard_negatives=-1))
    assert setting_errors(bad) == [
        "bad value 1.5 for 'loss.negfull.alpha': must lie in [0, 1] (the weight of the contrastive loss); "
        "e.g. loss.negfull.alpha=1",
        "bad value -1 for 'loss.negfull.hard_negatives': must be >= 0 (0: off); e.g. loss.negfull.hard_negatives=0"]
