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

Every row's image is in the gallery, in file order (an image named by several rows is there once per row, as
NegBench encodes it). Text→image: every caption is a query whose one right image is its row's. Image→text:
every image is a query and any of its row's captions is a hit. A row whose list is empty (``[]``) keeps its
image in the gallery: a distractor for text→image, and an image→text query with no positive. Metrics
(``<probe>/<dataset>/<metric>``):

- ``r<k>``, ``i2t_r<k>`` (negft's rule): ties count at their expected rank, never in favour of the right
  answer (all-equal scores give k / n); scores from ``negft.probes.similarity.score_matrix``, so an image
  named by several rows ties with itself exactly (a float32 product splits its columns by ~1e-8). ``i2t_r<k>`` leaves out images with no caption (nothing to find);
  ``skipped`` says how many.
- ``r<k>_official``, ``i2t_r<k>_official``: NegBench's rule, ``benchmarks/src/evaluation/retrieval.py``
  ``evaluate_model`` and ``recall_at_k`` (a copy of LAION-AI/CLIP_benchmark ``metrics/zeroshot_retrieval.py``),
  reproduced step by step: ``scores = texts @ images.T`` in float32 (the image→text scores are its
  transpose), rows taken ``batch_size`` at a time onto the model's device, a hit when
  ``torch.topk(scores, k, dim=1)`` returns a positive (``nb_true_positive / nb_positive > 0``); its
  ``image_retrieval_recall@k`` is our ``r<k>``, its ``text_retrieval_recall@k`` our ``i2t_r<k>``. An image
  with no caption has ``nb_positive`` 0: 0 / 0 is nan, and nan > 0 is False, so it counts as a miss.
  ``torch.topk`` leaves the order of tied scores unspecified, and it is not the lower index (among tied top
  scores at columns 4 and 5 it returned 5): on exact ties, duplicate images above all, the official number is
  whatever ``topk`` returns on that device, as NegBench's is. They differ from ``r<k>`` only on exact ties
  and in the no-caption images. Where k is larger than the gallery (or the captions), NegBench's ``topk``
  fails; here every entry is in the top k. NegBench reports k = 1, 5 only.
- ``skipped_rows``: rows left out (captions empty or not a list of strings, image file or video frames not
  found), with a ``skipped`` entry counting them by reason. NegBench's loader fails on each of them: an empty
  cell is a float nan to pandas and ``eval`` of it raises, any other text that is no Python list raises in
  ``eval`` (or is iterated character by character), a missing image raises in ``Image.open``.
"""
from __future__ import annotations

from collections import Counter

import torch

from negft.probes import register
from negft.data.schema import list_cell
from negft.probes.base import EvalContext, Dataset, ProbeResult, read_csv, resolve
from negft.probes.released import probe_file
from negft.probes.similarity import score_matrix
from negft.probes.stats import recall_any_at_k, recall_at_k
from negft.probes.video import locate, scorable

KS = (1, 5, 10)
FILES = {"retrieval": "retrieval.csv", "retrieval_neg": "retrieval_neg.csv"}


def caption_queries(rows) -> tuple[list[str], list[int]]:
    """Every caption as a query, with the row of its one right image."""
    queries, targets = [], []
    for i, r in enumerate(rows):
        for caption in (r["caption_list"] if "caption_list" in r else list_cell(r["captions"])):
            queries.append(caption)
            targets.append(i)
    return queries, targets


def topk_hits(scores: torch.Tensor, positive, ks=KS, device="cpu", batch_size: int = 256) -> dict[int, torch.Tensor]:
    """NegBench's ``recall_at_k(...) > 0`` per row of ``scores`` (Q, N): 1 when ``torch.topk(scores, k, dim=1)``
    returns an index ``positive(rows, indices)`` marks (a bool tensor of the indices' shape; ``rows`` are the
    row numbers). Rows go ``batch_size`` at a time to ``device``, as NegBench's ``batchify`` sends them."""
    out = {k: [] for k in ks}
    for start in range(0, scores.shape[0], batch_size):
        chunk = scores[start:start + batch_size].to(device)
        rows = torch.arange(start, start + chunk.shape[0]).view(-1, 1)
        for k in ks:
            top = torch.topk(chunk, min(k, chunk.shape[1]), dim=1)[1].cpu()
            out[k].append(positive(rows, top).any(1).float())
    return {k: torch.cat(v) if v else torch.zeros(0) for k, v in out.items()}


def load(dataset: Dataset, probe: str) -> dict:
    """{path, why, rows (each {filepath, caption_list, visual}; the list may be empty), skipped (reason ->
    count), total}."""
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
        cell = (r.get("captions") or "").strip()
        try:
            captions = list_cell(cell) if cell else None
            reason = None if cell else "empty captions cell"
        except ValueError:
            captions, reason = None, "captions not a list of strings"
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
    if not queries:
        result.skipped[prefix] = f"no caption in {data['path']}"
        return result
    texts = ctx.encode_texts(queries)
    targets = torch.tensor(targets)
    scores = texts.float() @ images.float().T          # NegBench's operand order: texts_emb @ images_emb.t()
    exact = score_matrix(texts, images)                # the same, with duplicate images tied exactly
    hits = recall_at_k(exact, targets, KS)
    official = topk_hits(scores, lambda q, top: top == targets[q], KS, ctx.device, ctx.batch_size)
    i2t_official = topk_hits(scores.T, lambda i, top: targets[top] == i, KS, ctx.device, ctx.batch_size)
    captioned = torch.zeros(len(rows), dtype=torch.bool)
    captioned[targets] = True
    positives = torch.zeros(len(rows), len(queries), dtype=torch.bool)
    positives[targets, torch.arange(len(queries))] = True
    i2t = recall_any_at_k(exact.T[captioned], positives[captioned], KS)
    if not captioned.all():
        n = int((~captioned).sum())
        result.skipped[f"{prefix}/i2t"] = (
            f"{n} of {len(rows)} images have no caption ([] in {data['path']}): in the gallery for both "
            f"directions; left out of i2t_r<k> (nothing to find), misses in i2t_r<k>_official as NegBench "
            f"counts them (0 / 0 positives is nan, not > 0)")
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


@register("retrieval", texts=_texts("retrieval"), version=2, metrics=("r<k>", "i2t_r<k>"))
def run_retrieval(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    return _recall(ctx, dataset, "retrieval")


@register("retrieval_neg", texts=_texts("retrieval_neg"), version=2, metrics=("r<k>", "i2t_r<k>"))
def run_retrieval_neg(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    return _recall(ctx, dataset, "retrieval_neg")
