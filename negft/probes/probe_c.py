"""Probe-C (the Probe-R/C/B paper, section 3.2, equations 4-6, figure 4): compositional understanding,
Winoground-style, read from the release's files.

Released layout (DeepLearningRobustnessStudies/UnderstandingVisualTextModels,
``core/eval_compositional_understanding.py`` and ``new_datasets/README.md``; paths in negft.data.layout_rcb):
``data/coco/data_compositional_switch.json`` (kind ``composition``: an attribute swapped for its antonym,
"a small dog" / "a large dog") and ``data/coco/data_object_switch.json`` (kind ``object``: the object swapped,
"a small dog" / "a small boy"), each a list of ``{img1_prompt, img1_id, img1_composition, img1_object, img2_id,
img2_prompt, img2_composition, img2_object}``; images ``data/coco/val2014/COCO_val2014_<id, 12 digits>.jpg`` (a
``.png`` of the same stem is accepted). Prompt k is true of image k only. A row that is not an object with both
prompts as non-empty strings and both ids, or whose image is missing, is skipped and counted
(``probe_c/<dataset>/skipped_rows``, only when rows were skipped, and ``skipped``); a file that cannot be read
is skipped with its reason.

Metrics ``probe_c/<dataset>/<metric>``, over both files and per kind (``<metric>_composition``,
``<metric>_object``), with s(p, x) the cosine similarity (negft) or the release's
logit ``logit_scale · cos(p, x)`` (``_official`` and ``confidence``):

- ``text`` / ``image`` / ``group`` (negft, ``relcomp.winoground_scores``): Winoground's text score
  [s(p1,x1) > s(p2,x1) and s(p2,x2) > s(p1,x2)], image score [s(p1,x1) > s(p1,x2) and s(p2,x2) > s(p2,x1)] and
  group score (both), with exact ties broken at random in expectation, so all-equal scores give chance
  (1/4, 1/4, 1/6);
- ``text_official`` / ``image_official`` / ``group_official`` (the release, ``eval_clip``: strict ``>`` in every
  comparison, ``relcomp.winoground_official``), so a tie is a failure and all-equal scores give 0. They differ
  only on ties.
- ``confidence``: the release's mean softmax of the matching prompt,
  (softmax(s(p1,x1), s(p2,x1))[0] + softmax(s(p2,x2), s(p1,x2))[0]) / 2 (its README; no tie rule involved).

Where ours differs from the release otherwise: pairs are scored in batches rather than at batch size 1 (the
scores are the same), and bad rows are counted and skipped where the release would stop.
"""
from __future__ import annotations

from collections import Counter

import torch

from negft.data import layout_rcb
from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult
from negft.probes.released import bad_object, parsed_rows, read_json, report_skips
from negft.probes.relcomp import winoground_official, winoground_scores
from negft.probes.similarity import grid_scores

KINDS = tuple(layout_rcb.PROBE_C_FILES)


def _bad(row) -> str | None:
    why = bad_object(row, ("img1_prompt", "img2_prompt"))
    if why:
        return why
    for key in ("img1_id", "img2_id"):
        if not isinstance(row.get(key), (int, str)) or isinstance(row.get(key), bool) or str(row[key]) == "":
            return f"'{key}' missing or not an id"
    return None


def _read(path) -> list:
    """[(image 1, image 2, prompt 1, prompt 2)] of a switch file, ``(None, reason)`` for a bad row, or
    ``[("file", reason)]`` when the file cannot be read."""
    data, why = read_json(path, list)
    if why:
        return [("file", why)]
    folder, names = layout_rcb.image_folder(path, layout_rcb.COCO_IMAGES)
    out = []
    for row in data:
        why = _bad(row)
        if why is None:
            images = [layout_rcb.find_image(folder, layout_rcb.coco_name(row[k]), names)
                      for k in ("img1_id", "img2_id")]
            if None in images:
                why = "image not found"
        if why is not None:
            out.append((None, why))
            continue
        out.append((layout_rcb.image_key(images[0]), layout_rcb.image_key(images[1]), row["img1_prompt"],
                    row["img2_prompt"]))
    return out


def read(dataset: Dataset, kind: str) -> tuple[list, Counter, str | None]:
    """(pairs, skipped rows by reason, why the whole file is skipped or None)."""
    return parsed_rows(dataset, dataset.root / layout_rcb.PROBE_C_FILES[kind], _read)


def prompts(pairs: list) -> list[str]:
    """The two prompts of every pair, pair by pair: what ``run`` encodes."""
    return [p[k] for p in pairs for k in (2, 3)]


def _texts(dataset: Dataset) -> list[str]:
    return [t for kind in KINDS for t in prompts(read(dataset, kind)[0])]


def pair_scores(cos: torch.Tensor, scale: float) -> dict[str, torch.Tensor]:
    """Per-pair metrics of the cosines ``cos`` (N, 2, 2) = cos[prompt, image]: negft's on the cosines, the
    release's on its logits ``scale · cos``, as it computes them."""
    out = dict(winoground_scores(cos))
    s = scale * cos
    out.update({f"{k}_official": v for k, v in winoground_official(s).items()})
    first = torch.softmax(torch.stack([s[:, 0, 0], s[:, 1, 0]], 1).float(), 1)[:, 0]
    second = torch.softmax(torch.stack([s[:, 1, 1], s[:, 0, 1]], 1).float(), 1)[:, 0]
    out["confidence"] = ((first + second) / 2).double()
    return out


@register("probe_c", texts=_texts, version=2, metrics=(
    "text", "image", "group", "confidence", "text_<x>", "image_<x>", "group_<x>", "confidence_<x>"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    prefix = f"probe_c/{dataset.name}"
    per_kind, records, skipped_all, total = {}, [], Counter(), 0
    for kind in KINDS:
        pairs, skipped, why = read(dataset, kind)
        path = dataset.root / layout_rcb.PROBE_C_FILES[kind]
        if why is not None:
            result.skipped[f"{prefix}/{kind}"] = why
            continue
        skipped_all.update({f"{path.name}: {why}": k for why, k in skipped.items()})
        total += len(pairs) + sum(skipped.values())
        if not pairs:
            result.skipped.setdefault(f"{prefix}/{kind}", f"no pair to score in {path}")
            continue
        n = len(pairs)
        images = ctx.encode_images([p[k] for p in pairs for k in (0, 1)]).view(n, 2, -1)
        texts = ctx.encode_texts(prompts(pairs)).view(n, 2, -1)
        per_kind[kind] = pair_scores(grid_scores(texts, images), ctx.logit_scale)
        records += [{"kind": kind, "image_1": p[0], "image_2": p[1], "prompt_1": p[2], "prompt_2": p[3],
                     **{k: float(v[i]) for k, v in per_kind[kind].items()}} for i, p in enumerate(pairs)]
    report_skips(result, prefix, dataset.root / layout_rcb.PROBE_C_DIR, skipped_all, total)
    if not per_kind:
        return result
    for name in next(iter(per_kind.values())):
        result.add(f"{prefix}/{name}", torch.cat([v[name] for v in per_kind.values()]), ctx.n_boot)
    for kind, scores in per_kind.items():
        for name, values in scores.items():
            base, official = (name[:-len("_official")], "_official") if name.endswith("_official") else (name, "")
            result.add(f"{prefix}/{base}_{kind}{official}", values, ctx.n_boot)
    result.records[prefix] = records
    return result
