"""Caption, NegCap and NegMCQ templates of the embedded world.

Every template is a ``str.format`` pattern. Slots:

- ``{objs}``  an affirmative list of present objects with optional attributes ("a small red star and a ring")
- ``{bg}``    a background phrase ("on the beach"); templates without it never mention the background
- ``{pos}``   the affirmative part of a negated caption (an ``{objs}`` phrase, maybe followed by a ``{bg}``)
- ``{an}``    one object named by shape with its article ("a star", "an arrow")
- ``{n}``     one object named by shape without article ("star")
- ``{p}``     (MCQ) the affirmed object with article; ``{q}`` / ``{Q}`` the negated object with article,
              ``{qn}`` the negated object without article (``_fill`` capitalises a text's first letter)

Each table is split into TRAIN phrasings (used in the pretrain / finetune shards) and HELD-OUT
phrasings (used only in the val / test CSVs). ``HELD_OUT_MARKERS`` gives, for every held-out phrasing,
a literal fragment that no training phrasing contains, so tests can check the split.

A held-out negation says "not" / "no" in an arrangement no training phrasing has (after the object, or
with a new verb), but never with a negation word the world's text never uses: the tiny text tower
learns its whole vocabulary here, so a cue it has never read ("nowhere", "lacks") would make the probe a
vocabulary test that no model trained on the world can pass. CLIP has read those words on the web; our
stand-in can only be asked to recombine the ones it knows (``SEEN_NEGATION_CUES``).
"""

from __future__ import annotations

from negft.text import with_article

# ---------------------------------------------------------------- affirmative captions (alt-text)
AFFIRM_TRAIN = (
    "{objs}",
    "{objs} {bg}",
    "a picture of {objs}",
    "a photo of {objs} {bg}",
    "an image showing {objs}",
    "there is {objs} {bg}",
    "a drawing of {objs}",
    "clip art of {objs} {bg}",
    "{bg}: {objs}",
    "this picture shows {objs}",
    "a scene with {objs} {bg}",
    "simple shapes: {objs}",
)
AFFIRM_HELD_OUT = (
    "a rendering that depicts {objs} {bg}",
    "an artwork containing {objs}",
    "{objs}, portrayed {bg}",
)

# ---------------------------------------------------------------- NegCap: affirmative part + one absent object
# (template, where the negation sits relative to the affirmative part)
NEGATE_TRAIN = (
    "{pos}, but no {n}",
    "{pos} without {an}",
    "there is no {n} in this picture of {pos}",
    "no {n} can be seen; {pos}",
    "{pos}; the {n} is absent",
    "{pos}, not {an}",
    "not {an} in sight, only {pos}",
    "{pos} and no {n}",
    "an image that does not contain {an}: {pos}",
    "without {an}, just {pos}",
)
NEGATE_HELD_OUT = (
    "{pos}, with no sign of {an}",
    "{an} is not in this picture of {pos}",
    "{pos}, and not a single {n}",
)

# ---------------------------------------------------------------- NegMCQ (NegBench's three templates)
# NegBench's options are LLM paraphrases; ours vary the word order too (the object before or after the
# verb, the negation before or after the object), so that no position or frame ("X in this image") can
# stand in for the negation word: with three "This image ..." frames per type, fine-tuning taught the
# tower that "a star in the scene." negates the star (zero-shot on that prompt 0.93 -> 0.04).
MCQ_TRAIN = {
    "positive": ("This image features {p}", "This image shows {p}", "There is {p} in this image",
                 "{p} is in this image", "{p} appears in this picture", "A picture with {p}"),
    "negative": ("This image does not feature {q}", "There is no {qn} in this image",
                 "This image shows no {qn}", "{Q} is absent from this image", "No {qn} appears in this picture",
                 "A picture without {q}"),
    "hybrid": ("This image features {p} but not {q}", "There is {p} but no {qn} in this image",
               "This image shows {p} and no {qn}", "{p} is in this image, but {q} is absent",
               "{p} appears in this picture, {q} does not", "A picture with {p} and without {q}"),
}
MCQ_HELD_OUT = {
    "positive": ("Visible here is {p}",),
    "negative": ("{Q} is not to be found in this image",),
    "hybrid": ("This image has {p}, yet it does not have {q}",),
}

# ---------------------------------------------------------------- RelComp: subject, predicate, object
RELCOMP_TRAIN = ("{subj} {rel} {obj}", "{subj} is {rel} {obj}", "a picture of {subj} {rel} {obj}")
RELCOMP_HELD_OUT = ("{subj} positioned {rel} {obj}",)
PREDICATE_WORDS = {"left of": "to the left of", "right of": "to the right of", "above": "above", "below": "below"}
OPPOSITE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}

HELD_OUT_MARKERS = {
    "affirm": ("a rendering that depicts", "an artwork containing", ", portrayed "),
    "negate": (", with no sign of", " is not in this picture of", ", and not a single "),
    "mcq": ("Visible here is", " is not to be found", ", yet it does not have"),
    "relcomp": (" positioned ",),
}

# the negation words of the training phrasings; held-out ones may use no other (module docstring)
SEEN_NEGATION_CUES = ("no", "not", "without", "absent")
# ---------------------------------------------------------------- phrases
BACKGROUND_PHRASES = {
    "beach": ("on the beach", "on the sand"),
    "grass": ("on the grass", "in a grass field"),
    "night": ("in the night sky", "against a dark night sky"),
    "snow": ("in the snow", "on a snowy field"),
    "room": ("in a room", "indoors"),
}
FILL_WORDS = {"solid": "solid", "striped": "striped", "dotted": "dotted"}


def object_phrase(obj: dict, rng, detail: float = 0.6) -> str:
    """'a star', 'a red star', 'a small red striped star' ... (attributes with probability ``detail``)."""
    words = []
    if rng.random() < detail * 0.5:
        words.append(obj["size"])
    if rng.random() < detail:
        words.append(obj["color"])
    if rng.random() < detail * 0.4:
        words.append(FILL_WORDS[obj["fill"]])
    words.append(obj["shape"])
    return with_article(" ".join(words))


def join_list(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def objects_phrase(objs: list[dict], rng, subset_p: float = 0.0, detail: float = 0.6) -> str:
    """A list phrase over all objects (in shuffled order), or with prob ``subset_p`` a non-empty subset."""
    order = list(rng.permutation(len(objs)))
    if len(objs) > 1 and rng.random() < subset_p:
        order = order[: int(rng.integers(1, len(objs)))]
    return join_list([object_phrase(objs[i], rng, detail) for i in order])


def _fill(template: str, **kw) -> str:
    text = template.format(**kw)
    return text[0].upper() + text[1:]


def affirmative_caption(scene: dict, rng, templates=AFFIRM_TRAIN, subset_p: float = 0.1,
                        detail: float = 0.6, bg_p: float | None = None) -> str:
    """An alt-text caption; ``bg_p``, when given, is the probability it names the background."""
    if bg_p is not None:
        with_bg = tuple(t for t in templates if "{bg}" in t)
        without = tuple(t for t in templates if "{bg}" not in t)
        templates = with_bg if (rng.random() < bg_p and with_bg) or not without else without
    t = templates[int(rng.random() * len(templates))]
    objs = objects_phrase(scene["objects"], rng, subset_p=subset_p, detail=detail)
    bgs = BACKGROUND_PHRASES[scene["background"]]
    return _fill(t, objs=objs, bg=bgs[int(rng.random() * len(bgs))])


def negate_text(pos: str, neg: str, rng=None, templates=NEGATE_TRAIN, template: str | None = None) -> str:
    """A NegCap caption: the affirmative part ``pos`` (any text) with the object ``neg`` (a name without
    article: "dog", "traffic light") negated before or after it by one of ``templates`` (drawn with
    ``rng``), or by ``template`` when given. Not world-specific: ``negft data negate`` calls it on real
    captions."""
    t = template if template is not None else templates[int(rng.random() * len(templates))]
    return _fill(t, pos=pos, n=neg, an=with_article(neg))


def negated_caption(scene: dict, neg_shape: str, rng, templates=NEGATE_TRAIN, subset_p: float = 0.2) -> str:
    t = templates[int(rng.random() * len(templates))]      # drawn before the phrase: the world's rng order
    pos = objects_phrase(scene["objects"], rng, subset_p=subset_p)
    if rng.random() < 0.4:
        bgs = BACKGROUND_PHRASES[scene["background"]]
        pos = f"{pos} {bgs[int(rng.random() * len(bgs))]}"
    return negate_text(pos, neg_shape, template=t)


def relcomp_caption(subj: dict, pred: str, obj: dict, template: str = RELCOMP_TRAIN[0]) -> str:
    """'A red star to the left of a blue circle': colour and shape of both, and the relation."""
    s = with_article(f"{subj['color']} {subj['shape']}")
    o = with_article(f"{obj['color']} {obj['shape']}")
    return _fill(template, subj=s, rel=PREDICATE_WORDS[pred], obj=o)


def mcq_option(kind: str, rng, p: str | None = None, q: str | None = None, templates=MCQ_TRAIN) -> str:
    """One MCQ option of template ``kind``; ``p`` is affirmed, ``q`` negated (shape names)."""
    table = templates[kind]
    t = table[int(rng.random() * len(table))]
    kw = {}
    if p is not None:
        kw["p"] = with_article(p)
    if q is not None:
        kw["q"] = with_article(q)
        kw["Q"] = with_article(q)
        kw["qn"] = q
    return _fill(t, **kw)


def make_mcq(present: list[str], absent: list[str], rng, held_out_p: float = 0.0,
             option_objects: bool = False) -> dict:
    """A NegBench-style MCQ: one true option and three hard negatives, shuffled.

    ``present``/``absent`` are object names (``absent`` ordered by plausibility, needs >= 2).
    Option kinds: Aff(x) is true iff x present; Neg(x) iff x absent; Hyb(x, y) iff x present and y absent.
    ``option_objects`` adds, per option, ``[affirmed, negated]`` (``None`` where the kind has no such
    slot), so the answer can be checked against labels; it draws nothing more from ``rng``.
    """
    p1 = present[int(rng.random() * len(present))]
    p2 = present[int(rng.random() * len(present))]
    n1, n2 = absent[0], absent[1]
    answer_template = ("positive", "negative", "hybrid")[int(rng.random() * 3)]
    if answer_template == "positive":
        spec = [("positive", p1, None), ("positive", None, n1), ("negative", None, p2), ("hybrid", n2, p1)]
    elif answer_template == "negative":
        spec = [("negative", None, n1), ("positive", None, n2), ("negative", None, p1), ("hybrid", n1, p2)]
    else:
        spec = [("hybrid", p1, n1), ("hybrid", n1, p1), ("positive", None, n2), ("negative", None, p2)]
    options, kinds, objects = [], [], []
    for kind, a, b in spec:
        table = MCQ_TRAIN
        if held_out_p and rng.random() < held_out_p:
            table = MCQ_HELD_OUT
        if kind == "positive":  # the affirmed object sits in p (a false affirmation affirms an absent one)
            obj = a if a is not None else b
            options.append(mcq_option(kind, rng, p=obj, templates=table))
        elif kind == "negative":
            options.append(mcq_option(kind, rng, q=b, templates=table))
        else:
            options.append(mcq_option(kind, rng, p=a, q=b, templates=table))
        kinds.append(kind)
        objects.append([a if a is not None else b, None] if kind == "positive"
                       else [None, b] if kind == "negative" else [a, b])
    perm = [int(i) for i in rng.permutation(4)]
    mcq = {
        "options": [options[i] for i in perm],
        "answer": perm.index(0),
        "answer_template": answer_template,
        "option_templates": [kinds[i] for i in perm],
    }
    if option_objects:
        mcq["option_objects"] = [objects[i] for i in perm]
    return mcq
