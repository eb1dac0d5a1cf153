"""``negft data negate``: NegCap + NegMCQ shards from any captioned dataset with object labels, offline.

NegBench (section 3.1, 5) builds CC12M-NegCap / NegMCQ with an LLM that extracts present objects and
proposes "contextually relevant but not present" ones, a detector that verifies them, templates that
put a negation before or after the original caption, and an LLM paraphrase. negft does the same without
a model, from labels the dataset already has:

- **absent objects** come from the labels' own co-occurrence statistics (``Cooccurrence``): for an image
  with present set S, object b ∉ S is drawn with probability ∝ mean over a ∈ S of
  (C[a, b] + λ·m(b)) / (R[a] + λ), where C[a, b] counts the images labelled with both a and b,
  R[a] = Σ_b C[a, b], m(b) = N[b] / Σ N the marginal label frequency and λ = ``smoothing``; three are
  drawn without replacement in that order (the most plausible first, as ``make_mcq`` expects). An object
  present in the image is never drawn. The labels are the only evidence of absence: a COCO image whose
  annotators missed an object may get it negated, as the paper's detector check may miss one too.
- **NegCap**: each absent object is negated in one of the phrasings of ``phrasings.NEGATE_TRAIN`` (before
  or after the affirmative part, which is one of the image's original captions: ``phrasings.negate_text``);
- **NegMCQ**: ``phrasings.make_mcq`` — Affirmation / Negation / Hybrid right answers with a false
  affirmation, a false negation and a swapped hybrid as hard negatives, options shuffled, the answer's
  template and each option's [affirmed, negated] objects recorded (``mcq.option_objects``);
- **splits**: an image goes to ``val`` with probability ``val_fraction`` (seeded); val images get only
  held-out phrasings (``NEGATE_HELD_OUT``, ``MCQ_HELD_OUT``), train images only training ones.

Output: ``out/train/`` and ``out/val/``, each shard folder with its own ``manifest.json``. A sample:
``caption`` (the first original caption), ``captions`` (all), ``negcap`` (3 negated captions, distinct
absent objects), ``mcq``, ``objects`` {positive, negative}, and ``image_id`` for COCO input. Same inputs
and seed → byte-identical shards; no image is decoded (bytes are copied).

Inputs (CAPTIONS chooses the reader by its suffix):

- COCO: ``CAPTIONS`` = ``captions_*.json``, ``IMAGES`` = its image folder, ``labels=instances_*.json``
  (layout: ``negft.convert.coco``) or ``labels=`` a labels CSV;
- CSV: ``CAPTIONS`` = a CSV with a header row and the columns ``filepath`` (the image, relative to
  ``IMAGES`` or absolute; alias ``image_path``), ``caption`` and ``objects`` (alias ``extracted_objects``,
  NegBench's name): the objects present, as a JSON list, a Python list literal (as NegBench's CSVs write
  it) or names separated by ``;``. Several rows of one ``filepath`` make one sample with several captions
  (objects are their union). With ``labels=`` a labels CSV, the ``objects`` column may be absent;
- labels CSV: columns ``filepath`` (COCO: the ``file_name``) and ``objects`` as above.

Object names are lower-cased with whitespace collapsed. Skipped and counted: the COCO reader's reasons
(``convert.coco``), an empty caption row, an image with no labels or an unparsable labels cell, an
image with fewer than 2 possible absent objects. Rows skipped while reading the inputs (before an image
has a split) are counted in ``train/manifest.json``.
"""
from __future__ import annotations

import csv
import hashlib
import os
import time
from bisect import bisect_right
from collections import Counter
from pathlib import Path

import numpy as np

from negft import phrasings
from negft.data import schema
from negft.convert import coco
from negft.data.shards import MANIFEST, ShardWriter, truthy
from negft.io import WriteError, remove

LAYOUT_SOURCE = {
    "coco": coco.LAYOUT_SOURCE,
    "csv": "negft.convert.negate (columns filepath, caption, objects; NegBench NegCap CSV names: filepath, "
           "caption, extracted_objects)",
}
FILEPATH_COLUMNS = ("filepath", "image_path")
OBJECTS_COLUMNS = ("objects", "extracted_objects")
MIN_ABSENT = 2                              # make_mcq needs two absent objects
TOO_FEW_ABSENT = "fewer than 2 possible absent objects"
NO_PRESENT = coco.NO_LABELS
BAD_OBJECTS = "unparsable objects cell"
MAX_TRIES = 64                              # rejection draws per image before the exact fallback


# ------------------------------------------------------------------ co-occurrence model
class Cooccurrence:
    """P(b absent-and-plausible | S present), estimated from the dataset's own label sets (module docstring)."""

    def __init__(self, label_sets, smoothing: float = 1.0):
        self.names = sorted({n for s in label_sets for n in s})
        self.index = {n: i for i, n in enumerate(self.names)}
        v = len(self.names)
        self.smoothing = float(smoothing)
        counts = [0] * v
        rows = [Counter() for _ in range(v)]
        for s in label_sets:
            ids = [self.index[n] for n in set(s)]
            for a in ids:
                counts[a] += 1
                row = rows[a]
                for b in ids:
                    if b != a:
                        row[b] += 1
        self.counts = counts
        self.images = len(label_sets)
        self.rows = rows
        self.row_ids = [sorted(r) for r in rows]
        self.row_cum = [np.cumsum([r[b] for b in ids]).tolist() for r, ids in zip(rows, self.row_ids)]
        self.row_total = [c[-1] if c else 0 for c in self.row_cum]
        self.marg_cum = np.cumsum(counts).tolist()
        self.marg_total = self.marg_cum[-1] if self.marg_cum else 0

    def __len__(self):
        return len(self.names)

    def weights(self, present: list[int]) -> np.ndarray:
        """The exact distribution over all labels (0 on ``present``, sums to 1) that ``sample``'s first
        draw follows."""
        m = np.asarray(self.counts, dtype=np.float64) / max(self.marg_total, 1)
        w = np.zeros(len(self.names))
        lam = self.smoothing
        for a in present:
            denom = self.row_total[a] + lam
            if denom <= 0:
                w += m
                continue
            row = np.zeros(len(self.names))
            row[self.row_ids[a]] = [self.rows[a][b] for b in self.row_ids[a]]
            w += (row + lam * m) / denom
        w[list(present)] = 0.0
        if w.sum() <= 0:                    # smoothing 0 and nothing co-occurs: fall back on the marginal
            w = m.copy()
            w[list(present)] = 0.0
        return w / w.sum()

    def _draw(self, a: int, rng) -> int:
        total = self.row_total[a]
        u = rng.random() * (total + self.smoothing)
        if u < total:
            return self.row_ids[a][bisect_right(self.row_cum[a], u)]
        return bisect_right(self.marg_cum, rng.random() * self.marg_total)

    def sample(self, present: list[int], k: int, rng) -> list[int]:
        """``k`` distinct labels not in ``present``, drawn one after another from ``weights`` renormalised
        over those not drawn yet (by rejection; exactly, from ``weights``, when rejection takes too long)."""
        excluded = set(present)
        chosen: list[int] = []
        tries = 0
        while len(chosen) < k and tries < MAX_TRIES:
            tries += 1
            b = self._draw(present[int(rng.random() * len(present))], rng)
            if b not in excluded:
                excluded.add(b)
                chosen.append(b)
        if len(chosen) < k:
            w = self.weights(present)
            w[chosen] = 0.0
            while len(chosen) < k and w.sum() > 0:
                b = int(np.searchsorted(np.cumsum(w), rng.random() * w.sum(), side="right"))
                b = min(b, len(w) - 1)
                chosen.append(b)
                w[b] = 0.0
        return chosen


# ------------------------------------------------------------------ text
def affirmative_part(caption: str) -> str:
    """A caption as the affirmative part of a negated one: whitespace collapsed, no final period, first
    letter lower-cased unless the first word is 'I' or an acronym (``_fill`` capitalises a text's start)."""
    text = " ".join(caption.split()).rstrip(" .")
    first = text.split(" ", 1)[0]
    if first == "I" or first.startswith("I'") or (len(first) > 1 and first[:2].isupper()):
        return text
    return text[:1].lower() + text[1:]


def _norm(name: str) -> str:
    return " ".join(str(name).lower().split())


def parse_objects(cell) -> list[str] | None:
    """A labels cell → object names (JSON list, Python list literal, or ';'-separated); None if unparsable."""
    text = (cell or "").strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            names = schema.list_cell(text)
        except ValueError:
            return None
    else:
        names = text.split(";")
    return sorted({_norm(n) for n in names if _norm(n)})


def _column(fields, names, path, required=True):
    for n in names:
        if n in fields:
            return n
    if required:
        raise ValueError(f"{path}: no column {' or '.join(names)} (columns: {', '.join(fields or [])})")
    return None


def read_labels_csv(path) -> dict[str, list[str] | None]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fcol = _column(reader.fieldnames, FILEPATH_COLUMNS, path)
        ocol = _column(reader.fieldnames, OBJECTS_COLUMNS, path)
        out: dict = {}
        for row in reader:
            objs = parse_objects(row[ocol])
            prev = out.get(row[fcol], [])
            out[row[fcol]] = None if objs is None or prev is None else sorted(set(prev) | set(objs))
    return out


def read_csv(path, images, skip, labels: dict | None = None) -> list[dict]:
    """Rows of a captions CSV grouped by image (first appearance order) as records."""
    root = Path(images)
    groups: dict[str, dict] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fcol = _column(reader.fieldnames, FILEPATH_COLUMNS, path)
        ccol = _column(reader.fieldnames, ("caption",), path)
        ocol = _column(reader.fieldnames, OBJECTS_COLUMNS, path, required=labels is None)
        for line, row in enumerate(reader, start=2):
            fp = (row[fcol] or "").strip()
            g = groups.setdefault(fp, {"captions": [], "objects": [], "line": line})
            text = coco.clean_caption(row[ccol])
            if not text:
                skip(coco.EMPTY_CAPTION, f"line {line} ({fp})")
            else:
                g["captions"].append(text)
            if ocol is not None and g["objects"] is not None:
                objs = parse_objects(row[ocol])
                g["objects"] = None if objs is None else sorted(set(g["objects"]) | set(objs))
    records = []
    for fp, g in groups.items():
        if not g["captions"]:
            skip(coco.NO_CAPTION, f"line {g['line']} ({fp})")
            continue
        ext = coco.IMAGE_EXTS.get(os.path.splitext(fp)[1].lower())
        if ext is None:
            skip(coco.BAD_TYPE, f"line {g['line']} ({fp})")
            continue
        p = Path(fp) if os.path.isabs(fp) else root / fp
        if not p.is_file():
            skip(coco.MISSING_FILE, f"line {g['line']} ({p})")
            continue
        objects = labels.get(fp, []) if labels is not None else g["objects"]
        records.append({"key": os.path.splitext(fp)[0], "id": fp, "path": str(p), "ext": ext,
                        "captions": g["captions"], "objects": objects})
    return records


def _image_rng(seed: int, ident: str):
    h = int.from_bytes(hashlib.blake2b(ident.encode(), digest_size=16).digest(), "little")
    return np.random.default_rng([seed, h])


# ------------------------------------------------------------------ the command
def negate(captions, images, out, labels="", seed="0", val_fraction="0.05", negatives="3", smoothing="1.0",
           maxcount="1000", progress="true") -> dict:
    """NegCap + NegMCQ shards in ``out/train`` and ``out/val``; see the module docstring."""
    t0 = time.perf_counter()
    seed, val_fraction, n_neg = int(seed), float(val_fraction), int(negatives)
    smoothing, maxcount = float(smoothing), int(maxcount)
    if seed < 0 or not 0.0 <= val_fraction <= 1.0 or n_neg < 1 or smoothing < 0:
        raise ValueError("need seed >= 0, 0 <= val_fraction <= 1, negatives >= 1, smoothing >= 0")
    if not Path(captions).is_file():
        raise FileNotFoundError(f"captions file {captions} not found")
    if labels and not Path(labels).is_file():
        raise FileNotFoundError(f"labels file {labels} not found")
    kind = "coco" if str(captions).lower().endswith(".json") else "csv"
    labels_csv = bool(labels) and not str(labels).lower().endswith(".json")
    if kind == "coco" and not labels:
        raise ValueError("negate needs object labels: pass labels=INSTANCES_JSON (or a labels CSV)")
    if kind == "csv" and labels and not labels_csv:
        raise ValueError("a captions CSV takes labels= as a CSV (filepath, objects), not a JSON file")
    out = Path(out)
    inputs = {"captions": str(captions), "images": str(images), "labels": str(labels)}
    params = {"seed": seed, "val_fraction": val_fraction, "negatives": n_neg, "smoothing": smoothing}
    progress = truthy(progress)
    with ShardWriter(out / "train", "negate", LAYOUT_SOURCE[kind], inputs, maxcount, progress) as train, \
            ShardWriter(out / "val", "negate", LAYOUT_SOURCE[kind], inputs, maxcount, progress) as val:
        lab = read_labels_csv(labels) if labels_csv else None
        if kind == "coco":
            records, notes = coco.read_coco(captions, "" if labels_csv else labels, images, train.skip)
            for r in records:
                r["id"] = r["file_name"]
                if lab is not None:
                    r["objects"] = lab.get(r["file_name"], [])
        else:
            records, notes = read_csv(captions, images, train.skip, lab), {}
        for r in records:
            if r["objects"] is not None:
                r["objects"] = sorted({_norm(o) for o in r["objects"] if _norm(o)})
        model = Cooccurrence([r["objects"] for r in records if r["objects"]], smoothing)
        t_model = time.perf_counter() - t0
        templates = {"train": (phrasings.NEGATE_TRAIN, 0.0), "val": (phrasings.NEGATE_HELD_OUT, 1.0)}
        answers = {"train": Counter(), "val": Counter()}
        for r in records:
            rng = _image_rng(seed, r["id"])
            split = "val" if rng.random() < val_fraction else "train"
            writer = val if split == "val" else train
            if r["objects"] is None:
                writer.skip(BAD_OBJECTS, r["id"])
                continue
            if not r["objects"]:
                writer.skip(NO_PRESENT, r["id"])
                continue
            present = [model.index[o] for o in r["objects"]]
            possible = len(model) - len(present)
            if possible < MIN_ABSENT:
                writer.skip(TOO_FEW_ABSENT, r["id"])
                continue
            data = coco.read_bytes(r["path"])
            if data is None:
                writer.skip(coco.UNREADABLE, r["path"])
                continue
            absent = [model.names[b] for b in model.sample(present, min(max(n_neg, MIN_ABSENT), possible), rng)]
            caps = r["captions"]
            neg_templates, held_out_p = templates[split]
            negcap = [phrasings.negate_text(affirmative_part(caps[int(rng.random() * len(caps))]), a, rng,
                                             neg_templates)
                      for a in absent[:n_neg]]
            mcq = phrasings.make_mcq(r["objects"], absent, rng, held_out_p=held_out_p, option_objects=True)
            answers[split][mcq["answer_template"]] += 1
            meta = {"caption": caps[0], "captions": caps, "negcap": negcap, "mcq": mcq,
                    "objects": {"positive": r["objects"], "negative": absent}}
            if "image_id" in r:
                meta["image_id"] = r["image_id"]
            writer.add(r["key"], data, r["ext"], meta)
        model_note = {"labels": len(model), "labelled_images": model.images,
                      "most_frequent": [[model.names[i], model.counts[i]]
                                        for i in sorted(range(len(model)), key=lambda i: -model.counts[i])[:10]],
                      "seconds": round(t_model, 3)}
        both = time.perf_counter() - t0
        for split, writer in (("train", train), ("val", val)):
            writer.notes.update(notes, split=split, negate={
                "images_per_second_both_splits": round((train.samples + val.samples) / both, 1) if both > 0 else None,
                **params, "negcap_templates": "NEGATE_HELD_OUT" if split == "val" else "NEGATE_TRAIN",
                "mcq_templates": "MCQ_HELD_OUT" if split == "val" else "MCQ_TRAIN",
                "answer_templates": dict(sorted(answers[split].items())), "cooccurrence": model_note,
                "read_skips_counted_in": "train"})
        m_train = train.close()
        try:
            m_val = val.close()
        except WriteError:      # train's manifest without val's is no conversion: the same command redoes both
            remove(out / "train" / MANIFEST)
            raise
    elapsed = time.perf_counter() - t0
    n = m_train["counts"]["samples"] + m_val["counts"]["samples"]
    skipped = Counter(m_train["skipped"]) + Counter(m_val["skipped"])
    return {"out": str(out), "counts": {"samples": n, "train": m_train["counts"]["samples"],
                                        "val": m_val["counts"]["samples"]},
            "skipped": dict(sorted(skipped.items())), "seconds": round(elapsed, 3),
            "images_per_second": round(n / elapsed, 1) if elapsed > 0 else None,
            "train": m_train, "val": m_val}
