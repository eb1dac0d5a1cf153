"""SNARE (sections III-B to III-E, tables II-IV, figure 2): multiple-choice alignment
probes built from ARO's released files, as SNARE's code builds them, and scored as the share of top-1 picks
per option class (the paper's "class probability").

Read from (one reader of ARO's JSON, ``negft.probes.aro``): ``visual_genome_attribution.json`` and
``visual_genome_relation.json`` (images cropped to each row's box, as SNARE's ``__getitem__`` crops them) for
negation logic, attribute ownership, relationship composition and multi-spatial relationship; the Karpathy test
captions (``coco_karpathy_test.json`` / ``flickr30k_test.json``, ARO's COCO-Order and Flickr30k-Order files) for
semantic structure. The options, from WangFei-2019/SNARE ``snare/datasets_zoo/snare_datasets.py`` (classes
``VG_Attribution``, ``VG_Relation``, ``COCO_Semantic_Structure``, ``Flickr30k_Semantic_Structure``) and
``snare/datasets_zoo/data_des.py`` (``Text_Des``), in SNARE's option order:

- ``snare_negation`` (``VG_Attribution(logic=True)``, every attribution row): Cor "the {obj1_name} is
  {attributes[0]} and the {obj2_name} is {attributes[1]}", Wro "the {obj1_name} is not {attributes[0]} and the
  {obj2_name} is not {attributes[1]}". Metrics ``cor``, ``wro``.
- ``snare_attribute`` (``VG_Attribution(attribute_ownership=True)``): Cor ``true_caption``, Exc ``false_caption``,
  Sep "the {obj1_name} and the {obj2_name} are {attributes[0]} and {attributes[1]} respectively". Metrics ``cor``,
  ``sep``, ``exc``.
- ``snare_relation`` (``VG_Relation(subordination_relation=True)``): the relation rows whose ``relation_name`` is
  not one of "near", "next to", "beside", "on the side of", "surrounding", "close to", "standing beside", "with",
  "by"; Cor ``true_caption``, Exc ``false_caption``, None ``true_caption.replace("is " + relation_name, "and")``
  ("the X and the Y"). Metrics ``cor``, ``exc``, ``none``.
- ``snare_spatial`` (``VG_Relation(multi_spatial_relation=True)``): the relation rows whose ``relation_name`` is
  "to the left of", "to the right of", "on" or "below"; the four options ``true_caption.replace(relation_name,
  p)`` for those four p (Python's ``str.replace`` replaces every occurrence, as SNARE's code does: "on" inside
  another word of the caption is replaced too), the right one being the row's relation. Metrics ``acc`` (the right
  option's share) and ``chose_left``, ``chose_right``, ``chose_on``, ``chose_below`` (figure 2: which predicate
  the picks land on).
- ``snare_structure`` (``COCO_Semantic_Structure`` / ``Flickr30k_Semantic_Structure``, ``semantic_structure=True``):
  every Karpathy test caption with options [caption, ``shuffle_nouns_and_verb_adj`` (nouns, verbs and adjectives,
  each class permuted among itself: the content words), ``shuffle_allbut_nouns_verb_adj`` (every other token),
  ``shuffle_all_words`` (the caption split on spaces and permuted)], each through ``pre_caption`` (30 words).
  Metrics ``origin``, ``shuffle_content``, ``shuffle_noncontent``, ``shuffle_all``. The first two need spaCy's
  ``en_core_web_sm`` tagger, which does not install from PyPI (``negft.probes.aro.pos_tagger``): without it the
  task is skipped with the reason. Seeded per caption as ARO's order perturbations are.

Scoring: per sample, the (cropped) image's cosine similarity to each option; each class's share of the top-1
pick, averaged over samples (every share metric of a task sums to 1). ``<class>`` (negft): ties split the pick
evenly, so a model that gives every option the same score spreads its picks evenly (chance). ``<class>_official``:
SNARE's rule, ``utils.top_n_accuracy`` (top-1) and ``np.argmax`` for semantic structure: a tie goes to the
first option (the authors' comment in ``top_n_accuracy``: reversing the columns makes ties favour the first
class), which is the true caption in every task but multi-spatial, where it is "to the left of". SNARE reports
these shares over all samples (its "总体数据" records); its per-relation / per-attribute breakdowns (groups of
25 rows or more) are not reported here. ``skipped_rows`` (only when rows were skipped; a count): rows of the
source file the task could not use (malformed rows, see ``negft.probes.aro``; attribution rows without
``obj1_name`` / ``obj2_name`` for negation and attribute ownership), with an entry ``<prefix>/rows`` in
``skipped`` counting them by reason; rows outside a task's relation set are not skipped rows but the task's
definition.

Datasets: ``vg`` (negft/data_manifests/snare.yaml, ARO's VG folder) runs the four VG tasks; ARO's order manifests
(``aro_coco_order``, ``aro_flickr30k_order``: datasets ``coco``, ``flickr30k``, which list ``snare`` among their probes) run semantic structure on
their caption file; any other dataset (the world's split, whose folder holds ARO's files as released) runs all
five, semantic structure on ``coco_karpathy_test.json``. Metric keys ``snare_<task>/<dataset>/<metric>``.
"""
from __future__ import annotations

from collections import Counter

import torch

from negft.probes import aro, register
from negft.probes.base import Dataset, EvalContext, ProbeResult, missing, parse_once
from negft.probes.released import report_skips
from negft.probes.stats import choice_shares
from negft.probes.similarity import option_scores

CLASSES = {
    "negation": ("cor", "wro"),
    "attribute": ("cor", "exc", "sep"),                  # SNARE's option order: correct, exchange, separate
    "relation": ("cor", "exc", "none"),
    "spatial": ("left", "right", "on", "below"),
    "structure": ("origin", "shuffle_content", "shuffle_noncontent", "shuffle_all"),
}
SPATIAL = {"left": "to the left of", "right": "to the right of", "on": "on", "below": "below"}
NOT_COMPOSITION = frozenset(("near", "next to", "beside", "on the side of", "surrounding", "close to",
                             "standing beside", "with", "by"))
VG_TASKS = {"negation": "vg_attribution", "attribute": "vg_attribution", "relation": "vg_relation",
            "spatial": "vg_relation"}
STRUCTURE_FILES = {"coco_order": "coco_karpathy_test.json", "flickr30k_order": "flickr30k_test.json"}
WORLD_STRUCTURE_FILE = "coco_karpathy_test.json"


def negation(r: dict) -> list[str]:
    (a, b), x, y = r["attributes"], r["obj1_name"], r["obj2_name"]
    return [f"the {x} is {a} and the {y} is {b}", f"the {x} is not {a} and the {y} is not {b}"]


def attribute(r: dict) -> list[str]:
    (a, b), x, y = r["attributes"], r["obj1_name"], r["obj2_name"]
    return [r["true"], r["false"], f"the {x} and the {y} are {a} and {b} respectively"]


def relation(r: dict) -> list[str]:
    return [r["true"], r["false"], r["true"].replace("is " + r["relation"], "and")]


def spatial(r: dict) -> list[str]:
    return [r["true"].replace(r["relation"], p) for p in SPATIAL.values()]


def _vg_samples(dataset: Dataset, task: str) -> tuple[list, Counter, str | None]:
    """([(image, box, options, right)], rows skipped by reason, why the file is skipped)."""
    rows, skipped, why = aro.read_vg(dataset, VG_TASKS[task])
    skipped = Counter(skipped)
    out = []
    for r in rows:
        if task in ("negation", "attribute"):
            if "obj1_name" not in r or "obj2_name" not in r:
                skipped["'obj1_name' / 'obj2_name' missing or not a non-empty string"] += 1
                continue
            out.append((r, negation(r) if task == "negation" else attribute(r), 0))
        elif task == "relation":
            if r["relation"] not in NOT_COMPOSITION:
                out.append((r, relation(r), 0))
        elif r["relation"] in SPATIAL.values():
            out.append((r, spatial(r), list(SPATIAL.values()).index(r["relation"])))
    return out, skipped, why


def _structure_cases(path) -> list:
    items, skipped, why = aro.read_captions(path)
    tag, _ = aro.pos_tagger()
    if tag is None:
        return [([], skipped, why)]
    cases = []
    for n, image, written, i, caption in items:
        tagged = tag(caption)
        opts = [caption,
                aro.shuffle_classes(tagged, (aro.NOUN, aro.VERB, aro.ADJ), aro.caption_rng(n, i, 5)),
                aro.shuffle_others(tagged, aro.NOUN | aro.VERB | aro.ADJ, aro.caption_rng(n, i, 6)),
                " ".join(caption.split(" ")[j] for j in aro.caption_rng(n, i, 7).permutation(
                    len(caption.split(" "))).tolist())]
        cases.append(({"image": image, "image_path": written, "caption_index": i},
                      [aro.pre_caption(o) for o in opts], 0))
    return [(cases, skipped, why)]


def _structure_samples(dataset: Dataset, filename: str) -> tuple[list, Counter, str | None]:
    path = dataset.root / filename
    if not path.exists():
        return [], Counter(), missing(dataset, path)
    cases, skipped, why = parse_once(path, _structure_cases)[0]
    if why is None and aro.pos_tagger()[0] is None:
        why = ("semantic structure left out: its options shuffle_nouns_and_verb_adj and "
               "shuffle_allbut_nouns_verb_adj are not built: " + aro.pos_tagger()[1])
    return cases, skipped, why


def tasks_of(dataset: Dataset) -> list[tuple[str, str | None]]:
    """[(task, caption file for structure)] the dataset serves."""
    task = aro.task_of(dataset)
    if dataset.name == "vg" and task is None:
        return [(t, None) for t in VG_TASKS]
    if task in STRUCTURE_FILES:
        return [("structure", STRUCTURE_FILES[task])]
    return [*((t, None) for t in VG_TASKS), ("structure", WORLD_STRUCTURE_FILE)]


def load_samples(dataset: Dataset) -> dict[str, tuple[list, Counter, str | None]]:
    """task -> ([(row or case, options in CLASSES order, index of the true option)], skipped rows by reason,
    why the task is skipped or None)."""
    return {task: (_structure_samples(dataset, f) if task == "structure" else _vg_samples(dataset, task))
            for task, f in tasks_of(dataset)}


def option_texts(items: list) -> list[str]:
    """Every sample's options, sample by sample: what ``run`` encodes."""
    return [o for _, opts, _ in items for o in opts]


def _texts(dataset: Dataset) -> list[str]:
    return [o for items, _, _ in load_samples(dataset).values() for o in option_texts(items)]


def _file(dataset: Dataset, task: str) -> str:
    if task == "structure":
        return str(dataset.root / dict(tasks_of(dataset))["structure"])
    return str(dataset.root / aro.VG_FILES[VG_TASKS[task]])


# the true option's share is better higher, every wrong option's lower; multi-spatial's picks per predicate
@register("snare", texts=_texts, version=2, metrics={
    "snare_negation": ("cor", "wro"), "snare_attribute": ("cor", "sep", "exc"),
    "snare_relation": ("cor", "exc", "none"), "snare_spatial": ("acc", "chose_<x>"),
    "snare_structure": ("origin", "shuffle_content", "shuffle_noncontent", "shuffle_all")},
    lower=("wro", "sep", "exc", "none", "shuffle_content", "shuffle_noncontent", "shuffle_all"),
    unordered=("chose_<x>",))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    for task, (items, skipped, why) in load_samples(dataset).items():
        prefix = f"snare_{task}/{dataset.name}"
        if why is not None:
            result.skipped[prefix] = why
            continue
        report_skips(result, prefix, _file(dataset, task), skipped, len(items) + sum(skipped.values()))
        if not items:
            result.skipped[prefix] = f"no sample of this task in {_file(dataset, task)}"
            continue
        k = len(CLASSES[task])
        if task == "structure":
            images = ctx.encode_images([r["image"] for r, _, _ in items])
        else:
            images = aro.encode_crops(ctx, [(r["image"], r["box"]) for r, _, _ in items])
        texts = ctx.encode_texts(option_texts(items)).view(len(items), k, -1)
        scores = option_scores(images, texts).double()
        for suffix, shares in (("", choice_shares(scores)), ("_official", aro.first_max(scores))):
            if task == "spatial":
                right = torch.tensor([r for _, _, r in items])
                result.add(f"{prefix}/acc{suffix}", shares.gather(1, right.view(-1, 1)).squeeze(1), ctx.n_boot)
                for c, name in enumerate(CLASSES[task]):
                    result.add(f"{prefix}/chose_{name}{suffix}", shares[:, c], ctx.n_boot)
            else:
                for c, name in enumerate(CLASSES[task]):
                    result.add(f"{prefix}/{name}{suffix}", shares[:, c], ctx.n_boot)
        shares = choice_shares(scores)
        result.records[prefix] = [{"image_path": r["image_path"], **({"box": list(r["box"])} if "box" in r else {}),
                                   "options": o, "right": right_i, "scores": [round(v, 5) for v in sc],
                                   "shares": sh}
                                  for (r, o, right_i), sc, sh in zip(items, scores.tolist(), shares.tolist())]
    return result
