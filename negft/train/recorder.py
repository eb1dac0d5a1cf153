"""A training run's evaluations, recorded: per-example values and figures, paired tests against epoch 0, the
patched model's numbers, the ledger line, TensorBoard scalars and report.md (``negft.train.ledger`` writes the
files)."""
from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from negft.config import Config
from negft.evaluate import evaluate, write_figures
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


def log_metrics(writer, result, step: int, prefix: str = "eval") -> None:
    for k, v in result.metrics.items():
        writer.add_scalar(f"{prefix}/{k}", v, step)


class EvalRecorder:
    """Evaluates the model being trained after an epoch and records the result (rank 0 only).

    ``bundle`` gives the evaluation transform and tokenizer, ``datasets`` the probe data, ``writer`` the run's
    TensorBoard writer, ``base_state`` the base model's weights (CPU, fp32) when ``patch.alpha`` asks for the
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

    def _evaluate(self, model, **caches):
        cfg = self.cfg
        return evaluate(model, self.bundle.preprocess_val, self.bundle.tokenizer, self.datasets, cfg.eval.suite,
                        cfg.eval.batch_size, cfg.eval.bootstrap, self.device, **caches)

    def record(self, clip: torch.nn.Module, epoch: int, step: int, data: dict | None = None) -> None:
        """Evaluate ``clip`` after ``epoch`` (0: before training) and write everything that records it; ``data``:
        what each stream read and left out in the epoch, for its ledger line."""
        cfg, t0 = self.cfg, time.time()
        result = self._evaluate(clip, **self.encoded)
        save_values(self.run_dir, epoch, result.values)
        write_figures(result, self.run_dir / "figures" / f"epoch_{epoch}")
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
        Ledger(self.run_dir).append(epoch, step, result.metrics, result.ci95, result.skipped, **extra)
        log_metrics(self.writer, result, step)
        self.writer.flush()
        write_report(self.run_dir, report_title(cfg), self.notes)
        headline = {k: round(v, 3) for k, v in result.metrics.items() if k.endswith(("/acc", "/r5", "/top1", "/group"))}
        print(f"[negft] epoch {epoch} eval ({time.time() - t0:.1f}s): {headline}", flush=True)
