"""Zero-shot classification on folder-layout sets (ImageNet val/<wnid>/, ImageNet-V2 by class index, a set with
CLIP_benchmark's classnames.txt / templates file, the world's zeroshot/ folder), with stand-in features whose
scores are known: tie-aware and official top-1 / top-5 / mean per-class recall."""
import csv
import json
import shutil

import open_clip
import pytest
import torch
import torch.nn.functional as F

from negft.probes.base import Dataset, EvalContext
from negft.probes.imagenet_wnids import WNIDS

D = 32
JUNK = D - 1                                   # every class of no interest shares this direction


def _world_images(cache, n):
    rows = list(csv.DictReader(open(cache / "world-s0-tiny" / "test" / "zeroshot.csv")))
    return [cache / "world-s0-tiny" / "test" / r["filepath"] for r in rows[:n]]


def _unit(*weights):
    """A unit vector from (basis index, weight) pairs."""
    v = torch.zeros(D)
    for i, w in weights:
        v[i] += w
    return F.normalize(v, dim=0)


def _ctx(images: dict, class_vector, classes, templates):
    """A stand-in model: each prompt's feature is its class's vector (``class_vector(index)``), images' given."""
    ctx = EvalContext(torch.nn.Linear(1, 1), None, None, "cpu", n_boot=20)
    for c, name in enumerate(classes):
        v = class_vector(c)
        for t in templates:
            ctx._texts[t.replace("{c}", name)] = v
    ctx._images.update({str(k): v for k, v in images.items()})
    return ctx


def _imagenet_fixture(root, cache):
    """val/<wnid>/ with world images: classes 0, 1 and 999, two images each (ImageNet's released layout)."""
    srcs = _world_images(cache, 6)
    paths = []
    for (cls, k), src in zip([(0, 0), (0, 1), (1, 0), (1, 1), (999, 0), (999, 1)], srcs):
        folder = root / "val" / WNIDS[cls]
        folder.mkdir(parents=True, exist_ok=True)
        dst = folder / f"ILSVRC2012_val_{cls:05d}{k}.JPEG"
        shutil.copyfile(src, dst)
        paths.append(dst)
    return paths


# interest: classes 0, 1, 999 (labels) and 10..14 (distractors), each its own direction
BASIS = {0: 0, 1: 1, 999: 2, 10: 3, 11: 4, 12: 5, 13: 6, 14: 7}


def _imagenet_ctx(paths):
    e = BASIS
    images = dict(zip(paths, [
        _unit((e[0], 1)),                                                   # right, alone at the top
        _unit((e[10], 5), (e[11], 4), (e[0], 3)),                           # right class 3rd
        _unit((e[10], 6), (e[11], 5), (e[12], 4), (e[13], 3), (e[14], 2), (e[1], 1)),   # 6th
        _unit((e[1], 1)),                                                   # right
        _unit((e[999], 1), (e[10], 1)),                                     # tied first with class 10
        _unit((e[10], 1)),                                                  # right class tied with 998 at 0
    ]))
    templates = [t("{c}") for t in open_clip.OPENAI_IMAGENET_TEMPLATES]
    return _ctx(images, lambda c: _unit((BASIS.get(c, JUNK), 1)), list(open_clip.IMAGENET_CLASSNAMES), templates)


def test_imagenet_val_folder_layout_with_open_clips_names_and_templates(tmp_path, cache):
    from negft.probes.zeroshot import load, run
    root = tmp_path / "imagenet"
    paths = _imagenet_fixture(root, cache)
    ds = Dataset("imagenet", root, "imagenet_val")
    data = load(ds)
    assert data["classes"] == list(open_clip.IMAGENET_CLASSNAMES) and len(data["prompts"]) == 1000 * 80
    assert data["prompts"][0] == "a bad photo of a tench." and data["labels"] == [0, 0, 1, 1, 999, 999]
    m = run(_imagenet_ctx(paths), ds).metrics
    assert m["zeroshot/imagenet/top1"] == pytest.approx((1 + 0 + 0 + 1 + 0.5 + 0) / 6)
    assert m["zeroshot/imagenet/top1_official"] == pytest.approx(2 / 6)          # the tie goes to class 10
    assert m["zeroshot/imagenet/top5"] == pytest.approx((1 + 1 + 0 + 1 + 1 + 4 / 999) / 6)
    assert m["zeroshot/imagenet/top5_official"] == pytest.approx(4 / 6)
    assert m["zeroshot/imagenet/mean_per_class_recall"] == pytest.approx((0.5 + 0.5 + 0.25) / 3)
    assert m["zeroshot/imagenet/mean_per_class_recall_official"] == pytest.approx(1 / 3)
    assert "zeroshot/imagenet/skipped_rows" not in m


def test_wnid_order_is_open_clips_class_order():
    """The sorted wnids are ImageFolder's class order and index open_clip's names (tench, goldfish, ...)."""
    assert list(WNIDS) == sorted(WNIDS) and len(set(WNIDS)) == 1000 == len(open_clip.IMAGENET_CLASSNAMES)
    names = dict(zip(WNIDS, open_clip.IMAGENET_CLASSNAMES))
    assert names["n01440764"] == "tench" and names["n01443537"] == "goldfish"
    assert names["n15075141"] == "toilet paper"


def test_all_scores_tied_with_the_answer_at_index_zero_tie_aware_is_chance_official_is_not(tmp_path, cache):
    """Every image of class 0, every logit equal: tie-aware top-1 1/1000 and top-5 5/1000; official (ties to
    the lower index) 1.0."""
    from negft.probes.zeroshot import run
    root = tmp_path / "imagenet"
    folder = root / "val" / WNIDS[0]
    folder.mkdir(parents=True)
    paths = []
    for i, src in enumerate(_world_images(cache, 3)):
        paths.append(folder / f"{i}.JPEG")
        shutil.copyfile(src, paths[-1])
    templates = [t("{c}") for t in open_clip.OPENAI_IMAGENET_TEMPLATES]
    ctx = _ctx({p: _unit((0, 1)) for p in paths}, lambda c: _unit((0, 1)), list(open_clip.IMAGENET_CLASSNAMES),
               templates)
    m = run(ctx, Dataset("imagenet", root, "imagenet_val")).metrics
    assert m["zeroshot/imagenet/top1"] == pytest.approx(1 / 1000)
    assert m["zeroshot/imagenet/top5"] == pytest.approx(5 / 1000)
    assert m["zeroshot/imagenet/top1_official"] == 1.0 and m["zeroshot/imagenet/top5_official"] == 1.0


def test_imagenet_v2_folders_are_class_indices_not_sorted_names(tmp_path, cache):
    """ImageNet-V2's folders 0..999 are class indices: folder "10" is class 10, though it sorts before "2"."""
    from negft.probes.zeroshot import load, run
    root = tmp_path / "imagenetv2"
    images = root / "imagenetv2-matched-frequency-format-val"
    paths = {}
    for cls, src in zip((2, 10, 999), _world_images(cache, 3)):
        (images / str(cls)).mkdir(parents=True)
        paths[cls] = images / str(cls) / f"{cls}abc.jpeg"
        shutil.copyfile(src, paths[cls])
    ds = Dataset("imagenetv2", root, "imagenetv2")
    assert sorted(load(ds)["labels"]) == [2, 10, 999]
    templates = [t("{c}") for t in open_clip.OPENAI_IMAGENET_TEMPLATES]
    basis = {2: 0, 10: 1, 999: 2}
    ctx = _ctx({p: _unit((basis[c], 1)) for c, p in paths.items()}, lambda c: _unit((basis.get(c, JUNK), 1)),
               list(open_clip.IMAGENET_CLASSNAMES), templates)
    m = run(ctx, ds).metrics
    assert m["zeroshot/imagenetv2/top1"] == 1.0 and m["zeroshot/imagenetv2/top1_official"] == 1.0


def test_any_folder_set_by_manifest_with_classnames_and_templates_files(tmp_path, cache, monkeypatch):
    """A user's set: a manifest naming the folder; CLIP_benchmark's classnames.txt and
    zeroshot_classification_templates.txt beside it; sorted folder names are the classes' order; a non-image
    file is counted as skipped; evaluate.datasets_for finds it under $NEGFT_DATA."""
    from negft.data import manifests
    from negft.evaluation import datasets_for
    from negft.probes.zeroshot import class_names, load, run
    mans = tmp_path / "manifests"
    mans.mkdir()
    (mans / "shapes.yaml").write_text("name: shapes\nroot: shapes\ndataset: shapes\nprobes: [zeroshot]\n"
                                      "files: [test/]\nzeroshot:\n  images: test\n")
    monkeypatch.setattr(manifests, "MANIFESTS", mans)
    monkeypatch.setenv("NEGFT_DATA", str(tmp_path / "data"))
    root = tmp_path / "data" / "shapes"
    srcs = _world_images(cache, 4)
    paths = {}
    for (folder, k), src in zip([("a_ring", 0), ("a_ring", 1), ("b_star", 0), ("c_dot", 0)], srcs):
        (root / "test" / folder).mkdir(parents=True, exist_ok=True)
        paths[(folder, k)] = root / "test" / folder / f"{k}.png"
        shutil.copyfile(src, paths[(folder, k)])
    (root / "test" / "b_star" / "notes.txt").write_text("not an image")
    (root / "classnames.txt").write_text("ring\nstar\ndot\n")
    (root / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\na {c}.\n")
    [ds] = [d for d in datasets_for(None) if d.name == "shapes"]
    data = load(ds)
    assert data["classes"] == ["ring", "star", "dot"] and data["prompts"] == [
        "a photo of a ring.", "a ring.", "a photo of a star.", "a star.", "a photo of a dot.", "a dot."]
    assert class_names(ds) == ["ring", "star", "dot"]
    feats = {paths[("a_ring", 0)]: _unit((0, 1)), paths[("a_ring", 1)]: _unit((1, 1)),
             paths[("b_star", 0)]: _unit((1, 1)), paths[("c_dot", 0)]: _unit((2, 1))}
    ctx = _ctx(feats, lambda c: _unit((c, 1)), data["classes"], ["a photo of a {c}.", "a {c}."])
    res = run(ctx, ds)
    m = res.metrics
    assert m["zeroshot/shapes/top1"] == pytest.approx(3 / 4)
    assert m["zeroshot/shapes/mean_per_class_recall"] == pytest.approx((0.5 + 1 + 1) / 3)
    assert "zeroshot/shapes/top5" not in m                # fewer than 5 classes, as CLIP_benchmark (NaN)
    assert m["zeroshot/shapes/skipped_rows"] == 1 and "not an image file: 1" in res.skipped["zeroshot/shapes/rows"]
    # a templates file without {c} is refused with its reason; a class-count mismatch too
    (root / "zeroshot_classification_templates.txt").write_text("a photo.\n")
    assert "{c}" in run(ctx, ds).skipped["zeroshot/shapes"]
    (root / "zeroshot_classification_templates.txt").unlink()
    (root / "classnames.txt").write_text("ring\nstar\n")
    assert "3 class folders but 2 class names" in run(ctx, ds).skipped["zeroshot/shapes"]


def test_missing_set_is_skipped_with_its_path_and_manifest(tmp_path):
    from negft.probes.zeroshot import run
    res = run(_ctx({}, lambda c: _unit((0, 1)), [], []), Dataset("imagenet", tmp_path / "nowhere", "imagenet_val"))
    msg = res.skipped["zeroshot/imagenet"]
    assert "nowhere/val" in msg and "data_manifests/imagenet_val.yaml" in msg and not res.metrics


def test_geometry_gets_imagenet_names_from_the_wnid_folders(tmp_path, cache):
    from negft.probes.zeroshot import class_names
    root = tmp_path / "imagenet"
    _imagenet_fixture(root, cache)
    assert class_names(root) == list(open_clip.IMAGENET_CLASSNAMES)
    assert class_names(Dataset("imagenet", root, "imagenet_val")) == list(open_clip.IMAGENET_CLASSNAMES)


def test_the_worlds_folder_set_gives_the_scores_of_its_zeroshot_csv(cache):
    """The world's zeroshot/ folder holds zeroshot.csv's images by label, with class names and prompts that
    make exactly the prompts the probe always used; a model's top-1 on it is the one zeroshot.csv gives."""
    from negft import models
    from negft.world.formats import zeroshot_folder
    from negft.probes.base import read_csv, resolve
    from negft.probes.stats import choice_credit
    from negft.probes.zeroshot import TEMPLATES, class_features, class_names, class_prompts, load, run
    split = cache / "world-s0-tiny" / "test"
    ds = Dataset("world", split)
    data = load(ds)
    classes = json.loads((cache / "world-s0-tiny" / "world.json").read_text())["classes"]
    assert data["prompts"] == class_prompts(classes)
    assert list(zeroshot_folder.PROMPTS) == [t.replace("{}", "{c}") for t in TEMPLATES]
    rows = read_csv(split / "zeroshot.csv")
    assert sorted((p.split("/")[-1], y) for p, y in zip(data["paths"], data["labels"])) == \
        sorted((r["filepath"].split("/")[-1], int(r["label"])) for r in rows)
    for p, y in zip(data["paths"], data["labels"]):
        src = split / "images" / p.split("/")[-1]
        assert open(p, "rb").read() == src.read_bytes()
    torch.manual_seed(0)
    b = models.build("negft-tiny", "")
    ctx = EvalContext(b.model.eval(), b.preprocess_val, b.tokenizer, "cpu", n_boot=20)
    got = run(ctx, ds).metrics
    legacy = choice_credit(ctx.encode_images([resolve(split, r["filepath"]) for r in rows]) @
                           class_features(ctx, class_names(split)).T, torch.tensor([int(r["label"]) for r in rows]))
    assert got["zeroshot/world/top1"] == pytest.approx(float(legacy.double().mean()), abs=1e-12)
    assert 0 <= got["zeroshot/world/top5"] <= 1 and got["zeroshot/world/top5"] >= got["zeroshot/world/top1"]


def test_the_worlds_class_folders_sort_as_text_in_class_order(cache):
    """torchvision's ImageFolder, which CLIP_benchmark reads a folder set with, numbers the class folders in their
    order as text: zero-padded, that is the class order, so line i of classnames.txt names the images of label i."""
    from torchvision.datasets import ImageFolder
    split = cache / "world-s0-tiny" / "test"
    folder = ImageFolder(str(split / "zeroshot"))
    assert folder.classes == [f"{i:02d}" for i in range(12)]
    labels = {r["filepath"].split("/")[-1]: int(r["label"]) for r in csv.DictReader(open(split / "zeroshot.csv"))}
    assert len(folder.samples) == len(labels)
    assert all(labels[path.split("/")[-1]] == target for path, target in folder.samples)
