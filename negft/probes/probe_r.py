"""Probe-R (the Probe-R/C/B paper, section 3.1, equations 1-3, figure 3): relational understanding by swapping one
part of a subject-predicate-object prompt, read from the release's files.

Released layout (DeepLearningRobustnessStudies/UnderstandingVisualTextModels, ``core/eval_relation_understanding.py``
and ``new_datasets/README.md``; paths in negft.data.layout_rcb): ``data/visual_genome/relation_eval_subject.json``
(the file the release's ``eval()`` reads) and, if present, ``relation_eval_object.json`` (its Dataset class's other
``switch_triplet``), each a dict ``{"<anchor image id>": {positive_image_ids, negative_image_ids, positive_prompt,
negative_prompt, negative_object, positive_object, negative_predicate_prompt}}``; images
``data/visual_genome/all_images/<id>.jpg`` (a ``.png`` of the same stem is accepted). A row whose anchor image
is missing, or that is not an object with the three prompts and ``positive_object`` as non-empty strings, is
skipped and counted (``<prefix>/skipped_rows``, only when rows were skipped, and ``skipped``); an unreadable
file is skipped with its reason.

Every comparison is the release's: a 2-way softmax over the scaled similarities ``logit_scale · cos`` of one image
(or the mean of those logits over several images) with the right prompt and a wrong one. Metrics
``<prefix>/<dataset>/<metric>``:

- ``probe_r_predicate``: the anchor image, ``positive_prompt`` (R1) against ``negative_predicate_prompt`` (R2, the
  predicate swapped for one never seen with that subject and object); from the subject file, else the object file.
- ``probe_r_subject``: the anchor image, R1 against the subject file's ``negative_prompt`` (R3, the subject
  swapped); ``probe_r_object``: the same with the object file's ``negative_prompt`` (the object swapped).
- ``probe_r_subject_only``: the subject file's ``positive_image_ids`` (images of the subject alone), the mean of
  their logits with ``"A photo of " + positive_object + "."`` (O1, the release's own wording) against R1: the
  release's ``obj1_images/obj1_vs_rel1``, right when the subject-only prompt wins. Images not found are left
  out of a row's mean; a row with none is skipped and counted.

Per family: ``confidence``, the mean softmax probability of the right prompt (the release's ``rel_diff``; no tie
rule involved); ``acc`` (negft): 1 when the right prompt's similarity is the larger, 1/2 on an exact tie, so a
model that cannot tell them apart scores chance; ``acc_official`` (the release: ``int(result[0] > result[1])`` on
the softmax, strict, so a tie counts as wrong and all-equal scores give 0). They differ only on ties.

Not computed: the release's ``rel1_vs_obj1`` (both prompts are true of the anchor image) and its ``obj3`` /
``obj1_vs_obj3`` object-recognition comparisons (their accuracy re-uses a stale result in the release's code).
Where ours differs from the release otherwise: prompts and images are batched (the release runs at batch size 1;
the scores are the same); bad rows are counted and skipped where the release would stop.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from negft.data import layout_rcb
from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult
from negft.probes.released import bad_object, parsed_rows, read_json, report_skips
from negft.probes.stats import pair_credits

CHUNK = 1 << 16               # image-prompt pairs per product in the subject-only means (bounded memory)
PROMPT_KEYS = ("positive_prompt", "negative_prompt", "negative_predicate_prompt", "positive_object")


def object_prompt(obj: str) -> str:
    """The release's subject-only prompt (``collate_fn``: ``'A photo of ' + x + '.'``)."""
    return f"A photo of {obj}."


def _bad(row) -> str | None:
    return bad_object(row, PROMPT_KEYS)


def _read(path) -> list:
    """[(anchor image, row, positive images)] of a relation_eval file, [(None, reason)] for a bad row, or
    [("file", reason)] when the file cannot be read. Images are resolved once per version of the file."""
    data, why = read_json(path, dict)
    if why:
        return [("file", why)]
    folder, names = layout_rcb.image_folder(path, layout_rcb.VG_IMAGES)
    out = []
    for image_id, row in data.items():
        why = _bad(row)
        anchor = None if why else layout_rcb.find_image(folder, layout_rcb.vg_name(image_id), names)
        if why is None and anchor is None:
            why = "anchor image not found"
        if why is not None:
            out.append((None, why))
            continue
        ids = row.get("positive_image_ids")
        found = ([layout_rcb.find_image(folder, layout_rcb.vg_name(i), names) for i in ids]
                 if isinstance(ids, list) else [])
        out.append((layout_rcb.image_key(anchor), row, [layout_rcb.image_key(p) for p in found if p is not None]))
    return out


def read(dataset: Dataset, switch: str) -> tuple[list, Counter, str | None]:
    """(rows (anchor, row, positive images), skipped rows by reason, why the whole file is skipped or None)."""
    return parsed_rows(dataset, dataset.root / layout_rcb.probe_r_file(switch), _read)


def switches(dataset: Dataset):
    """(switch, rows, skipped rows by reason, why the file is skipped or None, whether the predicate swap is
    scored on these rows) per switch, subject first: the predicate swap is scored once, on the first switch
    with rows (the release takes it from the subject file)."""
    predicate_done = False
    for switch in layout_rcb.PROBE_R_SWITCHES:
        rows, skipped, why = read(dataset, switch)
        with_predicate = why is None and bool(rows) and not predicate_done
        predicate_done = predicate_done or with_predicate
        yield switch, rows, skipped, why, with_predicate


def subject_only_rows(rows: list) -> list:
    """[(row, its subject-only images)] of the subject file's rows that have such images."""
    return [(r, positives) for _, r, positives in rows if positives]


def prompts(switch: str, rows: list, with_predicate: bool) -> dict[str, list[str]]:
    """The prompts ``run`` encodes for one switch's rows, by role: the right prompt R1, the swapped one, R2
    where the predicate swap is scored on these rows, and (subject file) the subject-only prompt O1 with R1
    for the rows that have subject-only images."""
    out = {"right": [r["positive_prompt"] for _, r, _ in rows], "swapped": [r["negative_prompt"] for _, r, _ in rows]}
    if with_predicate:
        out["predicate"] = [r["negative_predicate_prompt"] for _, r, _ in rows]
    if switch == "subject":
        kept = subject_only_rows(rows)
        out["subject_only"] = [object_prompt(r["positive_object"]) for r, _ in kept]
        out["subject_only_right"] = [r["positive_prompt"] for r, _ in kept]
    return out


def _texts(dataset: Dataset) -> list[str]:
    out = []
    for switch, rows, _, why, with_predicate in switches(dataset):
        if why is None:
            texts = prompts(switch, rows, with_predicate)
            out += [t for pair in zip(texts.pop("right"), texts.pop("swapped")) for t in pair]
            out += [t for role in texts.values() for t in role]
    return out


def two_way(right: torch.Tensor, wrong: torch.Tensor, right_logit: torch.Tensor,
            wrong_logit: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per example: negft's tie-aware credit from the right and the wrong prompt's cosines; the release's strict
    credit and the right prompt's softmax probability from their logits (``logit_scale`` · cosine), as it
    computes them."""
    prob = torch.softmax(torch.stack([right_logit, wrong_logit], dim=1).float(), dim=1)
    return {"acc": pair_credits(right, wrong)[0], "acc_official": pair_credits(prob[:, 0], prob[:, 1])[1],
            "confidence": prob[:, 0].double()}


def _add(result: ProbeResult, ctx: EvalContext, prefix: str, scores: dict, records: list[dict]) -> None:
    for name, values in scores.items():
        result.add(f"{prefix}/{name}", values, ctx.n_boot)
    result.records[prefix] = [{**rec, "confidence": round(float(c), 6), "acc": float(a)}
                              for rec, c, a in zip(records, scores["confidence"], scores["acc"])]


@register("probe_r", texts=_texts, version=1, metrics={
    f"probe_r_{task}": ("acc", "confidence") for task in ("predicate", "object", "subject", "subject_only")})
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    name = dataset.name
    scale = ctx.logit_scale
    predicate_done = False
    for switch, rows, skipped, why, with_predicate in switches(dataset):
        prefix = f"probe_r_{switch}/{name}"
        if why is not None:
            result.skipped[prefix] = why
            if switch == "subject":
                result.skipped[f"probe_r_subject_only/{name}"] = why
            continue
        path = dataset.root / layout_rcb.probe_r_file(switch)
        report_skips(result, prefix, path, skipped, sum(skipped.values()) + len(rows))
        if not rows:
            result.skipped[prefix] = f"no row to score in {path}"
            continue
        images = ctx.encode_images([a for a, _, _ in rows])
        texts = prompts(switch, rows, with_predicate)

        def cosines(role: str) -> torch.Tensor:
            return (images * ctx.encode_texts(texts[role])).sum(-1)

        right, wrong = cosines("right"), cosines("swapped")
        _add(result, ctx, prefix, two_way(right, wrong, scale * right, scale * wrong),
             [{"image": a, "right": r["positive_prompt"], "swapped": r["negative_prompt"]} for a, r, _ in rows])
        if with_predicate:
            wrong = cosines("predicate")
            _add(result, ctx, f"probe_r_predicate/{name}", two_way(right, wrong, scale * right, scale * wrong),
                 [{"image": a, "right": r["positive_prompt"], "swapped": r["negative_predicate_prompt"]}
                  for a, r, _ in rows])
            predicate_done = True
        if switch == "subject":
            _subject_only(ctx, result, f"probe_r_subject_only/{name}", rows, scale, path, texts)
    if not predicate_done:
        result.skipped[f"probe_r_predicate/{name}"] = result.skipped[f"probe_r_subject/{name}"]
    return result


def _subject_only(ctx, result: ProbeResult, prefix: str, rows: list, scale: float, path, texts: dict) -> None:
    """The release's ``obj1_images/obj1_vs_rel1``: the subject-only images' mean logits with the subject-only
    prompt against the relation prompt (``texts``: ``prompts`` of the subject file's rows)."""
    kept = subject_only_rows(rows)
    report_skips(result, prefix, path, Counter({f"no positive image found in {dataset_images(path)}":
                                                len(rows) - len(kept)}), len(rows))
    if not kept:
        result.skipped[prefix] = f"no positive image found for any row of {path}"
        return
    unique = list(dict.fromkeys(p for _, positives in kept for p in positives))
    feats = ctx.encode_images(unique)               # each image once (the release's 10 per row repeat a lot)
    where = {p: k for k, p in enumerate(unique)}
    image = torch.tensor([where[p] for _, positives in kept for p in positives])
    owner = torch.cat([torch.full((len(p),), k) for k, (_, p) in enumerate(kept)])
    counts = torch.bincount(owner, minlength=len(kept)).float()

    def means(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean cosine, mean logit) over each row's images, the release averaging logits."""
        text = ctx.encode_texts(texts)
        cos = torch.cat([(feats[image[i:i + CHUNK]] * text[owner[i:i + CHUNK]]).sum(-1)
                         for i in range(0, len(image), CHUNK)])
        mean = lambda v: torch.zeros(len(kept)).index_add_(0, owner, v) / counts
        return mean(cos), mean(scale * cos)

    subject = means(texts["subject_only"])
    relation = means(texts["subject_only_right"])
    _add(result, ctx, prefix, two_way(subject[0], relation[0], subject[1], relation[1]),
         [{"images": len(p), "right": object_prompt(r["positive_object"]), "swapped": r["positive_prompt"]}
          for r, p in kept])


def dataset_images(path) -> Path:
    return layout_rcb.release_root(path) / layout_rcb.VG_IMAGES
