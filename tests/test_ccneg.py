"""CC-Neg: the reader on fixtures in the released layout (CoN-CLIP's ccneg_preprocessed.pt + images under its
prefix), scored by a stand-in model with known scores, tie-aware and official (argmax: a tie is right), on the
evaluation split only; a torch file weights_only refuses, and its conversion; and the world's file."""
import json

import pytest
import torch
from PIL import Image

from negft.commands import cli
from negft.probes import ccneg
from negft.probes.base import Dataset, EvalContext
from negft.world.formats import ccneg as writer
from tests.conftest import planted_context

# text features against the one image feature [1, 0]: WIN beats LOSE, TIE_A ties TIE_B and the empty text ""
# (which the reference tokenizes and scores like any other)
WIN, LOSE, TIE_A, TIE_B = "a dog on a couch", "a dog not on a couch", "two cats", "two cats sleeping"
FEATURES = {WIN: [1.0, 0.0], LOSE: [0.0, 1.0], TIE_A: [1.0, 1.0], TIE_B: [1.0, 1.0], "": [1.0, 1.0]}
# (caption, negative-prompt as released: the reader removes its commas)
OUTCOME = {"win": (WIN, "a dog, not on a couch"), "lose": (LOSE, WIN), "tie": (TIE_A, TIE_B),
           "same": (WIN, "a dog on, a couch"), "empty caption": ("", LOSE), "commas only": (TIE_A, ",,,"),
           "caption not a string": (None, LOSE)}
IMAGES = "ccneg_images/cc3m_subset_images_extracted_final"
# rows before the evaluation split (CoN-CLIP's fine-tuning rows: read by neither rule, odd ones not counted), then
# the split's rows; EVAL_ROWS is set to the split's length
TRAIN = ["lose", "lose", "broken"]
SPLIT = ["win", "lose", "tie", "same", "win", "win", "no image", "empty caption", "commas only", "caption not a string",
         "not a dict", "path not a string"]
EVAL_ROWS = len(SPLIT)
# by hand over the eight rows scored (win, lose, tie, same, win, win, empty caption: a win, commas only: "" ties
# TIE_A): negft's 1 + 0 + 1/2 + 1/2 + 1 + 1 + 1 + 1/2; argmax gives the three ties to the caption
ACC, ACC_OFFICIAL = 5.5 / 8, 7 / 8


@pytest.fixture(autouse=True)
def _split(monkeypatch):
    monkeypatch.setattr(ccneg, "EVAL_ROWS", EVAL_ROWS)


def _ctx(image_paths, texts=FEATURES) -> EvalContext:
    return planted_context({str(p): [1.0, 0.0] for p in image_paths}, texts)


def released_fixture(root, world_split, extra=None) -> list[str]:
    """``ccneg_preprocessed.pt`` as the loader reads it (image paths under the authors' prefix) and JPEGs made
    from world images in the README's image folder; returns the image paths."""
    (root / IMAGES).mkdir(parents=True, exist_ok=True)
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    paths, annotations, images = [], [], []
    for k, outcome in enumerate(TRAIN + SPLIT):
        name = f"{1000 + 37 * k}.jpg"
        if outcome != "no image":
            Image.open(sources[k % len(sources)]).convert("RGB").save(root / IMAGES / name)
            images.append(str(root / IMAGES / name))
        caption, negated = OUTCOME.get(outcome, (WIN, LOSE))
        annotation = {"json": {"caption": caption, "key": str(k)},
                      "sop_data": {"negative-prompt": negated}}
        paths.append(7 if outcome == "path not a string" else f"{ccneg.PREFIX}{IMAGES}/{name}")
        annotations.append([caption, negated] if outcome in ("not a dict", "broken") else annotation)
    torch.save({"image_paths": paths, "annotations": annotations, **(extra or {})}, root / ccneg.FILE)
    return images


@pytest.fixture(scope="module")
def released(cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "ccneg"            # $NEGFT_DATA/ccneg, as the manifest's root
    return root, released_fixture(root, cache / "world-s0-tiny" / "val")


def test_known_scores_tie_aware_and_official_on_the_evaluation_split(released):
    root, images = released
    result = ccneg.run(_ctx(images), Dataset("ccneg", root, "ccneg"))
    m, p = result.metrics, "ccneg/ccneg"
    # "same": caption == negated once its commas go; the empty caption and the negation of commas only (now "")
    # are scored, as the reference scores them
    assert m[f"{p}/acc"] == pytest.approx(ACC) and m[f"{p}/acc_official"] == pytest.approx(ACC_OFFICIAL)
    assert m[f"{p}/skipped_rows"] == 4
    msg = result.skipped[f"{p}/rows"]
    assert msg.startswith("4 of 12 rows skipped") and ccneg.FILE in msg
    for why in ("image file not found: 1", "'json.caption' missing or not a string: 1",
                "annotation is not an object: 1", "image path not a non-empty string: 1"):
        assert why in msg, why
    # after the three fine-tuning rows
    assert [r["index"] for r in result.records[p]] == [3, 4, 5, 6, 7, 8, 10, 11]
    assert result.records[p][0]["negated"] == "a dog not on a couch"
    assert [(r["caption"], r["negated"]) for r in result.records[p][-2:]] == [("", LOSE), (TIE_A, "")]
    # the probe declares exactly the texts it encodes
    assert set(ccneg.texts(Dataset("ccneg", root, "ccneg"))) == set(FEATURES)


def test_a_missing_file_and_an_unpaired_file_are_skipped_with_their_reasons(released, tmp_path):
    root, images = released
    from negft import probes
    gone = probes.PROBES["ccneg"](_ctx([]), Dataset("ccneg", tmp_path / "none", "ccneg"))
    msg = gone.skipped["ccneg/ccneg"]
    assert f"{tmp_path}/none/{ccneg.FILE}" in msg and "data_manifests/ccneg.yaml" in msg and not gone.metrics
    torch.save({"image_paths": ["a.jpg"], "annotations": []}, tmp_path / ccneg.FILE)
    bad = ccneg.run(_ctx([]), Dataset("ccneg", tmp_path, "ccneg"))
    assert "1 entries and 'annotations' 0" in bad.skipped["ccneg/ccneg"] and not bad.metrics


class _Plant:
    """Unpickling this creates the file ``marker``: what a file carrying code would do when loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_file_weights_only_refuses_is_skipped_with_the_command_and_converts_on_request(cache, tmp_path, capsys):
    root, marker = tmp_path / "ccneg", tmp_path / "RAN"
    images = released_fixture(root, cache / "world-s0-tiny" / "val", extra={"x": _Plant(marker)})
    result = ccneg.run(_ctx(images), Dataset("ccneg", root, "ccneg"))
    msg = result.skipped["ccneg/ccneg"]
    assert "GLOBAL io.open refused" in msg and f"{root / ccneg.FILE}" in msg and not result.metrics
    assert f"python -m negft data convert ccneg {root / ccneg.FILE} {root / ccneg.CONVERTED}" in msg
    assert not marker.exists()                                 # nothing in it ran
    # the user's explicit request: the converter loads it (its payload runs) and writes the JSON the probe reads
    assert cli.main(["data", "convert", "ccneg", str(root / ccneg.FILE), str(root / ccneg.CONVERTED)]) == 0
    assert marker.exists() and json.loads(capsys.readouterr().out)["counts"]["rows"] == len(TRAIN + SPLIT)
    converted = ccneg.run(_ctx(images), Dataset("ccneg", root, "ccneg"))
    assert converted.metrics["ccneg/ccneg/acc"] == pytest.approx(ACC)
    assert converted.metrics["ccneg/ccneg/acc_official"] == pytest.approx(ACC_OFFICIAL)
    assert ccneg.CONVERTED in converted.skipped["ccneg/ccneg/rows"]
    # never overwritten
    assert cli.main(["data", "convert", "ccneg", str(root / ccneg.FILE), str(root / ccneg.CONVERTED)]) == 2


def test_the_manifest_serves_the_probe_from_negft_data(released, monkeypatch):
    from negft.evaluation import datasets_for
    root, images = released
    monkeypatch.setenv("NEGFT_DATA", str(root.parent))
    (ds,) = [d for d in datasets_for(None) if d.manifest == "ccneg"]
    assert ds.probes == ("ccneg",) and ds.root == root
    assert ccneg.image_path(ds.root, f"{ccneg.PREFIX}{IMAGES}/1.jpg") == f"{root}/{IMAGES}/1.jpg"
    assert ccneg.run(_ctx(images), ds).metrics["ccneg/ccneg/acc_official"] == pytest.approx(ACC_OFFICIAL)


# ------------------------------------------------------------------ the world
def test_world_file_loads_safely_true_captions_false_negations_and_zero_skipped(cache, monkeypatch):
    monkeypatch.setattr(ccneg, "EVAL_ROWS", 40000)
    root = cache / "world-s0-tiny" / "val"
    data = torch.load(root / writer.FILE, weights_only=True)
    records = [json.loads(line) for line in (root / "annotations.jsonl").read_text().splitlines()]
    scenes = {writer.PREFIX + r["image_path"]: r["scene"] for r in records}
    assert len(data["image_paths"]) == len(data["annotations"]) == sum(
        1 for line in (root / "mcq.csv").read_text().splitlines()) - 1
    for path, annotation in zip(data["image_paths"], data["annotations"]):
        shapes = {o["shape"] for o in scenes[path]["objects"]}
        colours = {(o["color"], o["shape"]) for o in scenes[path]["objects"]}
        caption, negated = annotation["json"]["caption"].lower(), annotation["sop_data"]["negative-prompt"].lower()
        assert all(f"{c} {s}" in caption for c, s in colours)            # every object, with its colour
        denied = [s for s in shapes if f"{s} is not" in negated or f"sign of a {s}" in negated
                  or f"sign of an {s}" in negated or f"single {s}" in negated]
        assert len(denied) == 1, negated                                  # one present shape denied: false
    ctx = _ctx([], {})
    gen = torch.Generator().manual_seed(0)
    ctx.encode_images = lambda paths: torch.nn.functional.normalize(torch.randn(len(paths), 8, generator=gen), dim=-1)
    ctx.encode_texts = lambda texts: torch.nn.functional.normalize(torch.randn(len(texts), 8, generator=gen), dim=-1)
    result = ccneg.run(ctx, Dataset("world", root))
    assert not result.skipped and {"ccneg/world/acc", "ccneg/world/acc_official"} <= set(result.metrics)
    assert len(result.records["ccneg/world"]) == len(data["image_paths"])
