"""SugarCrepe: the reader on fixtures in the released layout (RAIVNLab/sugar-crepe data/<split>.json + COCO
val2017 images), scored by stand-in models with known scores, tie-aware and official; and the world's files."""
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from negft.world.formats import sugarcrepe as writer
from negft.probes import sugarcrepe
from negft.probes.base import Dataset, EvalContext
from tests.conftest import planted_context

SPLITS = sugarcrepe.SPLITS
# text features against the one image feature [1, 0]: WIN beats LOSE, TIE_A ties TIE_B
WIN, LOSE, TIE_A, TIE_B = "a cat on a mat", "a mat on a cat", "two dogs", "two dogs running"
FEATURES = {WIN: [1.0, 0.0], LOSE: [0.0, 1.0], TIE_A: [1.0, 1.0], TIE_B: [1.0, 1.0]}
OUTCOME = {"win": (WIN, LOSE), "lose": (LOSE, WIN), "tie": (TIE_A, TIE_B)}
# per split, the outcome of each row: (tie-aware score, official score) follow
PLAN = {"add_obj": ["win", "win", "lose", "tie"],      # 2.5/4, 2/4
        "add_att": ["win", "tie"],                      # 1.5/2, 1/2
        "replace_obj": ["lose"],                        # 0, 0
        "replace_att": ["win", "win"],                  # 1, 1
        "replace_rel": ["tie", "tie", "win"],           # 2/3, 1/3
        "swap_obj": ["tie"],                            # 1/2, 0
        "swap_att": ["win", "lose", "lose", "lose"]}    # 1/4, 1/4


def _ctx(image_paths, texts=FEATURES) -> EvalContext:
    return planted_context({str(p): [1.0, 0.0] for p in image_paths}, texts)


def released_fixture(root: Path, world_split: Path, plan=PLAN) -> list[str]:
    """The seven split files as released (string ids, indented by 4) in ``root`` and COCO-named JPEGs made from
    world images in ``root/val2017``; returns the image paths."""
    (root / "val2017").mkdir(parents=True, exist_ok=True)
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    images, k = [], 0
    for split, outcomes in plan.items():
        rows = []
        for outcome in outcomes:
            name = f"{139 + k:012d}.jpg"
            Image.open(sources[k % len(sources)]).convert("RGB").save(root / "val2017" / name)
            images.append(str(root / "val2017" / name))
            caption, negative = OUTCOME[outcome]
            rows.append({"filename": name, "caption": caption, "negative_caption": negative})
            k += 1
        writer.write_split(root / f"{split}.json", rows)
    return images


def expected(plan=PLAN):
    tie_aware = {s: [{"win": 1.0, "lose": 0.0, "tie": 0.5}[o] for o in outs] for s, outs in plan.items()}
    official = {s: [float(o == "win") for o in outs] for s, outs in plan.items()}
    return tie_aware, official


def test_layout_is_the_released_one(tmp_path, cache):
    released_fixture(tmp_path, cache / "world-s0-tiny" / "val")
    text = (tmp_path / "add_obj.json").read_text()
    assert text.startswith('{\n    "0": {\n        "filename": "000000000139.jpg",\n        "caption": ')
    data = json.loads(text)
    assert list(data) == ["0", "1", "2", "3"]
    assert all(list(row) == ["filename", "caption", "negative_caption"] for row in data.values())


def test_known_scores_tie_aware_official_micro_and_macro(tmp_path, cache):
    images = released_fixture(tmp_path, cache / "world-s0-tiny" / "val")
    result = sugarcrepe.run(_ctx(images), Dataset("sugarcrepe", tmp_path, "sugarcrepe"))   # images: val2017
    m, p = result.metrics, "sugarcrepe/sugarcrepe"
    tie_aware, official = expected()
    for split in SPLITS:
        assert m[f"{p}/{split}"] == pytest.approx(sum(tie_aware[split]) / len(tie_aware[split])), split
        assert m[f"{p}/{split}_official"] == pytest.approx(sum(official[split]) / len(official[split])), split
    for category, splits in sugarcrepe.CATEGORIES.items():
        for scores, suffix in ((tie_aware, ""), (official, "_official")):
            pooled = [v for s in splits for v in scores[s]]
            assert m[f"{p}/{category}_micro{suffix}"] == pytest.approx(sum(pooled) / len(pooled))
            macro = sum(sum(scores[s]) / len(scores[s]) for s in splits) / len(splits)
            assert m[f"{p}/{category}_macro{suffix}"] == pytest.approx(macro)
    assert m[f"{p}/add_micro"] == pytest.approx(4 / 6) and m[f"{p}/add_macro"] == pytest.approx((2.5 / 4 + 0.75) / 2)
    assert f"{p}/skipped_rows" not in m and not result.skipped
    assert len(result.records[p]) == sum(map(len, PLAN.values()))
    # the probe declares exactly the texts it encodes
    assert set(sugarcrepe.texts(Dataset("sugarcrepe", tmp_path, "sugarcrepe"))) == set(FEATURES)


def test_swap_examples_with_the_captions_words_are_reported_apart(tmp_path, cache):
    """WIN and LOSE have the same words in another order, TIE_A and TIE_B do not: a swap split's examples are
    scored in two groups beside the whole, both rules; a group with no example has no metric."""
    plan = {"swap_obj": ["win", "lose", "tie", "tie", "win"], "swap_att": ["tie"], "add_obj": ["win"]}
    images = released_fixture(tmp_path, cache / "world-s0-tiny" / "val", plan)
    m, p = sugarcrepe.run(_ctx(images), Dataset("sugarcrepe", tmp_path, "sugarcrepe")).metrics, "sugarcrepe/sugarcrepe"
    assert m[f"{p}/swap_obj_same_words"] == pytest.approx(2 / 3) and m[f"{p}/swap_obj_same_words_official"] == \
        pytest.approx(2 / 3)
    assert m[f"{p}/swap_obj_new_words"] == 0.5 and m[f"{p}/swap_obj_new_words_official"] == 0.0
    assert m[f"{p}/swap_obj"] == pytest.approx(3 / 5)
    assert m[f"{p}/swap_att_new_words"] == 0.5 and f"{p}/swap_att_same_words" not in m
    assert not any(k.startswith(f"{p}/add_obj_") and "words" in k for k in m)
    assert sugarcrepe.same_words("A cat, on a mat.", "a MAT on a cat") and not sugarcrepe.same_words("a a b", "a b b")


def test_all_ties_with_the_caption_always_first_give_chance_and_official_zero(tmp_path, cache):
    """Every row's caption is first (its key is 'caption') and ties its negative: negft's rule gives 1/2,
    SugarCrepe's strict `pos > neg` gives 0 on every split."""
    plan = {s: ["tie"] * 3 for s in SPLITS}
    images = released_fixture(tmp_path, cache / "world-s0-tiny" / "val", plan)
    m = sugarcrepe.run(_ctx(images), Dataset("sugarcrepe", tmp_path, "sugarcrepe")).metrics
    for split in SPLITS:
        assert m[f"sugarcrepe/sugarcrepe/{split}"] == 0.5
        assert m[f"sugarcrepe/sugarcrepe/{split}_official"] == 0.0
    assert m["sugarcrepe/sugarcrepe/overall_micro"] == 0.5 and m["sugarcrepe/sugarcrepe/overall_macro_official"] == 0


def test_missing_file_is_skipped_with_its_path_and_the_others_still_run(tmp_path, cache):
    images = released_fixture(tmp_path, cache / "world-s0-tiny" / "val")
    (tmp_path / "swap_obj.json").unlink()
    result = sugarcrepe.run(_ctx(images), Dataset("sugarcrepe", tmp_path, "sugarcrepe"))
    msg = result.skipped["sugarcrepe/sugarcrepe/swap_obj"]
    assert f"{tmp_path}/swap_obj.json" in msg and "data_manifests/sugarcrepe.yaml" in msg
    assert "sugarcrepe/sugarcrepe/swap_obj" not in result.metrics
    assert result.metrics["sugarcrepe/sugarcrepe/swap_micro"] == pytest.approx(0.25)     # swap_att alone
    assert result.metrics["sugarcrepe/sugarcrepe/add_obj"] == pytest.approx(2.5 / 4)
    # nothing at all: every split skipped with its path, no metric, no crash
    empty = sugarcrepe.run(_ctx([]), Dataset("sugarcrepe", tmp_path / "none", "sugarcrepe"))
    assert set(empty.skipped) == {f"sugarcrepe/sugarcrepe/{s}" for s in SPLITS} and not empty.metrics


def test_malformed_rows_are_counted_and_a_malformed_file_is_skipped(tmp_path, cache):
    images = released_fixture(tmp_path, cache / "world-s0-tiny" / "val")
    data = json.loads((tmp_path / "add_att.json").read_text())
    data["7"] = {"filename": "000000000139.jpg", "caption": WIN}                       # no negative_caption
    data["8"] = ["000000000139.jpg", WIN, LOSE]                                        # not an object
    data["9"] = {"filename": "000000999999.jpg", "caption": WIN, "negative_caption": LOSE}   # no such image
    (tmp_path / "add_att.json").write_text(json.dumps(data, indent=4))
    (tmp_path / "replace_obj.json").write_text('{"0": {"filename": ')                 # truncated
    result = sugarcrepe.run(_ctx(images), Dataset("sugarcrepe", tmp_path, "sugarcrepe"))
    m, p = result.metrics, "sugarcrepe/sugarcrepe"
    assert m[f"{p}/skipped_rows"] == 3
    assert m[f"{p}/add_att"] == pytest.approx(0.75)                                  # the two good rows only
    msg = result.skipped[f"{p}/add_att/rows"]
    assert msg.startswith("3 of 5 rows skipped") and "image file not found: 1" in msg and "add_att.json" in msg
    assert "unreadable JSON" in result.skipped[f"{p}/replace_obj"]
    assert f"{p}/replace_obj" not in m and m[f"{p}/replace_att"] == 1.0


def test_the_manifest_serves_the_probe_from_negft_data(tmp_path, cache, monkeypatch):
    from negft.evaluation import datasets_for
    images = released_fixture(tmp_path / "sugarcrepe", cache / "world-s0-tiny" / "val")
    monkeypatch.setenv("NEGFT_DATA", str(tmp_path))
    (ds,) = [d for d in datasets_for(None) if d.name == "sugarcrepe"]
    assert ds.probes == ("sugarcrepe",) and ds.root == tmp_path / "sugarcrepe"
    assert sugarcrepe.image_root(ds) == str(tmp_path / "sugarcrepe" / "val2017")
    assert sugarcrepe.run(_ctx(images), ds).metrics["sugarcrepe/sugarcrepe/replace_att"] == 1.0


# ------------------------------------------------------------------ the world
SHAPES = "circle|square|triangle|star|heart|cross|diamond|hexagon|pentagon|ring|crescent|arrow"
ATTRS = "small|large|red|orange|yellow|green|blue|purple|pink|cyan|solid|striped|dotted"
PHRASE = re.compile(rf"\b[Aa]n? ((?:(?:{ATTRS}) )*)({SHAPES})\b")
PRED = {"to the left of": "left of", "to the right of": "right of", "above": "above", "below": "below"}
RELATION = re.compile(rf"^(.+) positioned ({'|'.join(PRED)}) (.+)$")


def _object(scene, text):
    """The object a noun phrase names if all its attributes hold, else None."""
    (attrs, shape), = PHRASE.findall(text)
    obj = next((o for o in scene["objects"] if o["shape"] == shape), None)
    if obj is None or any(a not in (obj["size"], obj["color"], obj["fill"]) for a in attrs.split()):
        return None
    return obj


def holds(scene: dict, caption: str) -> bool:
    """Is a world caption (a list of noun phrases, or 'X positioned <relation> Y') true of the scene?"""
    rel = RELATION.match(caption)
    if rel:
        subj, obj = _object(scene, rel[1]), _object(scene, rel[3])
        return subj is not None and obj is not None and \
            [scene["objects"].index(subj), PRED[rel[2]], scene["objects"].index(obj)] in scene["relations"]
    phrases = [m.group(0) for m in PHRASE.finditer(caption)]
    return bool(phrases) and all(_object(scene, ph) is not None for ph in phrases)


class _BagOfWords:
    """A stand-in model: random image features and an order-blind text tower (a sum of word vectors)."""
    n_boot = 50

    def __init__(self):
        self.gen, self.vectors = torch.Generator().manual_seed(0), {}

    def _vec(self, key):
        if key not in self.vectors:
            self.vectors[key] = torch.randn(32, generator=self.gen)
        return self.vectors[key]

    def encode_images(self, paths):
        return torch.stack([torch.nn.functional.normalize(self._vec(("image", p)), dim=0) for p in paths])

    def encode_texts(self, texts):
        return torch.stack([torch.nn.functional.normalize(sum(self._vec(w) for w in sorted(t.lower().split())),
                                                          dim=0) for t in texts])


def test_world_files_true_captions_false_negatives_and_scores(cache):
    root = cache / "world-s0-tiny" / "val"
    scenes = {json.loads(line)["image_path"]: json.loads(line)["scene"]
              for line in (root / "annotations.jsonl").read_text().splitlines()}
    n_main = len(list(csv_rows(root / "mcq.csv")))
    for split in SPLITS:
        data = json.loads((root / f"{split}.json").read_text())
        assert list(data) == [str(i) for i in range(len(data))]
        if split.startswith(("add", "replace_obj", "replace_att")):
            assert len(data) == n_main, split                    # always possible
        assert len(data) > n_main // 3, split
        for row in data.values():
            # a COCO file name resolved against val2017/ beside the JSON (main_eval.py's coco_image_root and
            # CLIP_benchmark's <root>/val2017), a link to the world's image of that number
            image = root / "val2017" / row["filename"]
            assert re.fullmatch(r"\d{12}\.png", row["filename"]) and image.is_file()
            world_image = f"images/{int(row['filename'][:12]):06d}.png"
            assert image.resolve() == (root / world_image).resolve()
            scene = scenes[world_image]
            assert holds(scene, row["caption"]), (split, row)
            assert not holds(scene, row["negative_caption"]), (split, row)
            if split.startswith("swap"):
                assert sorted(row["caption"].lower().split()) == sorted(row["negative_caption"].lower().split())
    result = sugarcrepe.run(_BagOfWords(), Dataset("world", root))
    m = result.metrics
    assert set(m) >= {f"sugarcrepe/world/{s}" for s in SPLITS} and not result.skipped
    # an order-blind text tower ties every swap: chance under negft's rule, 0 under SugarCrepe's
    assert m["sugarcrepe/world/swap_micro"] == 0.5 and m["sugarcrepe/world/swap_micro_official"] == 0.0
    for split in ("add_obj", "add_att", "replace_obj", "replace_att", "replace_rel"):
        assert 0.0 <= m[f"sugarcrepe/world/{split}"] <= 1.0


def test_the_world_writer_is_deterministic_and_leaves_the_records_alone(cache, tmp_path):
    import copy
    from negft.world import generator as world
    held = {tuple(c) for c in world.held_out_combos(0)}
    main = [world.probe_sample("val", 0, i, held, "tiny")[1] for i in range(12)]
    for i, rec in enumerate(main):
        rec["image_path"] = f"images/{i:06d}.png"
    before = copy.deepcopy(main)
    for out in (tmp_path / "a" / "val", tmp_path / "b" / "val"):
        out.mkdir(parents=True)
        writer.write(out, main, [], seed=0)
    assert main == before
    for split in SPLITS:
        assert (tmp_path / "a" / "val" / f"{split}.json").read_bytes() == \
            (tmp_path / "b" / "val" / f"{split}.json").read_bytes()


def csv_rows(path):
    import csv
    with open(path, newline="") as f:
        yield from csv.DictReader(f)


def test_copy_of_a_world_split_is_read_like_a_release(tmp_path, cache):
    """The world's files are the released layout: moved under a real root (JSON at the top, images beside as
    the manifest says), the same reader scores them the same way."""
    root = cache / "world-s0-tiny" / "val"
    real = tmp_path / "sugarcrepe"
    (real / "val2017").mkdir(parents=True)
    for split in SPLITS:
        data = json.loads((root / f"{split}.json").read_text())
        for row in data.values():
            name = row["filename"]
            if not (real / "val2017" / name).exists():
                shutil.copy(root / "val2017" / name, real / "val2017" / name)
        (real / f"{split}.json").write_text(json.dumps(data, indent=4))
    model = _BagOfWords()
    world = sugarcrepe.run(model, Dataset("world", root)).metrics
    copied = sugarcrepe.run(model, Dataset("sugarcrepe", real, "sugarcrepe")).metrics
    assert copied["sugarcrepe/sugarcrepe/swap_micro"] == world["sugarcrepe/world/swap_micro"]
    assert "sugarcrepe/sugarcrepe/skipped_rows" not in copied
