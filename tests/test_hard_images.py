"""negft data hard-images: world shards (relcomp samples, caption-only samples, planted bad ones) → each sample's
nearest-neighbour hard image as NegCLIP builds them → the negclip recipe trained on the output."""
import json

import numpy as np
import pytest
import torch

from negft.commands import cli
from negft.convert import hard_images as hi
from negft.data.shards import MANIFEST

from conftest import read_shards, train_on_shards, write_shard

RELCOMP, CAPTIONED = 24, 12
NOT_AN_IMAGE = b"\x89PNG\r\n\x1a\n not an image"


@pytest.fixture(scope="module")
def source(cache, tmp_path_factory):
    """Two shards: world relcomp samples (with the hard image the world drew), then caption-only world samples, an
    undecodable image, a sample without a caption and a byte-identical copy of the first relcomp image."""
    world = cache / "world-s0-tiny"
    relcomp = list(read_shards(world / "relcomp").items())[:RELCOMP]
    captioned = [(k, {e: v for e, v in s.items() if e in ("png", "json")})
                 for k, s in list(read_shards(world / "finetune").items())[:CAPTIONED]]
    first = relcomp[0][1]
    planted = [("bad-image", {"png": NOT_AN_IMAGE, "json": b'{"caption": "a broken picture"}'}),
               ("no-caption", {"png": first["png"], "json": b'{"objects": {}}'}),
               ("copy", {"png": first["png"], "json": b'{"caption": "the first picture again"}'})]
    folder = tmp_path_factory.mktemp("hard_src") / "src"
    folder.mkdir()
    write_shard(folder / "shard-000000.tar", relcomp)
    write_shard(folder / "shard-000001.tar", captioned + planted)
    return folder, dict(relcomp + captioned + planted)


def _convert(src, out, **keys):
    return hi.hard_images(str(src), str(out), model="negft-tiny", pretrained="", batch="8", maxcount="16",
                          progress="false", **keys)


@pytest.fixture(scope="module")
def converted(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("hard_out") / "out"
    return out, _convert(source[0], out)


class Skips:
    """ShardWriter's skip counter, for calling the step's parts on their own."""

    def __init__(self):
        self.reasons = {}

    def skip(self, reason, row):
        self.reasons[row] = reason


def _brute_force(sims: np.ndarray, k: int) -> list[list[int]]:
    """Each row's k largest others (-inf: not a candidate), ties to the lower index, padded with -1."""
    rows = []
    for row in sims:
        best = [int(j) for j in np.lexsort((np.arange(len(row)), -row)) if np.isfinite(row[j])][:k]
        rows.append(best + [-1] * (k - len(best)))
    return rows


def test_nearest_is_exact_with_ties_to_the_lower_index():
    gen = torch.Generator().manual_seed(0)
    feats = torch.randint(0, 3, (30, 3), generator=gen).float()       # small integers: exact dot products, many ties
    groups = torch.arange(30)
    groups[[4, 9]] = 4                                                  # one picture twice
    index, value = hi.nearest(feats, groups, k=5, block=7)
    f, g = feats.numpy().astype(np.float64), groups.numpy()
    sims = np.where(g[:, None] == g[None, :], -np.inf, f @ f.T)
    assert index.tolist() == _brute_force(sims, 5)
    assert np.array_equal(value.numpy(), np.take_along_axis(sims, index.numpy(), 1))
    few, _ = hi.nearest(feats[:3], torch.tensor([0, 1, 0]), k=3)      # fewer others than k: -1
    assert [sorted(r) for r in few.tolist()] == [[-1, -1, 1], [-1, 0, 2], [-1, -1, 1]]


def test_neighbours_equal_a_brute_force_cosine_argsort(source, converted):
    out, man = converted
    paths, skips = hi.shard_paths(source[0]), Skips()
    kept, feats = hi.embed(hi.scan(paths, skips), hi.load_model("negft-tiny", "", 0), 8, "cpu", skips, progress=False)
    keys = [s["key"] for s in kept]
    f = feats.numpy().astype(np.float64)
    same = np.array([[a["hash"] == b["hash"] for b in kept] for a in kept])
    sims = np.where(same, -np.inf, f @ f.T)
    # byte-identical images encoded in different batches differ in the last float32 bits: the brute force reads
    # similarities equal to 1e-6 as the tie they are (the converter's own ties go to the lower index)
    ranked = np.where(same, -np.inf, np.round(f @ f.T, 6))
    samples = read_shards(out)
    assert list(samples) == keys and man["k"] == 3 and man["model"] == "negft-tiny"
    for i, (key, order) in enumerate(zip(keys, _brute_force(ranked, 3))):
        got = json.loads(samples[key]["json"])["hard_images"]
        assert [n["key"] for n in got["neighbours"]] == [keys[j] for j in order]
        assert np.allclose([n["cosine"] for n in got["neighbours"]], sims[i, order], atol=1e-5)
        assert key not in [n["key"] for n in got["neighbours"]]
    copy = [n["key"] for n in json.loads(samples["copy"]["json"])["hard_images"]["neighbours"]]
    assert keys[0] not in copy and "copy" not in [n["key"] for n in json.loads(samples[keys[0]]["json"])
                                                  ["hard_images"]["neighbours"]]


def test_bad_samples_are_skipped_counted_and_no_ones_neighbour(converted):
    out, man = converted
    assert man["skipped"] == {hi.UNDECODABLE: 1, hi.NO_CAPTION: 1}
    assert man["counts"]["samples"] == RELCOMP + CAPTIONED + 1 and man["samples_without_hard_captions"] == CAPTIONED + 1
    samples = read_shards(out)
    assert not {"bad-image", "no-caption"} & set(samples)
    assert not any(n["key"] in ("bad-image", "no-caption")
                   for s in samples.values() for n in json.loads(s["json"])["hard_images"]["neighbours"])


def test_samples_keep_their_own_and_gain_the_drawn_neighbours_image(source, converted):
    _, originals = source
    out, _ = converted
    samples = read_shards(out)
    for key, s in samples.items():
        meta, before = json.loads(s["json"]), json.loads(originals[key]["json"])
        near = meta["hard_images"]
        assert near["drawn"] == hi.draw(0, key, len(near["neighbours"]))
        other = near["neighbours"][near["drawn"]]["key"]
        assert s["png"] == originals[key]["png"] and s["neg.png"] == originals[other]["png"]    # bytes copied
        assert set(s) == {"png", "json", "neg.png"}                                             # the old neg.* replaced
        assert {k: v for k, v in meta.items() if k not in ("relcomp", "hard_images")} == \
            {k: v for k, v in before.items() if k != "relcomp"}
        if "relcomp" not in before:
            assert "relcomp" not in meta        # none invented: the relcomp stream would refuse it
            continue
        theirs = json.loads(originals[other]["json"]).get("relcomp", {})
        kept = {k: v for k, v in before["relcomp"].items() if not k.startswith("negative_")}
        assert meta["relcomp"] == {**kept, "negative_image": "nearest",
                                   "negative_image_caption": near["neighbours"][near["drawn"]]["caption"],
                                   "negative_image_negatives": [n["text"] for n in theirs.get("negatives", [])]}
        assert meta["relcomp"]["negative_image_caption"] == theirs.get("caption", json.loads(
            originals[other]["json"]).get("caption"))


def test_rerun_through_the_cli_is_byte_identical_and_refusals_exit_2(source, converted, tmp_path, capsys):
    out, man = converted
    again = tmp_path / "again"
    assert cli.main(["data", "hard-images", str(source[0]), f"out={again}", "model=negft-tiny", "pretrained=",
                     "batch=8", "maxcount=16", "progress=false"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["counts"] == man["counts"]
    assert sorted(p.name for p in again.glob("shard-*")) == man["shards"]
    assert all((again / n).read_bytes() == (out / n).read_bytes() for n in man["shards"])
    assert cli.main(["data", "hard-images", str(source[0]), f"out={again}", "model=negft-tiny", "pretrained="]) == 2
    assert cli.main(["data", "hard-images", str(source[0]), f"out={tmp_path / 'k0'}", "k=0"]) == 2
    assert cli.main(["data", "hard-images", str(tmp_path / "none"), f"out={tmp_path / 'x'}"]) == 2
    assert not (tmp_path / "k0").exists() and not (tmp_path / "x").exists() and (again / MANIFEST).exists()


def test_negclip_trains_on_the_output(converted, tmp_path):
    out, man = converted
    run = tmp_path / "run"
    ledger = train_on_shards("negclip", "hard", out / man['pattern'], run, 4,
                             env={"NEGFT_CACHE": str(tmp_path / "cache")})
    assert ledger[-1]["epoch"] == 1 and ledger[-1]["step"] == 2
