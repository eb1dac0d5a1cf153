"""VALSE: the reader on fixtures in the released layout (a clone of Heidelberg-NLP/VALSE: data/<piece>.json, and each
piece's images in the folder its config.py names), scored by a stand-in model with known scores, tie-aware and
official, on the valid set only, empty texts scored as the reference scores them; and the world's files."""
import json
import os
import re

import pytest
import torch
from PIL import Image

from negft.probes import valse
from negft.probes.base import Dataset, EvalContext
from negft.world.formats import valse as writer
from tests.conftest import planted_context

# text features against the one image feature [1, 0]: WIN beats LOSE, TIE_A ties TIE_B
WIN, LOSE, TIE_A, TIE_B = "There are exactly 2 cars.", "There are exactly 0 cars.", "A dog.", "A dog running."
FEATURES = {WIN: [1.0, 0.0], LOSE: [0.0, 1.0], TIE_A: [1.0, 1.0], TIE_B: [1.0, 1.0]}
OUTCOME = {"win": (WIN, LOSE), "lose": (LOSE, WIN), "tie": (TIE_A, TIE_B), "same": (WIN, WIN)}
# per piece, each row's (outcome, annotators' votes for the caption): votes < 2 is outside the valid set
PLAN = {"existence": [("win", 3), ("tie", 2), ("lose", 1)],           # 1.5/2, 1/2 (the loss is not valid)
        "plurals": [("win", 3), ("win", 2)],                           # 1, 1
        "counting-hard": [("lose", 3), ("win", 0)],                    # 0, 0
        "counting-small-quant": [("same", 3), ("win", 3)],             # caption == foil: 1.5/2, 1/2
        "counting-adversarial": [("tie", 3), ("tie", 2), ("win", 2)],  # 2/3, 1/3
        "relations": [("win", 2), ("lose", 2), ("lose", 2), ("lose", 3)],   # 1/4, 1/4
        "action-replacement": [("win", 3)],
        "actant-swap": [("tie", 3), ("same", 1)],                      # 1/2, 0
        "coreference-standard": [("win", 3), ("lose", 3)],
        "coreference-hard": [("win", 2)],
        "foil-it": [("lose", 3), ("win", 3), ("tie", 3), ("win", 1)]}  # 1.5/3, 1/3
# config.py's DATA (Heidelberg-NLP/VALSE @ 2152d90), relative to the clone; FOIL-it's COCO val2014 is outside it
FOLDERS = {"existence": "data/visual7w/images", "plurals": "data/plurals/test_images",
           "counting-hard": "data/visual7w/images", "counting-small-quant": "data/visual7w/images",
           "counting-adversarial": "data/visual7w/images", "relations": "data/relations/test_images",
           "action-replacement": "data/actions/images_512", "actant-swap": "data/actions/images_512",
           "coreference-standard": "data/coref/release_too_many_is_this_in_color/images",
           "coreference-hard": "data/coref/release_v18/test_images", "foil-it": "../coco/val2014"}
# a release-style id and image file name per piece (ids are not contiguous numbers)
NAMING = {"existence": ("existence_visual7w_{k}", "v7w_{k}.jpg"), "plurals": ("plurals:coco2017:{k}", "{k:012d}.jpg"),
          "relations": ("relations:coco_2017:{k}", "{k:012d}.jpg"), "foil-it": ("{k}", "COCO_val2014_{k:012d}.jpg"),
          "action-replacement": ("actions_test_{k}", "exercising_{k}.jpg"),
          "actant-swap": ("actions_test_{k}", "exercising_{k}.jpg"),
          "coreference-standard": ("coref_train_{k}", "COCO_train2014_{k:012d}.jpg"),
          "coreference-hard": ("coref_test_{k}", "VisualDialog_val2018_{k:012d}.jpg")}


def _naming(piece):
    return NAMING.get(piece, ("counting_visual7w_{k}", "v7w_{k}.jpg"))


def _ctx(image_paths, texts=FEATURES) -> EvalContext:
    return planted_context({str(p): [1.0, 0.0] for p in image_paths}, texts)


def released_fixture(root, world_split, plan=PLAN) -> list[str]:
    """The piece files as released (ids -> rows with the release's keys, indented by 4) in ``root/data`` and JPEGs
    named as the sources name them, made from world images, in each piece's folder as config.py names it; returns
    the image paths."""
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    images, k = [], 0
    for piece, rows in plan.items():
        folder = root / FOLDERS[piece]
        folder.mkdir(parents=True, exist_ok=True)
        key, name = _naming(piece)
        data = {}
        for outcome, votes in rows:
            file = name.format(k=2371044 + 97 * k)
            Image.open(sources[k % len(sources)]).convert("RGB").save(folder / file)
            images.append(str(folder / file))
            caption, foil = OUTCOME[outcome]
            data[key.format(k=2371044 + 97 * k)] = {"dataset": "visual7w", "image_file": file, "caption": caption,
                                                    "classes": 2, "classes_foil": 0,
                                                    "mturk": {"foil": 0, "caption": votes, "other": 3 - votes},
                                                    "foil": foil}
            k += 1
        writer.write_piece(root / "data" / f"{piece}.json", data)
    return images


def expected(plan=PLAN):
    """(tie-aware, official) credits of the valid rows, per piece."""
    valid = {p: [o for o, votes in rows if votes >= 2] for p, rows in plan.items()}
    tie_aware = {p: [{"win": 1.0, "lose": 0.0, "tie": 0.5, "same": 0.5}[o] for o in outs] for p, outs in valid.items()}
    official = {p: [float(o == "win") for o in outs] for p, outs in valid.items()}
    return tie_aware, official


@pytest.fixture(scope="module")
def released(cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "valse"        # $NEGFT_DATA/valse, as the manifest's root
    return root, released_fixture(root, cache / "world-s0-tiny" / "val")


def test_known_scores_tie_aware_official_and_averages_on_the_valid_set(released):
    root, images = released
    result = valse.run(_ctx(images), Dataset("valse", root, "valse"))
    m, p = result.metrics, "valse/valse"
    tie_aware, official = expected()
    for piece in valse.PIECES:
        name = valse.metric_name(piece)
        assert m[f"{p}/{name}"] == pytest.approx(sum(tie_aware[piece]) / len(tie_aware[piece])), piece
        assert m[f"{p}/{name}_official"] == pytest.approx(sum(official[piece]) / len(official[piece])), piece
    # by hand: the rows outside the valid set (one win, one loss, a caption equal to its foil) do not count
    assert m[f"{p}/existence"] == 0.75 and m[f"{p}/existence_official"] == 0.5
    assert m[f"{p}/counting_small_quant"] == 0.75 and m[f"{p}/counting_small_quant_official"] == 0.5
    assert m[f"{p}/counting_hard"] == 0.0 and m[f"{p}/actant_swap_official"] == 0.0
    assert m[f"{p}/foil_it"] == pytest.approx(0.5) and m[f"{p}/foil_it_official"] == pytest.approx(1 / 3)
    for scores, suffix in ((tie_aware, ""), (official, "_official")):
        pooled = [v for s in scores.values() for v in s]
        assert m[f"{p}/avg_micro{suffix}"] == pytest.approx(sum(pooled) / len(pooled))
        macro = sum(sum(s) / len(s) for s in scores.values()) / len(scores)
        assert m[f"{p}/avg_macro{suffix}"] == pytest.approx(macro)
    assert f"{p}/skipped_rows" not in m and not result.skipped
    assert len(result.records[p]) == sum(len(s) for s in tie_aware.values())
    # the probe declares exactly the texts it encodes
    assert set(valse.texts(Dataset("valse", root, "valse"))) == set(FEATURES)


def test_odd_rows_are_counted_by_reason_and_a_bad_file_is_skipped(released, tmp_path):
    import shutil
    root, images = released
    copy = tmp_path / "valse"
    shutil.copytree(root, copy, symlinks=True)
    data = json.loads((copy / "data" / "relations.json").read_text())
    good = next(iter(data.values()))
    data["relations:coco_2017:1"] = {**good, "foil": ""}                               # empty texts: scored,
    data["relations:coco_2017:7"] = {**good, "caption": "", "foil": LOSE}             # as the reference
    data["relations:coco_2017:8"] = {**good, "caption": "", "foil": ""}                # tokenizes "" and
    data["relations:coco_2017:9"] = {**good, "foil": None}                             # scores it; no foil
    data["relations:coco_2017:2"] = {**good, "mturk": {"caption": "3"}}                # votes as a string
    data["relations:coco_2017:3"] = {k: v for k, v in good.items() if k != "mturk"}    # no votes
    data["relations:coco_2017:4"] = {**good, "image_file": "000000999999.jpg"}         # no such image
    data["relations:coco_2017:5"] = [good["caption"], good["foil"]]                    # not an object
    data["relations:coco_2017:6"] = {**good, "image_file": "000000999999.jpg", "mturk": {"caption": 1}}  # not valid
    (copy / "data" / "relations.json").write_text(json.dumps(data, indent=4))
    (copy / "data" / "plurals.json").write_text('{"plurals:coco2017:1": {"image_file": ')      # cut short
    (copy / "data" / "foil-it.json").unlink()
    texts = {**FEATURES, "": [0.6, 0.8]}                                  # "" scores 0.6: above LOSE, below WIN
    result = valse.run(_ctx([i.replace(str(root), str(copy)) for i in images], texts), Dataset("valse", copy, "valse"))
    m, p = result.metrics, "valse/valse"
    assert m[f"{p}/skipped_rows"] == 5
    # the four good rows (1 win) and the three with an empty text: WIN over "", "" over LOSE, "" tying ""
    assert m[f"{p}/relations_official"] == pytest.approx(3 / 7) and m[f"{p}/relations"] == pytest.approx(3.5 / 7)
    msg = result.skipped[f"{p}/relations/rows"]
    assert msg.startswith("5 of 12 rows skipped") and "relations.json" in msg
    for why in ("image file not found: 1", "row is not an object: 1", "'mturk' votes missing or not a whole "
                "number: 2", "'foil' missing or not a string: 1"):
        assert why in msg, why
    assert "unreadable JSON" in result.skipped[f"{p}/plurals"] and f"{p}/plurals" not in m
    assert f"{copy}/data/foil-it.json" in result.skipped[f"{p}/foil_it"]
    assert "data_manifests/valse.yaml" in result.skipped[f"{p}/foil_it"]
    assert m[f"{p}/existence"] == 0.75
    # nothing at all: every piece skipped with its path, no metric, no crash
    empty = valse.run(_ctx([]), Dataset("valse", tmp_path / "none", "valse"))
    assert set(empty.skipped) == {f"{p}/{valse.metric_name(s)}" for s in valse.PIECES} and not empty.metrics


def test_the_manifest_serves_the_probe_from_negft_data(released, monkeypatch):
    from negft.evaluation import datasets_for
    root, images = released
    monkeypatch.setenv("NEGFT_DATA", str(root.parent))
    (ds,) = [d for d in datasets_for(None) if d.manifest == "valse"]
    assert ds.probes == ("valse",) and ds.root == root
    assert os.path.realpath(valse.image_root(ds, "foil-it")) == str(root.parent / "coco" / "val2014")
    assert valse.image_root(ds, "coreference-hard") == str(root / "data/coref/release_v18/test_images")
    assert valse.run(_ctx(images), ds).metrics["valse/valse/plurals"] == 1.0
    # a tree without a manifest (the world's split) has the release's folders too
    assert valse.image_root(Dataset("world", root), "plurals") == str(root / "data/plurals/test_images")


def test_piece_files_are_read_from_the_clones_data_folder_only(released, tmp_path):
    """The release keeps its JSON files in data/; a piece file beside it (negft's earlier flat layout) is not read,
    and the skip names the path looked for."""
    import shutil
    root, images = released
    flat = tmp_path / "valse"
    shutil.copytree(root / FOLDERS["existence"], flat / FOLDERS["existence"])
    shutil.copy(root / "data" / "existence.json", flat / "existence.json")
    result = valse.run(_ctx([i.replace(str(root), str(flat)) for i in images]), Dataset("valse", flat, "valse"))
    assert not result.metrics and f"{flat}/data/existence.json" in result.skipped["valse/valse/existence"]
    (flat / "data" / "existence.json").symlink_to(flat / "existence.json")
    result = valse.run(_ctx([i.replace(str(root), str(flat)) for i in images]), Dataset("valse", flat, "valse"))
    assert result.metrics["valse/valse/existence_official"] == 0.5


# ------------------------------------------------------------------ the world
SHAPES = "circle|square|triangle|star|heart|cross|diamond|hexagon|pentagon|ring|crescent|arrow"
EXISTS = re.compile(rf"^There is (no|an?) ({SHAPES}) in the picture\.$")
COUNT = re.compile(r"^There (?:is|are) exactly (\d) shapes? in the picture\.$")
PRED = {"to the left of": "left of", "to the right of": "right of", "above": "above", "below": "below"}
RELATION = re.compile(rf"^An? (\w+) ({SHAPES}) positioned ({'|'.join(PRED)}) an? (\w+) ({SHAPES})\.$")


def holds(scene: dict, piece: str, text: str) -> bool:
    """Is a world caption of ``piece`` true of the scene?"""
    shapes = [o["shape"] for o in scene["objects"]]
    if piece == "existence":
        no, shape = EXISTS.match(text).groups()
        return (shape in shapes) != (no == "no")
    if piece == "counting-small-quant":
        return int(COUNT.match(text)[1]) == len(shapes)
    c1, s1, pred, c2, s2 = RELATION.match(text).groups()
    i, j = shapes.index(s1), shapes.index(s2)
    return scene["objects"][i]["color"] == c1 and scene["objects"][j]["color"] == c2 and \
        [i, PRED[pred], j] in scene["relations"]


def test_world_files_true_captions_false_foils_and_zero_skipped(cache):
    root = cache / "world-s0-tiny" / "val"
    scenes = {json.loads(line)["image_path"]: json.loads(line)["scene"]
              for line in (root / "annotations.jsonl").read_text().splitlines()}
    n_main = sum(1 for line in (root / "mcq.csv").read_text().splitlines()) - 1
    for piece in writer.PIECES:
        data = json.loads((root / "data" / f"{piece}.json").read_text())
        assert len(data) == n_main or (piece == "relations" and n_main // 3 < len(data) < n_main), piece
        for row in data.values():
            image = root / FOLDERS[piece] / row["image_file"]      # named as its source names it, in config.py's
            assert image.is_file() and row["mturk"]["caption"] >= 2     # folder, a link to the world's image
            world_image = str(image.resolve().relative_to(root.resolve()))
            assert world_image == f"images/{int(row['dataset_idx']):06d}.png"
            assert holds(scenes[world_image], piece, row["caption"]), (piece, row)
            assert not holds(scenes[world_image], piece, row["foil"]), (piece, row)
    ctx = _ctx([], {})
    gen = torch.Generator().manual_seed(0)
    ctx.encode_images = lambda paths: torch.nn.functional.normalize(torch.randn(len(paths), 8, generator=gen), dim=-1)
    ctx.encode_texts = lambda texts: torch.nn.functional.normalize(torch.randn(len(texts), 8, generator=gen), dim=-1)
    result = valse.run(ctx, Dataset("world", root))
    assert not any(k.endswith("/rows") for k in result.skipped) and "valse/world/skipped_rows" not in result.metrics
    assert set(result.skipped) == {f"valse/world/{valse.metric_name(p)}" for p in valse.PIECES
                                   if p not in writer.PIECES}
    assert {f"valse/world/{valse.metric_name(p)}_official" for p in writer.PIECES} <= set(result.metrics)


def test_the_world_writer_is_deterministic_and_leaves_the_records_alone(tmp_path):
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
    for piece in writer.PIECES:
        assert (tmp_path / "a" / "val" / "data" / f"{piece}.json").read_bytes() == \
            (tmp_path / "b" / "val" / "data" / f"{piece}.json").read_bytes()
