"""ARO (Yuksekgonul et al., ICLR 2023, "When and why vision-language models behave like bags-of-words"):
VG-Relation, VG-Attribution, COCO-Order and Flickr30k-Order, read as released, and the one reader of ARO's
files that SNARE's tasks are also built from (``negft.probes.snare``).

Released layouts (mertyg/vision-language-models-are-bows ``dataset_zoo/aro_datasets.py``, ``main_aro.py``,
``dataset_zoo/perturbations.py``, ``dataset_zoo/retrieval.py`` and the notebook ``notebooks/Replicate ARO!
VG-Relation, VG-Attribution.ipynb``; the same keys are read by WangFei-2019/SNARE
``snare/datasets_zoo/snare_datasets.py``):

- ``visual_genome_relation.json``: a JSON list of rows with ``image_path`` (relative to ``<root>/images``),
  ``bbox_x, bbox_y, bbox_w, bbox_h``, ``true_caption``, ``false_caption``, ``relation_name``. The captions
  read "the woman is wearing the shirt" / "the shirt is wearing the woman" (ARO's and SNARE's papers; SNARE's
  code builds its "None" option as ``true_caption.replace("is " + relation_name, "and")``, so the pattern is
  "the X is R the Y"). 23,937 rows (the Hugging Face mirrors of the release).
- ``visual_genome_attribution.json``: the same with ``attributes`` (two strings) instead of ``relation_name``,
  and ``obj1_name``, ``obj2_name`` (read by SNARE's code); "the blue sky and the large building" / "the large
  sky and the blue building" (the true caption gives ``attributes[0]`` to ``obj1_name``). 28,748 rows.
- Both are scored on the image cropped to the box, ``image.crop((x, y, x + w, y + h))`` as ARO's
  ``__getitem__`` does (the box covers the two objects); here the crop is encoded under its own cache key.
- COCO-Order and Flickr30k-Order: the Karpathy test captions, ``coco_karpathy_test.json`` in the COCO root
  (``[{"image": "val2014/COCO_val2014_....jpg", "caption": [5 strings]}]``, images resolved against the
  root) and ``flickr30k_test.json`` in the Flickr30k root (``"image": "flickr30k-images/....jpg"``); each
  caption is one example with options ``[caption, shuffle_nouns_and_adj, shuffle_allbut_nouns_and_adj,
  shuffle_within_trigrams, shuffle_trigrams]``, every option passed through BLIP's ``pre_caption`` (lower case,
  ``.!"()*#:;~`` removed, 30 words at most). 25,010 (COCO, 5,000 images) and 5,000 (Flickr30k, 1,000 images)
  examples.

The perturbations, as ``perturbations.py`` builds them: nouns (Penn tags NN, NNS, NNP, NNPS) permuted among
themselves and adjectives (JJ, JJR, JJS) among themselves; every other token permuted; the word tokens cut into
consecutive trigrams, each shuffled in place; the trigrams' order shuffled. ARO tags and tokenizes with spaCy's
``en_core_web_sm`` and the trigrams with ``nltk.word_tokenize``. ``en_core_web_sm`` is not on PyPI (spaCy
installs from PyPI, its models do not), so it is used when it can be loaded (the command in
``negft.text.SPACY_INSTALL`` installs both) and otherwise the two part-of-speech perturbations are left out and
said so in ``skipped``. The trigram perturbations need no tagger: ``nltk.word_tokenize`` when nltk is installed
(its Treebank tokenizer alone when the punkt data is not), otherwise a regular-expression tokenizer that splits
words, punctuation and clitics ("n't", "'s", ...) as Treebank does. Randomness: ARO draws from one global generator seeded 1 (``main_aro.py
--seed``) in file order; here each caption's perturbation k draws from its own generator seeded
``(1, image index, caption index, k)``, so the options are reproducible and do not depend on which other
perturbations could be built (the shuffles differ from a run of ARO's code, their distribution does not).

Metrics, ``aro_<task>/<dataset>/<metric>`` (``aro_vg_relation/vg/acc``, ``aro_coco_order/coco/acc``; on the
world ``aro_vg_relation/world/acc``): a manifest ``aro_<task>`` runs its task on its folder; the world's split,
whose folder holds all four sets of files, runs every task. With s(t) the cosine similarity of the (cropped) image and text t
(``negft.probes.similarity``: equal captions get equal scores, as in ARO's ``np.einsum``, so ties stay ties):

- VG-Relation, VG-Attribution ``acc`` (negft): the mean over all rows of 1 if s(true) > s(false), 1/2 on an
  exact tie, 0 otherwise: a model that cannot tell the captions apart scores chance, 0.5.
- ``acc_macro`` (negft's tie rule, ARO's averaging): the mean over groups of the group's ``acc``: VG-Relation
  groups by ``relation_name`` and drops the relations in the notebook's ``symmetric`` list (below); VG-Attribution
  groups by ``"<attributes[0]>_<attributes[1]>"`` and drops groups of fewer than 25 rows (``evaluate_scores``).
- ``acc_official``: ARO's number: the same macro average of ``np.argmax`` over ``[false_caption,
  true_caption]`` == 1 (``evaluate_scores``; the notebook prints the mean of the per-group accuracies).
  ``argmax`` takes the first maximum and ARO puts the false caption first, so an exact tie counts as wrong:
  equal scores give 0, not 0.5. ``acc_official`` and ``acc`` differ by the tie rule and by the averaging;
  ``acc_macro`` differs from ``acc_official`` by the tie rule only.
- COCO-Order, Flickr30k-Order ``acc`` (negft): the credit of the unperturbed caption among the five options,
  1/k when tied with k − 1 others (chance: 1/5). ``acc_official``: ARO's ``Precision@1``, ``np.argmax`` == 0,
  which gives every tie to the unperturbed caption (index 0): equal scores give 1. Ties are not rare here: a
  caption with one noun and one adjective comes back from ``shuffle_nouns_and_adj`` unchanged, and the two
  options are then the same text. Both are micro averages over captions, as ARO's are.
- ``acc_trigrams`` / ``acc_trigrams_official``: the same over the three options that need no tagger (the caption
  and its two trigram shuffles), always reported, so runs with and without spaCy share one comparable number.
  Without the tagger ``acc`` / ``acc_official`` are skipped with the reason.
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): rows left out (not an
  object; a key missing or of the wrong type; a box with no area; the image file not found; a Karpathy entry
  without captions); each file with skipped rows also has an entry ``<prefix>/rows`` in ``skipped`` naming the
  file and counting them by reason.

A macro average is the mean of per-example values reweighted by n / (g · n_group) (n rows kept, g groups), so
its interval and paired tests resample examples like any other metric. A task whose file is absent is skipped
with its path; an unreadable file (not JSON, not a list) is skipped with the reason; the other tasks still run.
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from numbers import Real

import numpy as np
import torch

from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult, crop_key, missing, parse_once, resolve
from negft.probes.released import count_skips, note_skips
from negft.probes.stats import choice_credit, pair_credits
from negft.probes.similarity import option_scores
from negft.text import SPACY_INSTALL

RELATION_FILE = "visual_genome_relation.json"
ATTRIBUTION_FILE = "visual_genome_attribution.json"
VG_FILES = {"vg_relation": RELATION_FILE, "vg_attribution": ATTRIBUTION_FILE}
ORDER_FILES = {"coco_order": "coco_karpathy_test.json", "flickr30k_order": "flickr30k_test.json"}
TASKS = (*VG_FILES, *ORDER_FILES)
VG_IMAGES = "images"                  # ARO: image_dir = os.path.join(root_dir, "images")
BBOX = ("bbox_x", "bbox_y", "bbox_w", "bbox_h")
MIN_ATTRIBUTE_PAIR = 25               # VG_Attribution.evaluate_scores: groups with fewer rows are dropped
MAX_WORDS = 30                        # COCO_Order / Flickr30k_Order: pre_caption(caption, max_words=30)
SEED = 1                              # main_aro.py --seed
NOUN = frozenset(("NN", "NNS", "NNP", "NNPS"))
ADJ = frozenset(("JJ", "JJR", "JJS"))
VERB = frozenset(("VB", "VBD", "VBG", "VBN", "VBP", "VBZ"))
ORDER_OPTIONS = ("caption", "shuffle_nouns_and_adj", "shuffle_allbut_nouns_and_adj", "shuffle_within_trigrams",
                 "shuffle_trigrams")
TRIGRAM_OPTIONS = ("caption", "shuffle_within_trigrams", "shuffle_trigrams")

# VG-Relation's macro average leaves these relations out: the ``symmetric`` list of the notebook
# "Replicate ARO! VG-Relation, VG-Attribution.ipynb" (it holds more than symmetric relations; taken as released)
SYMMETRIC = frozenset((
    "adjusting", "attached to", "between", "bigger than", "biting", "boarding", "brushing", "chewing", "cleaning",
    "climbing", "close to", "coming from", "coming out of", "contain", "crossing", "dragging", "draped over",
    "drinking", "drinking from", "driving", "driving down", "driving on", "eating from", "eating in", "enclosing",
    "exiting", "facing", "filled with", "floating in", "floating on", "flying", "flying above", "flying in",
    "flying over", "flying through", "full of", "going down", "going into", "going through", "grazing in",
    "growing in", "growing on", "guiding", "hanging from", "hanging in", "hanging off", "hanging over",
    "higher than", "holding onto", "hugging", "in between", "jumping off", "jumping on", "jumping over", "kept in",
    "larger than", "leading", "leaning over", "leaving", "licking", "longer than", "looking in", "looking into",
    "looking out", "looking over", "looking through", "lying next to", "lying on top of", "making", "mixed with",
    "mounted on", "moving", "on the back of", "on the edge of", "on the front of", "on the other side of",
    "opening", "painted on", "parked at", "parked beside", "parked by", "parked in", "parked in front of",
    "parked near", "parked next to", "perched on", "petting", "piled on", "playing", "playing in", "playing on",
    "playing with", "pouring", "reaching for", "reading", "reflected on", "riding on", "running in", "running on",
    "running through", "seen through", "sitting behind", "sitting beside", "sitting by", "sitting in front of",
    "sitting near", "sitting next to", "sitting under", "skiing down", "skiing on", "sleeping in", "sleeping on",
    "smiling at", "sniffing", "splashing", "sprinkled on", "stacked on", "standing against", "standing around",
    "standing behind", "standing beside", "standing in front of", "standing near", "standing next to",
    "staring at", "stuck in", "surrounding", "swimming in", "swinging", "talking to", "topped with", "touching",
    "traveling down", "traveling on", "tying", "typing on", "underneath", "wading in", "waiting for",
    "walking across", "walking by", "walking down", "walking next to", "walking through", "working in",
    "working on", "worn on", "wrapped around", "wrapped in", "by", "of", "near", "next to", "with", "beside",
    "on the side of", "around"))


# ------------------------------------------------------------------ the reader of ARO's VG files
def _load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return None, f"{path}: unreadable JSON ({type(e).__name__}: {e})"


def _is_text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and np.isfinite(value)


def _vg_row(row, kind: str, image_dir: str) -> tuple[dict | None, str | None]:
    """(the row as the probes use it, None) or (None, why it is skipped)."""
    if not isinstance(row, dict):
        return None, "row is not an object"
    for key in ("image_path", "true_caption", "false_caption"):
        if not _is_text(row.get(key)):
            return None, f"'{key}' missing or not a non-empty string"
    for key in BBOX:
        if not _is_number(row.get(key)):
            return None, f"'{key}' missing or not a number"
    x, y, w, h = (row[k] for k in BBOX)
    if w <= 0 or h <= 0:
        return None, "bbox has no area"
    out = {"image": resolve(image_dir, row["image_path"]), "image_path": row["image_path"],
           "box": (x, y, x + w, y + h), "true": row["true_caption"], "false": row["false_caption"]}
    if kind == "vg_relation":
        if not _is_text(row.get("relation_name")):
            return None, "'relation_name' missing or not a non-empty string"
        out["relation"] = row["relation_name"]
    else:
        attrs = row.get("attributes")
        if not (isinstance(attrs, list) and len(attrs) == 2 and all(_is_text(a) for a in attrs)):
            return None, "'attributes' missing or not two strings"
        out["attributes"] = (attrs[0], attrs[1])
        for key in ("obj1_name", "obj2_name"):          # SNARE's negation and Sep options need them
            if _is_text(row.get(key)):
                out[key] = row[key]
    if not os.path.isfile(out["image"]):
        return None, "image file not found"
    return out, None


def _parse_vg(path, kind: str) -> list:
    data, why = _load_json(path)
    if why is None and not isinstance(data, list):
        why = f"{path}: expected a JSON list of rows, found {type(data).__name__}"
    if why is not None:
        return [([], Counter(), why)]
    image_dir = os.path.join(os.path.dirname(os.fspath(path)), VG_IMAGES)
    rows, skipped = [], Counter()
    for row in data:
        out, bad = _vg_row(row, kind, image_dir)
        if bad is None:
            rows.append(out)
        else:
            skipped[bad] += 1
    return [(rows, skipped, None)]


def _parse_relation(path):
    return _parse_vg(path, "vg_relation")


def _parse_attribution(path):
    return _parse_vg(path, "vg_attribution")


_VG_PARSERS = {"vg_relation": _parse_relation, "vg_attribution": _parse_attribution}


def read_vg(dataset: Dataset, kind: str) -> tuple[list[dict], Counter, str | None]:
    """(rows that can be scored, rows skipped by reason, why the whole file is skipped or None) of ARO's
    ``visual_genome_relation.json`` (``kind`` vg_relation) or ``visual_genome_attribution.json`` in the
    dataset's folder, parsed once per file version. A row: ``image`` (resolved path), ``image_path``, ``box``
    (x0, y0, x1, y1 as ARO crops), ``true``, ``false``, and ``relation`` or ``attributes`` (+ ``obj1_name``,
    ``obj2_name`` where given)."""
    path = dataset.root / VG_FILES[kind]
    if not path.exists():
        return [], Counter(), missing(dataset, path)
    return parse_once(path, _VG_PARSERS[kind])[0]


# ------------------------------------------------------------------ the reader of the Karpathy caption files
def _parse_captions(path) -> list:
    """[(image, caption index, caption)] of a Karpathy test file, plus the skipped entries by reason."""
    data, why = _load_json(path)
    if why is None and not isinstance(data, list):
        why = f"{path}: expected a JSON list of images, found {type(data).__name__}"
    if why is not None:
        return [([], Counter(), why)]
    root = os.path.dirname(os.fspath(path))
    items, skipped = [], Counter()
    for n, ann in enumerate(data):
        if not isinstance(ann, dict) or not _is_text(ann.get("image")):
            skipped["'image' missing or not a non-empty string"] += 1
            continue
        caps = ann.get("caption")
        caps = [caps] if isinstance(caps, str) else caps
        if not isinstance(caps, list) or not any(_is_text(c) for c in caps):
            skipped["'caption' missing or holding no caption"] += 1
            continue
        image = resolve(root, ann["image"])
        if not os.path.isfile(image):
            skipped["image file not found"] += 1
            continue
        for i, c in enumerate(caps):
            if _is_text(c):
                items.append((n, image, ann["image"], i, c))
            else:
                skipped["caption not a non-empty string"] += 1
    return [(items, skipped, None)]


def read_captions(path) -> tuple[list, Counter, str | None]:
    """([(image index, resolved image, image as written, caption index, caption)], skipped by reason, why the
    file is skipped or None) of ``coco_karpathy_test.json`` / ``flickr30k_test.json``."""
    return parse_once(path, _parse_captions)[0]


def pre_caption(caption: str, max_words: int = MAX_WORDS) -> str:
    """BLIP's caption cleaning as ARO imports it (``dataset_zoo/retrieval.py``)."""
    caption = re.sub(r"([.!\"()*#:;~])", " ", caption.lower())
    caption = re.sub(r"\s{2,}", " ", caption).rstrip("\n").strip(" ")
    words = caption.split(" ")
    return " ".join(words[:max_words]) if len(words) > max_words else caption


# ------------------------------------------------------------------ tokenizers and the part-of-speech tagger
_TREEBANK = re.compile(r"""[A-Za-z]+(?=n't\b) | n't\b | '(?:s|re|ve|ll|d|m)\b | \w+(?:[-.']\w+)* | \.\.\. | [^\w\s]""",
                       re.VERBOSE | re.IGNORECASE)
_TOKENIZER = None
_TAGGER: list = []                    # [callable or None, why not]: loaded once per process


def regex_tokenize(text: str) -> list[str]:
    """Treebank-style word tokens without nltk: words (hyphenated words kept whole), punctuation, and the clitics
    "n't", "'s", "'re", "'ve", "'ll", "'d", "'m" split off ("don't" -> "do", "n't")."""
    out = []
    for tok in _TREEBANK.findall(text):
        m = re.fullmatch(r"(\w+)('(?:s|re|ve|ll|d|m))", tok, re.IGNORECASE)
        out += [m.group(1), m.group(2)] if m else [tok]
    return out


def word_tokenize(text: str) -> list[str]:
    """``nltk.word_tokenize`` (ARO's trigram tokenizer) when nltk and its punkt data are installed, nltk's
    Treebank tokenizer alone when only nltk is, else ``regex_tokenize``."""
    global _TOKENIZER
    if _TOKENIZER is None:
        try:
            import nltk
            try:
                nltk.word_tokenize("a test.")
                _TOKENIZER = nltk.word_tokenize
            except LookupError:
                _TOKENIZER = nltk.tokenize.NLTKWordTokenizer().tokenize
        except ImportError:
            _TOKENIZER = regex_tokenize
    return _TOKENIZER(text)


def pos_tagger():
    """(tag, None): ``tag(text) -> [(token, Penn tag)]`` with spaCy's ``en_core_web_sm``, the tagger ARO and SNARE
    use; or (None, why it cannot be loaded)."""
    if not _TAGGER:
        try:
            import spacy
            nlp = spacy.load("en_core_web_sm")
            _TAGGER[:] = [lambda text: [(t.text, t.tag_) for t in nlp(text)], None]
        except Exception as e:                       # ImportError, or OSError: model not installed
            _TAGGER[:] = [None, (f"they need spaCy's en_core_web_sm part-of-speech tagger, which cannot be loaded "
                                 f"here ({type(e).__name__}: {e}); install spaCy and the model with: "
                                 f"{SPACY_INSTALL.format(model='en_core_web_sm')}")]
    return _TAGGER[0], _TAGGER[1]


# ------------------------------------------------------------------ ARO's perturbations (perturbations.py)
def _permute(tokens: list[str], idx: list[int], rng) -> list[str]:
    out = list(tokens)
    for i, j in zip(idx, rng.permutation(idx).tolist()):
        out[i] = tokens[j]
    return out


def shuffle_classes(tagged: list[tuple[str, str]], classes, rng) -> str:
    """Each class's tokens permuted among themselves (shuffle_nouns_and_adj: classes NOUN, ADJ)."""
    tokens = [t for t, _ in tagged]
    for tags in classes:
        tokens = _permute(tokens, [i for i, (_, tag) in enumerate(tagged) if tag in tags], rng)
    return " ".join(tokens)


def shuffle_others(tagged: list[tuple[str, str]], keep, rng) -> str:
    """Every token whose tag is not in ``keep`` permuted (shuffle_allbut_nouns_and_adj: keep NOUN | ADJ)."""
    tokens = [t for t, _ in tagged]
    return " ".join(_permute(tokens, [i for i, (_, tag) in enumerate(tagged) if tag not in keep], rng))


def trigrams(tokens: list[str]) -> list[list[str]]:
    return [tokens[i:i + 3] for i in range(0, len(tokens), 3)]


def shuffle_within_trigrams(caption: str, rng) -> str:
    return " ".join(" ".join(_permute(t, list(range(len(t))), rng)) for t in trigrams(word_tokenize(caption)))


def shuffle_trigrams(caption: str, rng) -> str:
    grams = trigrams(word_tokenize(caption))
    return " ".join(" ".join(grams[j]) for j in rng.permutation(len(grams)).tolist())


def caption_rng(image: int, caption: int, k: int) -> np.random.Generator:
    return np.random.default_rng([SEED, image, caption, k])


def _order_cases(path) -> list:
    items, skipped, why = read_captions(path)
    tag, _ = pos_tagger()
    cases = []
    for n, image, written, i, caption in items:
        opts = {"caption": caption,
                "shuffle_within_trigrams": shuffle_within_trigrams(caption, caption_rng(n, i, 3)),
                "shuffle_trigrams": shuffle_trigrams(caption, caption_rng(n, i, 4))}
        if tag is not None:
            tagged = tag(caption)
            opts["shuffle_nouns_and_adj"] = shuffle_classes(tagged, (NOUN, ADJ), caption_rng(n, i, 1))
            opts["shuffle_allbut_nouns_and_adj"] = shuffle_others(tagged, NOUN | ADJ, caption_rng(n, i, 2))
        cases.append({"image": image, "image_path": written, "caption_index": i,
                      "options": {k: pre_caption(v) for k, v in opts.items()}})
    return [(cases, skipped, why)]


def read_order(dataset: Dataset, task: str) -> tuple[list[dict], Counter, str | None]:
    """(examples {image, image_path, caption_index, options: name -> text}, skipped by reason, why the file is
    skipped) of COCO-Order or Flickr30k-Order; the options named in ORDER_OPTIONS that could be built."""
    path = dataset.root / ORDER_FILES[task]
    if not path.exists():
        return [], Counter(), missing(dataset, path)
    return parse_once(path, _order_cases)[0]


# ------------------------------------------------------------------ images cropped to a box
def encode_crops(ctx: EvalContext, crops: list[tuple[str, tuple]]) -> torch.Tensor:
    """L2-normalised features (N, D) of each image cropped to its box ``(x0, y0, x1, y1)`` (PIL's crop, as ARO
    and SNARE crop), encoded and cached like any image under the key ``<path>#crop=x0,y0,x1,y1``."""
    return ctx.encode_images([crop_key(p, b) for p, b in crops])


# ------------------------------------------------------------------ scoring
def first_max(scores: torch.Tensor) -> torch.Tensor:
    """(N, C) one-hot of ``np.argmax``'s pick: the first of the maximal scores."""
    at_max = scores >= scores.max(dim=1, keepdim=True).values
    return (at_max & (at_max.int().cumsum(1) == 1)).double()


def macro_weights(groups: list, keep) -> tuple[torch.Tensor, int]:
    """(per-row weight n / (g · n_group) for rows whose group passes ``keep(group, count)``, else 0; g)."""
    counts = Counter(groups)
    kept = {k for k, c in counts.items() if keep(k, c)}
    n = sum(counts[k] for k in kept)
    w = torch.tensor([n / (len(kept) * counts[k]) if k in kept else 0.0 for k in groups], dtype=torch.float64)
    return w, len(kept)


def _vg_texts(rows) -> list[str]:
    return [t for r in rows for t in (r["true"], r["false"])]


def _order_texts(cases) -> tuple[list[str], list[str]]:
    """(the option names the cases have, in ARO's order; their texts, case by case)."""
    names = [n for n in ORDER_OPTIONS if n in cases[0]["options"]] if cases else []
    return names, [c["options"][n] for c in cases for n in names]


def score_vg(ctx, dataset: Dataset, kind: str, prefix: str, result: ProbeResult) -> int:
    """VG-Relation or VG-Attribution into ``result``; returns the number of rows skipped."""
    rows, skipped, why = read_vg(dataset, kind)
    if why is not None:
        result.skipped[prefix] = why
        return 0
    note_skips(result, prefix, dataset.root / VG_FILES[kind], skipped, len(rows) + sum(skipped.values()))
    if not rows:
        result.skipped.setdefault(prefix, f"no row to score in {dataset.root / VG_FILES[kind]}")
        return sum(skipped.values())
    images = encode_crops(ctx, [(r["image"], r["box"]) for r in rows])
    texts = ctx.encode_texts(_vg_texts(rows)).view(len(rows), 2, -1)
    s = option_scores(images, texts).double()        # [:, 0] true, [:, 1] false
    tie_aware, official = pair_credits(s[:, 0], s[:, 1])   # argmax over [false, true] == 1: a tie goes to the false one
    if kind == "vg_relation":
        groups = [r["relation"] for r in rows]
        weights, g = macro_weights(groups, lambda k, c: k not in SYMMETRIC)
        rule = "every relation is in ARO's symmetric list"
    else:
        groups = [f"{r['attributes'][0]}_{r['attributes'][1]}" for r in rows]
        weights, g = macro_weights(groups, lambda k, c: c >= MIN_ATTRIBUTE_PAIR)
        rule = f"no attribute pair has {MIN_ATTRIBUTE_PAIR} rows or more"
    result.add(f"{prefix}/acc", tie_aware, ctx.n_boot)
    if g:
        keep = weights > 0
        result.add(f"{prefix}/acc_macro", (tie_aware * weights)[keep], ctx.n_boot)
        result.add(f"{prefix}/acc_official", (official * weights)[keep], ctx.n_boot)
    else:
        for name in ("acc_macro", "acc_official"):
            result.skipped[f"{prefix}/{name}"] = f"ARO's macro average has no group to average: {rule}"
    result.records[prefix] = [
        {"image_path": r["image_path"], "box": list(r["box"]), "true_caption": r["true"],
         "false_caption": r["false"], "group": grp, "s_true": round(float(a), 5), "s_false": round(float(b), 5),
         "credit": float(c)} for r, grp, (a, b), c in zip(rows, groups, s.tolist(), tie_aware)]
    return sum(skipped.values())


def score_order(ctx, dataset: Dataset, task: str, prefix: str, result: ProbeResult) -> int:
    cases, skipped, why = read_order(dataset, task)
    if why is not None:
        result.skipped[prefix] = why
        return 0
    path = dataset.root / ORDER_FILES[task]
    note_skips(result, prefix, path, skipped, len(cases) + sum(skipped.values()))
    if not cases:
        result.skipped.setdefault(prefix, f"no caption to score in {path}")
        return sum(skipped.values())
    names, option_texts = _order_texts(cases)
    images = ctx.encode_images([c["image"] for c in cases])
    texts = ctx.encode_texts(option_texts).view(len(cases), len(names), -1)
    scores = option_scores(images, texts).double()
    right = torch.zeros(len(cases), dtype=torch.long)
    tri = [names.index(n) for n in TRIGRAM_OPTIONS]
    variants = [("acc_trigrams", scores[:, tri])]
    if len(names) == len(ORDER_OPTIONS):
        variants.insert(0, ("acc", scores))
    else:
        result.skipped[f"{prefix}/acc"] = ("ARO's five-option score left out: its perturbations "
                                           "shuffle_nouns_and_adj and shuffle_allbut_nouns_and_adj are not built: "
                                           + pos_tagger()[1])
    credit = None
    for name, sc in variants:
        credit_v = choice_credit(sc, right).double()
        credit = credit_v if credit is None else credit
        result.add(f"{prefix}/{name}", credit_v, ctx.n_boot)
        result.add(f"{prefix}/{name}_official", first_max(sc)[:, 0], ctx.n_boot)   # argmax == 0: ties to it
    result.records[prefix] = [
        {"image_path": c["image_path"], "caption_index": c["caption_index"], "options": dict(zip(names, opts)),
         "scores": [round(float(v), 5) for v in row], "credit": float(cr)}
        for c, opts, row, cr in zip(cases, ([c["options"][n] for n in names] for c in cases), scores, credit)]
    return sum(skipped.values())


def task_of(dataset: Dataset) -> str | None:
    """The one task a dataset serves: its manifest's (``aro_<task>``), or a dataset named after a task
    (fixtures); None for the world's split, whose folder holds all four sets of files."""
    if dataset.manifest.startswith("aro_") and dataset.manifest[4:] in TASKS:
        return dataset.manifest[4:]
    return dataset.name if dataset.name in TASKS else None


def tasks_of(dataset: Dataset) -> list[tuple[str, str]]:
    """[(task, metric prefix ``aro_<task>/<dataset>``)]: the dataset's one task, or all four."""
    task = task_of(dataset)
    return [(t, f"aro_{t}/{dataset.name}") for t in ([task] if task else TASKS)]


def texts(dataset: Dataset) -> list[str]:
    out = []
    for task, _ in tasks_of(dataset):
        if task in VG_FILES:
            out += _vg_texts(read_vg(dataset, task)[0])
        else:
            out += _order_texts(read_order(dataset, task)[0])[1]
    return out


@register("aro", texts=texts, version=2, metrics={
    "aro_vg_relation": ("acc", "acc_macro"), "aro_vg_attribution": ("acc", "acc_macro"),
    "aro_coco_order": ("acc", "acc_trigrams"), "aro_flickr30k_order": ("acc", "acc_trigrams")})
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    for task, prefix in tasks_of(dataset):
        score = score_vg if task in VG_FILES else score_order
        count_skips(result, prefix, score(ctx, dataset, task, prefix, result))
    return result
