"""The drift guard against the objective's terms, gradient for gradient.

    python experiments/guard_grads.py [CKPT_DIR] [loss.guard.caption=5 ...]

On a few real demo batches (world seed 0, the demo's streams), at the base or at a checkpoint of a guarded run
(the guard's reference is always the base): the norm of the text tower's gradient of α·L_clip, (1−α)·L_mcq and
the guard's weighted term, each alone, and their cosines; the guard term's value (1 − cos of the captions). Also
checks that the guard's gradient is not zero (the port found the branch's guard taking its model features under
no_grad: its caption / options / kl terms had none).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from negft import models  # noqa: E402
from negft.config import load_config, world_dir  # noqa: E402
from negft.data.pipeline import EpochBatches, Stream, StreamSpec  # noqa: E402
from negft.train.loop import by_task, setup, stream_extras  # noqa: E402
from negft.train.world_base import base_weights  # noqa: E402
from negft.train.task import Task, build_task  # noqa: E402


def main(argv):
    ckpt = argv[0] if argv and "=" not in argv[0] else None
    overrides = [a for a in argv if "=" in a] or ["loss.negfull.alpha=0.2", "loss.guard.caption=5"]
    cfg = load_config(["recipe=demo", "patch.sweep=false", *overrides])
    torch.manual_seed(0)
    base = base_weights(cfg, setup(cfg))
    bundle = models.build(cfg.model.world_arch, base)
    models.set_trainable(bundle.model, cfg.tower, cfg.model.train_logit_scale)
    task = build_task(bundle.model, cfg.loss, tower=cfg.tower)     # the reference: the base
    if ckpt:
        state = models.build(cfg.model.world_arch, f"local-dir:{ckpt}").model.state_dict()
        bundle.model.load_state_dict(state)
    models.train_mode(bundle.model, cfg.tower)
    world = world_dir(cfg)
    streams = {}
    for name, s in cfg.streams.items():
        shards = sorted(str(p) for p in (world / s.world_split).glob("*.tar"))
        spec = StreamSpec(shards, s.task, s.field, s.batch_size, **stream_extras(cfg.loss, s.task))
        streams[name] = iter(EpochBatches(Stream(spec, bundle.preprocess_val, bundle.tokenizer, 0), 0).epoch(1, 3))
    tasks = {n: s.task for n, s in cfg.streams.items()}
    params = [p for p in bundle.model.parameters() if p.requires_grad]
    alpha = cfg.loss.negfull.alpha
    negfull, guard = task.term("negfull"), task.term("guard")

    def grad(which, batch):
        bundle.model.zero_grad()
        if which != "guard":
            negfull.loss.alpha = 1.0 if which == "clip" else 0.0
        alone = Task(task.clip, task.objective, [guard if which == "guard" else negfull])     # one term alone
        loss, logs = alone(batch)
        w = alpha if which == "clip" else (1 - alpha) if which == "mcq" else 1.0
        (w * loss).backward()
        g = torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in params])
        return g, {k: float(v) for k, v in logs.items()}

    for i in range(3):
        raw = {n: {k: v for k, v in next(it).items() if k != "skipped"} for n, it in streams.items()}
        batch = by_task(raw, tasks)
        gs = {w: grad(w, batch) for w in ("clip", "mcq", "guard")}
        cos = lambda a, b: float(torch.nn.functional.cosine_similarity(a, b, dim=0))  # noqa: E731
        print(f"batch {i}: |g| α·clip {gs['clip'][0].norm():.4f}  (1−α)·mcq {gs['mcq'][0].norm():.4f}  "
              f"guard {gs['guard'][0].norm():.4f}  cos(guard, mcq) {cos(gs['guard'][0], gs['mcq'][0]):+.3f}  "
              f"cos(guard, clip) {cos(gs['guard'][0], gs['clip'][0]):+.3f}  guard terms "
              + ", ".join(f"{k} {v:.4f}" for k, v in gs['guard'][1].items() if k.startswith("guard")), flush=True)
    negfull.loss.alpha = alpha


if __name__ == "__main__":
    main(sys.argv[1:])
