"""Ops dispatched per training step (a proxy for a GPU's kernel launches) and host round trips, negft against
open_clip's own trainer, on the same model, batch and precision, counted on the CPU (negft.train.syncs).

    python bench/step_ops.py                                  # negft-tiny, fp32, batch 64, 8 steps
    python bench/step_ops.py --model negft-tiny --batch 64 --steps 8

- ``open_clip_train``: its ``train.train_one_epoch`` over synthetic batches (random images at the model's size,
  "Dummy caption" tokens, as its ``--dataset-type synthetic``), with the optimizer, scheduler and loss its
  ``main`` builds by default (AdamW over its parameter groups, cosine schedule, ``ClipLoss``; no clipping), its
  AdamW in the form torch picks on a CPU (one tensor at a time, reading each step count) and on a GPU (foreach);
- ``negft``: ``train.py recipe=negcap data=world train.synthetic=true`` (the plain contrastive objective, both
  towers) with the same model, batch and precision, through negft's whole loop (DeepSpeed engine,
  ``SkipNonFiniteAdamW`` in its GPU form, fused), its log steps only at the first and last step.

Each step's ops are split into the step's forward and backward (with the batch's transfer), the optimizer's
step, and the loop's bookkeeping after it; the batch's making is left out. The table gives the median over the
steps between the first and the last (no log step among them). Host syncs: the ops that would make the host
wait for a GPU in those steps (negft's loop run as on a GPU: ``loop.reads_freely`` false, its fused AdamW;
AdamW's step counts, which torch keeps on the host for its non-fused forms, are the host's).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import sys
import tempfile
from argparse import Namespace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import open_clip  # noqa: E402
import torch  # noqa: E402

from negft.train.syncs import HostSyncs, mark_host  # noqa: E402

open_clip.add_model_config(str(REPO / "negft" / "model_configs"))


class Counted:
    """A stream (or a loader) whose every batch begins a new step in ``count``, made on the host."""

    def __init__(self, inner, count: HostSyncs, first: bool, steps: list):
        self.inner, self.count, self.first, self.steps = inner, count, first, steps

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _counted(self, it):
        while True:
            if self.first:
                self.steps.append(len(self.steps) + 1)
                self.count.begin(f"step {self.steps[-1]}")
            try:
                with self.count.on_host():
                    batch = next(it)
            except StopIteration:
                return
            yield batch

    def epoch(self, *args, **kwargs):
        return self._counted(iter(self.inner.epoch(*args, **kwargs)))

    def __iter__(self):
        return self._counted(iter(self.inner))


def wrap_step(optimizer, count: HostSyncs, steps: list) -> None:
    """Split the optimizer's step into a bucket of its own, and what follows it into another."""
    step = optimizer.step

    def counted(*args, **kwargs):
        # torch keeps a non-fused, non-capturable AdamW's step counts on the host, on a GPU too: reading them is
        # no round trip
        for group in optimizer.param_groups:
            if not (group.get("fused") or group.get("capturable")):
                for p in group["params"]:
                    if "step" in optimizer.state.get(p, {}):
                        mark_host(optimizer.state[p]["step"])
        count.begin(f"opt {steps[-1]}")
        try:
            return step(*args, **kwargs)
        finally:
            count.begin(f"post {steps[-1]}")
    optimizer.step = counted


def open_clip_train(model_name: str, batch: int, steps: int, precision: str, foreach: bool | None) -> HostSyncs:
    from open_clip_train import train as oct_train
    from open_clip_train.scheduler import cosine_lr
    torch.manual_seed(0)
    model, _, _ = open_clip.create_model_and_transforms(model_name, precision=precision, output_dict=True)
    tokenizer = open_clip.get_tokenizer(model_name)
    size = model.visual.image_size
    size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
    batches = [(torch.randn(batch, 3, *size), tokenizer(["Dummy caption"] * batch)) for _ in range(steps)]

    def exclude(n, p):      # open_clip_train.main's parameter groups
        return p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n
    named = list(model.named_parameters())
    optimizer = torch.optim.AdamW(
        [{"params": [p for n, p in named if exclude(n, p) and p.requires_grad], "weight_decay": 0.0},
         {"params": [p for n, p in named if not exclude(n, p) and p.requires_grad], "weight_decay": 0.2}],
        lr=5e-4, betas=(0.9, 0.98), eps=1e-6, foreach=foreach)
    scheduler = cosine_lr(optimizer, 5e-4, 2, steps)
    loss = open_clip.ClipLoss(local_loss=False, gather_with_grad=False, cache_labels=True)
    count, marks = HostSyncs(), []
    loader = Counted(batches, count, True, marks)
    loader.num_batches, loader.num_samples = steps, steps * batch

    class Data:
        dataloader = loader

        def set_epoch(self, epoch):
            pass
    args = Namespace(device="cpu", precision=precision, distill=False, accum_freq=1, skip_scheduler=False,
                     horovod=False, grad_clip_norm=None, log_every_n_steps=steps - 1, rank=0, local_rank=0,
                     world_size=1, batch_size=batch, wandb=False)
    wrap_step(optimizer, count, marks)
    logging.disable(logging.INFO)
    with count:
        oct_train.train_one_epoch(model, {"train": Data()}, loss, 0, optimizer, None, scheduler, None, args)
    return count


def negft(model_name: str, batch: int, steps: int, precision: str, cache: Path) -> HostSyncs:
    from negft.train import loop
    from negft.commands.train import main as run_train
    count, marks = HostSyncs(), []
    open_streams, run_epochs, batch_to, build_engine = loop.open_streams, loop.run_epochs, loop.batch_to, \
        loop.build_engine

    def streams(*args, **kwargs):
        out = open_streams(*args, **kwargs)
        return {name: Counted(s, count, i == 0, marks) for i, (name, s) in enumerate(out.items())}

    def to_device(b, device, dtype):        # the step's tensors are the device's on a GPU
        out = batch_to(b, device, dtype)
        with count.pause():
            return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()}

    def engine_of(*args, **kwargs):
        eng, adamw, scheduler = build_engine(*args, **kwargs)
        wrap_step(adamw, count, marks)
        return eng, adamw, scheduler

    def epochs(*args, **kwargs):
        with count:
            return run_epochs(*args, **kwargs)
    loop.open_streams, loop.run_epochs, loop.batch_to, loop.build_engine = streams, epochs, to_device, engine_of
    loop.reads_freely = lambda device: False
    with tempfile.TemporaryDirectory() as out:
        code = run_train(["recipe=negcap", "data=world", "world.size=tiny", f"world.cache={cache}", "train.synthetic=true",
                          f"model.world_arch={model_name}", "model.world_pretrained=", "tower=vt", "train.workers=0",
                          f"streams.negcap.batch_size={batch}", f"train.precision={precision}", "epochs=1",
                          f"train.steps_per_epoch={steps}", f"train.log_every={steps}", "eval.suite=none",
                          "patch.sweep=false", f"out={out}/run"])
    if code:
        sys.exit(f"negft's run failed ({code})")
    return count


def summary(count: HostSyncs, steps: int) -> dict:
    inner = range(2, steps)         # between the first step and the last, which log
    parts = {}
    for phase in ("step", "opt", "post"):
        by = {b.label: b for b in count.buckets}
        parts[phase] = statistics.median(by[f"{phase} {i}"].ops if f"{phase} {i}" in by else 0 for i in inner)
    syncs = [s for b in count.buckets if b.label.split(" ")[-1].isdigit() and int(b.label.split()[-1]) in inner
             for s in b.syncs]
    return {**parts, "total": sum(parts.values()), "syncs": len(syncs) / len(inner), "report": count.report(syncs)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="negft-tiny")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--precision", default="fp32")
    a = p.parse_args(argv)
    rows = {"open_clip_train (AdamW as on a CPU: one tensor at a time)":
            summary(open_clip_train(a.model, a.batch, a.steps, a.precision, None), a.steps),
            "open_clip_train (AdamW as on a GPU: foreach)":
            summary(open_clip_train(a.model, a.batch, a.steps, a.precision, True), a.steps)}
    with tempfile.TemporaryDirectory() as cache:
        quiet = io.StringIO()
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            rows["negft"] = summary(negft(a.model, a.batch, a.steps, a.precision, Path(cache)), a.steps)
    print(f"{a.model}, {a.precision}, batch {a.batch}, CPU; median of steps 2..{a.steps - 1} of {a.steps}")
    print("| trainer | forward + backward | optimizer step | loop after it | ops per step | host syncs per step |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['step']:.0f} | {r['opt']:.0f} | {r['post']:.0f} | {r['total']:.0f} | {r['syncs']:g} |")
    for name, r in rows.items():
        if r["syncs"]:
            print(f"{name}'s host syncs:\n{r['report']}")


if __name__ == "__main__":
    main()
