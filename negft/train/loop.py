"""The training loop: one DeepSpeed engine, the same code for one process and for many ranks.

Read top to bottom: ``train`` sets up ranks → data → model → engine → evaluates epoch 0 → for each epoch:
steps (``train_epoch``), checkpoint, evaluation (``EvalRecorder``). Where its base model comes from, and what
follows training (patching sweep, release), is ``negft.commands.train``'s.
"""
from __future__ import annotations

import glob
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
from tqdm import tqdm

from negft import lora, models
from negft.config import RESUME_WORDS, Config, ConfigError, epoch_stream, model_arch, to_yaml, world_dir
from negft.data import manifests
from negft.data.check import check_shards
from negft.data.pipeline import EpochBatches, Stream, StreamSpec, SyntheticBatches, check_skipped, gather, shard_note
from negft.evaluation import datasets_for
from negft.train.engine import (barrier, batch_to, casts_weights, deepspeed_config, init_distributed, lr_lambda,
                                make_optimizer, own_clipping, skip_one_rank_allreduce, zero_stage)
from negft.io import WriteError, atomic_write, move_into_place, remove, staging_path, write_failure
from negft.losses import join_field
from negft.train.ledger import Ledger
from negft.train.recorder import EvalRecorder, RunLog, run_notes
from negft.train.stop import Stopped, StopRequest
from negft.train.task import build_task, stream_extras
from negft.world.generator import ensure_world


# --------------------------------------------------------------------------- data
def stream_source(cfg: Config, name: str, world: Path | None) -> tuple[list[str], int | None]:
    """(shard urls, sample count) of stream ``name``: world shards, explicit urls, or a manifest."""
    s = cfg.streams[name]
    if world is not None:
        meta = json.loads((world / "world.json").read_text())
        return sorted(glob.glob(str(world / s.world_split / "*.tar"))), meta["counts"][s.world_split]
    import braceexpand
    if s.urls:
        return list(braceexpand.braceexpand(s.urls)), None
    if not s.manifest:
        raise ConfigError(f"stream '{name}' has neither streams.{name}.urls nor streams.{name}.manifest")
    try:
        man = manifests.load(s.manifest)
    except FileNotFoundError as e:
        raise ConfigError(f"streams.{name}.manifest: {e}") from None
    problems = check_shards(man, counts=False, first_only=True)     # seconds, not hours into a loader
    if problems:
        raise ConfigError(f"stream '{name}': " + "; ".join(problems)
                          + f" (NEGFT_DATA={manifests.data_root()}; `negft data check {s.manifest}` checks it "
                            f"whole; data=world runs the recipe on the embedded world)")
    return manifests.shard_urls(man), manifests.sample_count(man, s.field)


@dataclass
class StepPlan:
    """How long the run is: each stream's (shard urls, sample count), and the epoch and step counts."""
    sources: dict[str, tuple[list[str], int | None]]
    epoch_stream: str          # whose one pass is an epoch and whose batch size is DeepSpeed's micro-batch
    steps_per_epoch: int       # optimizer steps
    micro_steps: int           # micro-batches per epoch (steps × train.grad_accum)
    total_steps: int


def plan_steps(cfg: Config, world: Path | None, world_size: int) -> StepPlan:
    """Each stream's shards, checked to hold one step's batch; an epoch is ``train.steps_per_epoch`` steps, or
    one pass over ``train.epoch_stream``."""
    if not cfg.streams:
        raise ConfigError(f"recipe '{cfg.recipe}' defines no streams")
    synthetic = cfg.train.synthetic
    sources = {name: ([], None) if synthetic else stream_source(cfg, name, world) for name in cfg.streams}
    for name, (_, n) in sources.items():
        per_step = cfg.streams[name].batch_size * world_size
        if n is not None and n < per_step:
            raise ConfigError(f"stream '{name}' has {n} samples, fewer than one step's batch ({per_step} = "
                              f"streams.{name}.batch_size × {world_size} rank(s)): lower streams.{name}.batch_size")
    first = epoch_stream(cfg)
    steps_per_epoch = cfg.train.steps_per_epoch
    if steps_per_epoch is None and synthetic:
        steps_per_epoch = cfg.max_steps or 100
    if steps_per_epoch is None:
        n = sources[first][1]
        if n is None:
            raise ConfigError(f"stream '{first}' has no sample count: set train.steps_per_epoch")
        steps_per_epoch = max(1, n // (cfg.streams[first].batch_size * world_size * cfg.train.grad_accum))
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    return StepPlan(sources, first, steps_per_epoch, steps_per_epoch * cfg.train.grad_accum, total_steps)


def redraw_step(cfg: Config, name: str, urls: list[str]):
    """The stream's per-epoch hard-caption draw (``streams.NAME.redraw_negatives``), or None. On the world it knows
    the world's vocabulary and held-out pairs; on real data spaCy is checked here, before any loader starts."""
    method = cfg.streams[name].redraw_negatives
    if method == "none" or cfg.train.synthetic:
        return None
    from negft.convert import negatives
    if cfg.data == "world":
        from negft.world.methods import world_tagger
        meta = json.loads((world_dir(cfg) / "world.json").read_text())
        return negatives.Redraw(method, cfg.seed, world_tagger({tuple(c) for c in meta["held_out_combos"]}))
    try:
        negatives.SpacyTagger()
    except negatives.TaggerMissing as e:
        raise ConfigError(f"streams.{name}.redraw_negatives={method}: {e}") from None
    return negatives.Redraw(method, cfg.seed, urls=urls)


def open_streams(cfg: Config, plan: StepPlan, bundle: models.Bundle, device, dtype, rank: int,
                 world_size: int) -> dict:
    """Each stream's batches: from its shards, or (``train.synthetic``) random ones made on the device."""
    specs = {name: StreamSpec(plan.sources[name][0], s.task, s.field, s.batch_size, cfg.train.resampled,
                              redraw=redraw_step(cfg, name, plan.sources[name][0]), **stream_extras(cfg.loss, s.task))
             for name, s in cfg.streams.items()}
    if cfg.train.synthetic:
        size = getattr(bundle.model.visual, "image_size", 224)
        size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        return {name: SyntheticBatches(spec, size, bundle.tokenizer, device, dtype, cfg.seed, rank)
                for name, spec in specs.items()}
    preprocess = train_transform(cfg, bundle)
    streams = {name: EpochBatches(Stream(spec, preprocess, bundle.tokenizer, cfg.seed), cfg.train.workers)
               for name, spec in specs.items()}
    for name, spec in specs.items():
        note = shard_note(spec.urls, world_size * max(1, cfg.train.workers), spec.resampled)
        if note and rank == 0:
            print(f"[negft] note: stream '{name}': {note}", flush=True)
    return streams


def by_task(batches: dict[str, dict], tasks: dict[str, str]) -> dict[str, dict]:
    """The step's batches keyed by task; streams sharing a task (several datasets) are concatenated."""
    grouped: dict[str, list[dict]] = {}
    for name, batch in batches.items():
        grouped.setdefault(tasks[name], []).append(batch)
    return {task: parts[0] if len(parts) == 1 else {k: join_field(k, [p[k] for p in parts]) for k in parts[0]}
            for task, parts in grouped.items()}


# --------------------------------------------------------------------------- model
def train_transform(cfg: Config, bundle: models.Bundle):
    """open_clip's augmenting train transform, or (world default) its deterministic eval transform."""
    augment = cfg.model.train_augment if cfg.model.train_augment is not None else cfg.data != "world"
    return bundle.preprocess_train if augment else bundle.preprocess_val


def build_model(cfg: Config, base: str, rank: int) -> tuple[models.Bundle, dict | None, dict]:
    """(the model from ``base`` with the recipe's towers (or text adapters, ``model.lora``) trainable, its weights
    on the CPU for evaluating the patched model after every epoch (``patch.alpha``; rank 0), the weights
    DeepSpeed's cast would round)."""
    bundle = models.load(base, model_arch(cfg), cfg.model.quick_gelu)
    if cfg.model.lora.rank > 0:
        lora.inject(bundle.model, cfg.model.lora)      # checkpoints hold it merged (models.write_local_dir)
    try:
        models.set_trainable(bundle.model, cfg.tower, cfg.model.train_logit_scale,
                             cfg.model.lock_text_unlocked_layers, list(cfg.model.frozen))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    models.train_mode(bundle.model, cfg.tower, cfg.model.freeze_norm_stats)
    base_state = None if cfg.patch.alpha is None or rank != 0 else {
        k: v.detach().to("cpu", torch.float32 if v.is_floating_point() else v.dtype, copy=True)
        for k, v in bundle.model.state_dict().items()}
    if cfg.train.grad_checkpointing:
        bundle.model.set_grad_checkpointing(True)
    # DeepSpeed casts the whole model for fp16 (and bf16 without train.autocast); keep the frozen weights' exact
    # values for saving, and the checkpointed buffers (batch-norm statistics) of a tower that does not train
    state_keys = bundle.model.state_dict().keys()
    uncast_frozen_state = {} if not casts_weights(cfg) else {
        **{n: p.detach().to("cpu", copy=True) for n, p in bundle.model.named_parameters() if not p.requires_grad},
        **{n: b.detach().to("cpu", copy=True) for n, b in bundle.model.named_buffers()
           if n in state_keys and b.is_floating_point() and models.tower_of(n) not in cfg.tower}}
    return bundle, base_state, uncast_frozen_state


def build_engine(cfg: Config, task: torch.nn.Module, plan: StepPlan, rank: int, world_size: int):
    """(DeepSpeed engine, the ``SkipNonFiniteAdamW`` it steps, the learning-rate scheduler)."""
    import deepspeed
    adamw = make_optimizer(task, cfg, cfg.optim.grad_clip if own_clipping(cfg, world_size) else 0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        adamw, lr_lambda(cfg.optim.warmup_steps, max(1, plan.total_steps), cfg.optim.min_lr_ratio))
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=task, optimizer=adamw, lr_scheduler=scheduler,
        config=deepspeed_config(cfg, cfg.streams[plan.epoch_stream].batch_size, world_size))
    adamw.checks = optimizer is adamw      # else DeepSpeed's ZeRO / bf16 / fp16 optimizer checks the step
    skip_one_rank_allreduce(engine, adamw, world_size)
    if rank == 0 and zero_stage(cfg, world_size) != cfg.train.zero_stage:
        print(f"[negft] train.zero_stage={cfg.train.zero_stage} on one rank runs as ZeRO-0: there is nothing to "
              "partition, and ZeRO-0 is faster", flush=True)
    if rank == 0 and engine.device.type == "cpu" and cfg.train.precision != "fp32":
        print(f"[negft] note: train.precision={cfg.train.precision} on CPU is emulated and slow; "
              "train.precision=fp32 is faster here", flush=True)
    return engine, adamw, scheduler


# --------------------------------------------------------------------------- checkpoints
def fp32_weights(engine, uncast_frozen_state: dict) -> dict:
    """Full-precision weights to save: trained parameters from DeepSpeed's fp32 master copies (bf16 /
    fp16 runs), frozen ones from the snapshot taken before DeepSpeed cast the model, so a frozen tower
    is saved bit-identical. A collective: every rank calls it, in the same order."""
    from deepspeed.utils import safe_get_full_fp32_param
    out = dict(uncast_frozen_state)      # frozen parameters and the frozen towers' buffers (batch-norm statistics)
    for name, p in engine.module.clip.named_parameters():
        if name not in out and p.requires_grad:
            out[name] = safe_get_full_fp32_param(p)
    return {k: v for k, v in out.items() if v is not None}


TERMS = "negft_terms"        # the loss terms' state in DeepSpeed's client state


def save_checkpoint(engine, bundle, provenance: dict, run_dir: Path, name: str, state: dict, rank: int,
                    uncast_frozen_state: dict | None = None) -> Path:
    """checkpoints/NAME: DeepSpeed resume state + an open_clip local-dir, renamed into place whole.

    A checkpoint directory without a leading dot is complete: every rank writes into one hidden staging
    directory (``negft.io.staging_path``, the same name on every rank), renamed into place when whole, which
    ``resume=latest`` ignores if a run is killed while writing. Where it sits in the run (``state``: epoch,
    step, ranks) is recorded once, in the ``negft`` block of its ``open_clip_config.json``, beside
    ``provenance`` (recipe, data, base model, tower, run directory: what patching and release read).
    A failed write (a full disk, a read-only file system) raises ``WriteError`` naming the checkpoint; the staging
    directory goes (it may hold most of the free space) and every complete checkpoint stays.
    """
    final = run_dir / "checkpoints" / name
    staged = staging_path(final, shared=True)
    try:
        if rank == 0:
            remove(staged)
            staged.mkdir(parents=True)
        barrier()
        # the loss terms' own state (CE-CLIP's thresholds) beside DeepSpeed's
        engine.save_checkpoint(str(staged / "state"), tag="ds", client_state={TERMS: engine.module.term_state()})
        weights = fp32_weights(engine, uncast_frozen_state or {})
        if rank == 0:
            models.write_local_dir(engine.module.clip, staged, bundle.model_cfg, bundle.preprocess_cfg,
                                   extra={**state, **provenance}, state=weights)
            move_into_place(staged, final)
    except Exception as e:
        if not write_failure(e):
            raise
        remove(staged)
        why = e if isinstance(e, OSError) else f"{e} (the writer says no more: is the file system full or read-only?)"
        raise WriteError(f"cannot write checkpoint '{final}': {why}") from e
    barrier()
    return final


def checkpoint_state(path: Path) -> dict | None:
    """The ``negft`` block of a resumable checkpoint's open_clip config, else None."""
    if not (Path(path) / "state").is_dir():
        return None
    state = models.negft_info(path)
    return state if "steps_per_epoch" in state else None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint with the most optimizer steps (epoch ends win ties)."""
    found = [(st["step"], st["epoch_step"] == st["steps_per_epoch"], p)
             for p in (run_dir / "checkpoints").glob("[!.]*") if (st := checkpoint_state(p))]
    return max(found)[2] if found else None


def resumable(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a complete checkpoint that this launch's ranks can resume."""
    ckpt = latest_checkpoint(run_dir)
    ranks = dist.get_world_size() if dist.is_initialized() else 1
    return ckpt is not None and checkpoint_state(ckpt)["world_size"] == ranks


def prune_step_checkpoints(run_dir: Path, keep: Path | None, rank: int) -> None:
    """Mid-epoch checkpoints are stepping stones: keep only ``keep`` (or none after an epoch ends)."""
    if rank == 0:
        for p in (run_dir / "checkpoints").glob("step_*"):
            if p != keep:
                shutil.rmtree(p, ignore_errors=True)


def resume_point(cfg: Config, run_dir: Path, world_size: int) -> tuple[Path, dict] | None:
    """(checkpoint, its state) to resume from, or None to start fresh; refuses a changed rank count.
    ``resume=latest`` and ``resume=auto`` take the newest complete checkpoint in ``run_dir`` (that it holds this run,
    or none, ``outdir.check_run_dir`` made sure before anything ran)."""
    if cfg.resume is None:
        return None
    path = latest_checkpoint(run_dir) if cfg.resume in RESUME_WORDS else Path(cfg.resume)
    if path is None:
        print(f"[negft] resume={cfg.resume}: no complete checkpoint under {run_dir / 'checkpoints'}; starting fresh",
              flush=True)
        return None
    state = checkpoint_state(path)
    if state is None:
        raise ConfigError(f"resume: '{path}' is not a resumable negft checkpoint (it needs state/ and the "
                          f"negft block of {models.CONFIG_FILE})")
    if state["world_size"] != world_size:
        raise ConfigError(
            f"resume: '{path}' was written by {state['world_size']} rank(s), this run has {world_size}. "
            f"Relaunch with {state['world_size']} rank(s), or start a new run from its weights with "
            f"model.pretrained=local-dir:{path} (or model.world_pretrained=local-dir:{path} for data=world), "
            f"which keeps the weights but not the optimizer state or data position.")
    return path, state



# --------------------------------------------------------------------------- the loop
WARM_STEPS = 5      # an epoch's first steps, left out of the rate it reports (allocator, cuDNN and kernel warm-up)


def train(cfg: Config, base: str, where: Placement, eval_caches: dict | None = None) -> Path:
    """Train ``base`` (an open_clip tag, a checkpoint file, ``local-dir:DIR``, or "" for random weights) as
    ``cfg`` says into the run directory ``cfg.out``, evaluating before training and after epochs; returns it.
    ``where``: this process's rank, the number of ranks and the world, as ``setup`` made them.
    ``negft.train.world_base.base_weights`` resolves a recipe's base. On SIGTERM or SIGUSR1 it finishes the step, writes a
    checkpoint and raises ``Stopped``; their handlers are the caller's again when it returns.
    ``eval_caches``: a dict the evaluations' caches are kept in (``EvalRecorder.encoded``), for the caller to
    reuse (the patching sweep's test-split evaluations)."""
    with StopRequest() as stop:
        return _train(cfg, base, where, stop, eval_caches)


class Placement(NamedTuple):
    """Where a process stands: its rank, the number of ranks, and the embedded world's folder (None: real data)."""
    rank: int
    world_size: int
    world: Path | None


def setup(cfg: Config) -> Placement:
    """The process group and, with data=world, the world rank 0 builds and every rank then reads: made once per
    process, before the base model (whose training reads the same world) and the run."""
    rank, world_size, _ = init_distributed(cfg.train.dist_timeout_s)
    world = None
    if cfg.data == "world":
        world = ensure_world(cfg, rank)
        barrier()                   # every rank reads the world rank 0 built
    return Placement(rank, world_size, world)


def _train(cfg: Config, base: str, where: Placement, stop: StopRequest, eval_caches: dict | None = None) -> Path:
    rank, world_size, world = where
    run_dir = Path(cfg.out)
    torch.manual_seed(cfg.seed + rank)
    plan = plan_steps(cfg, world, world_size)

    # fp32 matmuls and convolutions in TF32 on Ampere and later, as open_clip's trainer does: about twice the
    # speed of strict fp32 on a GPU (bench/RESULTS.md, Speed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    bundle, base_state, uncast_frozen_state = build_model(cfg, base, rank)
    try:
        task = build_task(bundle.model, cfg.loss, rank, world_size, cfg.tower)
    except ValueError as e:         # a term that cannot act on this model (Term.attach)
        raise ConfigError(str(e)) from None
    if cfg.train.compile:
        task.compile()      # in place: parameter names, checkpoints and DeepSpeed's hooks stay as they are
    engine, adamw, scheduler = build_engine(cfg, task, plan, rank, world_size)
    device, dtype = engine.device, next(engine.module.parameters()).dtype
    if "v" not in cfg.tower and train_transform(cfg, bundle) is bundle.preprocess_val and device.type == "cpu":
        task.use_image_cache()      # a frozen tower's features of unaugmented images never change
    streams = open_streams(cfg, plan, bundle, device, dtype, rank, world_size)
    provenance = {"recipe": cfg.recipe, "data": cfg.data, "arch": model_arch(cfg), "base": base, "tower": cfg.tower,
                  "world_dir": str(world_dir(cfg)) if cfg.data == "world" else "",
                  "run_dir": str(run_dir.resolve())}

    resume = resume_point(cfg, run_dir, world_size)
    step, first_epoch, start_in_epoch = 0, 1, 0
    if resume is not None:
        _, client = engine.load_checkpoint(str(resume[0] / "state"), tag="ds")
        try:
            task.load_term_state((client or {}).get(TERMS, {}))
        except ValueError as e:
            raise ConfigError(f"resume: '{resume[0]}': {e}") from None
        resumed_state = resume[1]
        if resumed_state["steps_per_epoch"] != plan.steps_per_epoch:
            raise ConfigError(f"resume: '{resume[0]}' ran {resumed_state['steps_per_epoch']} steps per epoch, this run "
                              f"{plan.steps_per_epoch}: keep the batch sizes, train.steps_per_epoch and rank count")
        step = resumed_state["step"]
        first_epoch, start_in_epoch = resumed_state["epoch"], resumed_state["epoch_step"]
        if start_in_epoch == plan.steps_per_epoch:
            first_epoch, start_in_epoch = first_epoch + 1, 0

    writer, recorder = None, None
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(run_dir / "config.yaml", to_yaml(cfg))
        writer = RunLog(cfg, run_dir, resumed=resume is not None)
        print(f"[negft] {cfg.recipe}: {world_size} rank(s) on {device}, {plan.steps_per_epoch} steps/epoch, "
              f"{plan.total_steps} steps, base={base or 'random init'}, act={models.activation(bundle.model)}"
              + (f"; resumed from {resume[0]} at step {step}" if resume else ""), flush=True)
        if not cfg.train.synthetic:     # random data: nothing to evaluate
            datasets = datasets_for(world / cfg.eval.split if world is not None else None)
            recorder = EvalRecorder(cfg, run_dir, bundle, datasets, device, writer, run_notes(cfg, run_dir, base),
                                    base_state, eval_caches)

    def evaluate(epoch: int, at_step: int, data: dict | None = None) -> None:
        if recorder is not None:
            recorder.record(engine.module.clip, epoch, at_step, data)
        barrier()

    evaluated = [{entry["epoch"] for entry in Ledger(run_dir).read()} if resume and rank == 0 else set()]
    dist.broadcast_object_list(evaluated, src=0)     # every rank must agree on which evaluations to run
    evaluated = evaluated[0]
    if 0 not in evaluated:
        evaluate(0, 0)
    if resume and start_in_epoch == 0 and first_epoch - 1 not in evaluated and first_epoch > 1:
        evaluate(first_epoch - 1, step)      # killed between an epoch's checkpoint and its evaluation

    run = Run(cfg, rank, world_size, run_dir, plan, engine, adamw, scheduler, streams, writer, bundle,
              provenance, uncast_frozen_state, NonFiniteSteps(cfg, engine, adamw, rank, writer), stop)
    try:
        run_epochs(run, first_epoch, start_in_epoch, step, evaluate)
    except BaseException as e:
        if writer:      # W&B shows a stopped run as stopped and a failed one as failed, not as finished
            writer.close(exit_code=e.exit_code if isinstance(e, Stopped) else 1)
        raise
    if writer:
        writer.close()
    barrier()
    return run_dir


def run_epochs(run: "Run", first_epoch: int, start_in_epoch: int, step: int, evaluate) -> None:
    """Each epoch's steps, checkpoint and (where due) evaluation. After SIGTERM or SIGUSR1 (``run.stop``):
    mid-epoch, a step checkpoint; at an epoch's end, its checkpoint without its evaluation (a resumed run evaluates
    it); then ``Stopped``."""
    cfg, plan, device = run.cfg, run.plan, run.engine.device
    for epoch in range(first_epoch, cfg.epochs + 1):
        if step >= plan.total_steps:
            break
        step, done_in_epoch = train_epoch(run, epoch, step, start_in_epoch if epoch == first_epoch else 0)
        if stops_mid_epoch(run, done_in_epoch, step):
            raise Stopped(step_checkpoint(run, epoch, done_in_epoch, step), step, run.stop.signum)
        ckpt = save_checkpoint(run.engine, run.bundle, run.provenance, run.run_dir, f"epoch_{epoch}",
                               position(run, epoch, done_in_epoch, step), run.rank, run.uncast_frozen_state)
        prune_step_checkpoints(run.run_dir, None, run.rank)
        stopping = run.stopping or run.stop.agreed(device)
        if not stopping and (epoch % cfg.eval.every == 0 or step >= plan.total_steps or epoch == cfg.epochs):
            evaluate(epoch, step, run.data_counts.get(epoch))
        if not cfg.train.synthetic:     # past train.max_skipped: stop, the epoch's checkpoint and evaluation kept
            if run.writer:
                run.writer.flush()
            check_skipped(run.tallies, cfg.train.max_skipped, epoch)
        if stopping or run.stop.agreed(device):     # a stop signal before or during the evaluation
            raise Stopped(ckpt, step, run.stop.signum)


@dataclass
class Run:
    """What a run's epochs share."""
    cfg: Config
    rank: int
    world_size: int
    run_dir: Path
    plan: StepPlan
    engine: object
    adamw: object              # the SkipNonFiniteAdamW the engine steps
    scheduler: object
    streams: dict
    writer: RunLog | None      # TensorBoard (and W&B) on rank 0, else None
    bundle: models.Bundle
    provenance: dict
    uncast_frozen_state: dict
    nonfinite: "NonFiniteSteps"
    stop: StopRequest
    stopping: bool = False                             # every rank has agreed to stop after this step (a signal)
    data_counts: dict = field(default_factory=dict)    # epoch -> stream -> what it read and left out (all ranks)
    tallies: dict = field(default_factory=dict)        # the last epoch's per-stream tallies (all ranks)


def position(run: Run, epoch: int, epoch_step: int, step: int) -> dict:
    """Where a checkpoint sits in the run (``save_checkpoint``'s ``state``)."""
    return {"epoch": epoch, "epoch_step": epoch_step, "step": step, "steps_per_epoch": run.plan.steps_per_epoch,
            "world_size": run.world_size}


def train_epoch(run: Run, epoch: int, step: int, done_in_epoch: int) -> tuple[int, int]:
    """The optimizer steps of ``epoch`` from its step ``done_in_epoch`` (a resumed run's), with logging and
    mid-epoch checkpoints; returns (steps in all, steps done in the epoch)."""
    cfg, plan, engine, rank = run.cfg, run.plan, run.engine, run.rank
    device, dtype = engine.device, next(engine.module.parameters()).dtype
    task_of = {n: s.task for n, s in cfg.streams.items()}
    iters = {name: s.epoch(epoch, plan.micro_steps, start=done_in_epoch * cfg.train.grad_accum)
             for name, s in run.streams.items()}
    bar = tqdm(total=min(plan.steps_per_epoch, plan.total_steps - step + done_in_epoch), initial=done_in_epoch,
               desc=f"epoch {epoch}", disable=rank != 0, dynamic_ncols=True)
    t_last, samples = time.time(), 0
    rate = EpochRate(done_in_epoch, device)
    try:        # a failing step or checkpoint leaves the bar's line ended, for the message that follows
        for _ in range(done_in_epoch * cfg.train.grad_accum, plan.micro_steps):
            batches = {name: batch_to(next(it), device, dtype) for name, it in iters.items()}
            loss, logs = engine(by_task(batches, task_of))
            if run.adamw.checks:
                run.adamw.note_loss(loss)
            engine.backward(loss)
            engine.step()
            n = sum(b["images"].shape[0] for b in batches.values()) * run.world_size
            samples += n
            rate.samples += n
            if not engine.is_gradient_accumulation_boundary():
                continue
            step += 1
            done_in_epoch += 1
            bar.update(1)
            run.nonfinite.after_step()
            rate.step(done_in_epoch)
            every = cfg.train.checkpoint_every
            checkpoint_due = bool(every and step % every == 0 and done_in_epoch < plan.steps_per_epoch)
            # where the host reads the device anyway (every step on CPU): skipped steps, and a stop signal on several
            # ranks
            synced = (reads_freely(device) or step % cfg.train.log_every == 0 or step == plan.total_steps
                      or checkpoint_due)
            run.stopping = run.stop.agreed(device) if synced or run.world_size == 1 else False
            if synced or run.stopping:
                run.nonfinite.check(step)       # past train.max_bad_steps: stop before any checkpoint of this state
            if step % cfg.train.log_every == 0 or step == plan.total_steps:
                per_s = samples / (time.time() - t_last)
                t_last, samples = time.time(), 0
                bar.set_postfix(loss=f"{loss.item():.3f}", samples_s=f"{per_s:.0f}")
                if run.writer:
                    log_step(run, loss, logs, per_s, step)
            if step >= plan.total_steps or run.stopping:
                break
            if checkpoint_due:
                step_checkpoint(run, epoch, done_in_epoch, step)
    finally:
        bar.close()
    if not stops_mid_epoch(run, done_in_epoch, step):
        end_epoch(run, epoch, step, rate)
    return step, done_in_epoch


def reads_freely(device) -> bool:
    """Whether the host reads the device's values at no cost (a CPU: the host is the device), so the loop reads
    them every step; elsewhere only at log steps and before checkpoints (tests/test_syncs.py counts the rest)."""
    return device.type == "cpu"


def stops_mid_epoch(run: Run, done_in_epoch: int, step: int) -> bool:
    """A stop signal stopped the run inside an epoch with steps left: a step checkpoint, and no end of the epoch."""
    return run.stopping and done_in_epoch < run.plan.steps_per_epoch and step < run.plan.total_steps


def step_checkpoint(run: Run, epoch: int, done_in_epoch: int, step: int) -> Path:
    """checkpoints/step_S mid-epoch (``train.checkpoint_every``, a stop signal); the one before it goes."""
    kept = save_checkpoint(run.engine, run.bundle, run.provenance, run.run_dir, f"step_{step}",
                           position(run, epoch, done_in_epoch, step), run.rank, run.uncast_frozen_state)
    prune_step_checkpoints(run.run_dir, kept, run.rank)
    return kept


def log_step(run: Run, loss: torch.Tensor, logs: dict, samples_per_s: float, step: int) -> None:
    run.writer.add_scalar("train/loss", loss.item(), step)
    for k, v in logs.items():
        run.writer.add_scalar(f"train/{k}", float(v), step)
    run.writer.add_scalar("train/lr", run.scheduler.get_last_lr()[0], step)
    run.writer.add_scalar("train/samples_per_s", samples_per_s, step)


def end_epoch(run: Run, epoch: int, step: int, rate: "EpochRate") -> None:
    """The epoch's skipped steps, its rate after the warm-up steps, and each stream's skipped samples."""
    run.nonfinite.check(step)
    sync(run.engine.device)
    if rate.start is not None and rate.steps and run.rank == 0:
        seconds = time.perf_counter() - rate.start
        per_s, ms = rate.samples / seconds, 1000 * seconds / rate.steps
        device = run.engine.device
        peak = (f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2 ** 30:.2f} GiB"
                if device.type == "cuda" else "")
        print(f"[negft] epoch {epoch}: {rate.steps} steps after the first {WARM_STEPS}: {per_s:.1f} "
              f"samples/s, {ms:.1f} ms/step{peak}", flush=True)
        run.writer.add_scalar("train/epoch_samples_per_s", per_s, step)
    run.tallies = {name: gather(s.tally) for name, s in run.streams.items()}     # all ranks, on every rank
    run.data_counts[epoch] = {name: t.as_dict() for name, t in run.tallies.items()}
    if run.rank == 0:
        named = set()       # streams reading the same shards: each bad shard named once
        for name, t in run.tallies.items():
            t.report(f"epoch {epoch}: stream '{name}'", run.writer, f"data/{name}", step, named)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class EpochRate:
    """Samples and steps of an epoch after its first ``WARM_STEPS`` steps (counted from ``first_step``, where a
    resumed epoch starts), and when they began."""

    def __init__(self, first_step: int, device):
        self.first_step, self.device = first_step, device
        self.start, self.steps, self.samples = None, 0, 0

    def step(self, done_in_epoch: int) -> None:
        """An optimizer step ended: start the clock after the warm-up steps, else count it."""
        if done_in_epoch - self.first_step == WARM_STEPS:
            sync(self.device)
            self.start, self.steps, self.samples = time.perf_counter(), 0, 0
        else:
            self.steps += 1


class BadSteps(RuntimeError):
    """``train.max_bad_steps`` optimizer steps in a row were skipped as non-finite: the run stops, writing nothing."""


class NonFiniteSteps:
    """Optimizer steps skipped for a non-finite loss or gradient: ``SkipNonFiniteAdamW`` skips them (ZeRO-0, fp32
    weights), elsewhere DeepSpeed's optimizer does. Read from the device only at log steps and before
    checkpoints on a GPU (every step on CPU, where reading costs nothing). fp16's loss-scale search skips steps by
    design: counted, never stopped."""

    def __init__(self, cfg: Config, engine, adamw, rank: int, writer):
        self.cfg, self.engine, self.adamw, self.rank, self.writer = cfg, engine, adamw, rank, writer
        self.seen = self.ds_seen = self.ds_run = 0      # reported so far; DeepSpeed's count and run in a row

    def after_step(self) -> None:
        if not self.adamw.checks:
            self.ds_run = self.ds_run + 1 if self.engine.skipped_steps > self.ds_seen else 0
            self.ds_seen = self.engine.skipped_steps

    def check(self, at: int) -> None:
        """Report new skips; stop after ``train.max_bad_steps`` in a row."""
        adamw, cfg = self.adamw, self.cfg
        if adamw.checks:
            total, run = (0, 0) if adamw.skipped is None else (int(adamw.skipped), int(adamw.bad_run))
        else:
            total, run = self.engine.skipped_steps, self.ds_run
        if total > self.seen and self.rank == 0:
            print(f"[negft] step {at}: {total - self.seen} step(s) skipped for a non-finite loss or gradient "
                  f"({run} in a row, {total} in all)", flush=True)
            self.writer.add_scalar("train/skipped_steps", total, at)
        self.seen = total
        if run >= cfg.train.max_bad_steps and cfg.train.precision != "fp16":
            raise BadSteps(f"{run} optimizer steps in a row had a non-finite loss or gradient "
                           f"(train.max_bad_steps={cfg.train.max_bad_steps}); stopped at step {at} without "
                           "writing a checkpoint. Lower optim.lr, raise optim.warmup_steps, or check the data")
