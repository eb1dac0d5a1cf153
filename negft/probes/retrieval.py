"""Retrieval and Retrieval-Neg (NegBench, section 3): text→image recall@1/5/10 (``r1``...) and
image→text recall (``i2t_r1``...).

Reads ``filepath, captions`` CSVs (one image per row, a list of captions that describe it):
``retrieval.csv`` holds affirmative captions, ``retrieval_neg.csv`` captions that also negate an
absent object. Text→image: every caption is a query whose one right image is its row's. Image→text:
every image is a query and any of its captions is a hit. Ties count at their expected rank, never in
favour of the right answer. (NegBench reports no R@10; we do.)
"""
from __future__ import annotations


import torch

from negft.probes import register
from negft.probes.base import EvalContext, Dataset, ProbeResult, csv_texts, missing, parse_list, read_csv, resolve
from negft.probes.stats import recall_any_at_k, recall_at_k

KS = (1, 5, 10)


def caption_queries(rows) -> tuple[list[str], list[int]]:
    """Every caption as a query, with the row of its one right image."""
    queries, targets = [], []
    for i, r in enumerate(rows):
        for caption in parse_list(r["captions"]):
            queries.append(caption)
            targets.append(i)
    return queries, targets


def _recall(ctx: EvalContext, dataset: Dataset, probe: str, filename: str) -> ProbeResult:
    result = ProbeResult()
    path = dataset.root / filename
    prefix = f"{probe}/{dataset.name}"
    if not path.exists():
        result.skipped[prefix] = missing(dataset, path)
        return result
    rows = read_csv(path)
    paths = [resolve(dataset.root, r["filepath"]) for r in rows]
    queries, targets = caption_queries(rows)
    images = ctx.encode_images(paths)
    texts = ctx.encode_texts(queries)
    targets = torch.tensor(targets)
    scores = texts @ images.T
    hits = recall_at_k(scores, targets, KS)
    positives = torch.zeros(len(rows), len(queries), dtype=torch.bool)
    positives[targets, torch.arange(len(queries))] = True
    i2t = recall_any_at_k(scores.T, positives, KS)
    for k in KS:
        result.add(f"{prefix}/r{k}", hits[k], ctx.n_boot)
        result.add(f"{prefix}/i2t_r{k}", i2t[k], ctx.n_boot)
    columns = {f"r{k}": hits[k].tolist() for k in KS}
    result.records[prefix] = [{"query": q, "target": paths[t], **{c: v[i] for c, v in columns.items()}}
                              for i, (q, t) in enumerate(zip(queries, targets.tolist()))]
    return result


@register("retrieval", texts=csv_texts("retrieval.csv", lambda rows: caption_queries(rows)[0]))
def run_retrieval(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    return _recall(ctx, dataset, "retrieval", "retrieval.csv")


@register("retrieval_neg", texts=csv_texts("retrieval_neg.csv", lambda rows: caption_queries(rows)[0]))
def run_retrieval_neg(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    return _recall(ctx, dataset, "retrieval_neg", "retrieval_neg.csv")
