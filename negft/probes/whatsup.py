"""What's Up (Kamath, Hessel and Chang, EMNLP 2023, "What's "up" with vision-language models? Investigating their
struggle with spatial reasoning"): pick the caption that states an image's spatial relation among captions that
differ only in the preposition, in six subsets.

Released layout (amitakamath/whatsup_vlms @ 7c1f255 ``dataset_zoo/aro_datasets.py`` ``Controlled_Images``,
``COCO_QA``, ``VG_QA`` and ``main_aro.py``; the JSON files and images are on Google Drive, not in the repository,
so the layout is the loaders'): one folder (the reference's ``data/``, ``dataset_zoo/constants.py`` ``ARO_ROOT``)
holding

- ``controlled_images_dataset.json`` (Controlled_Images_A, photographs) and ``controlled_clevr_dataset.json``
  (Controlled_Images_B, CLEVR renders): a JSON list of ``{"image_path", "caption_options"}``, four captions of one
  object pair that differ in the preposition, the right one first (README: "the first option is always the correct
  one"): "A beer bottle on a armchair", "... under a armchair", "... to the left of a armchair", "... to the right
  of a armchair" (A: on, under, left, right; B: in front, behind, left, right). ``image_path`` is relative to the
  reference repository's working directory, ``data/controlled_images/beer-bottle_on_armchair.jpeg``
  (``Image.open(test_case["image_path"])``): here a leading ``data/`` stands for the dataset's root. The file
  name is ``<object 1>_<relation>_<object 2>.<ext>`` with the relation ``on``, ``under``, ``left_of``,
  ``right_of`` (A) or ``in-front_of``, ``behind`` (B); the reference reads the set (one object pair) and the
  relation from it: ``name.split('_')[0]`` and ``name.split('_')[-1][:-5]`` (the extension ``.jpeg`` cut) the
  set, ``name.split('_')[1]`` the relation.
- ``coco_qa_one_obj.json``, ``coco_qa_two_obj.json`` (COCO-spatial) and ``vg_qa_one_obj.json``,
  ``vg_qa_two_obj.json`` (GQA-spatial, on Visual Genome images): a JSON list of ``[image id, right caption,
  wrong caption]``; the image is ``val2017/<id as 12 digits>.jpg`` (COCO) or ``vg_images/<id>.jpg`` (VG) under
  the root.

Metrics (``whatsup/<dataset>/<subset>...``, subsets ``controlled_a``, ``controlled_b``, ``coco_qa_one``,
``coco_qa_two``, ``vg_qa_one``, ``vg_qa_two``), with s(t) the cosine similarity of the image and caption t
(``negft.probes.similarity``, so equal captions score equal):

- ``<subset>`` (negft): the credit of the right caption among the options, 1/k when it ties k − 1 others at the
  maximum (chance 1/4 on the controlled sets, 1/2 on the QA sets).
- ``<subset>_official``: the reference's "Individual accuracy" (``evaluate_scores``): ``np.argmax`` over the
  options == 0, which gives every tie to the right caption, listed first: equal scores give 1.
- ``controlled_<x>_pair`` / ``_set`` (negft): a pair is the two images of one object pair in opposite relations
  (left and right; on and under, or in front and behind), a set its four images. Credit: the product of the
  images' credits (the chance that both, or all four, are right when ties are broken at random), averaged over
  the pairs and sets whose images are all present.
- ``controlled_<x>_pair_official`` / ``_set_official``: the reference's "Pair accuracy" and "Set accuracy" as
  fractions (it prints percent): the object pairs' count of opposite relations both right (argmax == 0), over
  N / 2, and the count of object pairs with all four right, over N / 4, N the rows scored. A relation an object
  pair lacks counts as wrong, and when one (object pair, relation) has several rows the last one counts, as
  the reference's ``eval_dict`` keeps it.
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): rows left out (not an
  object / a list of three; a caption or image name missing or empty; four captions expected and not given; a
  controlled file name that names no relation of its subset; the image file not found); ``skipped`` has an
  entry ``<prefix>/<subset>/rows`` per file naming it and counting them by reason. The reference reads no such
  row (it stops with an error), so ``_official`` counts only rows scored.

- ``<subset>_prep_<preposition>`` (negft: the mean credit) and ``..._official`` (the mean of argmax == 0): accuracy
  per preposition, as ``evaluate_scores`` logs it per subset ("Preposition", "Accuracy", "Count"), each row's
  preposition found as the reference finds it (``preposition``): on a controlled row from its ``image_path``
  (``left_of``, ``right_of``, then ``on`` for ``_on_`` and ``under`` for anything else in A; ``in-front_of`` and
  ``behind`` for the last two in B), on a QA row from its right caption (one object: its last word; two objects:
  ``left`` for "left of", ``right`` for "right of", then ``above`` / ``below`` on COCO, ``front`` / ``behind`` /
  ``top`` on VG). The preposition is written in the metric name in lower case with ``_`` for anything else
  (``in-front_of`` -> ``in_front_of``).

A subset whose file is absent is skipped with its path; an unreadable file (not JSON, not a list) is skipped with
the reason; the other subsets still run.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from functools import partial

import torch

from negft.probes import register
from negft.probes.aro import first_max
from negft.probes.base import Dataset, EvalContext, ProbeResult, resolve
from negft.probes.released import count_skips, file_rows, parsed_rows, read_json
from negft.probes.similarity import option_scores
from negft.probes.stats import choice_credit

RELEASE_DIR = "data/"       # the reference's working-directory prefix of image_path: the dataset's root
CONTROLLED = {              # subset -> (file, the relation pairs of a set, as the file names spell them)
    "controlled_a": ("controlled_images_dataset.json", (("left", "right"), ("on", "under"))),
    "controlled_b": ("controlled_clevr_dataset.json", (("left", "right"), ("in-front", "behind"))),
}
QA = {                      # subset -> (file, image folder, image file name of an id)
    "coco_qa_one": ("coco_qa_one_obj.json", "val2017", lambda i: f"{str(i).zfill(12)}.jpg"),
    "coco_qa_two": ("coco_qa_two_obj.json", "val2017", lambda i: f"{str(i).zfill(12)}.jpg"),
    "vg_qa_one": ("vg_qa_one_obj.json", "vg_images", lambda i: f"{i}.jpg"),
    "vg_qa_two": ("vg_qa_two_obj.json", "vg_images", lambda i: f"{i}.jpg"),
}
SUBSETS = (*CONTROLLED, *QA)
N_OPTIONS = 4               # a controlled row's captions


def _text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def set_and_relation(image_path: str) -> tuple[tuple[str, str], str]:
    """(the object pair, the relation) a controlled file name gives, read as the reference reads them."""
    parts = image_path.split("/")[-1].split("_")
    return (parts[0], parts[-1][:-5]), parts[1] if len(parts) > 2 else ""


def _controlled_row(row, root: str, relations: frozenset) -> tuple[dict | None, str | None]:
    if not isinstance(row, dict):
        return None, "row is not an object"
    if not _text(row.get("image_path")):
        return None, "'image_path' missing or not a non-empty string"
    options = row.get("caption_options")
    if not (isinstance(options, list) and len(options) == N_OPTIONS and all(map(_text, options))):
        return None, f"'caption_options' is not a list of {N_OPTIONS} non-empty strings"
    group, relation = set_and_relation(row["image_path"])
    if relation not in relations:
        return None, "file name names no relation of the subset (<object>_<relation>_<object>.<ext>)"
    image = resolve(root, row["image_path"].removeprefix(RELEASE_DIR))
    if not os.path.isfile(image):
        return None, "image file not found"
    return {"image": image, "image_path": row["image_path"], "options": list(options), "set": group,
            "relation": relation}, None


def _qa_row(row, root: str, folder: str, name) -> tuple[dict | None, str | None]:
    if not (isinstance(row, list) and len(row) == 3):
        return None, "row is not a list [image id, right caption, wrong caption]"
    image_id = row[0]
    if isinstance(image_id, bool) or not (isinstance(image_id, int) or _text(image_id)):
        return None, "image id is not an integer or a non-empty string"
    if not (_text(row[1]) and _text(row[2])):
        return None, "a caption missing or not a non-empty string"
    image = os.path.join(root, folder, name(image_id))
    if not os.path.isfile(image):
        return None, "image file not found"
    return {"image": image, "image_path": os.path.join(folder, name(image_id)), "options": [row[1], row[2]]}, None


def _parse(path, row_fn) -> list:
    """[(row,)] for a row that can be scored, (None, reason) for another, [("file", reason)] for a file that is
    not a JSON list (``released.parsed_rows``)."""
    data, why = read_json(path, list)
    if data is None:
        return [("file", why)]
    root = os.path.dirname(os.fspath(path))
    return [(out,) if bad is None else (None, bad) for out, bad in (row_fn(row, root) for row in data)]


def _controlled_parser(pairs):
    relations = frozenset(r for pair in pairs for r in pair)
    return partial(_parse, row_fn=lambda row, root: _controlled_row(row, root, relations))


# one parser per subset, made once: parse_once keys its cache by the function
PARSERS = {**{s: _controlled_parser(pairs) for s, (_, pairs) in CONTROLLED.items()},
           **{s: partial(_parse, row_fn=lambda row, root, f=folder, n=name: _qa_row(row, root, f, n))
              for s, (_, folder, name) in QA.items()}}


def file_of(subset: str) -> str:
    return (CONTROLLED.get(subset) or QA[subset])[0]


def read_subset(dataset: Dataset, subset: str) -> tuple[list[dict], Counter, str | None]:
    """(rows that can be scored, rows skipped by reason, why the whole file is skipped or None)."""
    rows, skipped, why = parsed_rows(dataset, dataset.root / file_of(subset), PARSERS[subset])
    return [row for row, in rows], skipped, why


def _options(rows: list[dict]) -> list[str]:
    return [t for r in rows for t in r["options"]]


def texts(dataset: Dataset) -> list[str]:
    return [t for subset in SUBSETS for t in _options(read_subset(dataset, subset)[0])]


def pairs_and_sets(rows: list[dict], credit: torch.Tensor, right: torch.Tensor, pairs) -> dict:
    """negft's and the reference's pair and set accuracy of one controlled subset: {metric: per-example values
    or None where nothing can be averaged}. ``credit``: each row's tie-aware credit; ``right``: argmax == 0."""
    table: dict[tuple, dict[str, int]] = {}
    for k, r in enumerate(rows):                  # the last row of a (set, relation) counts, as in eval_dict
        table.setdefault(r["set"], {})[r["relation"]] = k
    pair_credit, set_credit, pairs_right, sets_right = [], [], [], []
    for relation in table.values():
        both = [(relation[a], relation[b]) for a, b in pairs if a in relation and b in relation]
        pair_credit += [credit[i] * credit[j] for i, j in both]
        pairs_right.append(sum(bool(right[i] and right[j]) for i, j in both))
        four = [relation[r] for pair in pairs for r in pair if r in relation]
        if len(four) == 2 * len(pairs):
            set_credit.append(torch.prod(credit[four]))
        sets_right.append(float(len(four) == 2 * len(pairs) and bool(right[four].all())))
    n, g = len(rows), len(table)
    # the reference divides by N / 2 and N / 4: per object pair, its count reweighted so the mean is that ratio
    return {"pair": torch.stack(pair_credit) if pair_credit else None,
            "set": torch.stack(set_credit) if set_credit else None,
            "pair_official": torch.tensor(pairs_right, dtype=torch.float64) * g / (n / 2),
            "set_official": torch.tensor(sets_right, dtype=torch.float64) * g / (n / 4)}


def preposition(row: dict, subset: str) -> str:
    """A row's preposition as ``evaluate_scores`` finds it: tests on a controlled row's ``image_path`` as released,
    in the reference's order, or on a QA row's right caption."""
    if subset in CONTROLLED:
        path = row["image_path"]
        if "left_of" in path:
            return "left_of"
        if "right_of" in path:
            return "right_of"
        if subset == "controlled_a":
            return "on" if "_on_" in path else "under"
        return "in-front_of" if "_in-front_of_" in path else "behind"
    caption = row["options"][0]
    if subset.endswith("_one"):
        return caption.split()[-1]
    for words, name in (("left of", "left"), ("right of", "right")):
        if words in caption:
            return name
    if subset.startswith("coco"):
        return "above" if "above" in caption else "below"
    return "front" if "front of" in caption else "behind" if "behind" in caption else "top"


def metric_part(word: str) -> str:
    """A preposition as a metric-name part: lower case, ``_`` for anything else (``in-front_of`` -> ``in_front_of``)."""
    return re.sub(r"[^a-z0-9]+", "_", word.lower()).strip("_") or "none"


def by_preposition(result: ProbeResult, key: str, rows: list[dict], subset: str, credit: torch.Tensor,
                   right: torch.Tensor, n_boot: int) -> None:
    """``<key>_prep_<p>`` (mean credit) and ``_official`` (mean of argmax == 0) per preposition, as the reference
    logs "Accuracy" per "Preposition" (``np.unique`` of them: two spelled alike after ``metric_part`` are pooled)."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(metric_part(preposition(r, subset)), []).append(i)
    for name, idx in sorted(groups.items()):
        result.add(f"{key}_prep_{name}", credit[idx], n_boot)
        result.add(f"{key}_prep_{name}_official", right[idx].double(), n_boot)


def score_subset(ctx: EvalContext, dataset: Dataset, subset: str, prefix: str, result: ProbeResult) -> int:
    """One subset's metrics into ``result``; returns the number of rows skipped."""
    key, path = f"{prefix}/{subset}", dataset.root / file_of(subset)
    rows, n_skipped = file_rows(result, key, read_subset(dataset, subset), path)
    if rows is None:
        return n_skipped
    k = len(rows[0]["options"])
    images = ctx.encode_images([r["image"] for r in rows])
    options = ctx.encode_texts(_options(rows)).view(len(rows), k, -1)
    scores = option_scores(images, options).double()
    credit = choice_credit(scores, torch.zeros(len(rows), dtype=torch.long)).double()
    right = first_max(scores)[:, 0]          # np.argmax == 0: the first of the tied maxima, the right caption
    result.add_rules(key, (credit, right), ctx.n_boot)
    by_preposition(result, key, rows, subset, credit, right, ctx.n_boot)
    if subset in CONTROLLED:
        for name, values in pairs_and_sets(rows, credit, right, CONTROLLED[subset][1]).items():
            if values is None:
                result.skipped[f"{key}_{name}"] = f"no complete {name} of images in {path}"
            else:
                result.add(f"{key}_{name}", values, ctx.n_boot)
    result.records[key] = [{"image_path": r["image_path"], "options": r["options"],
                            "scores": [round(float(v), 5) for v in s], "credit": float(c)}
                           for r, s, c in zip(rows, scores, credit)]
    return n_skipped


@register("whatsup", texts=texts, version=2, metrics=(
    "controlled_a", "controlled_a_pair", "controlled_a_set", "controlled_b", "controlled_b_pair", "controlled_b_set",
    "coco_qa_one", "coco_qa_two", "vg_qa_one", "vg_qa_two", *(f"{s}_prep_<x>" for s in SUBSETS)))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    prefix = f"whatsup/{dataset.name}"
    n_skipped = sum(score_subset(ctx, dataset, subset, prefix, result) for subset in SUBSETS)
    count_skips(result, prefix, n_skipped)
    return result
