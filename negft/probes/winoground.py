"""Winoground (Thrush et al., CVPR 2022): two images and two captions with the same words in a different order;
match each caption to its image.

Released layout (facebook/winoground on Hugging Face, as its dataset card describes it: "The captions and tags
are located in ``data/examples.jsonl`` and the images are located in ``data/images.zip``"; read as
``os.path.join("data/images", example[key]) + ".png"`` by public evaluation code, and
ajd12342/why-winoground-hard README: "Place ``examples.jsonl`` and the extracted directory ``images`` inside
``dataset``"): ``examples.jsonl``, one JSON object a line with ``id, caption_0, caption_1, image_0, image_1,
tag, secondary_tag, num_main_preds, collapsed_tag``; ``image_k`` is a file stem (``ex_0_img_0``) of
``images/<stem>.png`` beside it. Here the dataset's root holds ``examples.jsonl`` and ``images/``
(negft/data_manifests/winoground.yaml); a name that already has an extension is used as it is.

Metrics (``winoground/<dataset>/<metric>``), with s(c, i) the cosine similarity of caption c and image i:

- ``text``: s(c0, i0) > s(c1, i0) and s(c1, i1) > s(c0, i1) (each image picks its caption);
  ``image``: s(c0, i0) > s(c0, i1) and s(c1, i1) > s(c1, i0) (each caption picks its image);
  ``group``: both. negft's rule: an exact tie is broken at random, and the score is the expected value over the
  24 orders of the four scores (``relcomp.winoground_scores``), so a constant model scores Winoground's chance
  levels, text 1/4, image 1/4, group 1/6 (the four scores in random order: each of text and image is two
  independent halves, 1/2 · 1/2; group needs s(c0,i0) and s(c1,i1) to be the two largest, 2!·2!/4! = 1/6).
  Half credit per tied comparison with the conjunction as a product would give the same 1/4 for text and
  image but 1/16 for group, below chance, since the four comparisons of the group share their scores.
- ``text_official``, ``image_official``, ``group_official``: the same inequalities strict, as Winoground's
  ``statistics/compute_statistics.py`` (``text_correct`` / ``image_correct`` / ``group_correct``) and the
  paper define them: a tie fails, so a constant model scores 0. They differ only on exact ties.
- ``<score>_<tag>`` and ``<score>_<tag>_official`` over the subsets of the paper's tables, selected as
  compute_statistics.py's ``filter_examples`` selects them, by equality of a field with one value:

  - each ``collapsed_tag`` present (``object``, ``relation``, ``both``): the linguistic breakdown;
  - each ``secondary_tag`` present (``symbolic``, ``pragmatics``, ``series``, ``morpheme_level``): the visual
    breakdown. The release writes an example's secondary tags as one string, ``", "``-separated (``"Symbolic,
    Series"``), empty for none; ``filter_examples({"secondary_tag": "Symbolic"})`` keeps the examples whose
    string *is* ``"Symbolic"``, so an example with several tags is in none of these subsets and one with none in
    none (counted under each tag it lists, the release has 41 / 24 / 31 examples of Symbolic / Pragmatics /
    Series; these subsets are smaller). A tag that appears only alongside others gives no subset;
  - each ``num_main_preds`` present: ``<score>_preds1``, ``<score>_preds2`` (``filter_examples({"num_main_preds":
    1})``).

  Names follow ``collapsed_tag``'s: lower case, anything but letters and digits as ``_``. A field that is missing,
  not the type the release gives it (a string; a positive integer), or names no tag leaves its example out of
  that breakdown only (still scored overall), and ``skipped`` has an entry ``<prefix>/tags`` counting such fields
  by reason; so does a secondary tag whose name a collapsed tag already has.
- ``skipped_rows`` (only when lines were skipped; a count, not a per-example metric): lines left out (not JSON,
  not an object, a caption or image name missing, an image file not found); ``skipped`` then has an entry
  ``<prefix>/rows`` saying how many and why.
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter

import torch

from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult, parse_once, require, resolve
from negft.probes.relcomp import add_pair_scores, captions
from negft.probes.released import bad_object, report_skips
from negft.probes.similarity import grid_scores

FILE = "examples.jsonl"
IMAGES = "images"
KEYS = ("caption_0", "caption_1", "image_0", "image_1")


def _lines(path) -> list:
    """Each line parsed, or None where it is not JSON."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append(None)
    return out


def image_path(dataset: Dataset, name: str) -> str:
    """``images/<name>.png`` under the root (the release's stems), or ``images/<name>`` if it has an extension."""
    return resolve(dataset.root, os.path.join(IMAGES, name if os.path.splitext(name)[1] else f"{name}.png"))


def _bad(row) -> str | None:
    return "line is not JSON" if row is None else bad_object(row, KEYS, "line")


def read_examples(dataset: Dataset) -> tuple[list[dict], Counter]:
    """(examples that can be scored, skipped lines by reason); the file must exist."""
    rows, skipped = [], Counter()
    for row in parse_once(dataset.root / FILE, _lines):
        why = _bad(row)
        if why is None:
            images = [image_path(dataset, row[k]) for k in ("image_0", "image_1")]
            if not all(os.path.isfile(p) for p in images):
                why = "image file not found"
        if why is not None:
            skipped[why] += 1
            continue
        tag, problem = _collapsed_tag(row)
        secondary, secondary_problem = _secondary_tags(row)
        preds, preds_problem = _main_preds(row)
        rows.append({"id": row.get("id"), "caption_0": row["caption_0"], "caption_1": row["caption_1"],
                     "image_0": images[0], "image_1": images[1],
                     "collapsed_tag": tag, "secondary_tag": secondary, "num_main_preds": preds,
                     "tag_problems": [p for p in (problem, secondary_problem, preds_problem) if p]})
    return rows, skipped


def _tag(tag) -> str | None:
    """A tag as a metric-name part: ``Object`` -> ``object``, ``Morpheme-Level`` -> ``morpheme_level``; None when
    absent or empty."""
    name = re.sub(r"[^a-z0-9]+", "_", tag.lower()).strip("_") if isinstance(tag, str) else ""
    return name or None


def _collapsed_tag(row: dict) -> tuple[str | None, str | None]:
    """(``collapsed_tag`` as a metric-name part, why it is unusable)."""
    value = row.get("collapsed_tag")
    if not isinstance(value, str):
        return None, "collapsed_tag missing" if "collapsed_tag" not in row else "collapsed_tag not a string"
    name = _tag(value)
    return name, None if name else "collapsed_tag names no tag"


def _secondary_tags(row: dict) -> tuple[list[str] | None, str | None]:
    """(``secondary_tag``'s tags as metric-name parts, [] for none; why it is unusable). The release separates
    an example's tags with ``", "``; None where the field cannot be read."""
    value = row.get("secondary_tag")
    if not isinstance(value, str):
        return None, "secondary_tag missing" if "secondary_tag" not in row else "secondary_tag not a string"
    names = [_tag(part) for part in value.split(",") if part.strip()]
    if None in names:
        return None, "secondary_tag names no tag"
    return names, None


def _main_preds(row: dict) -> tuple[int | None, str | None]:
    """(``num_main_preds``, why it is unusable): a positive integer, as released (1 or 2)."""
    value = row.get("num_main_preds")
    if isinstance(value, float) and value.is_integer():
        value = int(value)                              # equal to the int in compute_statistics.py's filter
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None, ("num_main_preds missing" if "num_main_preds" not in row
                      else "num_main_preds not a positive integer")
    return value, None


def subsets(rows: list[dict]) -> tuple[dict[str, torch.Tensor], Counter]:
    """(metric-name part -> mask of the examples in that breakdown, unusable tag fields by reason), each subset
    as compute_statistics.py's ``filter_examples`` selects it: the field equal to one value (module docstring)."""
    out, problems = {}, Counter(p for r in rows for p in r["tag_problems"])

    def add(name: str, selected: list[bool]) -> None:
        out[name] = torch.tensor(selected)

    for tag in sorted({r["collapsed_tag"] for r in rows if r["collapsed_tag"]}):
        add(tag, [r["collapsed_tag"] == tag for r in rows])
    for tag in sorted({r["secondary_tag"][0] for r in rows if r["secondary_tag"] and len(r["secondary_tag"]) == 1}):
        if tag in out:
            problems[f"secondary_tag '{tag}' has the name of a collapsed_tag"] += 1
            continue
        add(tag, [r["secondary_tag"] == [tag] for r in rows])
    for n in sorted({r["num_main_preds"] for r in rows if r["num_main_preds"] is not None}):
        add(f"preds{n}", [r["num_main_preds"] == n for r in rows])
    return out, problems


def texts(dataset: Dataset) -> list[str]:
    if not (dataset.root / FILE).exists():
        return []
    return captions(read_examples(dataset)[0])


@register("winoground", texts=texts, version=2, metrics=(
    "text", "image", "group", "text_<x>", "image_<x>", "group_<x>", "text_preds<n>", "image_preds<n>",
    "group_preds<n>"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    prefix = f"winoground/{dataset.name}"
    path = require(dataset, dataset.root / FILE)
    rows, skipped = read_examples(dataset)
    report_skips(result, prefix, path, skipped, len(rows) + sum(skipped.values()), unit="lines")
    if not rows:
        result.skipped.setdefault(prefix, f"no example to score in {path}")
        return result
    n = len(rows)
    images = ctx.encode_images([r[k] for r in rows for k in ("image_0", "image_1")]).view(n, 2, -1)
    encoded = ctx.encode_texts(captions(rows)).view(n, 2, -1)
    s = grid_scores(encoded, images)
    masks, problems = subsets(rows)
    if problems:
        result.skipped[f"{prefix}/tags"] = ("left out of the tag breakdowns (scored overall): "
                                            + ", ".join(f"{k}: {v}" for k, v in sorted(problems.items())))
    scores = add_pair_scores(result, prefix, s, masks, ctx.n_boot)
    result.records[prefix] = [
        {"id": r["id"], "collapsed_tag": r["collapsed_tag"], "secondary_tag": r["secondary_tag"],
         "num_main_preds": r["num_main_preds"], "caption_0": r["caption_0"], "caption_1": r["caption_1"],
         "image_0": r["image_0"], "image_1": r["image_1"],
         "scores": [[round(float(v), 5) for v in row] for row in s[i]],
         **{name: float(v[i]) for name, v in scores[""].items()}}
        for i, r in enumerate(rows)]
    return result
