"""A training run's evaluations, recorded: per-example values and figures, paired tests against epoch 0, the
patched model's numbers, the ledger line, TensorBoard (and W&B) scalars and report.md (``negft.train.ledger``
writes the files); ``RunLog``, where the run's scalars go."""
from __future__ import annotations

import copy
import netrc
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import torch
import yaml

from negft.config import Config, to_yaml
from negft.evaluation import run_suite, skipped_rows_summary, write_figures
from negft.io import WriteError, atomic_write
from negft.probes.base import PixelCache
from negft.probes.stats import one_blas_thread, paired_p_values
from negft.train.ledger import Ledger, load_values, save_values, write_report


def run_notes(cfg: Config, run_dir: Path, base: str) -> list[str]:
    """report.md's opening notes: where the run is, what it trained on and from."""
    return [f"Run directory `{run_dir}`; data={cfg.data}; tower={cfg.tower}; base={base or 'random init'}."]


def report_title(cfg: Config) -> str:
    return f"negft run: {cfg.recipe}"


def patched_copy(clip: torch.nn.Module, base_state: dict, alpha: float, tower: str) -> torch.nn.Module:
    """A copy of ``clip`` patched toward the base: θ = (1 − α)·θ_base + α·θ_now (α the fine-tuned weight)."""
    from negft.patching import interpolate
    now_state = {k: v.detach().to("cpu", torch.float32) if v.is_floating_point() else v.detach().cpu()
                 for k, v in clip.state_dict().items()}
    patched = copy.deepcopy(clip)
    patched.load_state_dict(interpolate(base_state, now_state, alpha, tower))
    return patched


class RunLog:
    """The run's scalars, sent to TensorBoard (``tensorboard/``) and, with ``log.wandb``, to a W&B run: the
    writer methods the loop calls (``add_scalar``, ``flush``, ``close``), and ``add_evaluation`` for what W&B
    also keeps (the ledger line, the figures). Rank 0 only.

    TensorBoard writes in a thread of its own; a write it cannot make (a full disk, a read-only file system)
    ends that thread and comes back, as the bare ``OSError``, at the next ``add_scalar`` or ``flush``: raised
    from there as ``WriteError`` naming the directory, the thread's own traceback silenced."""

    def __init__(self, cfg: Config, run_dir: Path, resumed: bool):
        from torch.utils.tensorboard import SummaryWriter
        self.dir, self.failed = Path(run_dir) / "tensorboard", False
        with self._tensorboard():
            self.tb = SummaryWriter(str(self.dir))
        self._excepthook, threading.excepthook = threading.excepthook, self._quiet_writer_thread
        self.wandb = wandb_run(cfg, Path(run_dir), resumed) if cfg.log.wandb else None

    @contextmanager
    def _tensorboard(self):
        try:
            yield
        except OSError as e:
            self.failed = True
            raise WriteError(f"cannot write TensorBoard's events in '{self.dir}': {e}. The checkpoints, "
                             f"ledger.jsonl and report.md are whole; TensorBoard lacks the scalars since the "
                             f"failed write") from e

    def _quiet_writer_thread(self, args) -> None:
        from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread
        if not (isinstance(args.thread, _AsyncWriterThread) and isinstance(args.exc_value, OSError)):
            self._excepthook(args)

    def add_scalar(self, tag: str, value, step: int) -> None:
        with self._tensorboard():
            self.tb.add_scalar(tag, value, step)
        if self.wandb is not None:
            self.wandb.log({tag: value}, step=step)

    def add_evaluation(self, line: dict, figures: list[Path], step: int) -> None:
        """W&B's record of an evaluation beyond its scalars: the ledger line (each metric with its 95% interval
        and paired p against epoch 0) as a table, and the probe figures."""
        if self.wandb is None:
            return
        import wandb
        p = line.get("paired_p", {})
        rows = [[line["epoch"], k, v, *line["ci95"].get(k, (None, None)), p.get(k)] for k, v in line["metrics"].items()]
        table = wandb.Table(columns=["epoch", "metric", "value", "ci95_low", "ci95_high", "paired_p"], data=rows)
        self.wandb.log({"ledger": table, **{f"figures/{f.stem}": wandb.Image(str(f)) for f in figures}}, step=step)

    def flush(self) -> None:
        with self._tensorboard():
            self.tb.flush()

    def close(self, exit_code: int = 0) -> None:
        """Close both; after a failed write TensorBoard has nothing more to write (and would raise it again).
        ``exit_code``: the command line's, which W&B records (0 finished, else failed or stopped)."""
        try:
            if not self.failed:
                with self._tensorboard():
                    self.tb.close()
        finally:
            threading.excepthook = self._excepthook
            if self.wandb is not None:
                self.wandb.finish(exit_code=exit_code)


def wandb_mode() -> str | None:
    """W&B's mode: the user's ``WANDB_MODE`` (None: wandb reads it), else offline where no API key is at hand
    (``WANDB_API_KEY``, a ``~/.netrc`` login for the W&B host), so that a run never stops to ask for a login."""
    if os.environ.get("WANDB_MODE"):
        return None
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        login = netrc.netrc().authenticators(host)
    except (OSError, netrc.NetrcParseError):
        login = None
    return "online" if login else "offline"


def wandb_run(cfg: Config, run_dir: Path, resumed: bool):
    """The W&B run of ``run_dir``, with the resolved recipe as its config: a resumed run goes on in the W&B run
    it started (its id kept in ``run_dir/wandb_id``), a new one starts a new W&B run. Its files go under
    ``run_dir/wandb/`` (or ``$WANDB_DIR``)."""
    import wandb
    id_file = run_dir / "wandb_id"
    run_id = id_file.read_text().strip() if resumed and id_file.exists() else None
    mode = wandb_mode()
    run = wandb.init(project=cfg.log.wandb_project, entity=cfg.log.wandb_entity,
                     name=cfg.log.wandb_name or run_dir.resolve().name, id=run_id, resume="allow",
                     config=yaml.safe_load(to_yaml(cfg)), dir=os.environ.get("WANDB_DIR") or str(run_dir), mode=mode)
    atomic_write(id_file, run.id)
    if run.offline:
        why = " (no WANDB_API_KEY or ~/.netrc login)" if mode == "offline" else ""
        print(f"[negft] W&B run {run.id} is offline{why}; `wandb sync {Path(run.dir).parent}` uploads it", flush=True)
    return run


def log_metrics(writer, result, step: int, prefix: str = "eval") -> None:
    for k, v in result.metrics.items():
        writer.add_scalar(f"{prefix}/{k}", v, step)


class EvalRecorder:
    """Evaluates the model being trained after an epoch and records the result (rank 0 only).

    ``bundle`` gives the evaluation transform and tokenizer, ``datasets`` the probe data, ``writer`` the run's
    ``RunLog``, ``base_state`` the base model's weights (CPU, fp32) when ``patch.alpha`` asks for the
    patched model to be evaluated too. The tower that does not train is encoded once per run, not once per
    evaluation; texts are tokenised and images decoded once (within a memory budget).
    """

    def __init__(self, cfg: Config, run_dir: Path, bundle, datasets, device, writer, notes: list[str],
                 base_state: dict | None = None, encoded: dict | None = None):
        self.cfg, self.run_dir, self.bundle, self.datasets = cfg, Path(run_dir), bundle, datasets
        self.device, self.writer, self.notes, self.base_state = device, writer, notes, base_state
        self.encoded = encoded if encoded is not None else {}
        self.encoded.update({"image_cache": {} if cfg.tower == "t" else None,
                             "text_cache": {} if cfg.tower == "v" else None,
                             "token_cache": {}, "pixel_cache": PixelCache()})
        self.epoch0_values = {}      # epoch 0's per-example values, read back from examples/ by a resumed run
        self.skips_said: list[str] = []     # the skipped-rows summary last printed

    def _evaluate(self, model, **caches):
        cfg = self.cfg
        return run_suite(model, self.bundle.preprocess_val, self.bundle.tokenizer, self.datasets, cfg.eval.suite,
                        cfg.eval.batch_size, cfg.eval.bootstrap, self.device, **caches)

    def record(self, clip: torch.nn.Module, epoch: int, step: int, data: dict | None = None) -> None:
        """Evaluate ``clip`` after ``epoch`` (0: before training) and write everything that records it; ``data``:
        what each stream read and left out in the epoch, for its ledger line."""
        cfg, t0 = self.cfg, time.time()
        result = self._evaluate(clip, **self.encoded)
        save_values(self.run_dir, epoch, result.values)
        figures = write_figures(result, self.run_dir / "figures" / f"epoch_{epoch}")
        extra = {"data": data} if data else {}
        if not self.epoch0_values:
            self.epoch0_values.update(result.values if epoch == 0 else load_values(self.run_dir, 0))
        if epoch > 0:       # report.md stars the last line's changes that a paired test supports
            with one_blas_thread():
                extra["paired_p"] = paired_p_values(self.epoch0_values, result.values, cfg.eval.bootstrap)
        extra["eval_seconds"] = round(time.time() - t0, 2)      # probes, values, figures and paired tests
        if self.base_state is not None and epoch > 0:
            patched = self._evaluate(patched_copy(clip, self.base_state, cfg.patch.alpha, cfg.patch.tower),
                                     token_cache=self.encoded["token_cache"],
                                     pixel_cache=self.encoded["pixel_cache"])
            extra["patched"] = {"alpha": cfg.patch.alpha, "tower": cfg.patch.tower,
                                "metrics": patched.metrics, "ci95": patched.ci95}
            log_metrics(self.writer, patched, step, prefix="eval_patched")
        line = Ledger(self.run_dir).append(epoch, step, result.metrics, result.ci95, result.skipped, **extra)
        log_metrics(self.writer, result, step)
        self.writer.add_evaluation(line, figures, step)
        self.writer.flush()
        write_report(self.run_dir, report_title(cfg), self.notes)
        headline = {k: round(v, 3) for k, v in result.metrics.items() if k.endswith(("/acc", "/r5", "/top1", "/group"))}
        print(f"[negft] epoch {epoch} eval ({time.time() - t0:.1f}s): {headline}", flush=True)
        skips = skipped_rows_summary(result)
        if skips != self.skips_said:        # the same files skip the same rows every epoch: said once, or anew
            self.skips_said = skips
            for text in skips:
                print(text, flush=True)
