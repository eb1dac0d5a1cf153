"""CC-Neg (Singh et al., WACV 2025, "Learning the Power of 'No'"): per CC3M image, its true caption against a
negated caption that is false of it.

Released layout (jaisidhsingh/CoN-CLIP @ 503388a; the files are hosted on Proton Drive, not in the repository, so
the layout is taken from its loader, ``src/data/evaluation_datasets.py`` ``CCNegEvalDataset``, its
``src/configs/__init__.py`` and ``ccneg_dataset/README.md``): one torch file, ``ccneg_preprocessed.pt``, in the
dataset folder (``configs.ccneg_root_folder``), holding a dict with

- ``image_paths``: a list of image paths as the authors' machine had them, under ``/workspace/datasets/cc3m/``,
  which the loader replaces by the dataset folder (``path.replace("/workspace/datasets/cc3m/", root + "/")``;
  the README puts the images in ``ccneg_images/cc3m_subset_images_extracted_final/`` there);
- ``annotations``: a list of the same length, row i's true caption ``annotations[i]["json"]["caption"]`` and its
  negated caption ``annotations[i]["sop_data"]["negative-prompt"]``, whose commas the loader removes
  (``.replace(",", "")``); negft reads it the same way for both metrics.

The evaluation split is the last 40,000 rows (``configs.num_ccneg_eval_samples``: "the last 40,000 indices
consist of the decided evaluation split for CC-Neg"; the rows before them are CoN-CLIP's fine-tuning data), or
every row of a shorter file, as the loader's ``[-40000:]`` gives. A path that does not start with the prefix is
taken as it is, a relative one under the dataset folder.

The file is opened with ``torch.load(weights_only=True)``, which reads tensors, dicts, lists, strings and numbers
and runs no code. A file it refuses (objects of other classes in its pickle) is skipped with the command that
converts it, once, on a user's explicit request (``negft data convert ccneg``, negft/convert/ccneg.py), to
``ccneg_preprocessed.json``: the same dict as JSON, which this reader then reads in its place.

Metrics (``ccneg/<dataset>/<metric>``), with s(t) the cosine similarity of the image and text t:

- ``acc`` (negft's rule): 1 when s(caption) > s(negated), 1/2 on an exact tie, 0 otherwise.
- ``acc_official``: CoN-CLIP's rule (README ``evaluate_clip_on_ccneg``): ``sim = [sim_true, sim_neg]``,
  ``preds = sim.argmax(dim=-1)``, correct when ``preds == 0``: ``argmax`` returns the first maximum, so a tie
  counts as right (equal scores give 1). They differ only on exact ties.
- A caption or negated caption that is "" (a negated caption of commas only becomes "" once they are removed) is
  scored as any text, under both rules: ``clip.tokenize`` reads "" as start and end tokens, and the reference's
  loop scores every row of the split.
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): rows of the split left out
  (an annotation not a dict, a caption or negated caption missing or not a string, an image path not a string,
  the image file not found: the reference stops with an error at each); ``skipped`` then has an entry
  ``<prefix>/rows`` counting them by reason.
"""
from __future__ import annotations

import os
import pickle
from collections import Counter
from pathlib import Path

import torch

from negft.models import refused_global
from negft.probes import register
from negft.probes.base import DataNotFound, Dataset, EvalContext, ProbeResult, parse_once, resolve
from negft.probes.released import read_json, rows_to_score
from negft.probes.similarity import caption_pair_scores
from negft.probes.stats import pair_credits

FILE = "ccneg_preprocessed.pt"
CONVERTED = "ccneg_preprocessed.json"       # negft data convert ccneg's output: the same dict as JSON
PREFIX = "/workspace/datasets/cc3m/"         # where the release's image paths start (the authors' machine)
EVAL_ROWS = 40000                            # configs.num_ccneg_eval_samples: the last rows are the test split
# why a row is skipped (parse_row)
NOT_AN_OBJECT = "annotation is not an object"
NO_CAPTION = "'json.caption' missing or not a non-empty string"       # fine-tuning rows (parse_row's default)
NO_NEGATED = "'sop_data.negative-prompt' missing or empty"
NOT_CAPTION = "'json.caption' missing or not a string"                # evaluation rows: "" is scored
NOT_NEGATED = "'sop_data.negative-prompt' missing or not a string"
NO_PATH = "image path not a non-empty string"


def refusal(path, error: Exception) -> str:
    """Why a torch file is not read, and the one command that converts it."""
    return (f"torch.load(weights_only=True) stopped at an object it does not load{refused_global(error)}: the file "
            f"holds more than tensors, dicts, lists, strings and numbers, and negft runs no code from a data file, so "
            f"nothing in it ran. If you trust where it came from, convert it once: "
            f"python -m negft data convert ccneg {path} {Path(path).parent / CONVERTED}")


def load(path) -> tuple:
    """(the dict of CC-Neg's torch file, or of its JSON conversion, "") or (None, why it cannot be read): the one
    reading of the file, for this probe and the fine-tuning split's converter (negft/convert/ccneg_train.py)."""
    if Path(path).suffix == ".json":
        return read_json(path, dict)
    try:
        return torch.load(path, map_location="cpu", weights_only=True), ""
    except pickle.UnpicklingError as e:
        return None, refusal(path, e)
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        return None, f"unreadable torch file ({type(e).__name__}: {e})"


def _rows(path) -> list:
    data, why = load(path)
    return [("file", why)] if data is None else rows_of(data)


def rows_of(data, split: str = "test") -> list:
    """[(index, image path, annotation)] of the evaluation split (``split="train"``: of the fine-tuning split, every
    row before it, as CoN-CLIP's ``FineTuningDataset`` slices ``[:len - 40000]``), or [("file", reason)]."""
    paths = data.get("image_paths") if isinstance(data, dict) else None
    annotations = data.get("annotations") if isinstance(data, dict) else None
    if not isinstance(paths, list) or not isinstance(annotations, list):
        found = f"a dict with keys {sorted(map(str, data))[:8]}" if isinstance(data, dict) else type(data).__name__
        return [("file", f"expected a dict with the lists 'image_paths' and 'annotations', found {found}")]
    if len(paths) != len(annotations):
        return [("file", f"'image_paths' has {len(paths)} entries and 'annotations' {len(annotations)}: rows cannot "
                         "be paired")]
    start = max(0, len(paths) - EVAL_ROWS)
    rows = range(start) if split == "train" else range(start, len(paths))
    return [(i, paths[i], annotations[i]) for i in rows]


def _text(annotation: dict, outer: str, inner: str) -> str | None:
    """``annotation[outer][inner]`` when it is a string ("" included: the reference tokenizes it), else None."""
    value = annotation.get(outer)
    value = value.get(inner) if isinstance(value, dict) else None
    return value if isinstance(value, str) else None


def parse_row(index: int, image, annotation, empty_ok: bool = False) -> dict | str:
    """The row's image path as released, caption and negated caption (commas removed, as CoN-CLIP's loaders do), or
    why it cannot be used: this probe and the fine-tuning split's converter skip a row by this reason. ``empty_ok``
    (the probe): a text that is or becomes "" is kept, as the reference's evaluation scores it; the converter
    keeps no empty training text (nothing to learn from)."""
    if not isinstance(annotation, dict):
        return NOT_AN_OBJECT
    caption = _text(annotation, "json", "caption")
    negated = _text(annotation, "sop_data", "negative-prompt")
    negated = None if negated is None else negated.replace(",", "")      # the loader's replace
    if caption is None or not (empty_ok or caption.strip()):
        return NOT_CAPTION if empty_ok else NO_CAPTION
    if negated is None or not (empty_ok or negated.strip()):
        return NOT_NEGATED if empty_ok else NO_NEGATED
    if not isinstance(image, str) or not image:
        return NO_PATH
    return {"index": index, "image": image, "caption": caption, "negated": negated}


def image_path(root, path: str) -> str:
    """A release's image path on this machine: the loader's prefix replaced by the dataset folder ``root``."""
    return resolve(root, path.replace(PREFIX, f"{root}/"))


def source(dataset: Dataset) -> Path:
    """The file read: negft's converted one when the dataset has it, else the release's."""
    converted = dataset.root / CONVERTED
    return converted if converted.exists() else dataset.root / FILE


def read(dataset: Dataset) -> tuple[list[dict], Counter, Path]:
    """(rows of the evaluation split that can be scored, skipped rows by reason, the file read); DataNotFound
    when there is no file, ValueError with the reason when it cannot be read."""
    path = source(dataset)
    if not path.exists():
        raise DataNotFound(dataset, dataset.root / FILE)
    parsed = parse_once(path, _rows)
    if parsed and parsed[0][0] == "file":
        raise ValueError(f"{path}: {parsed[0][1]}")
    rows, skipped = [], Counter()
    for index, image, annotation in parsed:
        row = parse_row(index, image, annotation, empty_ok=True)
        if isinstance(row, dict):
            row["image"] = image_path(dataset.root, row["image"])
            if not os.path.isfile(row["image"]):
                row = "image file not found"
        if isinstance(row, str):
            skipped[row] += 1
            continue
        rows.append(row)
    return rows, skipped, path


def caption_pairs(rows: list[dict]) -> list[str]:
    """Each row's caption and negated caption, row by row: what ``run`` encodes."""
    return [t for r in rows for t in (r["caption"], r["negated"])]


def texts(dataset: Dataset) -> list[str]:
    try:
        return caption_pairs(read(dataset)[0])
    except (DataNotFound, ValueError):
        return []


@register("ccneg", texts=texts, version=2, metrics=("acc",))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    prefix = f"ccneg/{dataset.name}"
    rows = rows_to_score(result, prefix, lambda: read(dataset)[:2], source(dataset))
    if rows is None:
        return result
    pos, neg = caption_pair_scores(ctx, [r["image"] for r in rows], caption_pairs(rows))
    tie_aware, official = pair_credits(pos, neg, tie_to_positive=True)     # CoN-CLIP's argmax, true caption first
    result.add_rules(f"{prefix}/acc", (tie_aware, official), ctx.n_boot)
    result.records[prefix] = [{"index": r["index"], "image": r["image"], "caption": r["caption"],
                               "negated": r["negated"], "pos": round(float(p), 5), "neg": round(float(q), 5),
                               "credit": float(c)} for r, p, q, c in zip(rows, pos, neg, tie_aware)]
    return result
