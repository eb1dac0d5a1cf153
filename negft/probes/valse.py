"""VALSE (Parcalabescu et al., ACL 2022): per image, a caption against a foil that changes one linguistic
phenomenon (existence, plurality, counting, spatial relations, actions, coreference, FOIL-it's nouns), in
eleven pieces.

Released layout (Heidelberg-NLP/VALSE @ 2152d90, ``data/*.json``, ``config.py`` and ``README.md``): a clone of the
repository is the dataset's root. One JSON file per piece under ``data/``: ``existence.json, plurals.json,
counting-hard.json, counting-small-quant.json, counting-adversarial.json, relations.json, action-replacement.json,
actant-swap.json, coreference-standard.json, coreference-hard.json, foil-it.json``, each a dict ``{"<id>": row}``
(ids such as ``"existence_visual7w_2371044"``, ``"plurals:coco2017:308510"``, ``"1283539"``), every row with
``dataset``, ``image_file``, ``caption``, ``foil``, ``classes``, ``classes_foil`` and ``mturk`` = ``{"caption": k,
"foil": k, "other": k}``, the votes of three annotators (the pieces add their own keys: ``answer``,
``nli_scores``, ``only_caption``, ...). ``image_file`` is a file name in the piece's source image set (Visual7W,
COCO 2017 val, SWiG, VisDial, COCO 2014 val: the README says "follow the downloading instructions of the
respective original dataset"), resolved against the piece's image folder as the reference's ``config.py``
names it relative to the clone (``DATA``: ``data/visual7w/images/`` for existence and counting,
``data/plurals/test_images/``, ``data/relations/test_images/``, ``data/actions/images_512/`` for both action
pieces, ``data/coref/release_too_many_is_this_in_color/images/``, ``data/coref/release_v18/test_images/``, and COCO
val2014 for FOIL-it, which it names by an absolute path of its authors' machine). The folders are the manifest's
``images`` (negft/data_manifests/valse.yaml: piece -> folder, relative to the root or absolute; FOIL-it's is
``$NEGFT_DATA/coco/val2014``, the COCO copy ARO reads); a dataset without a manifest (the world's split, a test
fixture) uses the same folders under its root. (``config.py`` also names four JSON files by older names,
``data/relation.json``, ``data/counting_hard.json``, ``data/counting_adversarial.json`` and
``data/actions/actant-swap.json``: negft reads the files the release has.)

Which rows count: the valid set, ``row["mturk"]["caption"] >= 2`` ("at least two out of three annotators
identified the caption, but not the foil, as the text which accurately describes the image", README), as
``lxmert_valse_eval.py`` and ``unimodal_valse_eval.py`` filter before scoring; both metrics below read only
valid rows (the release's rows with ``caption == foil`` all fall outside it). A caption or foil that is the empty
string (or only spaces) is scored as the reference scores it: its loop tokenizes ``[caption, foil]`` as they are
(LXMERT's tokenizer gives ``[CLS] [SEP]`` for "", as ``clip.tokenize("")`` and open_clip's tokenizer give the start
and end tokens) and counts the row; nothing filters or raises (``bench/parity/valse.md``).

Metrics (``valse/<dataset>/<metric>``; ``<piece>`` is the file's stem with ``-`` as ``_``), with s(t) the
cosine similarity of the image and text t:

- ``<piece>`` (negft's rule): pairwise accuracy, 1 when s(caption) > s(foil), 1/2 on an exact tie, 0 otherwise.
- ``<piece>_official``: VALSE's rule, ``lxmert_valse_eval.py``'s pairwise accuracy ``acc_r``:
  ``if cross_score[0, 1] > cross_score[1, 1]: pairwise_acc += 1`` over the valid rows, the caption's score against
  the foil's, strict (a tie counts as wrong; ``unimodal_valse_eval.py``'s ``ppls[0] < ppls[1]`` is strict too).
  That script also leaves out a row whose foil's two LXMERT logits are equal (its tokenisation check); a
  similarity model has no such pair, so no row is left out for it.
- ``avg_macro`` (and ``_official``): the unweighted mean of the piece accuracies present; ``avg_micro`` (and
  ``_official``): the mean over all valid rows. The reference code prints the pieces only, and which average the
  paper's "Avg." uses is not stated there, so both are given.
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): rows left out (not an
  object; votes missing or not a whole number; ``image_file`` missing or not a non-empty string; ``caption`` or
  ``foil`` missing or not a string; image file not found); each piece with skipped rows also has an entry
  ``<prefix>/<piece>/rows`` in ``skipped`` naming the file and counting them by reason. Rows outside the valid
  set are not skipped rows: they are not part of the benchmark.

A piece whose file is absent is skipped with its path; an unreadable file (not JSON, not a dict of rows) is
skipped with the reason; the other pieces still run.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from negft.data import manifests
from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult, resolve
from negft.probes.released import bad_object, file_rows, finish, keyed_rows, read_json, section
from negft.probes.similarity import caption_pair_scores
from negft.probes.stats import pair_credits, part_means

PIECES = ("existence", "plurals", "counting-hard", "counting-small-quant", "counting-adversarial", "relations",
          "action-replacement", "actant-swap", "coreference-standard", "coreference-hard", "foil-it")
TEXTS = ("caption", "foil")     # "" among them is a text: the reference tokenizes it and scores the row
JSON_FOLDER = "data"    # the release's folder of piece files
MANIFEST = "valse"      # whose ``images`` are the release's image folders
VALID_VOTES = 2         # README: valid rows have sample["mturk"]["caption"] >= 2
NOT_VALID = "outside the valid set"


def metric_name(piece: str) -> str:
    return piece.replace("-", "_")


def _json_rows(path) -> list:
    """[(id, row)] of a piece file, or [(None, reason)] when the file is not a JSON dict."""
    data, why = read_json(path, dict)
    return [(None, why)] if data is None else list(data.items())


def piece_file(dataset: Dataset, piece: str) -> Path:
    """Where the release keeps a piece's JSON file: ``data/<piece>.json`` under the clone."""
    return dataset.root / JSON_FOLDER / f"{piece}.json"


def image_root(dataset: Dataset, piece: str) -> str:
    """The folder a piece's ``image_file`` is resolved against: the dataset's manifest's ``images[piece]``, else
    the VALSE manifest's (the release's ``config.py`` folders), relative to the root or absolute."""
    folders = section(dataset, "images", {}) or manifests.load(MANIFEST)["images"]
    return resolve(dataset.root, str(folders[piece]))


def _why_left_out(row) -> str | None:
    """Why a row cannot be scored (a skip reason), ``NOT_VALID`` for a row outside the valid set, or None. The
    votes come first, as in the reference, which looks at nothing else of a row outside the valid set."""
    why = bad_object(row, ())
    if why is not None:
        return why
    votes = row.get("mturk")
    count = votes.get("caption") if isinstance(votes, dict) else None
    if not isinstance(count, int) or isinstance(count, bool):
        return "'mturk' votes missing or not a whole number"
    if count < VALID_VOTES:
        return NOT_VALID
    return bad_object(row, ("image_file",)) or next(
        (f"'{k}' missing or not a string" for k in TEXTS if not isinstance(row.get(k), str)), None)


def read_piece(dataset: Dataset, piece: str) -> tuple[list[dict], Counter, str | None]:
    """(valid rows that can be scored, skipped rows by reason, why the whole file is skipped or None)."""
    return keyed_rows(dataset, piece_file(dataset, piece), _json_rows, _why_left_out, image_root(dataset, piece),
                      "image_file", lambda key, row, image: {"id": key, "image": image, "caption": row["caption"],
                                                             "foil": row["foil"]}, not_counted=NOT_VALID)


def caption_pairs(rows: list[dict]) -> list[str]:
    """Each row's caption and foil, row by row: what ``run`` encodes."""
    return [t for r in rows for t in (r["caption"], r["foil"])]


def texts(dataset: Dataset) -> list[str]:
    return [t for piece in PIECES for t in caption_pairs(read_piece(dataset, piece)[0])]


@register("valse", texts=texts, version=1, metrics=(*map(metric_name, PIECES), "avg_macro", "avg_micro"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result, prefix = ProbeResult(), f"valse/{dataset.name}"
    per_piece: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    records, n_skipped = [], 0
    for piece in PIECES:
        name = metric_name(piece)
        rows, n = file_rows(result, f"{prefix}/{name}", read_piece(dataset, piece), piece_file(dataset, piece),
                            "valid row")
        n_skipped += n
        if rows is None:
            continue
        pos, neg = caption_pair_scores(ctx, [r["image"] for r in rows], caption_pairs(rows))
        tie_aware, _ = per_piece[name] = pair_credits(pos, neg)     # VALSE's: strict > over the foil
        result.add_rules(f"{prefix}/{name}", per_piece[name], ctx.n_boot)
        records += [{"piece": name, "id": r["id"], "image": r["image"], "caption": r["caption"], "foil": r["foil"],
                     "pos": round(float(p), 5), "neg": round(float(q), 5), "credit": float(c)}
                    for r, p, q, c in zip(rows, pos, neg, tie_aware)]
    if per_piece:
        for which, suffix in ((0, ""), (1, "_official")):
            micro, macro = part_means([v[which] for v in per_piece.values()])
            result.add(f"{prefix}/avg_micro{suffix}", micro, ctx.n_boot)
            result.add(f"{prefix}/avg_macro{suffix}", macro, ctx.n_boot)
    return finish(result, prefix, n_skipped, records)
