"""Each baseline recipe's optimizer settings against its authors' code: clipping, weight decay, schedule, batch.

The table is read off the authors' repositories at the commits the recipes name (file cited per row). Batch is per
rank, as negft's ``streams.NAME.batch_size`` and open_clip's ``--batch-size`` both count it; ``ranks`` is how many the
authors ran on. The world blocks (``on_world``) change the budget (lr, batch, warm-up, epochs) and nothing here.
"""
import math

import pytest

from negft.config import load_config
from negft.train.engine import lr_lambda

NEGCLIP = "vinid/open_clip@e680f8e"
CONCLIP = "jaisidhsingh/CoN-CLIP@503388a"
NEGATIONCLIP = "parkquasar/NegationCLIP@6f858ee"
FSCCLIP = "ytaek-oh/fsc-clip@604015d"
CECLIP = "lezhang7/Enhance-FineGrained@ef87eb7"
TRIPLETCLIP = "tripletclip/TripletCLIP@abbf81c"

# recipe -> the authors' values; clip None = no clipping; decay_all: weight decay on every parameter (a bare AdamW over
# model.parameters()) rather than open_clip's rule (no decay on gains, biases, logit_scale); schedule "cosine" (to 0
# after a linear warm-up) or "constant" (no scheduler at all)
AUTHORS = {
    "negclip": dict(clip=None, decay_all=False, weight_decay=0.1, schedule="cosine", warmup=50, batch=256, ranks=1, lr=1e-6,
                    beta2=0.98, eps=1e-6,
                    source=f"{NEGCLIP} src/training/params.py (--norm_gradient_clip None; ViT betas/eps), "
                           "src/training/train.py, src/training/main.py (cosine_lr); weight decay, warm-up, batch and "
                           "lr from the paper (the fork has no NegCLIP run script)"),
    "conclip": dict(clip=None, decay_all=True, weight_decay=0.2, schedule="cosine", warmup=50, batch=200, ranks=1, lr=1e-6,
                    beta2=0.999, eps=1e-8,
                    source=f"{CONCLIP} src/run_finetuning.sh, src/training_utils/helpers.py (setup_args), "
                           "src/conclip_fine_tuning.py (torch AdamW defaults, cosine_lr), "
                           "src/training_utils/schedulers.py"),
    "negationclip": dict(clip=None, decay_all=True, weight_decay=0.01, schedule="constant", warmup=0, batch=512, ranks=1, lr=1e-6,
                         beta2=0.999, eps=1e-8,
                         source=f"{NEGATIONCLIP} src/clip_finetune.py (torch.optim.AdamW(model.parameters(), "
                                "lr=args.lr), no scheduler, no clipping)"),
    "fscclip": dict(clip=None, decay_all=False, weight_decay=0.1, schedule="cosine", warmup=50, batch=256, ranks=1, lr=5e-6,
                    beta2=0.98, eps=1e-6,
                    source=f"{FSCCLIP} README.md (COCO ViT-B-32 command), src/training/params.py "
                           "(--grad-clip-norm None, --lr-scheduler cosine, ViT betas/eps)"),
    "ceclip": dict(clip=None, decay_all=False, weight_decay=0.1, schedule="cosine", warmup=50, batch=378, ranks=4, lr=5e-6,
                   beta2=0.98, eps=1e-6,
                   source=f"{CECLIP} scripts/run_multiple_nodes.sh (bs=378, gpu:a100l:4, --wd 0.1, --beta2 0.98), "
                          "src/training/params.py (--grad-clip-norm None, --lr-scheduler cosine)"),
    # fine-tuning: the code's optimizer, NegCLIP's fine-tuning budget (the repository publishes no fine-tuning setup)
    "tripletclip": dict(clip=None, decay_all=True, weight_decay=0.1, schedule="cosine", warmup=50, batch=256, ranks=1, lr=1e-6,
                        beta2=0.999, eps=1e-8,
                        source=f"{TRIPLETCLIP} src/openclip/src/parse_args.py (betas, eps, cosine), "
                               "src/openclip/src/train.py (no clipping); budget: negclip's row"),
    # pretraining from scratch: the paper's lr and weight decay; batch and warm-up scaled to the world (below)
    "tripletclip-pretrain": dict(clip=None, decay_all=True, weight_decay=0.5, schedule="cosine", warmup=1000, batch=1024, ranks=1,
                                 lr=5e-4, beta2=0.999, eps=1e-8,
                                 source=f"{TRIPLETCLIP} src/openclip/scripts/sample_train.sh (LR, BZ, EPOCHS), "
                                        "src/openclip/src/parse_args.py (--wd 0.5, --warmup 1000, betas, eps), "
                                        "src/openclip/src/train.py (no clipping)"),
}
SCALED = {"tripletclip-pretrain"}       # batch and warm-up scaled to the world as world-pretrain scales its own


def _schedule(cfg, total=200):
    f = lr_lambda(cfg.optim.warmup_steps, total, cfg.optim.min_lr_ratio)
    return [f(s) for s in range(total)]


@pytest.mark.parametrize("recipe", sorted(AUTHORS))
@pytest.mark.parametrize("data", ["real", "world"])
def test_recipe_clips_decays_and_schedules_as_its_authors_code(recipe, data):
    want = AUTHORS[recipe]
    cfg = load_config([f"recipe={recipe}", f"data={data}"])
    assert cfg.optim.grad_clip == 0 if want["clip"] is None else cfg.optim.grad_clip == want["clip"], want["source"]
    assert cfg.optim.weight_decay == pytest.approx(want["weight_decay"]), want["source"]
    assert cfg.optim.decay_all == want["decay_all"], want["source"]
    assert (cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps) == pytest.approx((0.9, want["beta2"], want["eps"]))
    lrs = _schedule(cfg)
    if want["schedule"] == "constant":
        assert lrs == [1.0] * len(lrs), want["source"]
    else:
        warm = cfg.optim.warmup_steps
        assert cfg.optim.min_lr_ratio == 0.0 and lrs[-1] < 1e-3 and max(lrs) == pytest.approx(1.0, abs=1e-3)
        assert lrs[:warm] == [pytest.approx((s + 1) / warm) for s in range(warm)]


@pytest.mark.parametrize("recipe", sorted(set(AUTHORS) - SCALED))
def test_recipe_batch_warmup_and_lr_as_its_authors_ran_them(recipe):
    want = AUTHORS[recipe]
    cfg = load_config([f"recipe={recipe}"])
    (stream,) = cfg.streams.values()
    assert stream.batch_size == want["batch"], want["source"]          # per rank, as open_clip's --batch-size
    assert (cfg.optim.warmup_steps, cfg.optim.lr) == (want["warmup"], want["lr"]), want["source"]


def test_ceclip_runs_its_per_gpu_batch_on_four_ranks():
    """378 is the batch of each of the 4 GPUs (global 1,512 after the gather): the recipe says so and keeps the
    per-rank value, which negft's batch_size counts."""
    from negft.config import RECIPES
    text = (RECIPES / "ceclip.yaml").read_text()
    assert AUTHORS["ceclip"]["ranks"] == 4 and "4 × 378 = 1,512" in text and "--num_gpus 4" in text


def test_tripletclip_pretrain_scales_the_papers_batch_and_warmup_as_world_pretrain_scales_its_own():
    """Same model, images, epochs and batch as world-pretrain; the paper's lr and weight decay; the warm-up the same
    share of the run as the paper's 1,000 of 10 epochs × ⌈1M / 1,024⌉ steps."""
    from negft.world.generator import SIZES
    want = AUTHORS["tripletclip-pretrain"]
    pre, base = load_config(["recipe=tripletclip-pretrain"]), load_config(["recipe=world-pretrain"])
    (stream,), (base_stream,) = pre.streams.values(), base.streams.values()
    assert pre.data == base.data == "world" and pre.model.world_pretrained == base.model.world_pretrained == ""
    assert (stream.batch_size, pre.epochs) == (base_stream.batch_size, base.epochs)
    assert (pre.optim.lr, pre.optim.weight_decay) == (want["lr"], want["weight_decay"])
    paper_steps = 10 * math.ceil(1_000_000 / want["batch"])
    world_steps = base.epochs * SIZES["demo"]["pretrain"] // base_stream.batch_size
    assert pre.optim.warmup_steps == round(want["warmup"] / paper_steps * world_steps) == 49
    assert stream.world_split == "tripletclip_pretrain" and pre.loss.name == "tripletclip"


@pytest.mark.parametrize("decay_all", [False, True])
def test_decay_all_decays_gains_biases_and_logit_scale_as_a_bare_adamw(decay_all):
    from negft import models
    from negft.train.engine import param_groups
    model = models.build("negft-tiny", "").model
    decayed = {id(p) for g in param_groups(model, 0.2, decay_all=decay_all) if g["weight_decay"] == 0.2
               for p in g["params"]}
    named = dict(model.named_parameters())
    assert (id(named["logit_scale"]) in decayed) == decay_all
    assert (id(named["ln_final.weight"]) in decayed) == decay_all
    assert id(named["text_projection"]) in decayed
    assert len(decayed) == (len(named) if decay_all else sum(p.ndim >= 2 and "ln" not in n and "bn" not in n
                                                              for n, p in named.items()))
