"""``negft release``: a checkpoint as a publishable open_clip ``local-dir`` with a model card and checksums.

Writes ``open_clip_model.safetensors``, ``open_clip_config.json``, ``MODEL_CARD.md`` and ``SHA256SUMS``
(``sha256sum -c`` format) into a new directory, verifies the written files against their sums, and
refuses an ``out`` that exists: a release is never overwritten. The card's provenance names the negft version and
git commit that released it and those that computed its probe table, with each probe's version
(``negft.provenance``, as the ledger or ``selected.json`` records them).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import yaml

from negft import models
from negft.config import ConfigError
from negft.data import manifests
from negft.io import atomic_path
from negft.provenance import code, describe
from negft.tables import metric_table
from negft.train.ledger import Ledger

SUMS = "SHA256SUMS"
CARD = "MODEL_CARD.md"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(directory: str | Path, only: str | None = None) -> list[str]:
    """Files whose content no longer matches ``SHA256SUMS`` (missing ones, and lines that name no file of the
    directory, included); [] when intact. ``only``: check that one file's line alone."""
    directory = Path(directory)
    bad = []
    for n, line in enumerate((directory / SUMS).read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or len(parts[0]) != 64:
            bad.append(f"{SUMS} line {n} (not 'SHA256  NAME')")
            continue
        digest, name = parts[0].lower(), parts[1].lstrip("*")
        if only is not None and name != only:
            continue
        path = directory / name
        if path.resolve().parent != directory.resolve() or not path.is_file() or sha256(path) != digest:
            bad.append(name)
    return bad


def parse_verify(value) -> bool:
    """``verify=`` of eval.py and ``negft patch``: true (default) or false."""
    text = str(value).strip().lower()
    if text not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"bad value '{value}' for 'verify'. Valid choices: true, false")
    return text in ("true", "1", "yes")


def check_release(key: str, path: str | Path, check: bool = True) -> None:
    """Refuse (``ConfigError``) a checkpoint passed as ``key`` whose files fail the ``SHA256SUMS`` beside them: a
    release directory, or one file of one. Nothing to check where there is no ``SHA256SUMS`` (a run's
    checkpoint, a tag), or with ``check`` false (``verify=false``)."""
    path = Path(path)
    if not check or not path.exists():
        return
    folder, only = (path, None) if path.is_dir() else (path.parent, path.name)
    if not (folder / SUMS).is_file():
        return
    bad = verify(folder, only)
    if bad:
        raise ConfigError(f"{key}: {', '.join(bad)} in '{folder}' fail(s) its {SUMS} (changed or damaged since it "
                          f"was released). Fetch the release again and compare with `sha256sum -c {SUMS}` in "
                          f"its folder, or pass verify=false to use it anyway")


def _selection_rule(ckpt: Path, info: dict) -> str:
    """The rule a patching sweep chose α by (selected.json beside the patched checkpoint), or ""."""
    path = ckpt.parent / "selected.json"
    if "patch" not in info or not path.exists():
        return ""
    sel = json.loads(path.read_text())
    targets = ", ".join(f"`{t}`" for t in sel.get("targets", []))
    return f"{sel.get('rule', '')} (targets: {targets})" if sel.get("rule") else ""


def _probe_table(ckpt: Path, info: dict, run: Path | None) -> tuple[list[str], str, list[dict | None]]:
    """(the markdown table of metric | base | this model | Δ, where the numbers come from, the provenance the
    source records for them: one per evaluation, None where it records none)."""
    if "patch" in info and (ckpt.parent / "selected.json").exists():
        selected = json.loads((ckpt.parent / "selected.json").read_text())
        sel = selected["test"]
        pairs = (sel["base_metrics"], sel["base_ci95"], sel["metrics"], sel["ci95"])
        source = f"`{ckpt.parent / 'selected.json'}` (test split; α chosen on the val split)"
        records = [selected.get("provenance")]
    elif run is not None and (run / "ledger.jsonl").exists():
        entries = {e["epoch"]: e for e in Ledger(run).read()}
        mine = entries.get(info.get("epoch"))
        if 0 not in entries or mine is None:
            return [], "no ledger entries for epoch 0 and this checkpoint's epoch", []
        pairs = (entries[0]["metrics"], entries[0]["ci95"], mine["metrics"], mine["ci95"])
        source = f"`{run / 'ledger.jsonl'}` (epoch 0 = the base model, and epoch {info.get('epoch')})"
        records = [entries[0].get("provenance"), mine.get("provenance")]
    else:
        return [], "no evaluation found beside the checkpoint", []
    base, base_ci, metrics, ci = pairs
    table = metric_table([("base", base, base_ci), ("this model", metrics, ci)],
                         [k for k in sorted(metrics) if k in base], reference=base)
    return table, source, records


def _provenance_lines(records: list[dict | None]) -> list[str]:
    """The card's provenance of the code: what released it, and what computed the probe table's numbers."""
    lines = [f"- released with: {describe(code())}"]
    for text in dict.fromkeys(describe(r) for r in records):
        lines.append(f"- probe results computed by: {text}")
    return lines


def _data_lines(run: Path | None, info: dict) -> list[str]:
    if info.get("data") == "world":
        meta = Path(info.get("world_dir", "")) / "world.json"
        if meta.exists():
            w = json.loads(meta.read_text())
            return [f"- the embedded world, generator `{w.get('generator_version')}`, seed {w.get('seed')}, "
                    f"size `{w.get('size')}`; `world.json` sha256 `{sha256(meta)}`"]
        return ["- the embedded world (its world.json was not found to hash)"]
    if run is None:
        return ["- unknown (the checkpoint is not inside a negft run directory)"]
    streams = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("streams", {})
    lines = []
    for name, s in streams.items():
        manifest = manifests.path(s.get("manifest", ""))
        if s.get("manifest") and manifest.exists():
            lines.append(f"- stream `{name}`: manifest `{s['manifest']}` sha256 `{sha256(manifest)}`")
        else:
            lines.append(f"- stream `{name}`: urls `{s.get('urls', '')}` (no manifest)")
    return lines


def _objective_line(run: Path | None) -> list[str]:
    """The loss as the run's config.yaml set it: its name and the blocks it reads, terms that are off left out
    (weights of 0; ``negation_weight`` 1, NegBench's unweighted mean)."""
    config = run / "config.yaml" if run is not None else None
    if config is None or not config.exists():
        return []
    from negft.train.task import LOSSES
    loss = (yaml.safe_load(config.read_text()) or {}).get("loss", {})
    name = loss.get("name", "?")
    blocks = LOSSES[name].blocks() if name in LOSSES else ()
    off = {"negation_weight": 1.0}
    parts = [f"`loss.{b}.{k}` = {v}" for b in blocks for k, v in (loss.get(b) or {}).items() if v != off.get(k, 0)]
    return [f"- objective: `loss.name` = {name}" + (f" ({', '.join(parts)})" if parts else "")]


def model_card(ckpt: Path, info: dict) -> str:
    run = models.run_dir_of(ckpt, info)
    patch = info.get("patch")
    table, source, records = _probe_table(ckpt, info, run)
    lines = [
        f"# {info.get('recipe', 'negft')} fine-tune of {info.get('arch', '?')}", "",
        "Released with negft from a training run; load it with plain open_clip:", "",
        "```python",
        "import open_clip",
        "model, _, preprocess = open_clip.create_model_and_transforms('local-dir:PATH/TO/THIS/DIR')",
        "tokenizer = open_clip.get_tokenizer('local-dir:PATH/TO/THIS/DIR')",
        "```", "",
        "## Provenance", "",
        f"- base model: `{info.get('arch', '?')}` from `{info.get('base') or 'random init'}`",
        f"- recipe: `{info.get('recipe', '?')}` (trained towers: `{info.get('tower', '?')}`)"
        + (f"; run `{run}`" if run else ""),
        *_objective_line(run),
        f"- checkpoint released: `{ckpt}`",
        "- patching: " + (f"θ = (1 − α)·θ_base + α·θ_finetuned with α = {patch['alpha']} (the weight of the "
                          f"fine-tuned model), tower mode `{patch['tower']}`, from `{info.get('finetuned')}`"
                          if patch else "none (the fine-tuned weights as trained)"),
        *([f"- patching α selection rule: {rule}"] if (rule := _selection_rule(ckpt, info)) else []),
        *_provenance_lines(records),
        "", "## Training data", "", *_data_lines(run, info), "",
        "## Probe results against the base model", "",
        f"From {source}. 95% bootstrap intervals in brackets; Δ = this model − base.", "",
    ]
    lines += table
    lines += [
        "", "## Intended use", "",
        "Research on negation and compositional understanding in dual-encoder vision-language models: "
        "zero-shot retrieval and classification where captions say what is absent or how objects relate.",
        "", "## Known limits", "",
        "- Measured only on the probes above; a gain on them need not transfer to other data or phrasings.",
        "- Fine-tuning moves the model away from its base (see the drift metrics: zero-shot and affirmative "
        "retrieval); patching trades part of the gain for less drift.",
        "- Inherits the biases of the base model's web pretraining data and of the fine-tuning captions.",
    ]
    if info.get("data") == "world":
        lines.append("- Trained on the embedded synthetic world with a tiny model: a demonstration, not a "
                     "model for real images.")
    return "\n".join(lines) + "\n"


def release(ckpt: str | Path, out: str | Path) -> Path:
    """Release checkpoint directory ``ckpt`` into the new directory ``out``."""
    src, dst = Path(ckpt), Path(out)
    if dst.exists():
        raise FileExistsError(f"out '{dst}' exists: a release is never overwritten; choose a new out")
    for name in (models.WEIGHTS_FILE, models.CONFIG_FILE):
        if not (src / name).is_file():
            raise FileNotFoundError(f"ckpt '{src}' has no {name}: pass a checkpoint directory "
                                    f"(runs/RUN/checkpoints/epoch_N or a patch's selected/)")
    info = models.negft_info(src)
    with atomic_path(dst, directory=True, overwrite=False) as staged:
        shutil.copyfile(src / models.WEIGHTS_FILE, staged / models.WEIGHTS_FILE)
        cfg = json.loads((src / models.CONFIG_FILE).read_text())
        # keep provenance, drop where the checkpoint sat in its run (meaningless once released)
        cfg["negft"] = {k: v for k, v in info.items()
                        if k not in ("epoch_step", "step", "steps_per_epoch", "world_size", "run_dir")}
        (staged / models.CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
        (staged / CARD).write_text(model_card(src, info))
        names = (models.WEIGHTS_FILE, models.CONFIG_FILE, CARD)
        (staged / SUMS).write_text("".join(f"{sha256(staged / n)}  {n}\n" for n in names))
        bad = verify(staged)
        if bad or sha256(staged / models.WEIGHTS_FILE) != sha256(src / models.WEIGHTS_FILE):
            raise OSError(f"release verification failed for {bad or [models.WEIGHTS_FILE]}")
    return dst
