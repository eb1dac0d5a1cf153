"""Each baseline's own kind of data on the world (negft/world/methods.py) and FSC-CLIP's hard captions drawn anew
each epoch in the data pipeline (negft/convert/negatives.py, Redraw). Every claim is checked against the world's
annotation of the images (the samples' scenes), never against the generator's own bookkeeping alone."""
import io
import json
import re

import pytest
from PIL import Image

from negft import phrasings
from negft.convert import negatives as gen
from negft.data import schema
from negft.world import generator as g
from negft.world import methods

HELD = {tuple(c) for c in g.held_out_combos(0)}
N = 24
TAGGER = methods.world_tagger(HELD)


def _samples(split, n=N):
    return [g.train_sample(split, 0, i, HELD) for i in range(n)]


def _scene(objects):
    return {"objects": objects, "relations": g.relations(objects)}


def _holds(text, scene):
    return gen.holds(TAGGER.tag([text])[0], scene)


def _negation(text: str, shape: str):
    """The affirmative part of a NegCap-form text that negates ``shape`` (one of NEGATE_TRAIN's templates), or None."""
    low = text[0].lower() + text[1:]
    for t in phrasings.NEGATE_TRAIN:
        pattern = re.escape(t[0].lower() + t[1:]).replace(r"\{pos\}", "(?P<pos>.+)")
        pattern = pattern.replace(r"\{n\}", re.escape(shape)).replace(r"\{an\}", re.escape(phrasings.with_article(shape)))
        m = re.fullmatch(pattern, low)
        if m:
            return m.group("pos")
    return None


def test_ccneg_negated_caption_denies_an_object_the_image_shows_and_is_true_of_its_distractor():
    for png, rec, distractor_png in _samples("ccneg"):
        record, scene = rec[schema.RELCOMP], rec[schema.SCENE]
        removed = rec["ccneg"]["removed"]
        distractor = _scene(rec["ccneg"]["distractor_objects"])
        shown = [o["shape"] for o in scene["objects"]]
        assert removed in shown and removed not in [o["shape"] for o in distractor["objects"]]
        assert [o for o in scene["objects"] if o["shape"] != removed] == distractor["objects"]   # only it is gone
        negated = record["negatives"][0]["text"]
        assert record["negative_image_caption"] == negated and record["negative_image"] == "distractor"
        affirmed = _negation(negated, removed)
        assert affirmed is not None, negated                  # it negates the removed object ...
        assert _holds(affirmed, distractor) and _holds(affirmed, scene), negated   # ... and affirms what stays
        assert removed not in affirmed.lower().split()
        assert _holds(record["caption"], scene)               # the alt-text caption is true of the image ...
        assert not _holds(record["caption"], distractor)      # ... and false of the distractor
        assert Image.open(io.BytesIO(distractor_png)).size == Image.open(io.BytesIO(png)).size
        assert distractor_png != png


def test_ceclip_split_fills_all_four_types_each_false_of_its_image():
    from negft.losses import ceclip_slots
    rows = []
    for _, rec, negative_png in _samples("ceclip"):
        record, scene = rec[schema.RELCOMP], rec[schema.SCENE]
        assert negative_png is None and _holds(record["caption"], scene)
        kinds = [n["kind"] for n in record["negatives"]]
        assert len(kinds) == len(set(kinds)) and set(kinds) <= set(schema.CECLIP_TYPES)
        assert not any(_holds(n["text"], scene) for n in record["negatives"])
        rows.append(rec)
    full = [r for r in rows if len(r[schema.RELCOMP]["negatives"]) == len(schema.CECLIP_TYPES)]
    assert len(full) >= 0.9 * len(rows)
    # each type in its own slot: the noun slot is filled, not padding
    slots = ceclip_slots(full)
    assert (slots < len(schema.CECLIP_TYPES)).all()
    for rec, row in zip(full, slots.tolist()):
        assert [rec[schema.RELCOMP]["negatives"][k]["kind"] for k in row] == list(schema.CECLIP_TYPES)


def test_negclip_split_swaps_and_a_neighbour_image_with_its_own_caption():
    for _, rec, negative_png in _samples("negclip"):
        record, scene = rec[schema.RELCOMP], rec[schema.SCENE]
        assert _holds(record["caption"], scene)
        assert record["negatives"] and {n["kind"] for n in record["negatives"]} <= {"swap", "shuffle"}
        assert not any(_holds(n["text"], scene) for n in record["negatives"])
        if negative_png is not None:
            near = _scene(record["negative_objects"])
            assert _holds(record["negative_image_caption"], near)
            assert not any(_holds(t, near) for t in record["negative_image_negatives"])


@pytest.mark.parametrize("split", ["tripletclip", "tripletclip_pretrain"])
def test_tripletclip_negative_image_is_rendered_from_the_negative_captions_scene(split):
    edits = 0
    for png, rec, negative_png in _samples(split):
        record, scene = rec[schema.RELCOMP], rec[schema.SCENE]
        (hard,) = record["negatives"]
        rendered = _scene(record["negative_objects"])
        assert _holds(record["caption"], scene) and not _holds(record["caption"], rendered)   # T true of I only
        assert not _holds(hard["text"], scene) and _holds(hard["text"], rendered)     # T⁻ false of I, true of I⁻
        assert record["negative_image_caption"] == hard["text"] and record["negative_image_negatives"] == \
            [record["caption"]]
        assert negative_png is not None and negative_png != png
        edits += sum(a != b for a, b in zip(scene["objects"], rendered["objects"]))
    assert edits >= N


def test_method_splits_leave_every_other_split_as_it_was(tmp_path):
    """A new split draws from its own stream: the existing splits' samples are the ones the unchanged code draws
    (their stream ids and draws untouched), and a method split drawn twice is byte-identical."""
    assert [g.SPLIT_IDS[s] for s in ("pretrain", "finetune", "val", "test", "val_zeroshot", "test_zeroshot",
                                     "relcomp")] == list(range(7))
    assert len(set(g.SPLIT_IDS.values())) == len(g.SPLIT_IDS)
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    for path in (a, b):
        g._write_shard(("ccneg", 0, 0, 5, str(path), sorted(HELD)))
    assert a.read_bytes() == b.read_bytes()


# ------------------------------------------------------------------ FSC-CLIP: drawn anew each epoch
@pytest.fixture(scope="module")
def negclip_shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("negclip-split")
    g._write_shard(("negclip", 0, 0, 24, str(out / "shard-000000.tar"), sorted(HELD)))
    return [str(out / "shard-000000.tar")]


def _metas(shards):
    from negft.data.shards import read_samples
    return {k: json.loads(m["json"]) for k, m in read_samples(shards).items()}


@pytest.mark.parametrize("data", ["world", "real"])
def test_fscclip_negatives_differ_between_epochs_and_repeat_on_a_resumed_epoch(negclip_shards, data):
    """On the world (the scene checks each negative) and on real data (no scene; the tagger stands in for spaCy,
    which the test environment lacks, and the replacements come from the shards' captions)."""
    metas = _metas(negclip_shards)
    if data == "real":
        metas = {k: {schema.CAPTION: m[schema.CAPTION]} for k, m in metas.items()}

    def make():
        if data == "world":
            return gen.Redraw("fscclip", 7, world=TAGGER)
        return gen.Redraw("fscclip", 7, urls=negclip_shards, tagger=gen.WorldTagger(TAGGER.lexicon["NN"],
                                                                                    TAGGER.lexicon["JJ"]))

    def draw(redraw, epoch):
        return {k: redraw(m, k, epoch)[schema.RELCOMP]["negatives"] for k, m in metas.items()}

    run = make()
    one, two = draw(run, 1), draw(run, 2)
    resumed = draw(make(), 1)                     # a new process resuming epoch 1
    assert one == resumed
    assert sum(one[k] != two[k] for k in one) >= len(one) // 2
    for k, m in metas.items():
        assert {n["kind"] for n in one[k]} <= {"swap", "replace", "shuffle"} and len(one[k]) <= 3
        assert "replace" in {n["kind"] for n in one[k]}            # two nouns and a relation: all three types
        if data == "world":
            assert not any(_holds(n["text"], m[schema.SCENE]) for n in one[k])


def test_pipeline_redraws_each_epoch_whatever_the_order_and_skips_nothing(negclip_shards):
    """The stream step: epoch 1 read twice (another shuffle seed, as another worker layout) gives each sample the same
    negatives; epoch 2 others; the shards' own negatives are never the ones served."""
    import random
    from negft.data.pipeline import StreamSpec, Tally, _examples
    from negft.data.shards import read_samples
    samples = [{"__key__": k, "__url__": negclip_shards[0], **m} for k, m in read_samples(negclip_shards).items()]
    spec = StreamSpec(negclip_shards, "itm", "relcomp", 4, redraw=gen.Redraw("fscclip", 0, world=TAGGER))
    preprocess = lambda im: im.size

    def served(epoch, order_seed):
        order = list(samples)
        random.Random(order_seed).shuffle(order)
        tally = Tally()
        out = {caption: negs for _, (caption, negs, _) in _examples(iter(order), spec, preprocess, tally, 0, epoch)}
        assert tally.faults == 0 and len(out) == len(samples)
        return out

    a, b, c = served(1, 0), served(1, 1), served(2, 0)
    assert a == b and a != c
    own = {m[schema.RELCOMP]["caption"]: [n["text"] for n in m[schema.RELCOMP]["negatives"]]
           for m in _metas(negclip_shards).values()}
    assert sum(a[k] != own[k] for k in a) >= len(a) // 2


def test_redraw_negatives_is_refused_on_a_stream_without_hard_captions():
    from negft.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="streams.negcap.redraw_negatives"):
        load_config(["recipe=negcap", "streams.negcap.redraw_negatives=fscclip"])


def test_redraw_on_real_data_without_spacy_stops_before_training_naming_the_install(monkeypatch):
    import sys
    from negft.config import ConfigError, load_config
    from negft.train.loop import redraw_step
    monkeypatch.setitem(sys.modules, "spacy", None)                     # import spacy raises ImportError
    cfg = load_config(["recipe=fscclip"])
    assert redraw_step(load_config(["recipe=negclip"]), "hard", []) is None
    with pytest.raises(ConfigError, match=r"streams.hard.redraw_negatives=fscclip.*pip install 'negft\[negatives\]'"):
        redraw_step(cfg, "hard", [])
