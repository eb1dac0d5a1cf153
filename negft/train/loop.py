"""The training loop: one DeepSpeed engine, the same code for one process and for many ranks.

Read top to bottom: set up ranks → data → model → engine → evaluate epoch 0 → for each epoch:
steps, checkpoint, evaluate, ledger, report.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import math
import os
import shutil
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from negft import models
from negft.config import Config, ConfigError, to_yaml, world_dir
from negft.data import manifests
from negft.data.check import check_shards
from negft.data.pipeline import EpochBatches, Stream, StreamSpec, SyntheticBatches, check_skipped, gather, shard_note
from negft.evaluate import datasets_for, evaluate, write_figures
from negft.probes.base import PixelCache
from negft.probes.stats import one_blas_thread, paired_p_values
from negft.train.ledger import Ledger, atomic_write, load_values, save_values, write_report
from negft.train.task import DualEncoderTask, build_loss

# --------------------------------------------------------------------------- ranks
def init_distributed() -> tuple[int, int, int]:
    """(rank, world_size, local_rank), with a process group of one when not launched by DeepSpeed."""
    import deepspeed
    if not torch.cuda.is_available():
        # DeepSpeed's CPU backend would JIT-compile a shared-memory all-reduce used only for
        # inference (about a minute on 2 cores); training all-reduces go through gloo anyway.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def barrier():
    if dist.is_initialized():
        dist.barrier()


# --------------------------------------------------------------------------- data
def ensure_world(cfg: Config, rank: int) -> Path:
    """Build the embedded world once (rank 0); every rank then reads it."""
    from negft.data.world import build_world
    root = world_dir(cfg)
    if rank == 0:
        build_world(root, seed=cfg.world.seed, size=cfg.world.size)
    barrier()
    return root


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


# --------------------------------------------------------------------------- model
def train_transform(cfg: Config, bundle: models.Bundle):
    """open_clip's augmenting train transform, or (world default) its deterministic eval transform."""
    augment = cfg.model.train_augment if cfg.model.train_augment is not None else cfg.data != "world"
    return bundle.preprocess_train if augment else bundle.preprocess_val


BASE_KEY_FIELDS = ("epochs", "max_steps", "seed", "tower", "data", "model", "streams", "loss", "optim", "train")


def shards_digest(world: Path, splits) -> str:
    """sha256 over a world's training shards in ``splits``: a generator change that leaves them
    byte-identical (new probe files, say) keeps the base model trained on them."""
    h = hashlib.sha256()
    for split in sorted(splits):
        for shard in sorted((world / split).glob("*.tar")):
            h.update(shard.name.encode())
            with open(shard, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
    return h.hexdigest()


def base_model_source(cfg: Config, rank: int) -> str:
    """``model.pretrained`` for real data; for the world, the cached result of its pretrain recipe."""
    if cfg.data != "world":
        return cfg.model.pretrained
    if not cfg.model.world_pretrained:
        return ""
    if cfg.model.world_pretrained.startswith(models.LOCAL_DIR) or Path(cfg.model.world_pretrained).exists():
        return cfg.model.world_pretrained      # a local-dir or a checkpoint file
    from negft.config import load_config
    pre = load_config([f"recipe={cfg.model.world_pretrained}", "data=world", f"world.seed={cfg.world.seed}",
                       f"world.size={cfg.world.size}", f"world.cache={cfg.world.cache}"])
    # keyed by what decides the weights: the recipe's training settings (not its evaluation or patching
    # settings) and the bytes of the shards it trains on
    decides = {k: dataclasses.asdict(pre)[k] for k in BASE_KEY_FIELDS}
    decides["shards"] = shards_digest(world_dir(cfg), {s.world_split for s in pre.streams.values()})
    key = hashlib.sha256(json.dumps(decides, sort_keys=True).encode()).hexdigest()[:12]
    base = Path(cfg.world.cache).expanduser() / "base" / f"{pre.recipe}-s{cfg.world.seed}-{cfg.world.size}-{key}"
    model_dir = base / "model"
    if not (model_dir / models.WEIGHTS_FILE).exists():
        if rank == 0:
            print(f"[negft] base model not cached: training recipe={pre.recipe} into {base}", flush=True)
        pre.out = str(base / "run")
        run_dir = train(pre)
        if rank == 0:
            last = sorted((run_dir / "checkpoints").glob("epoch_*"), key=lambda p: int(p.name.split("_")[1]))[-1]
            tmp = base / ".model.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(last, tmp, ignore=shutil.ignore_patterns("state"))
            models.replace_dir(tmp, model_dir)
        barrier()
    return models.LOCAL_DIR + str(model_dir)


ALIGN = 8      # elements: 16 bytes of bf16, the alignment cuBLAS's fast kernels want of every weight and bias


def param_groups(module: torch.nn.Module, weight_decay: float) -> list[dict]:
    """open_clip's rule: no weight decay on gains, biases, embeddings-like 1-d params, logit_scale.

    Parameters whose size is not a multiple of ``ALIGN`` elements (the 1-element ``logit_scale``) come in groups
    of their own, last: DeepSpeed's ZeRO and bf16 optimizers flatten each group into one buffer, so such a
    tensor ahead of others would start every later one off a 16-byte boundary, and cuBLAS then takes a slow
    path for each bias GEMM (ViT-B-32 on an H100: forward 52 ms misaligned, 27 ms aligned). AdamW's arithmetic
    is per parameter, so the grouping changes no result; it changes the optimizer state's layout, so a
    checkpoint written before the regrouping does not resume."""
    groups = {(False, True): [], (False, False): [], (True, True): [], (True, False): []}   # (odd size, decay)
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        exclude = p.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name
        groups[(p.numel() % ALIGN != 0, not exclude)].append(p)
    return [{"params": ps, "weight_decay": weight_decay if decay else 0.0}
            for (odd, decay), ps in groups.items() if ps]


class GuardedAdamW(torch.optim.AdamW):
    """AdamW that skips a step whose loss or gradients are not finite, and clips the gradients' global norm.

    Used where DeepSpeed hands the whole gradients to the client optimizer (ZeRO-0 with fp32 weights: fp32, and
    bf16 under ``train.autocast``), where DeepSpeed's engine neither clips in one pass nor checks for overflow.
    A skipped step changes no weight, moment or step count (on a GPU the fused kernel skips it on the device,
    without waiting for the host); the engine's step and the learning-rate schedule still advance, so they
    follow the data. ``skipped`` and ``bad_run`` (steps skipped in all, and in a row) are device counters.

    The clipping is DeepSpeed's arithmetic (per-tensor norms, their squares summed, ``max / (norm + 1e-6)``
    capped at 1), in a few multi-tensor kernels instead of two per tensor: the same weights as DeepSpeed's
    clipping on CPU, bit for bit. The gradients are all-reduced before ``step`` (in DeepSpeed's backward), so
    every rank computes the same norm and takes the same decision.
    """

    def __init__(self, params, clip: float = 0.0, order: list | None = None, **kwargs):
        super().__init__(params, **kwargs)
        self.clip = clip
        # the parameters in the module's order, as DeepSpeed sums their norms (a float sum depends on its order)
        self.order = order if order is not None else [p for g in self.param_groups for p in g["params"]]
        self.guard = True           # False when a DeepSpeed optimizer wraps this one (it checks and clips)
        self.skipped = self.bad_run = self._loss_bad = None

    def note_loss(self, loss: torch.Tensor) -> None:
        """Record a micro-batch's loss: a non-finite one makes the step it belongs to skip."""
        bad = ~torch.isfinite(loss.detach())
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad

    @torch.no_grad()
    def step(self, closure=None):
        if not self.guard:
            self._loss_bad = None
            return super().step(closure)
        grads = [p.grad for p in self.order if p.grad is not None]
        device = grads[0].device
        norm = torch.stack(torch._foreach_norm(grads, 2.0)).pow(2.0).sum().float().pow(0.5)
        bad = ~torch.isfinite(norm)
        if self._loss_bad is not None:
            loss_bad = self._loss_bad.to(device)
            if dist.is_initialized() and dist.get_world_size() > 1:    # a loss is per rank; the decision global
                loss_bad = loss_bad.to(torch.float32)
                dist.all_reduce(loss_bad, op=dist.ReduceOp.MAX)
                loss_bad = loss_bad > 0
            bad = bad | loss_bad
        self._loss_bad = None
        if self.clip > 0:
            coef = torch.clamp(torch.full_like(norm, self.clip) / (norm + 1e-6), max=1.0)
            torch._foreach_mul_(grads, coef)
        if self.skipped is None:
            self.skipped = torch.zeros((), dtype=torch.int64, device=device)
            self.bad_run = torch.zeros((), dtype=torch.int64, device=device)
        self.skipped += bad
        self.bad_run.mul_(bad).add_(bad)
        self.last_norm = norm
        if self.defaults.get("fused"):
            self.found_inf = bad.to(torch.float32)       # 0-d, read by the fused kernel on the device
            return super().step(closure)
        if not bool(bad):
            return super().step(closure)
        return None


def make_optimizer(module: torch.nn.Module, cfg: Config, clip: float, device_type: str) -> GuardedAdamW:
    """AdamW over ``param_groups``: fused on a GPU (one kernel for every parameter), PyTorch's default on CPU."""
    return GuardedAdamW(param_groups(module, cfg.optim.weight_decay), clip=clip,
                        order=[p for p in module.parameters() if p.requires_grad], lr=cfg.optim.lr,
                        betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps,
                        **({"fused": True} if device_type == "cuda" else {}))


def lr_lambda(warmup: int, total: int, min_ratio: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def zero_stage(cfg: Config, world_size: int) -> int:
    """The ZeRO stage the engine runs: ``train.zero_stage``, except 0 for stages 1 and 2 on one rank.

    ZeRO-1/2 partition optimizer states (and gradients) over the ranks; on one rank there is nothing to
    partition, and their per-parameter gradient hooks cost time (ViT-B-32 on an H100: backward 69-73 ms under
    ZeRO-1 against 47-50 ms under ZeRO-0; bench/RESULTS.md)."""
    stage = cfg.train.zero_stage
    return 0 if world_size == 1 and stage in (1, 2) else stage


def casts_weights(cfg: Config) -> bool:
    """Whether DeepSpeed casts the weights to 16 bits (fp16; bf16 without ``train.autocast``)."""
    return cfg.train.precision == "fp16" or (cfg.train.precision == "bf16" and not cfg.train.autocast)


def own_clipping(cfg: Config, world_size: int) -> bool:
    """Whether ``GuardedAdamW`` clips and checks the step: ZeRO-0 with fp32 weights, where DeepSpeed gives the
    client optimizer the whole gradients (its own clipping there costs two kernels per tensor)."""
    return zero_stage(cfg, world_size) == 0 and not casts_weights(cfg)


def deepspeed_config(cfg: Config, micro_batch: int, world_size: int = 1) -> dict:
    """bf16 runs as torch.autocast over fp32 weights (``train.autocast``, DeepSpeed's ``torch_autocast``; its
    gradients are reduced in fp32), or with the weights cast to bf16 by DeepSpeed's bf16 optimizer. Where
    ``GuardedAdamW`` clips, DeepSpeed's clipping is off; elsewhere DeepSpeed clips and skips non-finite steps."""
    autocast = cfg.train.precision == "bf16" and cfg.train.autocast
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": cfg.train.grad_accum,
        "gradient_clipping": 0.0 if own_clipping(cfg, world_size) else cfg.optim.grad_clip,
        "zero_optimization": {"stage": zero_stage(cfg, world_size)},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": cfg.train.precision == "bf16" and not autocast},
        "fp16": {"enabled": cfg.train.precision == "fp16", "loss_scale": 0},
        **({"torch_autocast": {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}}
           if autocast else {}),
        # floating buffers (batch-norm statistics) in the parameters' dtype, as module.bfloat16() did: DeepSpeed
        # 0.19.8 casts parameters only, and a ResNet tower's batch norm then fails on bf16 weights
        # with fp32 statistics ("expected scalar type BFloat16 but found Float")
        **({"data_types": {"buffer_dtype": cfg.train.precision}} if casts_weights(cfg) else {}),
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }


# --------------------------------------------------------------------------- checkpoints
def fp32_weights(engine, frozen: dict) -> dict:
    """Full-precision weights to save: trained parameters from DeepSpeed's fp32 master copies (bf16 /
    fp16 runs), frozen ones from the snapshot taken before DeepSpeed cast the model, so a frozen tower
    is saved bit-identical. A collective: every rank calls it, in the same order."""
    from deepspeed.utils import safe_get_full_fp32_param
    out = dict(frozen)      # frozen parameters and the frozen towers' buffers (batch-norm statistics)
    for name, p in engine.module.clip.named_parameters():
        if name not in out and p.requires_grad:
            out[name] = safe_get_full_fp32_param(p)
    return {k: v for k, v in out.items() if v is not None}


def save_checkpoint(engine, bundle, provenance: dict, run_dir: Path, name: str, state: dict, rank: int,
                    frozen: dict | None = None) -> Path:
    """checkpoints/NAME: DeepSpeed resume state + an open_clip local-dir, renamed into place whole.

    A checkpoint directory without a leading dot is complete: a run killed while writing leaves only
    ``.NAME.tmp`` behind, which ``resume=latest`` ignores. Where it sits in the run (``state``: epoch,
    step, ranks) is recorded once, in the ``negft`` block of its ``open_clip_config.json``, beside
    ``provenance`` (recipe, data, base model, tower: what patching and release read).
    """
    final = run_dir / "checkpoints" / name
    tmp = run_dir / "checkpoints" / f".{name}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    engine.save_checkpoint(str(tmp / "state"), tag="ds")
    weights = fp32_weights(engine, frozen or {})
    if rank == 0:
        models.write_local_dir(engine.module.clip, tmp, bundle.model_cfg, bundle.preprocess_cfg,
                               extra={**state, **provenance},
                               state=weights)
        models.replace_dir(tmp, final)
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


def prune_step_checkpoints(run_dir: Path, keep: Path | None, rank: int) -> None:
    """Mid-epoch checkpoints are stepping stones: keep only ``keep`` (or none after an epoch ends)."""
    if rank == 0:
        for p in (run_dir / "checkpoints").glob("step_*"):
            if p != keep:
                shutil.rmtree(p, ignore_errors=True)


def resume_point(cfg: Config, run_dir: Path, world_size: int) -> tuple[Path, dict] | None:
    """(checkpoint, its state) to resume from, or None to start fresh; refuses a changed rank count."""
    if cfg.resume is None:
        return None
    path = latest_checkpoint(run_dir) if cfg.resume == "latest" else Path(cfg.resume)
    if path is None:
        print(f"[negft] resume=latest: no complete checkpoint under {run_dir / 'checkpoints'}; starting fresh",
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


def batch_to(batch: dict, device, dtype) -> dict:
    """A batch on ``device``: copied as it is (the loader pins it on a GPU machine) without blocking the host,
    then cast there. Casting on the host first cost 37.5 ms a step for a ViT-B-32 batch of 256 on an H100 (bf16
    into unpinned memory, then copied). A batch already there (``train.synthetic``) is not copied."""
    return {k: (v.to(device, non_blocking=True).to(dtype) if v.is_floating_point() else v.to(device, non_blocking=True))
            for k, v in batch.items()}


def by_task(batches: dict[str, dict], tasks: dict[str, str]) -> dict[str, dict]:
    """The step's batches keyed by task; streams sharing a task (several datasets) are concatenated."""
    grouped: dict[str, list[dict]] = {}
    for name, batch in batches.items():
        grouped.setdefault(tasks[name], []).append(batch)
    return {task: parts[0] if len(parts) == 1 else {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            for task, parts in grouped.items()}


def _log_eval(writer, result, step: int, prefix: str = "eval"):
    for k, v in result.metrics.items():
        writer.add_scalar(f"{prefix}/{k}", v, step)


def patched_copy(clip: torch.nn.Module, base_state: dict, alpha: float, tower: str) -> torch.nn.Module:
    """A copy of ``clip`` patched toward the base: θ = (1 − α)·θ_base + α·θ_now (α the fine-tuned weight)."""
    import copy
    from negft.patching import interpolate
    now_state = {k: v.detach().to("cpu", torch.float32) if v.is_floating_point() else v.detach().cpu()
                 for k, v in clip.state_dict().items()}
    patched = copy.deepcopy(clip)
    patched.load_state_dict(interpolate(base_state, now_state, alpha, tower))
    return patched


def train(cfg: Config) -> Path:
    import deepspeed
    from torch.utils.tensorboard import SummaryWriter

    rank, world_size, local_rank = init_distributed()
    run_dir = Path(cfg.out)
    torch.manual_seed(cfg.seed + rank)
    world = ensure_world(cfg, rank) if cfg.data == "world" else None

    # data
    if not cfg.streams:
        raise ConfigError(f"recipe '{cfg.recipe}' defines no streams")
    synthetic = cfg.train.synthetic
    sources = {name: ([], None) if synthetic else stream_source(cfg, name, world) for name in cfg.streams}
    for name, (_, n) in sources.items():
        per_step = cfg.streams[name].batch_size * world_size
        if n is not None and n < per_step:
            raise ConfigError(f"stream '{name}' has {n} samples, fewer than one step's batch ({per_step} = "
                              f"streams.{name}.batch_size × {world_size} rank(s)): lower streams.{name}.batch_size")
    first = next(iter(cfg.streams))
    steps_per_epoch = cfg.train.steps_per_epoch
    if steps_per_epoch is None and synthetic:
        steps_per_epoch = cfg.max_steps or 100
    if steps_per_epoch is None:
        n = sources[first][1]
        if n is None:
            raise ConfigError(f"stream '{first}' has no sample count: set train.steps_per_epoch")
        steps_per_epoch = max(1, n // (cfg.streams[first].batch_size * world_size * cfg.train.grad_accum))
    micro_steps = steps_per_epoch * cfg.train.grad_accum
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)

    # fp32 matmuls and convolutions in TF32 on Ampere and later, as open_clip's trainer does: on an H100 a
    # ViT-B-32 NegFull step took 355 ms in strict fp32 and 167 ms with TF32 (README: Towers, precision, scale)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    # model
    pretrained = base_model_source(cfg, rank)
    arch = cfg.model.world_arch if cfg.data == "world" else cfg.model.arch
    bundle = models.build(arch, pretrained, quick_gelu=cfg.model.quick_gelu)
    models.set_trainable(bundle.model, cfg.tower, cfg.model.train_logit_scale)
    models.train_mode(bundle.model, cfg.tower)
    # the base weights, for evaluating the patched model after every epoch (patch.alpha)
    patch_base = None if cfg.patch.alpha is None or rank != 0 else {
        k: v.detach().to("cpu", torch.float32 if v.is_floating_point() else v.dtype, copy=True)
        for k, v in bundle.model.state_dict().items()}
    if cfg.train.grad_checkpointing:
        bundle.model.set_grad_checkpointing(True)
    # DeepSpeed casts the whole model for fp16 (and bf16 without train.autocast); keep the frozen weights' exact values for saving, and
    # the saved buffers (batch-norm statistics) of a tower that does not train
    saved = bundle.model.state_dict().keys()
    frozen = {} if not casts_weights(cfg) else {
        **{n: p.detach().to("cpu", copy=True) for n, p in bundle.model.named_parameters() if not p.requires_grad},
        **{n: b.detach().to("cpu", copy=True) for n, b in bundle.model.named_buffers()
           if n in saved and b.is_floating_point() and models.tower_of(n) not in cfg.tower}}
    task = DualEncoderTask(bundle.model, build_loss(cfg.loss, {s.task for s in cfg.streams.values()},
                                                    rank, world_size))
    if cfg.train.compile:
        task.compile()      # in place: parameter names, checkpoints and DeepSpeed's hooks stay as they are
    guarded = make_optimizer(task, cfg, cfg.optim.grad_clip if own_clipping(cfg, world_size) else 0.0,
                             "cuda" if torch.cuda.is_available() else "cpu")
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        guarded, lr_lambda(cfg.optim.warmup_steps, max(1, total_steps), cfg.optim.min_lr_ratio))
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=task, optimizer=guarded, lr_scheduler=scheduler,
        config=deepspeed_config(cfg, cfg.streams[first].batch_size, world_size))
    guarded.guard = optimizer is guarded      # else DeepSpeed's ZeRO / bf16 / fp16 optimizer checks the step
    if rank == 0 and zero_stage(cfg, world_size) != cfg.train.zero_stage:
        print(f"[negft] train.zero_stage={cfg.train.zero_stage} on one rank runs as ZeRO-0: there is nothing to "
              "partition, and ZeRO-0 is faster", flush=True)
    device, dtype = engine.device, next(engine.module.parameters()).dtype
    if rank == 0 and device.type == "cpu" and cfg.train.precision != "fp32":
        print(f"[negft] note: train.precision={cfg.train.precision} on CPU is emulated and slow; "
              "train.precision=fp32 is faster here", flush=True)

    provenance = {"recipe": cfg.recipe, "data": cfg.data, "arch": arch, "base": pretrained, "tower": cfg.tower,
                  "world_dir": str(world_dir(cfg)) if cfg.data == "world" else ""}
    preprocess = train_transform(cfg, bundle)
    specs = {name: StreamSpec(sources[name][0], s.task, s.field, s.batch_size, cfg.train.resampled)
             for name, s in cfg.streams.items()}
    if synthetic:
        size = getattr(bundle.model.visual, "image_size", 224)
        size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        streams = {name: SyntheticBatches(spec, size, bundle.tokenizer, device, dtype, cfg.seed, rank)
                   for name, spec in specs.items()}
    else:
        streams = {name: EpochBatches(Stream(spec, preprocess, bundle.tokenizer, cfg.seed), cfg.train.workers)
                   for name, spec in specs.items()}
        for name, spec in specs.items():
            note = shard_note(spec.urls, world_size * max(1, cfg.train.workers), spec.resampled)
            if note and rank == 0:
                print(f"[negft] note: stream '{name}': {note}", flush=True)
    eval_sets = None if synthetic else datasets_for(world / cfg.eval.split if world is not None else None)

    # the tower that does not train is encoded once per run, not once per evaluation; texts are tokenised
    # and images decoded once (within a memory budget)
    frozen_cache = {"image_cache": {} if cfg.tower == "t" else None, "text_cache": {} if cfg.tower == "v" else None,
                    "token_cache": {}, "pixel_cache": PixelCache()}
    report_notes = [f"Run directory `{run_dir}`; data={cfg.data}; tower={cfg.tower}; "
                    f"base={pretrained or 'random init'}."]

    baseline = {}           # epoch 0's per-example values, read back from examples/ by a resumed run
    data_counts = {}        # epoch -> stream -> Tally.as_dict(), for the epoch's ledger line

    def run_eval(epoch: int, step: int):
        if synthetic:       # random data: nothing to evaluate
            return
        if rank == 0:
            t0 = time.time()
            eval_args = (bundle.preprocess_val, bundle.tokenizer, eval_sets, cfg.eval.suite, cfg.eval.batch_size,
                         cfg.eval.bootstrap, device)
            result = evaluate(engine.module.clip, *eval_args, **frozen_cache)
            save_values(run_dir, epoch, result.values)
            write_figures(result, run_dir / "figures" / f"epoch_{epoch}")
            extra = {}
            if not baseline:
                baseline.update(result.values if epoch == 0 else load_values(run_dir, 0))
            if epoch > 0:       # report.md stars the last line's changes that a paired test supports
                with one_blas_thread():
                    extra["paired_p"] = paired_p_values(baseline, result.values, cfg.eval.bootstrap)
            extra["eval_seconds"] = round(time.time() - t0, 2)      # probes, values, figures and paired tests
            if epoch in data_counts:        # what each stream read and left out in this epoch (all ranks)
                extra["data"] = data_counts[epoch]
            if patch_base is not None and epoch > 0:
                patched = evaluate(patched_copy(engine.module.clip, patch_base, cfg.patch.alpha, cfg.patch.tower),
                                   *eval_args, token_cache=frozen_cache["token_cache"],
                                   pixel_cache=frozen_cache["pixel_cache"])
                extra["patched"] = {"alpha": cfg.patch.alpha, "tower": cfg.patch.tower,
                                    "metrics": patched.metrics, "ci95": patched.ci95}
                _log_eval(writer, patched, step, prefix="eval_patched")
            Ledger(run_dir).append(epoch, step, result.metrics, result.ci95, result.skipped, **extra)
            _log_eval(writer, result, step)
            writer.flush()
            write_report(run_dir, f"negft run: {cfg.recipe}", report_notes)
            headline = {k: round(v, 3) for k, v in result.metrics.items()
                        if k.endswith(("/acc", "/r5", "/top1", "/group"))}
            print(f"[negft] epoch {epoch} eval ({time.time() - t0:.1f}s): {headline}", flush=True)
        barrier()

    resume = resume_point(cfg, run_dir, world_size)
    step, first_epoch, start_in_epoch = 0, 1, 0
    if resume is not None:
        engine.load_checkpoint(str(resume[0] / "state"), tag="ds")
        saved = resume[1]
        if saved["steps_per_epoch"] != steps_per_epoch:
            raise ConfigError(f"resume: '{resume[0]}' ran {saved['steps_per_epoch']} steps per epoch, this run "
                              f"{steps_per_epoch}: keep the batch sizes, train.steps_per_epoch and rank count")
        step = saved["step"]
        first_epoch, start_in_epoch = saved["epoch"], saved["epoch_step"]
        if start_in_epoch == steps_per_epoch:
            first_epoch, start_in_epoch = first_epoch + 1, 0

    writer = None
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(run_dir / "config.yaml", to_yaml(cfg))
        writer = SummaryWriter(str(run_dir / "tensorboard"))
        print(f"[negft] {cfg.recipe}: {world_size} rank(s) on {device}, {steps_per_epoch} steps/epoch, "
              f"{total_steps} steps, base={pretrained or 'random init'}, act={models.activation(bundle.model)}"
              + (f"; resumed from {resume[0]} at step {step}" if resume else ""), flush=True)
    evaluated = [{entry["epoch"] for entry in Ledger(run_dir).read()} if resume and rank == 0 else set()]
    dist.broadcast_object_list(evaluated, src=0)     # every rank must agree on which evaluations to run
    evaluated = evaluated[0]
    if 0 not in evaluated:
        run_eval(0, 0)
    if resume and start_in_epoch == 0 and first_epoch - 1 not in evaluated and first_epoch > 1:
        run_eval(first_epoch - 1, step)      # killed between an epoch's checkpoint and its evaluation

    def state(epoch: int, epoch_step: int) -> dict:
        return {"epoch": epoch, "epoch_step": epoch_step, "step": step, "steps_per_epoch": steps_per_epoch,
                "world_size": world_size}

    # non-finite steps: GuardedAdamW skips them (ZeRO-0, fp32 weights), elsewhere DeepSpeed's optimizer does;
    # counted here and read from the device only at log steps and before checkpoints on a GPU (every step on
    # CPU, where reading costs nothing). fp16's loss-scale search skips steps by design: counted, never stopped.
    bad = {"seen": 0, "ds_seen": 0, "ds_run": 0}

    def check_steps(at: int) -> None:
        if guarded.guard:
            total, run = (0, 0) if guarded.skipped is None else (int(guarded.skipped), int(guarded.bad_run))
        else:
            total, run = engine.skipped_steps, bad["ds_run"]
        if total > bad["seen"] and rank == 0:
            print(f"[negft] step {at}: {total - bad['seen']} step(s) skipped for a non-finite loss or gradient "
                  f"({run} in a row, {total} in all)", flush=True)
            writer.add_scalar("train/skipped_steps", total, at)
        bad["seen"] = total
        if run >= cfg.train.max_bad_steps and cfg.train.precision != "fp16":
            raise RuntimeError(f"{run} optimizer steps in a row had a non-finite loss or gradient "
                               f"(train.max_bad_steps={cfg.train.max_bad_steps}); stopped at step {at} without "
                               "writing a checkpoint. Lower optim.lr, raise optim.warmup_steps, or check the data")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    task_of = {n: s.task for n, s in cfg.streams.items()}
    for epoch in range(first_epoch, cfg.epochs + 1):
        if step >= total_steps:
            break
        done_in_epoch = start_in_epoch if epoch == first_epoch else 0
        iters = {name: s.epoch(epoch, micro_steps, start=done_in_epoch * cfg.train.grad_accum)
                 for name, s in streams.items()}
        bar = tqdm(total=min(steps_per_epoch, total_steps - step + done_in_epoch), initial=done_in_epoch,
                   desc=f"epoch {epoch}", disable=rank != 0, dynamic_ncols=True)
        t_last, samples = time.time(), 0
        timed = {"from": None, "steps": 0, "samples": 0}     # the epoch's rate after its first WARM_STEPS
        first_step = done_in_epoch
        for micro in range(done_in_epoch * cfg.train.grad_accum, micro_steps):
            batches = {name: batch_to(next(it), device, dtype) for name, it in iters.items()}
            loss, logs = engine(**by_task(batches, task_of))
            if guarded.guard:
                guarded.note_loss(loss)
            engine.backward(loss)
            engine.step()
            n = sum(b["images"].shape[0] for b in batches.values()) * world_size
            samples += n
            timed["samples"] += n
            if not engine.is_gradient_accumulation_boundary():
                continue
            step += 1
            done_in_epoch += 1
            bar.update(1)
            if not guarded.guard:
                bad["ds_run"] = bad["ds_run"] + 1 if engine.skipped_steps > bad["ds_seen"] else 0
                bad["ds_seen"] = engine.skipped_steps
            if done_in_epoch - first_step == WARM_STEPS:
                sync()
                timed.update({"from": time.perf_counter(), "steps": 0, "samples": 0})
            else:
                timed["steps"] += 1
            every = cfg.train.checkpoint_every
            checkpoint_due = bool(every and step % every == 0 and done_in_epoch < steps_per_epoch)
            if device.type == "cpu" or step % cfg.train.log_every == 0 or step == total_steps or checkpoint_due:
                check_steps(step)
            if step % cfg.train.log_every == 0 or step == total_steps:
                rate = samples / (time.time() - t_last)
                t_last, samples = time.time(), 0
                bar.set_postfix(loss=f"{loss.item():.3f}", samples_s=f"{rate:.0f}")
                if writer:
                    writer.add_scalar("train/loss", loss.item(), step)
                    for k, v in logs.items():
                        writer.add_scalar(f"train/{k}", float(v), step)
                    writer.add_scalar("train/lr", scheduler.get_last_lr()[0], step)
                    writer.add_scalar("train/samples_per_s", rate, step)
            if step >= total_steps:
                break
            if checkpoint_due:
                kept = save_checkpoint(engine, bundle, provenance, run_dir, f"step_{step}", state(epoch, done_in_epoch),
                                       rank, frozen)
                prune_step_checkpoints(run_dir, kept, rank)
        bar.close()
        check_steps(step)
        sync()
        if timed["from"] is not None and timed["steps"] and rank == 0:
            seconds = time.perf_counter() - timed["from"]
            rate, ms = timed["samples"] / seconds, 1000 * seconds / timed["steps"]
            peak = (f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2 ** 30:.2f} GiB"
                    if device.type == "cuda" else "")
            print(f"[negft] epoch {epoch}: {timed['steps']} steps after the first {WARM_STEPS}: {rate:.1f} "
                  f"samples/s, {ms:.1f} ms/step{peak}", flush=True)
            writer.add_scalar("train/epoch_samples_per_s", rate, step)
        tallies = {name: gather(s.tally) for name, s in streams.items()}     # all ranks, on every rank
        data_counts[epoch] = {name: t.as_dict() for name, t in tallies.items()}
        if rank == 0:
            for name, t in tallies.items():
                t.report(f"epoch {epoch}: stream '{name}'", writer, f"data/{name}", step)
        save_checkpoint(engine, bundle, provenance, run_dir, f"epoch_{epoch}", state(epoch, done_in_epoch), rank, frozen)
        prune_step_checkpoints(run_dir, None, rank)
        if epoch % cfg.eval.every == 0 or step >= total_steps or epoch == cfg.epochs:
            run_eval(epoch, step)
        if not synthetic:       # past train.max_skipped: stop, the epoch's checkpoint and evaluation kept
            if writer:
                writer.flush()
            check_skipped(tallies, cfg.train.max_skipped, epoch)
    if writer:
        writer.close()
        if cfg.patch.sweep and not synthetic:
            last = max((run_dir / "checkpoints").glob("epoch_*"), key=lambda p: int(p.name.split("_")[1]))
            report_notes += sweep_and_release(cfg, run_dir, last, pretrained, arch)
            write_report(run_dir, f"negft run: {cfg.recipe}", report_notes)
        print(f"[negft] done: {run_dir if synthetic else run_dir / 'report.md'}", flush=True)
    barrier()
    return run_dir


def sweep_and_release(cfg: Config, run_dir: Path, last: Path, base: str, arch: str) -> list[str]:
    """patch.sweep: patch the last epoch toward the base (negft patch), release the selected model.
    Both are kept if they exist (a re-run into the same run directory), never overwritten."""
    from negft.patch_cmd import patch
    from negft.release import release
    if not base:
        print("[negft] patch.sweep skipped: the run started from random weights, there is no base to patch "
              "toward", flush=True)
        return []
    out, rel = run_dir / "patch", run_dir / "release"
    if not (out / "selected.json").exists():
        print(f"[negft] patching sweep: towers {cfg.patch.towers}, alphas {cfg.patch.alphas} → {out}", flush=True)
        patch(base=base, finetuned=str(last), out=str(out), alphas=cfg.patch.alphas, towers=cfg.patch.towers,
              suite=cfg.eval.suite, arch=arch, bootstrap=str(cfg.eval.bootstrap), batch_size=str(cfg.eval.batch_size))
    if not rel.exists():
        release(ckpt=str(out / "selected"), out=str(rel))
    sel = json.loads((out / "selected.json").read_text())
    print(f"[negft] selected tower {sel['tower']}, alpha {sel['alpha']}; released {rel}", flush=True)
    return ["", f"Patching sweep of `{last.name}` toward the base (α = weight of the fine-tuned model): "
                f"[sweep.png](patch/sweep.png), [sweep.jsonl](patch/sweep.jsonl), "
                f"[selected.json](patch/selected.json) — tower `{sel['tower']}`, α = {sel['alpha']}, chosen on the "
                f"val split by: {sel['rule']}.",
            f"Release of the selected model: [release/](release/) ([MODEL_CARD.md](release/MODEL_CARD.md))."]
