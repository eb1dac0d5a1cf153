"""``negft data negatives``: NegCLIP's, FSC-CLIP's and CE-CLIP's hard captions made from any captioned shards.

    negft data negatives METHOD SHARDS out=DIR [tagger=world|spacy] [spacy_model=en_core_web_sm] [seed=0]
                         [per_caption=N]

Each method's generator works on a tagged caption (``Tagged``: words with a coarse part of speech and a fine tag,
noun phrases, verb phrases) and a seeded generator, the way its authors' code makes them:

- ``negclip``: two phrases of one type exchanged (kind ``swap``); the types are noun phrases of more than two words,
  verb phrases, singular nouns (NN), plural nouns (NNS), adverbs and adjectives. A type is drawn among those with two
  phrases of different text, then a pair of them. The code is the gist that mertyg/vision-language-models-are-bows
  issue #13 links (not in the repository @ 81fdd20), as ytaek-oh/fsc-clip @ 604015d keeps it
  (``src/training/text_negatives/text_negatives_data.py``, ``_generate_hard_negatives_like_negclip``). The issue
  also names ARO's trigram shuffle (``dataset_zoo/perturbations.py`` ``shuffle_trigrams``, an evaluation
  perturbation there): here it is the fallback for a caption with nothing to swap (kind ``shuffle``).
- ``fscclip``: FSC-CLIP's ``fsc-clip`` style (same file, ``add_random_text_hard_negatives``): one NegCLIP swap, one
  ``replace`` and one ``shuffle`` per caption. ``replace`` changes one element of the caption's graph (a noun, an
  adjective, a relation or verb) for another of its kind, only in a caption with at least two nouns and one adjective,
  relation or verb; ``shuffle`` cuts the words into bigrams and permutes them, a trailing punctuation mark put back
  at a random place, redrawn until it differs from the caption (10 tries: ``ngram_shuffler.py``).
- ``ceclip``: CE-CLIP's four types (lezhang7/Enhance-FineGrained @ ef87eb7, ``data/dataset.py``
  ``TextAugment.mask_captions``), in schema.CECLIP_TYPES order: ``relation`` two nouns exchanged (the first two);
  ``adjective`` / ``noun`` / ``verb`` one word of that part of speech (drawn) replaced by another. A caption without
  a verb takes a relation word (a preposition) instead.

Where negft differs, and why: the references tag with spaCy's ``en_core_web_sm``; FSC-CLIP's ``replace`` draws
WordNet antonyms and co-hyponyms and CE-CLIP fills a mask with distilroberta-base (its fourth guess), both models
this step does without: a replacement is a word of the same fine tag seen in the data (or in the tagger's own
lexicon), drawn uniformly, and an "a"/"an" before a changed word is made to agree. CE-CLIP exchanges the first two
nouns only in a caption with more than two, by ``str.replace`` of every occurrence: here any caption with two nouns of
different text, those two words alone. FSC-CLIP's scene-graph parser (``sng_parser``) is read off the tags.

Taggers (``tagger=``): ``spacy`` (an optional extra: ``pip install 'negft[negatives]' && python -m spacy download
en_core_web_sm``; a missing one is one error naming that command), or ``world``: the embedded world's vocabulary
as the samples' scenes name things (shapes are nouns; colours, sizes and fills adjectives) and the world's relation
phrases (prepositions), which needs no model.

On the world (a sample with ``scene``), every negative is checked against the scene, not the text: the world tagger
reads the negative (each shape with the adjectives just before it; a relation phrase between the shapes around it),
and a negative whose reading holds of the scene is dropped and another drawn, so each one kept is false of the image.
Nor does a negative give a shape a colour no input scene gives it (the world holds such pairs out of training).

Input: SHARDS is a folder of negft shards (its ``*.tar``) or a shard pattern (``shard-{000000..000009}.tar``); a
sample needs an image and a ``caption``. Output (``out``): the same samples, image bytes copied unchanged, their json
with ``relcomp`` = {caption, negatives: [{text, kind}] (1..``per_caption``), negative_image: null} (any earlier
``relcomp`` replaced). Skipped and counted in manifest.json: a sample without an image, with an unreadable json,
without a caption, or whose caption gives no negative. Each sample draws from its own generator seeded by
(seed, key): same inputs and seed, byte-identical shards.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from negft import phrasings
from negft.convert import coco
from negft.convert.negate import _image_rng
from negft.data.schema import CAPTION, CECLIP_TYPES, IMAGE_KEYS, MAX_NEGATIVES, RELCOMP, SCENE
from negft.data.shards import MISSING_IMAGE, ShardWriter, read_samples, truthy
from negft.text import SPACY_INSTALL, article

LAYOUT_SOURCE = "negft shards (negft/data/schema.py: a json with caption; scene on the world)"
# method -> negatives per caption by default: NegCLIP's file has 1 to 5 per caption (its loader draws one each epoch,
# as the itm stream does), FSC-CLIP makes one per operation, CE-CLIP one per type
METHODS = {"negclip": MAX_NEGATIVES, "fscclip": 3, "ceclip": len(CECLIP_TYPES)}
TAGGERS = ("world", "spacy")
MAX_TRIES = 100                 # candidates one draw examines at most (on the world the scene may refuse many)
SHUFFLE_TRIES = 10              # FSC-CLIP's MAX_SHUFFLE_RETRY
REPLACEABLE = ("NOUN", "ADJ", "VERB", "ADP")       # the parts of speech a replacement may change

# skip reasons (manifest.json's "skipped")
NO_CAPTION = "sample without a caption"
BAD_JSON = "sample with an unreadable json"
NO_NEGATIVE = "caption with no possible negative"


# ------------------------------------------------------------------ tagged captions
@dataclass(frozen=True)
class Word:
    """A token: its text and characters in the caption, its coarse part of speech (spaCy's ``pos_``: NOUN, ADJ,
    VERB, ADP, ADV, DET, PUNCT, ...) and fine tag (Penn: NN, NNS, JJ, ...), which picks its replacements."""
    text: str
    start: int
    end: int
    pos: str
    tag: str


@dataclass(frozen=True)
class Tagged:
    """A caption, its words, and its noun and verb phrases as (first word, end word) ranges."""
    text: str
    words: tuple[Word, ...]
    noun_phrases: tuple[tuple[int, int], ...] = ()
    verb_phrases: tuple[tuple[int, int], ...] = ()

    def span_text(self, i: int, j: int) -> str:
        return self.text[self.words[i].start:self.words[j - 1].end]


class TaggerMissing(ValueError):
    """spaCy or its model is not installed: the message names the command that installs them."""


class WorldTagger:
    """The part-of-speech pipeline of the world's vocabulary: shapes are nouns, colours, sizes and fills adjectives,
    the relation phrases prepositions (one word each, "to the left of"), articles determiners. Converters do not
    import the world, so its shapes and attribute words come in (``of_scenes``: read off the samples' scenes)."""

    def __init__(self, nouns, adjectives, combinations=None):
        self.combinations = combinations        # (colour, shape) pairs a negative may name; None: any
        self.lexicon = {"NN": tuple(sorted(set(nouns))), "JJ": tuple(sorted(set(adjectives))),
                        "IN": tuple(sorted(phrasings.PREDICATE_WORDS.values()))}
        self.pos = {**{w: ("NOUN", "NN") for w in self.lexicon["NN"]},
                    **{w: ("ADJ", "JJ") for w in self.lexicon["JJ"]},
                    **{w: ("ADP", "IN") for w in self.lexicon["IN"]},
                    **{w: ("DET", "DT") for w in ("a", "an", "the")}}
        phrases = sorted(self.lexicon["IN"], key=len, reverse=True)        # "to the left of" before "left"
        self.token = re.compile("|".join([*(r"\b" + re.escape(p) + r"\b" for p in phrases), r"\w+", r"[^\w\s]"]),
                                re.IGNORECASE)

    @classmethod
    def of_scenes(cls, scenes) -> WorldTagger:
        """The scenes' vocabulary, and their colour-shape pairs as the only ones a negative may name: the world
        holds some pairs out of training (generator.held_out_combos), and training scenes show none of them."""
        objects = [o for scene in scenes for o in scene["objects"]]
        return cls({o["shape"] for o in objects}, {w for o in objects for w in object_words(o)},
                   {(o["color"], o["shape"]) for o in objects})

    def names_seen_pairs(self, t: Tagged) -> bool:
        """Whether every colour the text gives a shape is one the scenes show on that shape."""
        colours = {c for c, _ in self.combinations} if self.combinations is not None else set()
        return all((c, shape) in self.combinations for shape, adjectives in reading(t)[0]
                   for c in adjectives & colours)

    def tag(self, texts: list[str]) -> list[Tagged]:
        return [self._tag(t) for t in texts]

    def _tag(self, text: str) -> Tagged:
        words = []
        for m in self.token.finditer(text):
            w = m.group()
            pos, tag = self.pos.get(w.lower(), ("X", "X") if w[0].isalnum() or w[0] == "_" else ("PUNCT", "."))
            words.append(Word(w, m.start(), m.end(), pos, tag))
        return Tagged(text, tuple(words), _world_noun_phrases(words),
                      tuple((i, i + 1) for i, w in enumerate(words) if w.pos == "ADP"))


def _world_noun_phrases(words: list[Word]) -> tuple[tuple[int, int], ...]:
    """Runs of an optional article, adjectives and a noun."""
    out, start = [], None
    for i, w in enumerate(words):
        if w.pos == "NOUN":
            out.append((i if start is None else start, i + 1))
            start = None
        elif w.pos in ("DET", "ADJ"):
            if start is None or w.pos == "DET":
                start = i
        else:
            start = None
    return tuple(out)


class SpacyTagger:
    """spaCy's tagger and parser (the references' ``en_core_web_sm``): noun chunks, and verb phrases by the
    references' pattern (an optional verb, adverbs, auxiliaries, verbs)."""
    VERB_PHRASE = [{"POS": "VERB", "OP": "?"}, {"POS": "ADV", "OP": "*"}, {"POS": "AUX", "OP": "*"},
                   {"POS": "VERB", "OP": "+"}]

    def __init__(self, model: str = "en_core_web_sm"):
        try:
            import spacy
            from spacy.matcher import Matcher
        except ImportError as e:
            raise TaggerMissing(_missing(model, f"spaCy is not installed: {e}")) from None
        try:
            self.nlp = spacy.load(model, exclude=["ner"])
        except OSError as e:
            raise TaggerMissing(_missing(model, f"its model cannot be loaded: {e}")) from None
        self.lexicon: dict[str, tuple[str, ...]] = {}
        self.matcher = Matcher(self.nlp.vocab)
        self.matcher.add("verb phrase", [self.VERB_PHRASE])

    def tag(self, texts: list[str]) -> list[Tagged]:
        return [self._tagged(doc) for doc in self.nlp.pipe(texts, batch_size=256)]

    def _tagged(self, doc) -> Tagged:
        import spacy
        words = tuple(Word(t.text, t.idx, t.idx + len(t.text), t.pos_, t.tag_) for t in doc)
        verbs = spacy.util.filter_spans(self.matcher(doc, as_spans=True))
        return Tagged(doc.text, words, tuple((s.start, s.end) for s in doc.noun_chunks),
                      tuple((s.start, s.end) for s in verbs))


def _missing(model: str, why: str) -> str:
    return (f"tagger=spacy needs spaCy and its {model} model ({why}); install them with: "
            f"{SPACY_INSTALL.format(model=model)}")


def vocabulary(tagged: list[Tagged], lexicon: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Fine tag -> the words (lower case) of that tag in the data and the tagger's lexicon: the replacements."""
    words: dict[str, set] = {tag: set(ws) for tag, ws in lexicon.items()}
    for t in tagged:
        for w in t.words:
            if w.pos in REPLACEABLE:
                words.setdefault(w.tag, set()).add(w.text.lower())
    return {tag: tuple(sorted(ws)) for tag, ws in sorted(words.items())}


# ------------------------------------------------------------------ text edits
def edit(t: Tagged, edits: list[tuple[int, int, str]]) -> str:
    """The caption with word ranges (first, end) replaced by texts; an "a"/"an" just before a replaced range agrees
    with its new first word."""
    edits = sorted(edits)
    fixes = []
    for i, j, new in edits:
        before = t.words[i - 1] if i else None
        if before is not None and before.text.lower() in ("a", "an") and not any(a <= i - 1 < b for a, b, _ in edits):
            a = article(new)
            fixes.append((i - 1, i, a.capitalize() if before.text[0].isupper() else a))
    out, pos = [], 0
    for i, j, new in sorted(edits + fixes):
        out += [t.text[pos:t.words[i].start], new]
        pos = t.words[j - 1].end
    return "".join(out) + t.text[pos:]


def swap(t: Tagged, a: tuple[int, int], b: tuple[int, int]) -> str:
    return edit(t, [(*a, t.span_text(*b)), (*b, t.span_text(*a))])


def shuffle_ngrams(t: Tagged, n: int, rng) -> str | None:
    """The words cut into consecutive n-grams, the n-grams permuted; a final punctuation mark alone in the last one is
    put back at a random place (FSC-CLIP's ``_shuffle_ngrams``). None where one n-gram (and a mark) is all."""
    words = list(t.words)
    grams = [words[i:i + n] for i in range(0, len(words), n)]
    mark = None
    if len(grams) > 1 and len(grams[-1]) == 1 and grams[-1][0].pos == "PUNCT":
        mark, grams = grams[-1][0], grams[:-1]
    if len(grams) < 2:
        return None
    order = rng.permutation(len(grams)).tolist()
    grams = [list(grams[k]) for k in order]
    if mark is not None:
        at = int(rng.integers(0, len(grams) + 1))
        grams.insert(0, [mark]) if at == 0 else grams[at - 1].append(mark)
    return " ".join(_join(g) for g in grams)


def _join(words: list[Word]) -> str:
    return "".join((" " if k and w.pos != "PUNCT" else "") + w.text for k, w in enumerate(words))


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


# ------------------------------------------------------------------ drawing
@dataclass(frozen=True)
class Group:
    """Candidates drawn without replacement: ``make(i)`` for i < size is the i-th text (None: no candidate)."""
    size: int
    make: Callable[[int], str | None]
    kind: str


def pick(groups: list[Group], k: int, rng, keep) -> list[dict]:
    """Up to ``k`` negatives: a group drawn uniformly among those with candidates left, then one of its candidates,
    kept when ``keep`` accepts its text and it is new."""
    tried = [set() for _ in groups]
    live = [g for g, group in enumerate(groups) if group.size]
    out, seen = [], set()
    for _ in range(MAX_TRIES):
        if not live or len(out) == k:
            break
        g = live[int(rng.random() * len(live))]
        i = int(rng.random() * groups[g].size)
        while i in tried[g]:
            i = int(rng.random() * groups[g].size)
        tried[g].add(i)
        if len(tried[g]) == groups[g].size:
            live.remove(g)
        text = groups[g].make(i)
        if text is not None and text not in seen and keep(text):
            seen.add(text)
            out.append({"text": text, "kind": groups[g].kind})
    return out


def _pairs(t: Tagged, spans) -> list[tuple]:
    spans = list(spans)
    return [(a, b) for x, a in enumerate(spans) for b in spans[x + 1:] if t.span_text(*a) != t.span_text(*b)]


def _swap_group(t: Tagged, spans, kind: str = "swap") -> Group:
    pairs = _pairs(t, spans)
    return Group(len(pairs), lambda i: swap(t, *pairs[i]), kind)


def _replace_group(t: Tagged, i: int, vocab: dict, kind: str) -> Group:
    w = t.words[i]
    words = vocab.get(w.tag, ())
    return Group(len(words), lambda k: None if words[k] == w.text.lower() else edit(t, [(i, i + 1, words[k])]), kind)


def _shuffle_group(t: Tagged, n: int, rng) -> Group:
    return Group(SHUFFLE_TRIES, lambda _: shuffle_ngrams(t, n, rng), "shuffle")


def _singles(t: Tagged, test) -> list[tuple[int, int]]:
    return [(i, i + 1) for i, w in enumerate(t.words) if test(w)]


def negclip_swaps(t: Tagged) -> list[Group]:
    """NegCLIP's swap types (the module docstring), one group each."""
    return [_swap_group(t, spans) for spans in (
        [s for s in t.noun_phrases if s[1] - s[0] > 2], t.verb_phrases,
        _singles(t, lambda w: w.tag == "NN"), _singles(t, lambda w: w.tag == "NNS"),
        _singles(t, lambda w: w.pos == "ADV"), _singles(t, lambda w: w.pos == "ADJ"))]


def negclip(t: Tagged, rng, vocab: dict, k: int, keep) -> list[dict]:
    return pick(negclip_swaps(t), k, rng, keep) or pick([_shuffle_group(t, 3, rng)], 1, rng, keep)


def fscclip(t: Tagged, rng, vocab: dict, k: int, keep) -> list[dict]:
    nouns = [i for i, w in enumerate(t.words) if w.pos == "NOUN"]
    others = [i for i, w in enumerate(t.words) if w.pos in ("ADJ", "ADP", "VERB")]
    replace = [_replace_group(t, i, vocab, "replace") for i in nouns + others] if len(nouns) > 1 and others else []
    out = pick(negclip_swaps(t), 1, rng, keep) + pick(replace, 1, rng, keep) \
        + pick([_shuffle_group(t, 2, rng)], 1, rng, keep)
    return _distinct(out)[:k]


def ceclip(t: Tagged, rng, vocab: dict, k: int, keep) -> list[dict]:
    """One negative per CE-CLIP type where the caption allows it."""
    nouns = _singles(t, lambda w: w.pos == "NOUN")
    relation = next(({"text": text, "kind": "relation"} for text in (swap(t, a, b) for a, b in _pairs(t, nouns))
                     if keep(text)), None)
    out = [relation] if relation else []
    verbs = [i for i, w in enumerate(t.words) if w.pos == "VERB"] \
        or [i for i, w in enumerate(t.words) if w.pos == "ADP"]
    for kind, positions in (("adjective", [i for i, w in enumerate(t.words) if w.pos == "ADJ"]),
                            ("noun", [i for i, _ in nouns]), ("verb", verbs)):
        out += pick([_replace_group(t, i, vocab, kind) for i in positions], 1, rng, keep)
    return _distinct(out)[:k]


def _distinct(negatives: list[dict]) -> list[dict]:
    seen = set()
    return [n for n in negatives if not (n["text"] in seen or seen.add(n["text"]))]


GENERATORS = {"negclip": negclip, "fscclip": fscclip, "ceclip": ceclip}


# ------------------------------------------------------------------ the world's truth
def object_words(obj: dict) -> tuple[str, str, str]:
    """The adjectives true of a world object: its colour, size and fill word."""
    return obj["color"], obj["size"], phrasings.FILL_WORDS[obj["fill"]]


def reading(t: Tagged) -> tuple[list[tuple[str, frozenset]], list[tuple[int, str, int]]]:
    """What a text the world tagger tagged says: (shape, adjectives) mentions, each noun with the adjectives just
    before it, and (mention, relation phrase, mention) triples, a relation phrase joining the mentions around it."""
    mentions, relations, adjectives, pending = [], [], [], None
    for w in t.words:
        if w.pos == "ADJ":
            adjectives.append(w.text.lower())
        elif w.pos == "NOUN":
            mentions.append((w.text.lower(), frozenset(adjectives)))
            if pending is not None:
                relations.append((pending[0], pending[1], len(mentions) - 1))
                pending = None
            adjectives = []
        elif w.pos == "ADP":
            pending = (len(mentions) - 1, w.text.lower()) if mentions else None
            adjectives = []
        elif w.pos != "DET":
            adjectives = []
    return mentions, relations


def holds(t: Tagged, scene: dict) -> bool:
    """Whether the world's reading of ``t`` is true of ``scene`` (shapes in a scene are distinct, so a shape names
    its object)."""
    by_shape = {o["shape"]: k for k, o in enumerate(scene["objects"])}
    mentions, relations = reading(t)
    for shape, adjectives in mentions:
        o = scene["objects"][by_shape[shape]] if shape in by_shape else None
        if o is None or not adjectives <= set(object_words(o)):
            return False
    predicate = {words: p for p, words in phrasings.PREDICATE_WORDS.items()}
    stated = {tuple(r) for r in scene["relations"]}
    return all((by_shape[mentions[a][0]], predicate[p], by_shape[mentions[b][0]]) in stated
               for a, p, b in relations)


def keeper(caption: str, scene: dict | None, world: WorldTagger | None):
    """The test a negative passes: its words differ from the caption's, and on the world it is false of the scene and
    names no colour-shape pair the world holds out (``WorldTagger.of_scenes``)."""
    same = _words(caption)

    def keep(text: str) -> bool:
        if _words(text) == same:
            return False
        if scene is None:
            return True
        t = world.tag([text])[0]
        return not holds(t, scene) and world.names_seen_pairs(t)
    return keep


def generate(method: str, t: Tagged, rng, vocab: dict, k: int, scene: dict | None = None,
             world: WorldTagger | None = None) -> list[dict]:
    """``method``'s negatives of a tagged caption (at most ``k``); with a scene, only ones false of it as ``world``
    reads them."""
    return GENERATORS[method](t, rng, vocab, k, keeper(t.text, scene, world))


# ------------------------------------------------------------------ the command
def shard_paths(shards: str) -> list[str]:
    import braceexpand
    p = Path(shards)
    paths = sorted(str(s) for s in p.glob("*.tar")) if p.is_dir() else list(braceexpand.braceexpand(shards))
    missing = [s for s in paths if not Path(s).is_file()]
    if not paths or missing:
        raise FileNotFoundError(f"no shards at {shards}" + (f" (missing: {missing[0]})" if missing else ""))
    return paths


def _samples(paths: list[str]):
    """(key, members) of every sample, one shard in memory at a time."""
    for path in paths:
        yield from read_samples([path]).items()


def _meta(members: dict) -> dict | None:
    try:
        meta = json.loads(members.get("json", b"{}"))
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def _caption(meta: dict | None) -> str:
    text = meta.get(CAPTION) if meta else None
    return coco.clean_caption(text) if isinstance(text, str) else ""


def negatives(method, shards, out, tagger="world", spacy_model="en_core_web_sm", seed="0", per_caption="",
              maxcount="1000", progress="true") -> dict:
    """``relcomp`` hard captions by METHOD (negclip, fscclip, ceclip) for every captioned sample of SHARDS, into
    ``out``; ``per_caption``: at most this many per caption (default ``METHODS``: negclip 4, fscclip 3, ceclip 4);
    ``tagger``: world or spacy (``spacy_model``). See the module docstring."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    seed, k = int(seed), int(per_caption) if str(per_caption).strip() else METHODS[method]
    if seed < 0 or not 1 <= k <= MAX_NEGATIVES:
        raise ValueError(f"need seed >= 0 and 1 <= per_caption <= {MAX_NEGATIVES}")
    if tagger not in TAGGERS:
        raise ValueError(f"tagger must be one of {', '.join(TAGGERS)}, not {tagger!r}")
    paths = shard_paths(shards)
    captions, scenes = [], []
    for _, members in _samples(paths):
        meta = _meta(members)
        captions.append(_caption(meta))
        if meta and isinstance(meta.get(SCENE), dict):
            scenes.append(meta[SCENE])
    world = WorldTagger.of_scenes(scenes)
    if tagger == "world" and not world.lexicon["NN"]:
        raise ValueError(f"tagger=world takes the world's vocabulary from the samples' scenes, and {shards} has "
                         "none: use tagger=spacy")
    tag = world if tagger == "world" else SpacyTagger(spacy_model)
    tagged = iter(tag.tag([c for c in captions if c]))
    tagged = [next(tagged) if c else None for c in captions]
    vocab = vocabulary([t for t in tagged if t is not None], tag.lexicon)
    kinds: Counter = Counter()
    inputs = {"shards": str(shards)}
    with ShardWriter(out, f"negatives-{method}", LAYOUT_SOURCE, inputs, int(maxcount), truthy(progress)) as w:
        for (key, members), t in zip(_samples(paths), tagged):
            ext = next((e for e in IMAGE_KEYS if e in members), None)
            meta = _meta(members)
            if ext is None:
                w.skip(MISSING_IMAGE, key)
            elif meta is None:
                w.skip(BAD_JSON, key)
            elif t is None:
                w.skip(NO_CAPTION, key)
            else:
                negs = generate(method, t, _image_rng(seed, key), vocab, k, meta.get(SCENE), world)
                if not negs:
                    w.skip(NO_NEGATIVE, key)
                    continue
                kinds.update(n["kind"] for n in negs)
                w.add(key, members[ext], ext, {**meta, CAPTION: t.text,
                                               RELCOMP: {"caption": t.text, "negatives": negs, "negative_image": None}})
        w.notes["negatives"] = {"method": method, "tagger": tagger, "spacy_model": spacy_model if tagger == "spacy"
                                else None, "seed": seed, "per_caption": k, "kinds": dict(sorted(kinds.items())),
                                "vocabulary": {tag_: len(ws) for tag_, ws in vocab.items()}}
        manifest = w.close()
    return {"out": str(out), "counts": manifest["counts"], "skipped": manifest["skipped"],
            "images_per_second": manifest["images_per_second"], "manifest": manifest}


# ------------------------------------------------------------------ drawn anew each epoch, in the data pipeline
class Redraw:
    """A method's hard captions drawn anew from each sample's caption every time the sample is read, as FSC-CLIP's
    COCO runs draw theirs per batch (``--add-random-text-hard-negatives="fsc-clip"``: ytaek-oh/fsc-clip @ 604015d,
    ``src/training/data.py`` ``CocoDataset.collate_fn`` → ``text_negatives_data.py``
    ``add_random_text_hard_negatives``; the file's own hard captions go unread). A data-pipeline step (an itm
    stream's ``streams.NAME.redraw_negatives``): ``relcomp`` becomes {caption, negatives, negative_image: null}, drawn
    by a generator seeded by (seed, epoch, sample key), so a resumed epoch draws what the interrupted one drew,
    whatever the rank, worker or shuffle, and the next epoch draws others.

    On the world (``world``: the world's vocabulary, ``methods.world_tagger``) each negative is false of the sample's
    scene; on real data the tagger is spaCy's (an optional extra) and the replacements are the words of each fine tag
    in the first ``VOCABULARY_SAMPLES`` captions of the stream's first shard (in name order; the same for every
    worker), the tagger's own lexicon being empty."""
    VOCABULARY_SAMPLES = 2000

    def __init__(self, method: str, seed: int, world: WorldTagger | None = None, urls=(), tagger=None,
                 spacy_model: str = "en_core_web_sm"):
        if method not in METHODS:
            raise ValueError(f"redraw_negatives must be one of {', '.join(METHODS)}, not {method!r}")
        self.method, self.seed, self.world, self.urls, self.spacy_model = method, seed, world, list(urls), spacy_model
        self._tagger = world if world is not None else tagger       # tagger: real data's, where not spaCy's
        self._vocab = vocabulary([], world.lexicon) if world is not None else None

    def _ready(self):
        """(tagger, vocabulary), made in the loader worker on first use (spaCy and its model load there)."""
        if self._tagger is None:
            self._tagger = SpacyTagger(self.spacy_model)
        if self._vocab is None:
            captions = []
            for _, members in _samples(sorted(self.urls)[:1]):
                if (c := _caption(_meta(members))):
                    captions.append(c)
                if len(captions) == self.VOCABULARY_SAMPLES:
                    break
            self._vocab = vocabulary(self._tagger.tag(captions), self._tagger.lexicon)
        return self._tagger, self._vocab

    def rng(self, epoch: int, key: str):
        return _image_rng(self.seed, f"{epoch}/{key}")

    def __call__(self, meta: dict, key: str, epoch: int) -> dict:
        """``meta`` with ``relcomp`` drawn for (epoch, key); unchanged where it has no caption. A caption that gives
        no negative leaves ``relcomp`` with none (the stream skips it as malformed, counted)."""
        record = meta.get(RELCOMP)
        caption = _caption(meta) or (coco.clean_caption(record["caption"]) if isinstance(record, dict)
                                     and isinstance(record.get("caption"), str) else "")
        if not caption:
            return meta
        tagger, vocab = self._ready()
        scene = meta.get(SCENE) if self.world is not None and isinstance(meta.get(SCENE), dict) else None
        negs = generate(self.method, tagger.tag([caption])[0], self.rng(epoch, key), vocab, METHODS[self.method],
                        scene, self.world)
        return {**meta, RELCOMP: {"caption": caption, "negatives": negs, "negative_image": None}}
