"""How fast a tiny world model learns shapes from the world's pretraining images, by architecture and
caption style.

    python experiments/pretrain_captions.py WORLD_DIR [--model negft-tiny-rn|negft-tiny|...]
        [--captions shipped|plain|templates|templates-bg] [--detail 0.3] [--single] [--steps 120]
        [--lr 2e-3] [--batch 128] [--config-dir DIR]

Trains the model with negft's contrastive loss on the world's pretrain images held in memory (plain PyTorch,
no DeepSpeed: this measures the learning problem, not the loop; the optimizer, schedule and clamped
``logit_scale`` are world-pretrain's) and prints val zero-shot shape accuracy every 40 steps, as the zero-shot
probe scores it. ``shipped`` uses the captions in the shards; the other styles re-caption the same scenes:
``plain`` lists the objects, ``templates`` adds the alt-text templates without background phrases,
``templates-bg`` with them: a way to compare caption styles and architectures for the world base model
(experiments/RESULTS.md, "The world base model").
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import open_clip
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from negft import phrasings  # noqa: E402
from negft.data.shards import read_samples  # noqa: E402
from negft.evaluation import run_suite  # noqa: E402
from negft.losses import ContrastiveLoss  # noqa: E402
from negft.models import build, train_mode  # noqa: E402
from negft.probes.base import Dataset, PixelCache  # noqa: E402
from negft.train.engine import lr_lambda, param_groups  # noqa: E402
from negft.train.task import MAX_LOGIT_SCALE  # noqa: E402


def load_pretrain(world: Path):
    images, captions, scenes = [], [], []
    for members in read_samples(sorted((world / "pretrain").glob("*.tar"))).values():
        images.append(np.array(Image.open(io.BytesIO(members["png"])).convert("RGB")))
        meta = json.loads(members["json"])
        captions.append(meta["caption"])
        scenes.append(meta["scene"])
    return torch.from_numpy(np.stack(images)), captions, scenes


def recaption(scenes, style: str, detail: float) -> list[str]:
    rng = np.random.default_rng(0)
    templates = ("{objs}",) if style == "plain" else phrasings.AFFIRM_TRAIN
    if style == "templates":
        templates = tuple(t for t in templates if "{bg}" not in t)
    return [phrasings.affirmative_caption(s, rng, templates=templates, detail=detail) for s in scenes]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("world", type=Path, help="a built world, e.g. ~/.cache/negft/world-s0-demo")
    ap.add_argument("--captions", default="shipped", choices=("shipped", "plain", "templates", "templates-bg"))
    ap.add_argument("--detail", type=float, default=0.3, help="attribute rate when re-captioning")
    ap.add_argument("--single", action="store_true", help="single-object images only")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--model", default="negft-tiny-rn", help="architecture name (negft's or open_clip's)")
    ap.add_argument("--config-dir", type=Path, help="extra open_clip model configs to register")
    args = ap.parse_args()
    torch.manual_seed(0)

    images, captions, scenes = load_pretrain(args.world)
    if args.captions != "shipped":
        captions = recaption(scenes, args.captions, args.detail)
    if args.single:
        keep = [i for i, s in enumerate(scenes) if len(s["objects"]) == 1]
        images, captions = images[keep], [captions[i] for i in keep]
    if args.config_dir:
        open_clip.add_model_config(args.config_dir)
    bundle = build(args.model, "")
    model, tokenizer = bundle.model, bundle.tokenizer
    mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(open_clip.OPENAI_DATASET_STD).view(1, 3, 1, 1)

    def prep(u8):
        return (u8.permute(0, 3, 1, 2).float() / 255 - mean) / std

    tokens = tokenizer(captions)
    val = [Dataset("world", args.world / "val")]
    token_cache, pixel_cache = {}, PixelCache()         # the val images and prompts are prepared once

    def zeroshot() -> float:
        """The zero-shot probe's top-1 (ties shared) on the val split."""
        result = run_suite(model, bundle.preprocess_val, tokenizer, val, "zeroshot", n_boot=1,
                          token_cache=token_cache, pixel_cache=pixel_cache)
        return result.metrics["zeroshot/world/top1"]

    # world-pretrain's optimizer (its weight-decay groups, warmup and cosine schedule) and loss
    loss_fn = ContrastiveLoss()
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=args.lr, betas=(0.9, 0.98), eps=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(50, args.steps, 0.05))
    g = torch.Generator().manual_seed(0)
    order, pos = torch.randperm(len(captions), generator=g), 0
    print(f"{len(captions)} images, captions={args.captions}, e.g. {captions[:2]}", flush=True)
    t0 = time.time()
    train_mode(model, "vt")            # both towers train, as in world-pretrain
    for step in range(1, args.steps + 1):
        if pos + args.batch > len(order):
            order, pos = torch.randperm(len(captions), generator=g), 0
        idx = order[pos:pos + args.batch]
        pos += args.batch
        img, txt, _ = model(prep(images[idx]), tokens[idx])
        scale = model.logit_scale.clamp(0, MAX_LOGIT_SCALE).exp()      # clamped in the forward, as the loop does
        loss = loss_fn(img, txt, scale)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 40 == 0 or step == args.steps:
            print(f"step {step}  loss {loss.item():.3f}  zeroshot_top1 {zeroshot():.3f}  "
                  f"{time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
