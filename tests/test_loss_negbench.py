"""NegBench's MCQ loss under ``similarity: dot``: the scaled dot product of the towers' un-normalised features, as
NegBench's released train.py scores its options (its MCQLoss on encode_image / encode_text), against hand-computed
values and gradients in float64 (the check against the reference's own function: bench/parity/loss-negbench-mcq.md)."""
import math

import pytest
import torch
import torch.nn.functional as F

from negft.losses import MCQ, LossCfg, MCQCfg, NegFull, NegFullCfg, Step, setting_errors


def _step(img, opts, answers, scale, contrastive=None):
    """A Step whose mcq rows sit after two contrastive rows (so the term must take its own slices)."""
    m, c, d = opts.shape
    junk_img, junk_txt = torch.full((2, d), 5.0, dtype=img.dtype), torch.full((2, d), -5.0, dtype=img.dtype)
    features = {"mcq": (F.normalize(img, dim=-1), F.normalize(opts, dim=-1), answers, None)}
    if contrastive is not None:
        features["contrastive"] = contrastive
    return Step(batch={"mcq": {"answers": answers}}, scale=scale, features=features,
                images=torch.cat([junk_img, img]), texts=torch.cat([junk_txt, opts.flatten(0, 1)]), extra={},
                encode_text=None, image_rows={"mcq": slice(2, 2 + m)}, text_rows={"mcq": slice(2, 2 + m * c)})


def test_dot_similarity_scores_raw_features_hand_computed():
    """One question, image (3, 0), options (2, 0) and (0.6, 0.8), the right answer the second, s = 1: the dot logits
    are (6, 1.8), the cosine logits (1, 0.6)."""
    img = torch.tensor([[3.0, 0.0]], dtype=torch.float64)
    opts = torch.tensor([[[2.0, 0.0], [0.6, 0.8]]], dtype=torch.float64)
    answers, scale = torch.tensor([1]), torch.tensor(1.0, dtype=torch.float64)
    dot, logs = MCQ(MCQCfg(similarity="dot"))(_step(img, opts, answers, scale))
    assert dot.item() == pytest.approx(math.log(1 + math.exp(6 - 1.8)), rel=1e-12)
    assert logs["mcq"].item() == dot.item()
    cosine, _ = MCQ(MCQCfg())(_step(img, opts, answers, scale))
    assert cosine.item() == pytest.approx(math.log(1 + math.exp(1 - 0.6)), rel=1e-12)


def test_dot_similarity_gradients_are_the_cross_entropys_on_raw_features():
    """dL/dv_m = s Σ_c (p_mc − y_mc) t_mc / M and dL/dt_mc = s (p_mc − y_mc) v_m / M, p the softmax of the scaled
    raw dot products, in float64, at the logit scales 1/0.07 and 100."""
    torch.manual_seed(0)
    for s in (1 / 0.07, 100.0):
        img = (torch.randn(3, 5, dtype=torch.float64) * 0.3).requires_grad_()
        opts = (torch.randn(3, 4, 5, dtype=torch.float64) * 0.3).requires_grad_()
        with torch.no_grad():
            opts[1, 2] = opts[1, 0]             # a planted exact tie
        answers, scale = torch.tensor([0, 2, 3]), torch.tensor(s, dtype=torch.float64)
        loss, _ = MCQ(MCQCfg(similarity="dot"))(_step(img, opts, answers, scale))
        loss.backward()
        with torch.no_grad():
            logits = s * torch.einsum("md,mcd->mc", img, opts)
            p = logits.softmax(-1)
            y = F.one_hot(answers, 4).to(p.dtype)
            want = (torch.logsumexp(logits, -1) - logits.gather(1, answers[:, None]).squeeze(1)).mean()
            grad_img = s * torch.einsum("mc,mcd->md", p - y, opts) / 3
            grad_opts = s * (p - y)[..., None] * img[:, None] / 3
        assert loss.item() == pytest.approx(want.item(), rel=1e-12)
        torch.testing.assert_close(img.grad, grad_img, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(opts.grad, grad_opts, rtol=1e-10, atol=1e-12)


def test_negfull_reads_the_same_key():
    """NegBench eq. 2's MCQ part is the same loss on the same features: α = 0 leaves it alone."""
    torch.manual_seed(1)
    img, opts = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    answers, scale = torch.tensor([2, 0]), torch.tensor(10.0, dtype=torch.float64)
    pair = (F.normalize(torch.randn(2, 4, dtype=torch.float64), dim=-1),) * 2
    step = _step(img, opts, answers, scale, contrastive=pair)
    mcq, _ = MCQ(MCQCfg(similarity="dot"))(step)
    total, logs = NegFull(NegFullCfg(alpha=0.0, similarity="dot"))(step)
    assert total.item() == pytest.approx(mcq.item(), rel=1e-12) and logs["mcq"].item() == total.item()
    cosine, _ = NegFull(NegFullCfg(alpha=0.0))(step)
    assert cosine.item() != pytest.approx(total.item(), rel=1e-3)


def test_dot_similarity_in_the_model_reads_the_towers_own_features():
    """In a trained module the key scores encode_image / encode_text as they come: scaling the text projection
    changes the loss (it does not under cosine, test_losses)."""
    from negft import models
    from negft.train.task import build_task
    torch.manual_seed(0)
    bundle = models.build("negft-tiny", "")
    clip = bundle.model.eval()
    task = build_task(clip, LossCfg(name="mcq", mcq=MCQCfg(similarity="dot"))).eval()
    batch = {"images": torch.randn(2, 3, 64, 64), "options": torch.randint(1, 400, (2, 4, 32)),
             "answers": torch.tensor([1, 3])}
    with torch.no_grad():
        got, _ = task({"mcq": batch})
        scale = clip.logit_scale.exp().clamp(max=100)
        img, txt = clip.encode_image(batch["images"]), clip.encode_text(batch["options"].flatten(0, 1))
        want = F.cross_entropy(scale * torch.einsum("md,mcd->mc", img, txt.view(2, 4, -1)), batch["answers"])
        assert got.item() == pytest.approx(want.item(), rel=1e-4)
        clip.text_projection.mul_(7.0)
        scaled, _ = task({"mcq": batch})
    assert scaled.item() != pytest.approx(got.item(), rel=1e-2)


def test_the_key_is_validated_and_cosine_by_default():
    assert LossCfg().mcq.similarity == "cosine" and LossCfg().negfull.similarity == "cosine"
    assert setting_errors(LossCfg(name="mcq", mcq=MCQCfg(similarity="raw"))) == [
        "bad value 'raw' for 'loss.mcq.similarity'. Valid choices: cosine, dot"]
