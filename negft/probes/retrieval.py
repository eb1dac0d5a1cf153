"""Retrieval and Retrieval-Neg (NegBench, section 3): text→image recall@1/5/10 (``r1``...) and image→text
recall (``i2t_r1``...), of images or (MSR-VTT) videos.

Released layout (m1k2zoo/negbench ``benchmarks/src/training/data.py`` ``CsvImageCaptionDataset``, and for videos
``video_utils/video_dataset.py`` ``CsvVideoCaptionDataset``): a CSV of ``filepath, captions``, one image (or
video, ``negft.probes.video``) per row with a list of the captions that describe it (``str(list)``, read
with ``schema.list_cell``, never ``eval`` as the reference does). Files (``datasets.md``,
``benchmarks/scripts/evaluate_images.sh`` / ``evaluate_videos.sh``): COCO ``COCO_val_retrieval.csv`` and
Retrieval-Neg ``COCO_val_negated_retrieval.csv`` (template) or
``COCO_val_negated_retrieval_llama3.1_rephrased_affneg_true.csv`` (paraphrased); HardNeg-Syn ``synthetic_retrieval_v1.csv`` / ``synthetic_retrieval_v2.csv``
(their columns could not be confirmed from code: NegBench's ``get_data`` never loads ``--synthetic-retrieval``,
so they are read as the COCO files are); MSR-VTT ``msr_vtt_retrieval.csv`` /
``msr_vtt_retrieval_rephrased_llama.csv``. The file is the manifest's ``probe_files`` entry for
``retrieval`` / ``retrieval_neg`` (``negft.probes.released``); without one, ``retrieval.csv`` /
``retrieval_neg.csv`` (the world's names).

Text→image: every caption is a query whose one right image is its row's. Image→text: every image is a query
and any of its captions is a hit. Metrics (``<probe>/<dataset>/<metric>``):

- ``r<k>``, ``i2t_r<k>`` (negft's rule): ties count at their expected rank, never in favour of the right
  answer (all-equal scores give k / n).
- ``r<k>_official``, ``i2t_r<k>_official``: NegBench's rule, ``benchmarks/src/evaluation/retrieval.py``
  ``recall_at_k`` (a copy of LAION-AI/CLIP_benchmark ``metrics/zeroshot_retrieval.py``): a hit when a positive
  is among ``torch.topk(scores, k)``; its ``image_retrieval_recall@k`` is our ``r<k>``, its
  ``text_retrieval_recall@k`` our ``i2t_r<k>``. ``torch.topk`` leaves the order of tied scores unspecified (on
  CPU 12 equal scores came back as indices 9, 7, 8, 6, 10), so here ties go to the lower index, as
  ``torch.argmax`` breaks them. They differ only on exact ties. NegBench reports k = 1, 5 only.
- ``skipped_rows``: rows left out (captions not a list of strings or empty, image file or video frames not
  found), with a ``skipped`` entry counting them by reason.
"""
from __future__ import annotations

from collections import Counter

import torch

from negft.probes import register
from negft.probes.base import EvalContext, Dataset, ProbeResult, parse_list, read_csv, resolve
from negft.probes.released import probe_file
from negft.probes.stats import recall_any_at_k, recall_at_k
from negft.probes.video import locate, scorable

KS = (1, 5, 10)
FILES = {"retrieval": "retrieval.csv", "retrieval_neg": "retrieval_neg.csv"}


def caption_queries(rows) -> tuple[list[str], list[int]]:
    """Every caption as a query, with the row of its one right image."""
    queries, targets = [], []
    for i, r in enumerate(rows):
        for caption in (r["caption_list"] if "caption_list" in r else parse_list(r["captions"])):
            queries.append(caption)
            targets.append(i)
    return queries, targets


def recall_at_k_official(scores: torch.Tensor, targets: torch.Tensor, ks=KS) -> dict[int, torch.Tensor]:
    """Per query: 1 when ``targets`` is among the k best of ``scores`` (Q, N), ties going to the lower index."""
    target = scores.gather(1, targets.view(-1, 1))
    before = torch.arange(scores.shape[1]).view(1, -1) < targets.view(-1, 1)
    rank = (scores > target).sum(1, dtype=torch.int32) + ((scores == target) & before).sum(1, dtype=torch.int32)
    return {k: (rank < k).float() for k in ks}


def recall_any_at_k_official(scores: torch.Tensor, positives: torch.Tensor, ks=KS) -> dict[int, torch.Tensor]:
    """Per row: 1 when any of its ``positives`` is among the k best of ``scores`` (Q, N), ties going to the lower
    index. The best-placed positive is the first of the highest-scoring ones; the entries above it are those
    scoring more and the (negative) ties before it."""
    only_positives = scores.masked_fill(~positives, float("-inf"))
    best, first = only_positives.max(1, keepdim=True).values, only_positives.argmax(1, keepdim=True)
    before = torch.arange(scores.shape[1]).view(1, -1) < first
    rank = (scores > best).sum(1, dtype=torch.int32) + ((scores == best) & before).sum(1, dtype=torch.int32)
    return {k: (rank < k).float() for k in ks}


def load(dataset: Dataset, probe: str) -> dict:
    """{path, why, rows (each {filepath, caption_list, visual}), skipped (reason -> count), total}."""
    path, why = probe_file(dataset, probe, FILES[probe])
    out = {"path": path, "why": why, "rows": [], "skipped": Counter(), "total": 0}
    if path is None:
        return out
    table = read_csv(path)
    header = list(table[0]) if table else []
    lacks = [c for c in ("filepath", "captions") if c not in header]
    if table and lacks:
        out["why"] = f"{path}: lacks column(s) {', '.join(lacks)}; it has {', '.join(header)}"
        return out
    items = locate(dataset, [r.get("filepath") for r in table])
    for r, item in zip(table, items):
        try:
            captions = parse_list(r.get("captions") or "")
            reason = None if captions else "no caption"
        except ValueError:
            captions, reason = [], "captions not a list of strings"
        if reason is None and isinstance(item, str):
            reason = item
        if reason is None:
            out["rows"].append({"filepath": r["filepath"], "caption_list": captions, "visual": item})
        else:
            out["skipped"][reason] += 1
    out["total"] = len(table)
    return out


def _texts(probe: str):
    return lambda dataset: caption_queries(load(dataset, probe)["rows"])[0]


def _recall(ctx: EvalContext, dataset: Dataset, probe: str) -> ProbeResult:
    result = ProbeResult()
    prefix = f"{probe}/{dataset.name}"
    data = load(dataset, probe)
    found = scorable(ctx, dataset, data, result, prefix, "row")
    if found is None:
        return result
    images, rows = found
    queries, targets = caption_queries(rows)
    texts = ctx.encode_texts(queries)
    targets = torch.tensor(targets)
    scores = texts @ images.T
    hits = recall_at_k(scores, targets, KS)
    official = recall_at_k_official(scores, targets, KS)
    positives = torch.zeros(len(rows), len(queries), dtype=torch.bool)
    positives[targets, torch.arange(len(queries))] = True
    i2t = recall_any_at_k(scores.T, positives, KS)
    i2t_official = recall_any_at_k_official(scores.T, positives, KS)
    for k in KS:
        result.add(f"{prefix}/r{k}", hits[k], ctx.n_boot)
        result.add(f"{prefix}/i2t_r{k}", i2t[k], ctx.n_boot)
    for k in KS:
        result.add(f"{prefix}/r{k}_official", official[k], ctx.n_boot)
        result.add(f"{prefix}/i2t_r{k}_official", i2t_official[k], ctx.n_boot)
    paths = [resolve(dataset.root, r["filepath"]) for r in rows]
    columns = {f"r{k}": hits[k].tolist() for k in KS}
    result.records[prefix] = [{"query": q, "target": paths[t], **{c: v[i] for c, v in columns.items()}}
                              for i, (q, t) in enumerate(zip(queries, targets.tolist()))]
    return result


@register("retrieval", texts=_texts("retrieval"))
def run_retrieval(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    return _recall(ctx, dataset, "retrieval")


@register("retrieval_neg", texts=_texts("retrieval_neg"))
def run_retrieval_neg(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    return _recall(ctx, dataset, "retrieval_neg")
