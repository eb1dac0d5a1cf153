"""The DeepSpeed engine's parts: ranks, optimizer (with its parameter groups and learning-rate schedule),
the engine's config, and batches moved to the device. The loop builds its engine from these; the benches
measure the same step with them."""
from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from negft.config import Config, ConfigError
from negft.losses import HOST


# --------------------------------------------------------------------------- ranks
@dataclass(frozen=True)
class LaunchEnv:
    """Who started this process and where it stands among the ranks."""
    launcher: str              # python (no launcher) | deepspeed | torchrun | srun
    rank: int
    world_size: int
    local_rank: int
    local_size: int            # ranks on this machine where the launcher says (DeepSpeed, torchrun), else world_size


def launch_env(environ=None) -> LaunchEnv:
    """The ranks a launcher put in the environment. The DeepSpeed launcher and torchrun set torch's own variables
    (RANK, WORLD_SIZE, LOCAL_RANK; torchrun also TORCHELASTIC_RUN_ID and LOCAL_WORLD_SIZE, DeepSpeed LOCAL_SIZE);
    srun sets SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, read where torch's are absent, as open_clip_train's
    ``world_info_from_env`` reads them (a launcher run inside a Slurm job keeps its own ranks)."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        local = env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE") or world
        return LaunchEnv("torchrun" if "TORCHELASTIC_RUN_ID" in env else "deepspeed", int(env["RANK"]), world,
                         int(env.get("LOCAL_RANK", 0)), int(local))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = int(env["SLURM_NTASKS"])
        return LaunchEnv("srun", int(env["SLURM_PROCID"]), world, int(env.get("SLURM_LOCALID", 0)), world)
    return LaunchEnv("python", 0, 1, 0, 1)


_launched: LaunchEnv | None = None      # this process's, as init_distributed found it


def launched() -> LaunchEnv:
    """How this process was launched: as ``init_distributed`` found it (it then exports torch's variables, which
    would make an srun rank look like one of the DeepSpeed launcher's), else as the environment says now."""
    return _launched or launch_env()


DEFAULT_TIMEOUT_S = 600.0


def collective_timeout(key: float | None, environ=None) -> tuple[float, str]:
    """(seconds a collective waits, where that comes from): ``train.dist_timeout_s`` where the recipe or command
    line sets it, else DEEPSPEED_TIMEOUT (minutes, as DeepSpeed reads it: ``deepspeed.constants.default_pg_timeout``),
    else 600 s, DeepSpeed's own default."""
    env = os.environ if environ is None else environ
    if key is not None:
        return float(key), f"train.dist_timeout_s={key:g} seconds"
    minutes = env.get("DEEPSPEED_TIMEOUT", "")
    if minutes:
        try:
            return 60.0 * float(minutes), f"{60.0 * float(minutes):g} seconds, DEEPSPEED_TIMEOUT={minutes} minutes"
        except ValueError:
            raise ConfigError(f"DEEPSPEED_TIMEOUT={minutes!r} is not a number of minutes: set it to one (e.g. "
                              "DEEPSPEED_TIMEOUT=30), unset it, or set train.dist_timeout_s (seconds)") from None
    return DEFAULT_TIMEOUT_S, (f"{DEFAULT_TIMEOUT_S:g} seconds, the default; train.dist_timeout_s or "
                               "DEEPSPEED_TIMEOUT sets it")


def init_distributed(timeout_key: float | None = None) -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the launcher's environment (``launch_env``), with a process group of one
    when no launcher started this process. A collective fails after ``collective_timeout(timeout_key)`` seconds
    rather than wait forever for a dead rank; the first call sets it for the process."""
    from datetime import timedelta
    import deepspeed
    global _launched
    if not torch.cuda.is_available():
        # DeepSpeed's CPU backend would JIT-compile a shared-memory all-reduce used only for
        # inference (about a minute on 2 cores); training all-reduces go through gloo anyway.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    initialized = dist.is_initialized()
    env = _launched if initialized and _launched else launch_env()
    if env.launcher in ("python", "srun"):
        export_ranks(env)
    _launched = env
    if not initialized:
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo",
                                   timeout=timedelta(seconds=collective_timeout(timeout_key)[0]))
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))


def export_ranks(env: LaunchEnv) -> None:
    """torch's variables for ``env`` (what torch.distributed's env:// and DeepSpeed read). Alone or as srun's only
    task, the rendezvous is this machine on a free port; several srun tasks need the job script's MASTER_ADDR and
    MASTER_PORT (scripts/slurm/negfull.sbatch)."""
    if env.world_size > 1 and not ("MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ):
        raise ConfigError(f"srun started {env.world_size} tasks, but MASTER_ADDR and MASTER_PORT are not set: the "
                          "job script sets them before srun (MASTER_ADDR=$(scontrol show hostnames "
                          "\"$SLURM_JOB_NODELIST\" | head -n 1), MASTER_PORT a free port; "
                          "scripts/slurm/negfull.sbatch)")
    if env.world_size == 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    os.environ.update(RANK=str(env.rank), LOCAL_RANK=str(env.local_rank), WORLD_SIZE=str(env.world_size))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def barrier():
    if dist.is_initialized():
        dist.barrier()


def lost_rank(e: BaseException) -> bool:
    """Whether ``e`` is a collective that failed for want of another rank (dead, hung, unreachable): torch's
    ``DistError``, or gloo's plain ``RuntimeError`` ("Connection closed by peer", "Timed out waiting ...")."""
    return isinstance(e, dist.DistError) or (isinstance(e, RuntimeError) and "gloo" in str(e))


# --------------------------------------------------------------------------- optimizer
ALIGN = 8      # elements: 16 bytes of bf16, the alignment cuBLAS's fast kernels want of every weight and bias


EMBEDDINGS = ("token_embedding", "positional_embedding", "class_embedding")


def param_groups(module: torch.nn.Module, weight_decay: float, embedding_lr_scale: float = 1.0,
                 decay_all: bool = False) -> list[dict]:
    """open_clip's rule: no weight decay on gains, biases, embeddings-like 1-d params, logit_scale; ``decay_all``:
    every parameter decays, as a bare ``torch.optim.AdamW(model.parameters())`` decays them (CoN-CLIP's,
    NegationCLIP's and TripletCLIP's code).

    Parameters whose size is not a multiple of ``ALIGN`` elements (the 1-element ``logit_scale``) come in groups
    of their own, last: DeepSpeed's ZeRO and bf16 optimizers flatten each group into one buffer, so such a
    tensor ahead of others would start every later one off a 16-byte boundary, and cuBLAS then takes a slow
    path for each bias GEMM (about twice the forward time of ViT-B-32 on a GPU; bench/RESULTS.md, Speed). AdamW's
    arithmetic is per parameter, so the grouping changes no result; it changes the optimizer state's layout, so
    a checkpoint written with another grouping does not resume. With ``embedding_lr_scale`` other than 1 the
    embeddings (``EMBEDDINGS``) come in groups of their own whose ``lr_scale`` multiplies the learning rate
    (``make_optimizer`` sets their ``lr``; the schedule then scales it with the others)."""
    own = embedding_lr_scale != 1.0
    groups = {}     # (odd size, decay, embedding) -> params, in this order
    for key in ((False, True, True), (False, False, True), (False, True, False), (False, False, False),
                (True, True, True), (True, False, True), (True, True, False), (True, False, False)):
        groups[key] = []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        exclude = not decay_all and (p.ndim < 2 or "bn" in name or "ln" in name or "bias" in name
                                     or "logit_scale" in name)
        embedding = own and any(e in name for e in EMBEDDINGS)
        groups[(p.numel() % ALIGN != 0, not exclude, embedding)].append(p)
    return [{"params": ps, "weight_decay": weight_decay if decay else 0.0,
             **({"lr_scale": embedding_lr_scale} if embedding else {})}
            for (odd, decay, embedding), ps in groups.items() if ps]


class SkipNonFiniteAdamW(torch.optim.AdamW):
    """AdamW that skips a step whose loss or gradients are not finite, and clips the gradients' global norm.

    Used where DeepSpeed hands the whole gradients to the client optimizer (ZeRO-0 with fp32 weights: fp32, and
    bf16 under ``train.autocast``), where DeepSpeed's engine neither clips in one pass nor checks for overflow.
    A skipped step changes no weight, moment or step count (the fused kernel ``make_optimizer`` builds skips it on
    the device, CPU or GPU, without waiting for the host); the engine's step and the learning-rate schedule still
    advance, so they follow the data. ``skipped`` and ``bad_run`` (steps skipped in all, and in a row) are device
    counters.

    The clipping is DeepSpeed's arithmetic (per-tensor norms, their squares summed, ``max / (norm + 1e-6)``
    capped at 1), in a few multi-tensor kernels instead of two per tensor: the same weights as DeepSpeed's
    clipping on CPU, bit for bit. On several ranks the gradients are all-reduced before ``step`` (in DeepSpeed's
    backward), so every rank computes the same norm and takes the same decision; on one rank the engine skips
    that copy (``build_engine``) and ``step`` gives a parameter the loss did not reach the zero gradient the
    all-reduce would have given it, so its weight still decays, as on several ranks.
    """

    def __init__(self, params, clip: float = 0.0, order: list | None = None, **kwargs):
        super().__init__(params, **kwargs)
        self.clip = clip
        # the parameters in the module's order, as DeepSpeed sums their norms (a float sum depends on its order)
        self.order = order if order is not None else [p for g in self.param_groups for p in g["params"]]
        self.checks = True           # False when a DeepSpeed optimizer wraps this one (it checks and clips)
        self.skipped = self.bad_run = self._loss_bad = None

    def note_loss(self, loss: torch.Tensor) -> None:
        """Record a micro-batch's loss: a non-finite one makes the step it belongs to skip."""
        bad = ~torch.isfinite(loss.detach())
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad

    @torch.no_grad()
    def step(self, closure=None):
        if not self.checks:
            self._loss_bad = None
            return super().step(closure)
        for p in self.order:       # a zero gradient where the loss did not reach, as DeepSpeed's all-reduce gives
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self.order]
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


def make_optimizer(module: torch.nn.Module, cfg: Config, clip: float) -> SkipNonFiniteAdamW:
    """AdamW over ``param_groups``, PyTorch's fused form on every device: one kernel for every parameter, its
    skip decided on the device (``found_inf``). On CPU it steps in a quarter of the multi-tensor form's time
    (the token embedding is most of a small model's weights); it rounds differently from it in the last bit."""
    groups = param_groups(module, cfg.optim.weight_decay, cfg.optim.embedding_lr_scale, cfg.optim.decay_all)
    for g in groups:
        if "lr_scale" in g:
            g["lr"] = cfg.optim.lr * g.pop("lr_scale")
    return SkipNonFiniteAdamW(groups, clip=clip, order=[p for p in module.parameters() if p.requires_grad],
                              lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps,
                              fused=True)


def skip_one_rank_allreduce(engine, optimizer: SkipNonFiniteAdamW, world_size: int) -> None:
    """On one rank, where DeepSpeed steps ``optimizer`` itself, its gradient all-reduce only copies every gradient
    into a flat buffer and back (about 4% of a CPU pretraining step): skipped. The weights stay bit-identical:
    ``SkipNonFiniteAdamW.step`` gives a parameter the loss did not reach the zero gradient the all-reduce gives it."""
    if optimizer.checks and world_size == 1:
        engine.enable_backward_allreduce = False


def lr_lambda(warmup: int, total: int, min_ratio: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


# --------------------------------------------------------------------------- the engine's config
def zero_stage(cfg: Config, world_size: int) -> int:
    """The ZeRO stage the engine runs: ``train.zero_stage``, except 0 for stages 1 and 2 on one rank.

    ZeRO-1/2 partition optimizer states (and gradients) over the ranks; on one rank there is nothing to
    partition, and their per-parameter gradient hooks only slow the backward pass (bench/RESULTS.md, Speed)."""
    stage = cfg.train.zero_stage
    return 0 if world_size == 1 and stage in (1, 2) else stage


def casts_weights(cfg: Config) -> bool:
    """Whether DeepSpeed casts the weights to 16 bits (fp16; bf16 without ``train.autocast``)."""
    return cfg.train.precision == "fp16" or (cfg.train.precision == "bf16" and not cfg.train.autocast)


def own_clipping(cfg: Config, world_size: int) -> bool:
    """Whether ``SkipNonFiniteAdamW`` clips and checks the step: ZeRO-0 with fp32 weights, where DeepSpeed gives the
    client optimizer the whole gradients (its own clipping there costs two kernels per tensor)."""
    return zero_stage(cfg, world_size) == 0 and not casts_weights(cfg)


def deepspeed_config(cfg: Config, micro_batch: int, world_size: int = 1) -> dict:
    """bf16 runs as torch.autocast over fp32 weights (``train.autocast``, DeepSpeed's ``torch_autocast``; its
    gradients are reduced in fp32), or with the weights cast to bf16 by DeepSpeed's bf16 optimizer. Where
    ``SkipNonFiniteAdamW`` clips, DeepSpeed's clipping is off; elsewhere DeepSpeed clips and skips non-finite steps."""
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


# --------------------------------------------------------------------------- batches
def batch_to(batch: dict, device, dtype) -> dict:
    """A batch on ``device``: copied as it is (the loader pins it on a GPU machine) without blocking the host,
    then cast there: a cast on the host writes unpinned memory, whose copy then blocks the step
    (bench/RESULTS.md, Speed). A batch already there (``train.synthetic``) is not copied. A batch the host built
    keeps the host's copy under ``losses.HOST``: what the step sizes by the values (the texts' trim, the rows a
    mask selects) is read there, with no round trip to the device."""
    out = {k: (v.to(device, non_blocking=True).to(dtype) if v.is_floating_point() else v.to(device, non_blocking=True))
           for k, v in batch.items()}
    if all(v.device.type == "cpu" for v in batch.values()):
        out[HOST] = batch
    return out

