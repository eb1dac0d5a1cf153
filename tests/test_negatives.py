"""``negft data negatives``: NegCLIP's, FSC-CLIP's and CE-CLIP's hard captions on hand-checked captions, on world
samples (every negative false of its scene), skips, reruns, the missing-spaCy message, and a baseline training on
the output."""
import json
import sys
import types
from collections import Counter

import numpy as np
import pytest

from negft.commands import data
from negft.convert import negatives as ng
from negft.data.schema import CECLIP_TYPES, RELCOMP, SCENE
from negft.phrasings import FILL_WORDS
from negft.world import generator
from negft.world.render import COLORS, SHAPES, SIZES

from conftest import read_shards, train_on_shards, write_shard

WORLD = ng.WorldTagger(SHAPES, [*COLORS, *SIZES, *FILL_WORDS.values()])
VOCAB = ng.vocabulary([], WORLD.lexicon)
N_WORLD = 40
# a red star to the left of, and above, a blue circle (shapes in a scene are distinct)
SCENE_RB = {"background": "grass",
            "objects": [{"shape": "star", "color": "red", "size": "small", "fill": "solid"},
                        {"shape": "circle", "color": "blue", "size": "large", "fill": "striped"}],
            "relations": [[0, "left of", 1], [0, "above", 1], [1, "right of", 0], [1, "below", 0]]}


def tag(text):
    return WORLD.tag([text])[0]


def every(method, text, scene=None, k=1, seeds=60) -> set:
    """Every (kind, text) the method draws for ``text`` over ``seeds`` seeds."""
    return {(n["kind"], n["text"]) for s in range(seeds)
            for n in ng.generate(method, tag(text), np.random.default_rng(s), VOCAB, k, scene, WORLD)}


def test_world_tagger():
    t = tag("A red star to the left of a blue circle.")
    assert [(w.text, w.pos, w.tag) for w in t.words] == [
        ("A", "DET", "DT"), ("red", "ADJ", "JJ"), ("star", "NOUN", "NN"), ("to the left of", "ADP", "IN"),
        ("a", "DET", "DT"), ("blue", "ADJ", "JJ"), ("circle", "NOUN", "NN"), (".", "PUNCT", ".")]
    assert t.noun_phrases == ((0, 3), (4, 7)) and t.verb_phrases == ((3, 4),)
    assert ng.reading(t) == ([("star", frozenset({"red"})), ("circle", frozenset({"blue"}))], [(0, "to the left of", 1)])


def test_the_reading_holds_of_the_scene_only_when_true():
    assert ng.holds(tag("a small red star above a striped circle"), SCENE_RB)
    for false in ("a blue star", "a red heart", "a circle to the left of a star", "a red star below a circle",
                  "a large star"):
        assert not ng.holds(tag(false), SCENE_RB), false


def test_swap_and_edit_keep_articles_agreeing():
    t = tag("a star and an arrow")
    assert ng.swap(t, (1, 2), (4, 5)) == "an arrow and a star"
    assert ng.edit(tag("An arrow"), [(1, 2, "star")]) == "A star"


def test_negclip_swaps():
    caption = "a red star and a blue circle"
    assert every("negclip", caption) == {("swap", "a blue circle and a red star"),      # noun phrases
                                         ("swap", "a red circle and a blue star"),      # nouns
                                         ("swap", "a blue star and a red circle")}      # adjectives
    # the noun phrases exchanged say what the caption says: never a negative of the scene
    assert every("negclip", caption, SCENE_RB) == {("swap", "a red circle and a blue star"),
                                                   ("swap", "a blue star and a red circle")}


def test_negclip_falls_back_on_a_trigram_shuffle():
    caption = "there is a star on the table today"
    drawn = every("negclip", caption, seeds=10)
    assert drawn and {k for k, _ in drawn} == {"shuffle"}
    assert all(sorted(text.split()) == sorted(caption.split()) and text != caption for _, text in drawn)
    assert every("negclip", "a star") == set()                         # one trigram: nothing to do


def test_fscclip_bigram_shuffle_keeps_a_final_mark():
    t = tag("a red star and a blue circle.")
    for s in range(20):
        text = ng.shuffle_ngrams(t, 2, np.random.default_rng(s))
        assert sorted(text.replace(".", " . ").split()) == sorted("a red star and a blue circle .".split())
    assert ng.shuffle_ngrams(tag("a star."), 2, np.random.default_rng(0)) is None


def test_fscclip_one_of_each_operation():
    drawn = every("fscclip", "a red star and a blue circle", k=3)
    assert {k for k, _ in drawn} == {"swap", "replace", "shuffle"}
    replaced = [[w for w in text.split() if w not in ("a", "an")] for k, text in drawn if k == "replace"]
    assert replaced and all(sum(a != b for a, b in zip(r, "red star and blue circle".split())) == 1 for r in replaced)
    # replace needs two nouns and an adjective, relation or verb (FSC-CLIP's scene-graph filter)
    assert "replace" not in {k for k, _ in every("fscclip", "a star and a circle", k=3)}


def test_ceclip_typed_negatives():
    caption = "a red star to the left of a blue circle"
    negs = ng.generate("ceclip", tag(caption), np.random.default_rng(0), VOCAB, 4)
    assert [n["kind"] for n in negs] == list(CECLIP_TYPES)
    assert negs[0]["text"] == "a red circle to the left of a blue star"               # the first two nouns
    drawn = every("ceclip", caption, SCENE_RB, k=4)
    verbs = {text for k, text in drawn if k == "verb"}
    # "above" holds of the scene: never drawn; the other relations are
    assert verbs == {"a red star to the right of a blue circle", "a red star below a blue circle"}
    nouns = {text.split()[2] for k, text in drawn if k == "noun" and text.split()[-1] == "circle"}
    assert nouns and "star" not in nouns and nouns <= set(WORLD.lexicon["NN"])


def test_a_negative_names_no_colour_shape_pair_the_scenes_do_not_show():
    world = ng.WorldTagger.of_scenes([SCENE_RB])
    drawn = {n["text"] for s in range(60) for n in ng.generate(
        "ceclip", world.tag(["a red star to the left of a blue circle"])[0], np.random.default_rng(s),
        ng.vocabulary([], world.lexicon), 4, SCENE_RB, world)}
    assert "a striped star to the left of a blue circle" in drawn        # false of the scene, a shown pair
    assert not any("blue star" in t or "red circle" in t for t in drawn)    # pairs no scene shows


def _world_samples():
    held_out = {tuple(c) for c in generator.held_out_combos(0)}
    return [generator.train_sample("finetune", 0, i, held_out)[:2] for i in range(N_WORLD)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Finetune samples of the world, and planted bad ones: an empty caption, no caption, a caption with nothing to
    exchange (for negclip), an unreadable json, a sample without an image."""
    root = tmp_path_factory.mktemp("negatives")
    samples = _world_samples()
    png = samples[0][0]
    rows = [(f"w{i:03d}", {"png": p, "json": json.dumps(rec).encode()}) for i, (p, rec) in enumerate(samples)]
    rows += [("empty", {"png": png, "json": b'{"caption": "  "}'}), ("none", {"png": png, "json": b"{}"}),
             ("single", {"png": png, "json": b'{"caption": "a star"}'}), ("badjson", {"png": png, "json": b"{no"}),
             ("noimage", {"json": b'{"caption": "a red star and a blue circle"}'})]
    (root / "in").mkdir()
    write_shard(root / "in" / "shard-000000.tar", rows)
    return root, samples


@pytest.fixture(scope="module")
def made(world):
    root, _ = world
    return {m: ng.negatives(m, str(root / "in"), str(root / m), progress="false") for m in ng.METHODS}


def test_world_captions_hold_and_every_negative_is_false_of_its_scene(world, made):
    root, samples = world
    assert all(ng.holds(tag(rec["caption"]), rec[SCENE]) for _, rec in samples)
    shown = {(o["color"], o["shape"]) for _, rec in samples for o in rec[SCENE]["objects"]}
    for method in ng.METHODS:
        out = read_shards(root / method)
        assert out, method
        for key, members in out.items():
            meta = json.loads(members["json"])
            if SCENE not in meta:                                              # a planted row
                continue
            assert members["png"] == samples[int(key[1:])][0]                  # bytes copied, not decoded
            rel = meta[RELCOMP]
            assert rel["caption"] == meta["caption"] and rel["negative_image"] is None
            assert 1 <= len(rel["negatives"]) <= ng.METHODS[method]
            for n in rel["negatives"]:
                assert not ng.holds(tag(n["text"]), meta[SCENE]), (method, n)
                mentions = ng.reading(tag(n["text"]))[0]
                assert all((c, shape) in shown for shape, adjectives in mentions for c in adjectives & set(COLORS))
        kinds = Counter(n["kind"] for m in out.values() for n in json.loads(m["json"])[RELCOMP]["negatives"])
        expected = {"negclip": {"swap", "shuffle"}, "fscclip": {"swap", "replace", "shuffle"},
                    "ceclip": set(CECLIP_TYPES)}[method]
        assert set(kinds) <= expected and (len(kinds) >= 2 or method == "negclip"), (method, kinds)


def test_planted_rows_are_skipped_and_counted(made):
    for method, result in made.items():
        skipped = result["skipped"]
        assert skipped.get(ng.NO_CAPTION) == 2 and skipped.get(ng.BAD_JSON) == 1, method
        assert skipped.get("missing image") == 1, method
        counted = sum(skipped.values()) + result["counts"]["samples"]
        assert counted == N_WORLD + 5, method
    assert "single" not in read_shards(made["negclip"]["out"])            # a star: nothing to swap or shuffle


def test_rerun_is_byte_identical(world, made, tmp_path):
    root, _ = world
    again = ng.negatives("ceclip", str(root / "in" / "shard-{000000..000000}.tar"), str(tmp_path / "again"),
                         progress="false")
    first = {p.name: p.read_bytes() for p in (root / "ceclip").glob("shard-*.tar")}
    assert first == {p.name: p.read_bytes() for p in (tmp_path / "again").glob("shard-*.tar")}
    assert again["manifest"]["sha256"] == made["ceclip"]["manifest"]["sha256"]


def _cli(args, capsys):
    """``negft data negatives ARGS``: (exit status, stderr)."""
    code = data.main(["negatives", *args])
    return code, capsys.readouterr().err


def test_missing_spacy_is_one_message_with_the_install_command(world, tmp_path, monkeypatch, capsys):
    root, _ = world
    monkeypatch.setitem(sys.modules, "spacy", None)                     # import spacy raises ImportError
    code, err = _cli(["ceclip", str(root / "in"), f"out={tmp_path / 'a'}", "tagger=spacy"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "pip install 'negft[negatives]' && python -m spacy download en_core_web_sm" in err
    fake = types.ModuleType("spacy")
    fake.load = lambda name, **kw: (_ for _ in ()).throw(OSError(f"[E050] Can't find model '{name}'"))
    matcher = types.ModuleType("spacy.matcher")
    matcher.Matcher = object
    monkeypatch.setitem(sys.modules, "spacy", fake)
    monkeypatch.setitem(sys.modules, "spacy.matcher", matcher)
    code, err = _cli(["ceclip", str(root / "in"), f"out={tmp_path / 'b'}", "tagger=spacy",
                      "spacy_model=en_core_web_md"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "E050" in err and "python -m spacy download en_core_web_md" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_cli_runs_and_refuses_bad_keys(world, tmp_path, capsys):
    root, samples = world
    plain = write_shard(tmp_path / "plain.tar", [("a", {"png": samples[0][0], "json": b'{"caption": "a red star"}'})])
    assert _cli(["negclip", str(root / "in"), f"out={tmp_path / 'ok'}", "progress=false"], capsys)[0] == 0
    assert (tmp_path / "ok" / "manifest.json").is_file()
    for bad in (["clip", str(root / "in")], ["negclip", str(root / "in"), "per_caption=5"],
                ["negclip", str(tmp_path / "none")], ["negclip", str(root / "in"), "tagger=nltk"],
                ["negclip", plain]):                                      # no scenes: no world vocabulary
        assert _cli([*bad, f"out={tmp_path / 'x'}"], capsys)[0] == 2, bad


def test_a_baseline_recipe_trains_on_the_output(made, tmp_path):
    out = made["ceclip"]["manifest"]
    run = tmp_path / "run"
    last = train_on_shards("ceclip", "hard", f"{made['ceclip']['out']}/{out['pattern']}", run, 4)[-1]
    assert last["step"] == 2 and last["data"]["hard"]["skipped"] == {}


def test_spacy_tagger_reads_a_parsed_doc():
    """The spaCy path on a doc parsed by hand (en_core_web_sm is not on PyPI): words, noun chunks, verb phrases."""
    spacy = pytest.importorskip("spacy")
    from spacy.matcher import Matcher
    from spacy.tokens import Doc
    nlp = spacy.blank("en")
    doc = Doc(nlp.vocab, words=["A", "man", "is", "riding", "a", "brown", "horse", "near", "two", "dogs"],
              spaces=[True] * 9 + [False],
              pos=["DET", "NOUN", "AUX", "VERB", "DET", "ADJ", "NOUN", "ADP", "NUM", "NOUN"],
              tags=["DT", "NN", "VBZ", "VBG", "DT", "JJ", "NN", "IN", "CD", "NNS"], heads=[1, 3, 3, 3, 6, 6, 3, 3, 9, 7],
              deps=["det", "nsubj", "aux", "ROOT", "det", "amod", "dobj", "prep", "nummod", "pobj"])
    tagger = object.__new__(ng.SpacyTagger)
    tagger.matcher = Matcher(nlp.vocab)
    tagger.matcher.add("verb phrase", [ng.SpacyTagger.VERB_PHRASE])
    t = tagger._tagged(doc)
    assert [t.span_text(*s) for s in t.noun_phrases] == ["A man", "a brown horse", "two dogs"]
    assert [t.span_text(*s) for s in t.verb_phrases] == ["is riding"]
    vocab = {"NN": ("horse", "man", "tree"), "JJ": ("brown", "white"), "VBG": ("feeding", "riding"), "IN": ("near",)}
    negs = ng.generate("ceclip", t, np.random.default_rng(0), vocab, 4)
    assert [n["kind"] for n in negs] == list(CECLIP_TYPES)
    assert negs[0]["text"] == "A horse is riding a brown man near two dogs"
    assert negs[1]["text"] == "A man is riding a white horse near two dogs"
    assert negs[3]["text"] == "A man is feeding a brown horse near two dogs"
