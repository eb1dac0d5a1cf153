"""What's Up: the reader on a fixture in the released layout (amitakamath/whatsup_vlms: controlled_*_dataset.json
with data/-prefixed image paths, [id, caption, caption] QA lists with val2017/ and vg_images/), scored by a stand-in
model with known scores, tie-aware and official, with the reference's pair and set accuracy; and the world's files."""
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from negft import phrasings
from negft.probes import whatsup
from negft.probes.base import Dataset, EvalContext
from negft.world.formats import whatsup as writer
from negft.world.generator import relations
from tests.conftest import planted_context

RIGHT, WRONG, EVEN = [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]     # text features against the one image feature [1, 0]
# an outcome: the four option features, the right one first -> (negft's credit, the reference's argmax == 0)
OUTCOMES = {"win": ([RIGHT, WRONG, WRONG, WRONG], 1.0, 1.0), "lose": ([WRONG, RIGHT, WRONG, WRONG], 0.0, 0.0),
            "tie2": ([EVEN, WRONG, EVEN, WRONG], 0.5, 1.0), "tie4": ([EVEN] * 4, 0.25, 1.0)}
# Controlled_Images_A: a complete set (mug, table) and one without "under" (cup, plate)
CONTROLLED_A = [("mug_on_table", "win"), ("mug_under_table", "tie2"), ("mug_left_of_table", "win"),
                ("mug_right_of_table", "win"), ("cup_left_of_plate", "tie4"), ("cup_right_of_plate", "lose"),
                ("cup_on_plate", "win")]
ODD_A = [["mug_on_table.jpeg", "not an object"],
         {"image_path": "data/controlled_images/mug_on_table.jpeg", "caption_options": ["a", "b", "c"]},
         {"image_path": "data/controlled_images/mug.jpeg", "caption_options": ["a", "b", "c", "d"]},
         {"image_path": "data/controlled_images/bowl_on_table.jpeg", "caption_options": ["a", "b", "c", "d"]}]
COCO_TWO = [(139, "win"), (285, "tie2"), ("632", "lose")]          # ids as the release has them, and one string
COCO_WORDS = {139: "to the left of", 285: "above", "632": "to the left of"}     # in each row's captions
ODD_COCO = [[139, "a"], [True, "a", "b"], [999, "a", "b"], [724, "", "b"]]


TWO = {"win": [RIGHT, WRONG], "lose": [WRONG, RIGHT], "tie2": [EVEN, EVEN]}     # a QA row's two options


def _options(stem: str, outcome: str, k: int) -> tuple[list[str], dict]:
    features = OUTCOMES[outcome][0] if k == 4 else TWO[outcome]
    texts = [f"{stem} option {i}" for i in range(k)]
    return texts, dict(zip(texts, features))


def released_fixture(root: Path, world_split: Path) -> tuple[list[str], dict]:
    """controlled_images_dataset.json + controlled_images/ and coco_qa_two_obj.json + val2017/ in ``root``, made
    from world images; returns (image paths, text features)."""
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    images, features, rows = [], {}, []
    (root / "controlled_images").mkdir(parents=True)
    for k, (stem, outcome) in enumerate(CONTROLLED_A):
        Image.open(sources[k]).convert("RGB").save(root / "controlled_images" / f"{stem}.jpeg")
        images.append(str(root / "controlled_images" / f"{stem}.jpeg"))
        texts, feats = _options(stem, outcome, 4)
        features.update(feats)
        rows.append({"image_path": f"data/controlled_images/{stem}.jpeg", "caption_options": texts})
    (root / "controlled_images_dataset.json").write_text(json.dumps(rows + ODD_A, indent=4))
    (root / "val2017").mkdir()
    qa = []
    for k, (image_id, outcome) in enumerate(COCO_TWO):
        path = root / "val2017" / f"{str(image_id).zfill(12)}.jpg"
        Image.open(sources[10 + k]).convert("RGB").save(path)
        images.append(str(path))
        texts, feats = _options(f"coco {image_id} {COCO_WORDS[image_id]}", outcome, 2)
        features.update(feats)
        qa.append([image_id, *texts])
    (root / "coco_qa_two_obj.json").write_text(json.dumps(qa + ODD_COCO))
    return images, features


def _ctx(images, features) -> EvalContext:
    return planted_context({p: RIGHT for p in images}, features)


@pytest.fixture(scope="module")
def fixture_result(cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("whatsup")
    images, features = released_fixture(root, cache / "world-s0-tiny" / "val")
    dataset = Dataset("whatsup", root, "whatsup")
    return root, whatsup.run(_ctx(images, features), dataset), set(whatsup.texts(dataset)), set(features)


def test_known_scores_tie_aware_and_official(fixture_result):
    root, result, declared, features = fixture_result
    m, p = result.metrics, "whatsup/whatsup"
    credit = [OUTCOMES[o][1] for _, o in CONTROLLED_A]
    right = [OUTCOMES[o][2] for _, o in CONTROLLED_A]
    assert m[f"{p}/controlled_a"] == pytest.approx(sum(credit) / 7) == pytest.approx(4.75 / 7)
    assert m[f"{p}/controlled_a_official"] == pytest.approx(6 / 7)      # every tie goes to the first option
    # negft: pairs mug left-right 1·1, mug on-under 1·½, cup left-right ¼·0 (cup has no under); the set mug ½
    assert m[f"{p}/controlled_a_pair"] == pytest.approx(1.5 / 3)
    assert m[f"{p}/controlled_a_set"] == pytest.approx(0.5)
    # the reference: mug's two pairs right, cup's none, over N / 2 = 3.5; mug's set right over N / 4 = 1.75
    assert right.count(1.0) == 6
    assert m[f"{p}/controlled_a_pair_official"] == pytest.approx(2 / 3.5)
    assert m[f"{p}/controlled_a_set_official"] == pytest.approx(1 / 1.75)
    assert m[f"{p}/coco_qa_two"] == pytest.approx(0.5) and m[f"{p}/coco_qa_two_official"] == pytest.approx(2 / 3)
    assert declared == features                 # the probe declares exactly the texts it encodes


def test_accuracy_per_preposition_as_the_reference_logs_it(fixture_result):
    """evaluate_scores' "Accuracy" per "Preposition": controlled rows by their image_path (on, under, left_of,
    right_of), two-object COCO rows by their right caption ("left of" -> left; "above"); by hand from CONTROLLED_A
    and COCO_TWO, (negft's mean credit, the reference's mean of argmax == 0)."""
    root, result, _, _ = fixture_result
    m, p = result.metrics, "whatsup/whatsup"
    expected = {"controlled_a_prep_on": (1.0, 1.0),                 # mug win, cup win
                "controlled_a_prep_under": (0.5, 1.0),              # mug tie2
                "controlled_a_prep_left_of": ((1 + 0.25) / 2, 1.0),  # mug win, cup tie4
                "controlled_a_prep_right_of": (0.5, 0.5),           # mug win, cup lose
                "coco_qa_two_prep_left": (0.5, 0.5),                # 139 win, 632 lose
                "coco_qa_two_prep_above": (0.5, 1.0)}               # 285 tie2
    for name, (tie_aware, official) in expected.items():
        assert m[f"{p}/{name}"] == pytest.approx(tie_aware), name
        assert m[f"{p}/{name}_official"] == pytest.approx(official), name
    assert sorted(k for k in m if "_prep_" in k and not k.endswith("_official")) == sorted(f"{p}/{k}" for k in expected)
    from negft import probes
    assert all(probes.declared(k) for k in m)


def test_the_preposition_is_found_as_the_reference_finds_it():
    find = whatsup.preposition
    assert find({"image_path": "data/controlled_clevr/cube_in-front_of_sphere.jpeg"}, "controlled_b") == "in-front_of"
    assert find({"image_path": "data/controlled_clevr/cube_behind_sphere.jpeg"}, "controlled_b") == "behind"
    assert find({"image_path": "data/controlled_images/mug_under_table.jpeg"}, "controlled_a") == "under"
    assert find({"options": ["A dog on the left", "A dog on the right"]}, "vg_qa_one") == "left"
    assert find({"options": ["A cup on top of a table", "x"]}, "vg_qa_two") == "top"
    assert find({"options": ["A cup in front of a table", "x"]}, "vg_qa_two") == "front"
    assert find({"options": ["A cup below a table", "x"]}, "coco_qa_two") == "below"
    assert whatsup.metric_part("in-front_of") == "in_front_of"


def test_odd_rows_are_counted_by_reason_and_absent_files_skipped_with_their_path(fixture_result):
    root, result, _, _ = fixture_result
    m, p = result.metrics, "whatsup/whatsup"
    assert m[f"{p}/skipped_rows"] == len(ODD_A) + len(ODD_COCO)
    msg = result.skipped[f"{p}/controlled_a/rows"]
    assert msg.startswith("4 of 11 rows skipped") and "controlled_images_dataset.json" in msg
    for reason in ("row is not an object: 1", "not a list of 4 non-empty strings: 1", "names no relation",
                   "image file not found: 1"):
        assert reason in msg, reason
    msg = result.skipped[f"{p}/coco_qa_two/rows"]
    for reason in ("row is not a list", "image id is not an integer", "image file not found: 1",
                   "a caption missing"):
        assert reason in msg, reason
    for subset in ("controlled_b", "coco_qa_one", "vg_qa_one", "vg_qa_two"):
        assert f"{root / whatsup.file_of(subset)}" in result.skipped[f"{p}/{subset}"]
        assert "data_manifests/whatsup.yaml" in result.skipped[f"{p}/{subset}"]
        assert f"{p}/{subset}" not in m


def test_an_unreadable_file_is_skipped_and_the_others_run(tmp_path, cache):
    images, features = released_fixture(tmp_path, cache / "world-s0-tiny" / "val")
    (tmp_path / "coco_qa_two_obj.json").write_text('[[139, "a"')
    result = whatsup.run(_ctx(images, features), Dataset("whatsup", tmp_path, "whatsup"))
    assert "unreadable JSON" in result.skipped["whatsup/whatsup/coco_qa_two"]
    assert result.metrics["whatsup/whatsup/controlled_a_official"] == pytest.approx(6 / 7)


# ------------------------------------------------------------------ the world
def _holds(objects, rels, caption: str) -> bool:
    """Is a world What's Up caption ("A red star to the left of a blue circle", "A red star on the left") true?"""
    by_phrase = {phrasings.with_article(f"{o['color']} {o['shape']}").lower(): k for k, o in enumerate(objects)}
    text = caption.lower()
    for words in ("to the left of", "to the right of", "above", "below", "on", "under", "in front of", "behind"):
        a, sep, b = text.partition(f" {words} ")
        if sep and a in by_phrase and b in by_phrase:
            pred = {v: k for k, v in phrasings.PREDICATE_WORDS.items()}.get(words)
            return pred is not None and [by_phrase[a], pred, by_phrase[b]] in rels
    (o,) = objects
    side = text.rsplit(" ", 1)[1]
    dx, dy = o["x"] - 32, o["y"] - 32
    return {"left": dx < -4, "right": dx > 4, "top": dy < -4, "bottom": dy > 4}[side]


def test_world_files_parse_whole_and_their_captions_are_true_first(cache):
    root = cache / "world-s0-tiny" / "val"
    records = [json.loads(line) for line in (root / "annotations.jsonl").read_text().splitlines()]
    scenes = {int(Path(r["image_path"]).stem): r["scene"] for r in records if "zs_" not in r["image_path"]}
    for file in ("coco_qa_one_obj.json", "coco_qa_two_obj.json", "vg_qa_one_obj.json", "vg_qa_two_obj.json"):
        rows = json.loads((root / file).read_text())
        assert rows, file
        for image_id, true, false in rows:
            scene = scenes[image_id]
            assert _holds(scene["objects"], scene["relations"], true), (file, true)
            assert not _holds(scene["objects"], scene["relations"], false), (file, false)
    n = 0
    for rec in records:
        if "zs_" in rec["image_path"] or writer.horizontal(rec) is None:
            continue
        (i, j), images = writer.horizontal(rec)
        for k, (_, pred) in enumerate(images):
            objects = rec["scene"]["objects"] if k == 0 else rec["relcomp"]["objects_1"]
            rels = relations(objects)
            assert [i, pred, j] in rels and not any([i, p, j] in rels for p in ("above", "below"))
            n += 1
    controlled = [json.loads((root / f).read_text()) for f in writer.CONTROLLED]
    assert 0 < sum(map(len, controlled)) <= n
    for rows in controlled:
        for row in rows:
            assert (root / row["image_path"].removeprefix("data/")).is_file()
            assert len(set(row["caption_options"])) == 4
    result = whatsup.run(_BagOfWords(), Dataset("world", root))
    assert not {k: v for k, v in result.skipped.items() if "no complete set" not in v}, result.skipped
    assert {f"whatsup/world/{s}" for s in whatsup.SUBSETS} <= set(result.metrics)
    assert "whatsup/world/skipped_rows" not in result.metrics


class _BagOfWords:
    """A stand-in model: random image features and an order-blind text tower (a sum of word vectors)."""
    n_boot = 20

    def __init__(self):
        self.gen, self.vectors = torch.Generator().manual_seed(0), {}

    def _vec(self, key):
        if key not in self.vectors:
            self.vectors[key] = torch.randn(16, generator=self.gen)
        return self.vectors[key]

    def encode_images(self, paths):
        return torch.stack([torch.nn.functional.normalize(self._vec(("image", p)), dim=0) for p in paths])

    def encode_texts(self, texts):
        return torch.stack([torch.nn.functional.normalize(sum(self._vec(w) for w in t.lower().split()), dim=0)
                            for t in texts])


def test_the_world_writer_is_deterministic(cache, tmp_path):
    import shutil
    root = cache / "world-s0-tiny" / "val"
    records = [json.loads(line) for line in (root / "annotations.jsonl").read_text().splitlines()
               if "zs_" not in line]
    for out in (tmp_path / "a" / "val", tmp_path / "b" / "val"):
        shutil.copytree(root / "images", out / "images")
        writer.write(out, records, [], seed=0)
    for file in (*writer.CONTROLLED, "coco_qa_two_obj.json", "vg_qa_one_obj.json"):
        assert (tmp_path / "a" / "val" / file).read_bytes() == (tmp_path / "b" / "val" / file).read_bytes()
        assert (tmp_path / "a" / "val" / file).read_bytes() == (root / file).read_bytes()
