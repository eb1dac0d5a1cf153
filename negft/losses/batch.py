"""The batch fields the terms ask for, each a function of a batch's samples' json (and the stream's tokenizer) ->
a tensor, which the data pipeline calls on each batch of a stream that reads it (a term's ``fields``;
``negft.data.pipeline.StreamSpec.fields``). A field one method alone reads sits in that method's module
(CE-CLIP's ``ceclip_slots``)."""
from __future__ import annotations

import re

import torch

from negft.data import schema


def _mentions(text: str, names) -> set:
    return {n for n in names if re.search(rf"\b{re.escape(n)}s?\b", text.lower())}


def _objects(meta: dict) -> tuple[list, list]:
    objects = meta.get(schema.OBJECTS)
    if not isinstance(objects, dict):
        return [], []
    return [o for o in objects.get("positive", []) if isinstance(o, str)], \
        [o for o in objects.get("negative", []) if isinstance(o, str)]


def answer_truth(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(M, M) bool: whether question i's right answer is true of image j, from the object labels. The answer's
    mentioned objects that image i holds are affirmed, those it lacks negated; the answer is true of image j when
    j holds every affirmed object and none of the negated ones. Where a label is missing (real data without
    ``objects``) the truth is unknown and counted true: an unlabelled question's row is all true, so it adds
    nothing to the text→image term ("no dog" is true of most images; treating them as wrong would teach the
    opposite of negation), and an unlabelled image is never a wrong pick."""
    objects = [_objects(m) for m in metas]
    pos = [set(p) for p, _ in objects]
    neg = [set(n) for _, n in objects]
    labelled = [bool(p or n) for p, n in zip(pos, neg)]
    truth = torch.ones(len(metas), len(metas), dtype=torch.bool)
    for i, m in enumerate(metas):
        if not labelled[i]:
            continue
        answer = m[schema.MCQ]["options"][m[schema.MCQ]["answer"]]
        said = _mentions(answer, pos[i] | neg[i])
        affirmed, negated = said & pos[i], said & neg[i]
        for j in range(len(metas)):
            if labelled[j] and j != i:
                truth[i, j] = affirmed <= pos[j] and not (negated & pos[j])
    return truth


def option_truth(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(M·C, M) bool, rows in (question, option) order: whether option c of question i is true of image j, from
    the option's recorded [affirmed, negated] objects (``mcq.option_objects``) and image j's labels: j holds the
    affirmed object and not the negated one. A question without ``option_objects``, or an image without labels,
    is unknown and counted true (an all-true row adds 0 to the term), as in ``answer_truth``."""
    pos = [set(_objects(m)[0]) for m in metas]
    n = len(metas)
    truth = torch.ones(n, schema.N_OPTIONS, n, dtype=torch.bool)
    for i, m in enumerate(metas):
        said = m[schema.MCQ].get("option_objects")
        if not (isinstance(said, list) and len(said) == schema.N_OPTIONS
                and all(isinstance(o, list) and len(o) == 2 for o in said)):
            continue
        for c, (affirmed, negated) in enumerate(said):
            for j in range(n):
                if pos[j]:
                    truth[i, c, j] = (affirmed is None or affirmed in pos[j]) and negated not in pos[j]
    return truth.flatten(0, 1)


def negcap_hard_negatives(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(M, M) bool: whether image j (j ≠ i) holds an object that the NegCap caption drawn for sample i negates
    (one of i's labelled ``objects.negative`` the caption mentions, which image i lacks), so the caption is false
    of it. A sample without a drawn NegCap caption (another stream's) or without labels has no hard negatives,
    and an unlabelled image is none: the labels alone say an image holds the object."""
    objects = [_objects(m) for m in metas]
    held = [set(pos) for pos, _ in objects]
    hard = torch.zeros(len(metas), len(metas), dtype=torch.bool)
    for i, m in enumerate(metas):
        caption = m.get(schema.DRAWN_NEGCAP)
        negated = _mentions(caption, objects[i][1]) if isinstance(caption, str) else set()
        for j, h in enumerate(held):
            hard[i, j] = j != i and bool(negated & h)
    return hard


def _caption(meta: dict) -> str:
    caption = meta.get(schema.CAPTION)
    return caption if isinstance(caption, str) else ""


def caption_tokens(metas: list[dict], tokenize) -> torch.Tensor:
    """The tokens of each sample's affirmative ``caption`` ("" where it has none)."""
    return tokenize([_caption(m) for m in metas])


def has_caption(metas: list[dict], tokenize=None) -> torch.Tensor:
    return torch.tensor([bool(_caption(m)) for m in metas])


def option_affirmative(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(M, C) bool: which MCQ options are affirmative (``option_templates`` == positive; none where unrecorded)."""
    rows = []
    for m in metas:
        templates = m[schema.MCQ].get("option_templates")
        rows.append([t == "positive" for t in templates] if isinstance(templates, list)
                    and len(templates) == schema.N_OPTIONS else [False] * schema.N_OPTIONS)
    return torch.tensor(rows)


def question_weights(metas: list[dict], tokenize=None, weight: float = 1.0) -> torch.Tensor:
    """(M,): ``weight`` where the question's right answer is a negation (``answer_template`` = negative), 1
    elsewhere."""
    return torch.tensor([weight if m[schema.MCQ].get("answer_template") == "negative" else 1.0 for m in metas])


def _hard_texts(meta: dict) -> tuple[str, str, str]:
    """A RelComp sample's (drawn hard caption, its negative image's caption, that image's drawn hard caption), ""
    for what it lacks. The pipeline drew the indices for the epoch (``schema.DRAWN_NEGATIVES``)."""
    record = meta.get(schema.RELCOMP)
    drawn = meta.get(schema.DRAWN_NEGATIVES)
    if not isinstance(record, dict) or drawn is None:
        return "", "", ""
    negatives = [n["text"] for n in record.get("negatives") or () if isinstance(n, dict)]
    own = record.get("negative_image_caption")
    own = own if isinstance(own, str) else ""
    theirs = [t for t in record.get("negative_image_negatives") or () if isinstance(t, str) and t]
    return (negatives[drawn[0]] if drawn[0] < len(negatives) else "", own,
            theirs[drawn[1]] if own and drawn[1] < len(theirs) else "")


def hard_caption(metas: list[dict], tokenize) -> torch.Tensor:
    """(B, L): one hard-negative caption of each image, drawn from its ``negatives`` anew each epoch (NegCLIP's T⁻)."""
    return tokenize([_hard_texts(m)[0] for m in metas])


def negative_image_caption(metas: list[dict], tokenize) -> torch.Tensor:
    """(B, L): the caption of each sample's hard-negative image ("" where it has none: TripletCLIP's T⁻ of I⁻)."""
    return tokenize([_hard_texts(m)[1] for m in metas])


def negative_image_hard_caption(metas: list[dict], tokenize) -> torch.Tensor:
    """(B, L): a hard-negative caption of the negative image, drawn anew each epoch (NegCLIP's fourth text block)."""
    return tokenize([_hard_texts(m)[2] for m in metas])


def negative_image_captioned(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(B,) bool: the sample's negative image comes with its own caption."""
    return torch.tensor([bool(_hard_texts(m)[1]) for m in metas])


def negative_image_hard_captioned(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(B,) bool: the sample's negative image comes with its own caption and a hard caption of it."""
    return torch.tensor([all(_hard_texts(m)[1:]) for m in metas])
