"""What a run that trains the image tower loses through batch-norm statistics alone: the world's base (a conv image
tower, negft-tiny-rn) run forward in training mode over a baseline recipe's batches of the relcomp split, without
a gradient or a step, so that only its batch norms' running statistics move; then evaluated on val, as a run's
epoch-0 and last ledger lines are. CLIP's ViTs have no batch norm: this is the world's base alone
(model.freeze_norm_stats, negft/config.py).

    python experiments/norm_stats.py [--recipe negclip] [--steps 300] [--seed 0]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from negft import models  # noqa: E402
from negft.config import load_config, model_arch, world_dir  # noqa: E402
from negft.data.pipeline import EpochBatches, Stream, StreamSpec  # noqa: E402
from negft.evaluation import datasets_for, run_suite  # noqa: E402
from negft.train import loop  # noqa: E402
from negft.train.world_base import base_weights  # noqa: E402

SHOWN = {"zeroshot/world/top1": "zero-shot", "retrieval/world/r5": "R@5", "mcq_neg/world/acc": "MCQ",
         "retrieval_neg/world/r5": "Retrieval-Neg R@5"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="negclip")
    p.add_argument("--steps", type=int, default=300, help="batches (the recipes' world budget: 4 epochs x 75)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    cfg = load_config([f"recipe={a.recipe}", "data=world", f"world.seed={a.seed}"])
    world = world_dir(cfg)
    base = base_weights(cfg, loop.setup(cfg))
    bundle = models.build(model_arch(cfg), base)
    val = datasets_for(world / "val")

    def scores() -> dict:
        r = run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer, val,
                      suite=",".join(k.split("/")[0] for k in SHOWN), n_boot=200)
        return {k: r.metrics[k] for k in SHOWN}
    before = scores()
    [name] = cfg.streams
    urls, _ = loop.stream_source(cfg, name, world)
    spec = StreamSpec(urls, "contrastive", "caption", cfg.streams[name].batch_size)
    batches = EpochBatches(Stream(spec, loop.train_transform(cfg, bundle), bundle.tokenizer, seed=0), workers=0)
    models.train_mode(bundle.model, "vt")           # what a run with tower=vt does, freeze_norm_stats false
    with torch.no_grad():
        for batch in batches.epoch(1, steps=a.steps):
            bundle.model.encode_image(batch["images"])
    after = scores()
    print(f"world seed {a.seed}, recipe {a.recipe}'s world stream ({spec.batch_size} images a batch), {a.steps} "
          f"batches in training mode, no step; val:")
    print("| | " + " | ".join(SHOWN.values()) + " |\n|---|" + "---|" * len(SHOWN))
    for label, m in (("the base", before), ("its batch-norm statistics moved", after)):
        print(f"| {label} | " + " | ".join(f"{m[k]:.3f}" for k in SHOWN) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
