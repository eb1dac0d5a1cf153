"""``negft release``: a checkpoint as a publishable open_clip ``local-dir`` and Hugging Face Hub model repository.

Writes ``open_clip_model.safetensors``, ``open_clip_config.json``, ``README.md`` (the model card, with the Hub's
YAML front matter: ``huggingface_hub.ModelCardData``) and ``SHA256SUMS`` (``sha256sum -c`` format) into a new
directory, verifies the written files against their sums, and refuses an ``out`` that exists: a release is never
overwritten. No released file names a path of the machine that built it: the base is named by its open_clip tag or
its release name and weights' sha256, the run by its recipe and the commit that trained it. The card's provenance
names the negft version and git commit that released it and those that computed its probe table, with each
probe's version (``negft.provenance``, as the ledger or ``selected.json`` records them). ``push``: a verified
release uploaded to the Hub as one commit.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from negft import models
from negft.checksums import SUMS, check_release, sha256, verify
from negft.config import ConfigError
from negft.data import manifests
from negft.io import atomic_path
from negft.provenance import code, describe
from negft.tables import metric_table
from negft.train.ledger import Ledger

CARD = "README.md"          # the file the Hub renders as a repository's model card
TASK = "zero-shot-image-classification"
TAGS = ["clip", "open_clip", "negation", "negft", TASK]
WORLD_DATASET = "negft-world"
# where the checkpoint sat in its run and the building machine's paths: meaningless once released
UNRELEASED = ("epoch_step", "step", "steps_per_epoch", "world_size", "run_dir", "world_dir", "finetuned", "base")
ABSOLUTE_PATH = re.compile(r"(?<![\w:/])/[^\s:;,()'\"`]+")


# --------------------------------------------------------------------------- what the release names
def base_of(info: dict) -> dict:
    """The base model as a release names it: {"tag", "name"} for an open_clip tag (name: the Hub repository
    open_clip downloads it from, where it names one), {"name", "sha256"} for a local base (its release name and
    its weights' digest, where they are still there to hash), {} for random init."""
    base = info.get("base") or ""
    if not base:
        return {}
    local = base.startswith(models.LOCAL_DIR)
    path = Path(base[len(models.LOCAL_DIR):] if local else base)
    if not (local or "/" in base or path.exists()):      # a tag never holds a /
        import open_clip
        hub = str(open_clip.get_pretrained_cfg(info.get("arch", ""), base).get("hf_hub", "")).strip("/")
        return {"tag": base, "name": hub or f"{info.get('arch', '?')}/{base}"}
    # a world base is cached as base/<recipe>-s<seed>-<size>-<key>/model (negft.train.world_base.world_base): that
    # entry's name says what trained it
    name = path.parent.name if path.name == "model" and path.parent.parent.name == "base" else path.name
    weights = path if path.is_file() else path / models.WEIGHTS_FILE
    return {"name": name, "sha256": sha256(weights) if weights.is_file() else None}


def _epoch(info: dict) -> int | None:
    """The epoch of the fine-tuned checkpoint a release holds (a patched model: the one it was patched from)."""
    if "patch" not in info:
        return info.get("epoch")
    name = Path(info.get("finetuned", "")).name
    return int(name.split("_")[1]) if name.startswith("epoch_") and name.split("_")[1].isdigit() else None


def run_of(info: dict, run: Path | None) -> dict:
    """The training run as a release names it: its recipe, the epoch released and the code that trained it (the
    run's ledger's provenance at that epoch), never its folder."""
    record = {"recipe": info.get("recipe"), "epoch": _epoch(info)}
    if run is not None and (run / "ledger.jsonl").exists():
        entry = {e["epoch"]: e for e in Ledger(run).read()}.get(record["epoch"]) or {}
        trained = entry.get("provenance") or {}
        record.update({k: trained[k] for k in ("negft_version", "git_commit", "git_dirty") if k in trained})
    return record


def world_of(info: dict) -> dict:
    """The embedded world a run trained on, by its folder's name, generator, seed, size and world.json's sha256."""
    folder = Path(info.get("world_dir", ""))
    meta = folder / "world.json"
    if not meta.is_file():
        return {"name": folder.name}
    w = json.loads(meta.read_text())
    return {"name": folder.name, "generator_version": w.get("generator_version"), "seed": w.get("seed"),
            "size": w.get("size"), "world_json_sha256": sha256(meta)}


def _streams(run: Path | None) -> dict:
    config = run / "config.yaml" if run is not None else None
    if config is None or not config.exists():
        return {}
    return (yaml.safe_load(config.read_text()) or {}).get("streams") or {}


def datasets_of(run: Path | None, info: dict) -> list[str]:
    """The card's ``datasets``: ``negft-world`` for the embedded world, else each stream's manifest (a stream read
    from ``urls`` alone: its name in the recipe)."""
    if info.get("data") == "world":
        return [WORLD_DATASET]
    return list(dict.fromkeys(s.get("manifest") or name for name, s in _streams(run).items()))


def released_info(info: dict, run: Path | None) -> dict:
    """The ``negft`` block of the released ``open_clip_config.json``: the checkpoint's record with its paths
    named as the card names them. The checkpoint's own record keeps them: patching and eval read them there."""
    out = {k: v for k, v in info.items() if k not in UNRELEASED}
    base = base_of(info)
    if base:
        out["base"] = base.get("tag") or base["name"]
        if base.get("sha256"):
            out["base_sha256"] = base["sha256"]
    out["run"] = run_of(info, run)
    if info.get("data") == "world":
        out["world"] = world_of(info)
    return out


# --------------------------------------------------------------------------- the card
@dataclass
class Probes:
    """The card's probe numbers, this model's beside its base's, and where they come from."""
    metrics: dict
    ci: dict
    base: dict
    base_ci: dict
    split: str
    source: str
    records: list           # the provenance each source evaluation records (None where it records none)

    def keys(self) -> list[str]:
        return [k for k in sorted(self.metrics) if k in self.base]


def _selection_rule(ckpt: Path, info: dict) -> str:
    """The rule a patching sweep chose α by (selected.json beside the patched checkpoint), or ""."""
    path = ckpt.parent / "selected.json"
    if "patch" not in info or not path.exists():
        return ""
    sel = json.loads(path.read_text())
    targets = ", ".join(f"`{t}`" for t in sel.get("targets", []))
    return f"{sel.get('rule', '')} (targets: {targets})" if sel.get("rule") else ""


def probes_of(ckpt: Path, info: dict, run: Path | None) -> Probes | str:
    """The probe results of the released model and its base, or why there are none."""
    if "patch" in info and (ckpt.parent / "selected.json").exists():
        selected = json.loads((ckpt.parent / "selected.json").read_text())
        sel = selected["test"]
        return Probes(sel["metrics"], sel["ci95"], sel["base_metrics"], sel["base_ci95"], "test",
                      "the patching sweep's `selected.json` (test split; α chosen on the val split)",
                      [selected.get("provenance")])
    if run is not None and (run / "ledger.jsonl").exists():
        entries = {e["epoch"]: e for e in Ledger(run).read()}
        mine = entries.get(info.get("epoch"))
        if 0 not in entries or mine is None:
            return "no ledger entries for epoch 0 and this checkpoint's epoch"
        split = ((yaml.safe_load((run / "config.yaml").read_text()) or {}).get("eval") or {}).get("split", "test")
        return Probes(mine["metrics"], mine["ci95"], entries[0]["metrics"], entries[0]["ci95"], split,
                      f"the run's `ledger.jsonl` ({split} split; epoch 0 = the base model, and epoch "
                      f"{info.get('epoch')})", [entries[0].get("provenance"), mine.get("provenance")])
    return "no evaluation found beside the checkpoint"


def eval_results(probes: Probes | str) -> list:
    """The card's ``model-index``: each metric of the probe table, this model's value, named
    ``<probe>/<dataset>/<metric>`` (README "Metrics"); NaN values (the table's –) left out."""
    from huggingface_hub import EvalResult
    if isinstance(probes, str):
        return []
    results = []
    for key in probes.keys():
        value = probes.metrics[key]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        probe, dataset, metric = (key.split("/", 2) + ["", ""])[:3]
        dataset = WORLD_DATASET if dataset == "world" else dataset
        # the Hub groups a model-index's results by task, dataset, config and split: the probe is the config
        results.append(EvalResult(task_type=TASK, dataset_type=dataset, dataset_name=dataset, dataset_config=probe,
                                  dataset_split=probes.split, metric_type=metric or key, metric_name=key,
                                  metric_value=value))
    return results


def _provenance_lines(records: list[dict | None]) -> list[str]:
    """The card's provenance of the code: what released it, and what computed the probe table's numbers."""
    lines = [f"- released with: {describe(_pathless(code()))}"]
    for text in dict.fromkeys(describe(_pathless(r)) for r in records):
        lines.append(f"- probe results computed by: {text}")
    return lines


def _pathless(record: dict | None) -> dict | None:
    """A provenance record whose ``git_note`` names folders (negft installed as a package) by their names alone."""
    if not record or not record.get("git_note"):
        return record
    return {**record, "git_note": ABSOLUTE_PATH.sub(lambda m: Path(m.group()).name, record["git_note"])}


def _data_lines(run: Path | None, info: dict) -> list[str]:
    if info.get("data") == "world":
        w = world_of(info)
        if "world_json_sha256" in w:
            return [f"- the embedded world, generator `{w['generator_version']}`, seed {w['seed']}, size "
                    f"`{w['size']}`; `world.json` sha256 `{w['world_json_sha256']}`"]
        return ["- the embedded world (its world.json was not found to hash)"]
    if run is None:
        return ["- unknown (the checkpoint is not inside a negft run directory)"]
    lines = []
    for name, s in _streams(run).items():
        manifest = manifests.path(s.get("manifest", ""))
        if s.get("manifest") and manifest.exists():
            lines.append(f"- stream `{name}`: manifest `{s['manifest']}` sha256 `{sha256(manifest)}`")
        else:       # a local shard pattern by its file name: its folder is the building machine's
            urls = str(s.get("urls", ""))
            lines.append(f"- stream `{name}`: urls `{urls if '://' in urls else Path(urls).name}` (no manifest)")
    return lines


def _objective_line(run: Path | None) -> list[str]:
    """The loss as the run's config.yaml set it: its name and the blocks it reads, terms that are off left out
    (each at the value its term declares off: ``negft.losses.off_values``)."""
    config = run / "config.yaml" if run is not None else None
    if config is None or not config.exists():
        return []
    from negft.losses import OBJECTIVES, off_values
    loss = (yaml.safe_load(config.read_text()) or {}).get("loss", {})
    name = loss.get("name", "?")
    blocks = OBJECTIVES[name].blocks() if name in OBJECTIVES else ()
    parts = [f"`loss.{b}.{k}` = {v}" for b in blocks for k, v in (loss.get(b) or {}).items()
             if k not in off_values(b) or v != off_values(b)[k]]
    return [f"- objective: `loss.name` = {name}" + (f" ({', '.join(parts)})" if parts else "")]


def _base_line(info: dict) -> str:
    base = base_of(info)
    if not base:
        where = "random init"
    elif "tag" in base:
        where = f"open_clip pretrained tag `{base['tag']}` (`{base['name']}`)"
    else:
        where = f"`{base['name']}`" + (f" (weights sha256 `{base['sha256']}`)" if base.get("sha256") else "")
    return f"- base model: `{info.get('arch', '?')}` from {where}"


def _trained_by(record: dict) -> str:
    commit = record.get("git_commit")
    if not commit:
        return "the commit that trained it not recorded"
    return f"trained at git commit {commit}" + (" (tracked files modified)" if record.get("git_dirty") else "")


def model_card(ckpt: Path, info: dict) -> str:
    """The card's text (the README.md body after its front matter)."""
    run = models.run_dir_of(ckpt, info)
    patch = info.get("patch")
    record = run_of(info, run)
    probes = probes_of(ckpt, info, run)
    lines = [
        f"# {info.get('recipe', 'negft')} fine-tune of {info.get('arch', '?')}", "",
        "Released with negft from a training run; load it with plain open_clip, from the Hub or from a folder:", "",
        "```python",
        "import open_clip",
        "model, _, preprocess = open_clip.create_model_and_transforms('hf-hub:ORG/NAME')   # or 'local-dir:PATH'",
        "tokenizer = open_clip.get_tokenizer('hf-hub:ORG/NAME')",
        "```", "",
        "## Provenance", "",
        _base_line(info),
        f"- recipe: `{info.get('recipe', '?')}` (trained towers: `{info.get('tower', '?')}`), {_trained_by(record)}",
        *_objective_line(run),
        "- checkpoint released: " + (f"a patch of the run's `epoch_{record['epoch']}`" if patch
                                     else f"the run's `epoch_{record['epoch']}`"),
        "- patching: " + (f"θ = (1 − α)·θ_base + α·θ_finetuned with α = {patch['alpha']} (the weight of the "
                          f"fine-tuned model), tower mode `{patch['tower']}`, from the run's `epoch_{record['epoch']}`"
                          if patch else "none (the fine-tuned weights as trained)"),
        *([f"- patching α selection rule: {rule}"] if (rule := _selection_rule(ckpt, info)) else []),
        *_provenance_lines([] if isinstance(probes, str) else probes.records),
        "", "## Training data", "", *_data_lines(run, info), "",
        "## Probe results against the base model", "",
    ]
    if isinstance(probes, str):
        lines.append(f"From {probes}.")
    else:
        lines += [f"From {probes.source}. 95% bootstrap intervals in brackets; Δ = this model − base.", ""]
        lines += metric_table([("base", probes.base, probes.base_ci), ("this model", probes.metrics, probes.ci)],
                              probes.keys(), reference=probes.base)
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


def hub_card(ckpt: Path, info: dict, license: str = "other"):
    """The model card as the Hub reads it (``huggingface_hub.ModelCard``): front matter, then ``model_card``."""
    from huggingface_hub import ModelCard, ModelCardData
    run = models.run_dir_of(ckpt, info)
    base = base_of(info)
    data = ModelCardData(
        library_name="open_clip", license=license, base_model=base.get("name"), tags=list(TAGS),
        datasets=datasets_of(run, info) or None, pipeline_tag=TASK,
        model_name=f"{info.get('recipe', 'negft')} fine-tune of {info.get('arch', '?')}",
        eval_results=eval_results(probes_of(ckpt, info, run)) or None)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{model_card(ckpt, info)}")


def release(ckpt: str | Path, out: str | Path, license: str = "other", overwrite: bool = False) -> Path:
    """Release checkpoint directory ``ckpt`` into the new directory ``out``; ``license``: the card's Hub license
    id. ``overwrite``: replace the release in ``out`` (a folder with ``SHA256SUMS``, or an empty one; nothing else),
    in one rename once the new one is whole."""
    src, dst = Path(ckpt), Path(out)
    if dst.exists() and not overwrite:
        raise FileExistsError(f"out '{dst}' exists: a release is never overwritten silently; choose a new out=, or "
                              "pass overwrite=true to replace the release there")
    if dst.exists() and not (dst.is_dir() and ((dst / SUMS).is_file() or not any(dst.iterdir()))):
        raise FileExistsError(f"out '{dst}' exists and is not a release (no {SUMS}): overwrite=true replaces a "
                              "release only; choose a new out=")
    for name in (models.WEIGHTS_FILE, models.CONFIG_FILE):
        if not (src / name).is_file():
            raise FileNotFoundError(f"ckpt '{src}' has no {name}: pass a checkpoint directory "
                                    f"(runs/RUN/checkpoints/epoch_N or a patch's selected/)")
    if not str(license).strip():
        raise ConfigError("bad value '' for 'license': pass a Hub license id (mit, apache-2.0, ...) or other")
    info = models.negft_info(src)
    with atomic_path(dst, directory=True, overwrite=overwrite) as staged:
        shutil.copyfile(src / models.WEIGHTS_FILE, staged / models.WEIGHTS_FILE)
        cfg = json.loads((src / models.CONFIG_FILE).read_text())
        cfg["negft"] = released_info(info, models.run_dir_of(src, info))
        (staged / models.CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
        hub_card(src, info, str(license).strip()).save(staged / CARD)
        names = (models.WEIGHTS_FILE, models.CONFIG_FILE, CARD)
        (staged / SUMS).write_text("".join(f"{sha256(staged / n)}  {n}\n" for n in names))
        bad = verify(staged)
        if bad or sha256(staged / models.WEIGHTS_FILE) != sha256(src / models.WEIGHTS_FILE):
            raise OSError(f"release verification failed for {bad or [models.WEIGHTS_FILE]}")
    return dst


# --------------------------------------------------------------------------- the Hub
def released_files(directory: Path) -> list[str]:
    """What a release holds: the files its ``SHA256SUMS`` lists, and that file."""
    lines = (directory / SUMS).read_text().splitlines()
    return [line.split(maxsplit=1)[1].lstrip("*") for line in lines if line.strip()] + [SUMS]


def _hub_offline() -> bool:
    """huggingface_hub reads HF_HUB_OFFLINE once, at import (``negft.models._hub_offline``): the variable as it is
    now counts too."""
    from huggingface_hub import constants
    return constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {
        "1", "ON", "YES", "TRUE"}


def push_to_hub(directory: str | Path, repo_id: str, private: bool = False, dry_run: bool = False) -> str:
    """Upload the release ``directory`` to the Hub model repository ``repo_id`` (created if absent) as one commit;
    returns its URL. Its ``SHA256SUMS`` is checked first; ``dry_run`` prints what would be uploaded and changes
    nothing. Without a token, or with the Hub out of reach, nothing is uploaded and the ``ConfigError`` says what
    to set."""
    directory = Path(directory)
    if len(repo_id.split("/")) != 2 or not all(repo_id.split("/")):
        raise ConfigError(f"bad value '{repo_id}' for 'push': pass the Hub repository as ORG/NAME")
    if not (directory / SUMS).is_file():
        raise ConfigError(f"push: '{directory}' is no release (no {SUMS}); make one with negft release ckpt=DIR "
                          f"out={directory}")
    check_release("push", directory)
    files = released_files(directory)
    url = f"https://huggingface.co/{repo_id}"
    if dry_run:
        print(f"[negft] dry run: would upload to {url} ({'private' if private else 'public'}):")
        for name in files:
            print(f"  {name}  {(directory / name).stat().st_size} bytes")
        return url
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError, HTTPError
    unreachable = ("push: the Hugging Face Hub cannot be reached, nothing was uploaded. Unset HF_HUB_OFFLINE and "
                   f"run where huggingface.co (or $HF_ENDPOINT) is reachable over the network")
    if _hub_offline():
        raise ConfigError(f"{unreachable} (HF_HUB_OFFLINE is set)")
    if get_token() is None:
        raise ConfigError("push: no Hugging Face token, nothing was uploaded. Set HF_TOKEN to a token that may "
                          "write to the repository, or log in once with `hf auth login` (`huggingface-cli login` "
                          "in older huggingface_hub)")
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=str(directory), allow_patterns=files,
                          commit_message=f"negft release ({len(files)} files)")
    except HfHubHTTPError as e:         # the Hub answered: a token it refuses, a repository of another owner
        raise ConfigError(f"push: the Hub refused the upload to {repo_id}: {str(e).splitlines()[0]}. Check that "
                          f"HF_TOKEN (or `hf auth login`'s token) may write to {repo_id.split('/')[0]}") from None
    except (ConnectionError, HTTPError) as e:
        raise ConfigError(f"{unreachable} ({type(e).__name__}: {e})") from None
    print(f"[negft] pushed {len(files)} files to {url}")
    return url
