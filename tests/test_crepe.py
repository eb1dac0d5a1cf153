"""CREPE: the reader on fixtures in the released layout (RAIVNLab/CREPE prod_hard_negatives/ and
syst_hard_negatives/ CSVs + Visual Genome's VG_100K, VG_100K_2), scored by a stand-in model with known scores,
tie-aware and official; and the world's files."""
import csv
import json
import re
from pathlib import Path

import pytest
import torch
from PIL import Image

from negft.probes import crepe
from negft.probes.base import Dataset, EvalContext, crop_key
from negft.world.formats import crepe as writer
from tests.conftest import planted_context

# text features against the one image feature [1, 0]: WIN scores 1, LOSE 0, every TIE_* 1/√2
WIN, LOSE, LOSE2 = "a dog on a couch", "a couch on a dog", "a cat under a couch"
TIES = [f"two dogs {k}" for k in range(17)]
FEATURES = {WIN: [1.0, 0.0], LOSE: [0.0, 1.0], LOSE2: [0.0, 1.0], **{t: [1.0, 1.0] for t in TIES}}
COLUMNS = ("image_id", "caption", "x", "y", "width", "height", "hard_negs")
SYST_COLUMNS = ("region_id", "caption", "x", "y", "width", "height", "valid_hard_negs_comp", "valid_hard_negs_atom",
                "image_id", "valid_hard_negs_combined")
BOX = {"x": "3", "y": "4", "width": "30", "height": "28"}


def _row(image_id, caption, negatives, **box) -> dict:
    return {"image_id": str(image_id), "caption": caption, **BOX, **box,
            "hard_negs": negatives if isinstance(negatives, str) else str(negatives)}


# prod atom complexity 4: (tie-aware credit, official hit) per scored row; None: skipped from both
ATOM_4 = [
    (_row(1, WIN, [LOSE, LOSE2]), 1.0, 1.0),
    (_row(7, LOSE, [WIN]), 0.0, 0.0),
    (_row(2417, TIES[0], [TIES[1], LOSE]), 1 / 2, 1.0),       # a tie within 16 options: argsort puts index 0 first
    (_row(2417, TIES[0], TIES[1:3]), 1 / 3, 1.0),
    (_row(61, WIN, []), None, 1.0),                          # no hard negative: negft leaves it out, a hit there
    (_row(1, WIN, "not a list"), None, None),
    (_row(1, "", [LOSE]), None, None),
    (_row(999999, WIN, [LOSE]), None, None),                  # no such image
    (_row(1, WIN, [LOSE], x="3.5"), None, None),
    (_row(1, WIN, [LOSE], width="0"), None, None),
]
ATOM_5 = [(_row(61, TIES[0], TIES[1:17]), 1 / 17, None),       # 17 tied options: the order is PyTorch's
          (_row(7, WIN, [LOSE]), 1.0, 1.0)]
SWAP_4 = [(_row(1, LOSE, [LOSE2]), 1 / 2, 1.0)]                 # LOSE ties LOSE2 at 0
# prod negate complexity 4, for the ranks: (row, the reference's 0-based rank, negft's expected rank, R@3, R@5, R@10)
NEGATE_4 = [(_row(1, LOSE, [WIN, *TIES[1:4]]), 4, 5, 0, 1, 1),            # four options above
            (_row(7, WIN, [LOSE]), 0, 1, 1, 1, 1),
            (_row(61, LOSE, [*TIES[1:12], WIN]), 12, 13, 0, 0, 0),          # twelve above
            (_row(2417, TIES[0], [WIN, *TIES[1:3]]), 1, 3, 2 / 3, 1, 1)]    # one above, two tied: index 0 first


def _syst(region, image_id, caption, atom, comp) -> dict:
    return {"region_id": str(region), "caption": caption, **BOX, "image_id": str(image_id),
            "valid_hard_negs_atom": str(atom), "valid_hard_negs_comp": str(comp),
            "valid_hard_negs_combined": str(atom + comp)}


SEEN = [_syst(374, 1, WIN, [LOSE], [TIES[0]]), _syst(12, 7, TIES[0], [TIES[1]], [])]
UNSEEN = [_syst(5, 2417, LOSE, [WIN, LOSE2], [LOSE2])]


def write_csv(path: Path, columns, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def released_fixture(root: Path, world_split: Path) -> list[str]:
    """The files as released under ``root`` (prod_hard_negatives/<type>/..., syst_hard_negatives/...) and VG JPEGs
    made from world images in VG_100K (ids 1, 7, 61) and VG_100K_2 (id 2417); returns the crop keys."""
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    for k, (folder, image_id) in enumerate((("VG_100K", 1), ("VG_100K", 7), ("VG_100K", 61), ("VG_100K_2", 2417))):
        (root / folder).mkdir(parents=True, exist_ok=True)
        Image.open(sources[k]).convert("RGB").save(root / folder / f"{image_id}.jpg")
    for (kind, n), rows in {("atom", 4): ATOM_4, ("atom", 5): ATOM_5, ("swap", 4): SWAP_4}.items():
        write_csv(crepe.prod_path(root, kind, n), COLUMNS, [r for r, _, _ in rows])
    write_csv(crepe.prod_path(root, "negate", 4), COLUMNS, [r[0] for r in NEGATE_4])
    write_csv(crepe.syst_path(root, "seen", "laion"), SYST_COLUMNS, SEEN)
    write_csv(crepe.syst_path(root, "unseen", "laion"), SYST_COLUMNS, UNSEEN)
    x, y, w, h = (int(BOX[k]) for k in ("x", "y", "width", "height"))
    return [crop_key(str(root / folder / f"{i}.jpg"), (x, y, x + w, y + h))
            for folder, i in (("VG_100K", 1), ("VG_100K", 7), ("VG_100K", 61), ("VG_100K_2", 2417))]


def _ctx(keys) -> EvalContext:
    return planted_context({k: [1.0, 0.0] for k in keys}, FEATURES)


@pytest.fixture(scope="module")
def fixture_result(cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("crepe")
    keys = released_fixture(root, cache / "world-s0-tiny" / "val")
    return root, crepe.run(_ctx(keys), Dataset("crepe", root, "crepe"))


def _mean(values):
    return sum(values) / len(values)


def test_every_rank_metric_the_reference_prints_per_file(fixture_result):
    """get_one2many_metrics on prod negate 4's ranks [4, 0, 12, 1] (0-based), by hand: mean rank (5+1+13+2)/4,
    np.std of the ranks (population), floor(median 2.5) + 1, R@k and np.std of its hits; negft's own with ties in
    random order."""
    root, result = fixture_result
    m, p = result.metrics, "crepe/crepe/prod_negate_4"
    official = {"_official": 1 / 4, "_mean_rank_official": 21 / 4, "_rank_std_official": (88.75 / 4) ** 0.5,
                "_median_rank_official": 3.0, "_r3_official": 2 / 4, "_r5_official": 3 / 4, "_r10_official": 3 / 4,
                "_r1_std_official": (3 / 16) ** 0.5, "_r3_std_official": 0.5, "_r5_std_official": (3 / 16) ** 0.5,
                "_r10_std_official": (3 / 16) ** 0.5}
    for suffix, value in official.items():
        assert m[p + suffix] == pytest.approx(value), suffix
    ranks = [r[1] for r in NEGATE_4]
    assert m[p + "_mean_rank_official"] == pytest.approx(_mean([r + 1 for r in ranks]))
    negft = {"_mean_rank": _mean([r[2] for r in NEGATE_4]), "_r3": _mean([r[3] for r in NEGATE_4]),
             "_r5": _mean([r[4] for r in NEGATE_4]), "_r10": _mean([r[5] for r in NEGATE_4])}
    assert negft["_mean_rank"] == 5.5 and negft["_r3"] == pytest.approx(5 / 12)
    for suffix, value in negft.items():
        assert m[p + suffix] == pytest.approx(value), suffix
    lo, hi = result.ci95[p + "_rank_std_official"]      # the statistic's own bootstrap interval
    assert 0 <= lo <= hi and lo < hi
    # an empty list is rank 0 for the reference (the prod atom 4 file): a hit, in its mean rank too
    a = "crepe/crepe/prod_atom_4"
    assert m[a + "_mean_rank_official"] == pytest.approx(_mean([1, 2, 1, 1, 1]))
    from negft import probes
    assert all(probes.declared(k) for k in m)
    assert probes.direction(p + "_mean_rank_official") == -1 and probes.direction(p + "_rank_std_official") == 0


def test_known_scores_tie_aware_and_official(fixture_result):
    root, result = fixture_result
    m, p = result.metrics, "crepe/crepe"
    assert m[f"{p}/prod_atom_4"] == pytest.approx(_mean([1, 0, 1 / 2, 1 / 3]))
    assert m[f"{p}/prod_atom_4_official"] == pytest.approx(_mean([1, 0, 1, 1, 1]))     # the empty list: a hit
    # 17 tied options: negft 1/17; the reference's argsort puts whichever index PyTorch's sort puts first
    first = float(torch.argsort(torch.zeros(1, 17), descending=True)[0, 0] == 0)
    assert m[f"{p}/prod_atom_5"] == pytest.approx(_mean([1 / 17, 1]))
    assert m[f"{p}/prod_atom_5_official"] == pytest.approx(_mean([first, 1]))
    assert m[f"{p}/prod_swap_4"] == 0.5 and m[f"{p}/prod_swap_4_official"] == 1.0
    # a type's files pooled, example by example
    assert m[f"{p}/prod_atom"] == pytest.approx(_mean([1, 0, 1 / 2, 1 / 3, 1 / 17, 1]))
    assert m[f"{p}/prod_atom_official"] == pytest.approx(_mean([1, 0, 1, 1, 1, first, 1]))
    # systematicity: one file, three columns; seen's second row has no comp negative
    assert m[f"{p}/syst_laion_seen_atom"] == pytest.approx(_mean([1, 1 / 2]))
    assert m[f"{p}/syst_laion_seen_atom_official"] == 1.0
    assert m[f"{p}/syst_laion_seen_comp"] == 1.0 and m[f"{p}/syst_laion_seen_comp_official"] == 1.0
    assert m[f"{p}/syst_laion_seen_combined"] == pytest.approx(_mean([1, 1 / 2]))
    assert m[f"{p}/syst_laion_unseen_atom"] == 0.0 and m[f"{p}/syst_laion_unseen_combined_official"] == 0.0
    assert m[f"{p}/syst_laion_unseen_comp"] == 0.5 and m[f"{p}/syst_laion_unseen_comp_official"] == 1.0


def test_skipped_rows_counted_by_reason_and_missing_files_named(fixture_result):
    root, result = fixture_result
    m, p = result.metrics, "crepe/crepe"
    assert m[f"{p}/skipped_rows"] == 7          # atom 4: 5 bad rows and 1 empty list; seen: 1 empty comp list
    why = result.skipped[f"{p}/prod_atom_4/rows"]
    assert why.startswith("6 of 10 rows skipped") and "prod_vg_hard_negs_atom_complexity_4.csv" in why
    for reason in ("'hard_negs' not a list of strings: 1", "empty caption: 1", "image file not found: 1",
                   "box not integers: 1", "box with no area: 1", "no hard negative (a hit under the reference's rule): 1"):
        assert reason in why, reason
    assert "no hard negative" in result.skipped[f"{p}/syst_laion_seen_comp/rows"]
    missing = result.skipped[f"{p}/prod_negate_12"]
    assert str(crepe.prod_path(root, "negate", 12)) in missing and "data_manifests/crepe.yaml" in missing
    assert not any(k.startswith(f"{p}/syst_cc12m") for k in (*result.metrics, *result.skipped))
    # the probe declares exactly the texts it encodes
    assert set(crepe.texts(Dataset("crepe", root, "crepe"))) <= set(FEATURES)


def test_unreadable_files_and_an_absent_release(tmp_path, cache):
    keys = released_fixture(tmp_path, cache / "world-s0-tiny" / "val")
    crepe.prod_path(tmp_path, "swap", 4).write_text("image_id,caption\n1,a dog\n")
    result = crepe.run(_ctx(keys), Dataset("crepe", tmp_path, "crepe"))
    assert "no column x, y, width, height, hard_negs" in result.skipped["crepe/crepe/prod_swap_4"]
    assert "crepe/crepe/prod_atom_4" in result.metrics
    from negft.probes import PROBES
    absent = PROBES["crepe"](_ctx([]), Dataset("crepe", tmp_path / "none", "crepe"))
    assert not absent.metrics and "prod_hard_negatives" in absent.skipped["crepe/crepe"]


def test_the_manifest_serves_the_probe_from_negft_data(tmp_path, cache, monkeypatch):
    from negft.evaluation import datasets_for
    keys = released_fixture(tmp_path / "crepe", cache / "world-s0-tiny" / "val")
    monkeypatch.setenv("NEGFT_DATA", str(tmp_path))
    (ds,) = [d for d in datasets_for(None) if d.name == "crepe"]
    assert ds.probes == ("crepe",) and ds.root == tmp_path / "crepe"
    assert crepe.image_dirs(ds) == [str(tmp_path / "crepe" / "VG_100K"), str(tmp_path / "crepe" / "VG_100K_2")]
    assert crepe.run(_ctx(keys), ds).metrics["crepe/crepe/prod_swap_4"] == 0.5


# ------------------------------------------------------------------ the world
SHAPES = "circle|square|triangle|star|heart|cross|diamond|hexagon|pentagon|ring|crescent|arrow"
ATTRS = "small|large|red|orange|yellow|green|blue|purple|pink|cyan|solid|striped|dotted"
NP = rf"an? ((?:(?:{ATTRS}) )*)({SHAPES})(?: that is not ({ATTRS}))?"
PRED = {"to the left of": "left of", "to the right of": "right of", "above": "above", "below": "below"}
CLAUSE = re.compile(rf"^{NP}(?:( not)? ({'|'.join(PRED)}) {NP})?$")


def _object(scene, attrs, shape, not_attr):
    """The index of the object a noun phrase names if it holds, else None."""
    i = next((k for k, o in enumerate(scene["objects"]) if o["shape"] == shape), None)
    if i is None:
        return None
    values = {scene["objects"][i][a] for a in ("size", "color", "fill")}
    ok = all(a in values for a in attrs.split()) and (not not_attr or not_attr not in values)
    return i if ok else None


def holds(scene: dict, text: str) -> bool:
    """Is a world CREPE caption (clauses joined by ', ' / ' and ') true of the scene?"""
    for clause in re.split(r", | and ", text):
        g = CLAUSE.match(clause)
        assert g, clause
        i = _object(scene, g[1], g[2], g[3])
        if i is None:
            return False
        if g[5]:
            j = _object(scene, g[6], g[7], g[8])
            if j is None or ([i, PRED[g[5]], j] in scene["relations"]) == bool(g[4]):
                return False
    return True


def atoms(text: str) -> int:
    """CREPE's complexity of a world caption: its objects, their attributes and its relations."""
    attributes, relations = {}, 0
    for clause in re.split(r", | and ", text):
        g = CLAUSE.match(clause)
        for words, shape in ((g[1], g[2]), (g[6], g[7])):
            if shape:
                attributes[shape] = set(words.split())
        relations += bool(g[5])
    return len(attributes) + sum(map(len, attributes.values())) + relations


def _world_rows(root: Path):
    for path in sorted((root / crepe.PROD_DIR).rglob("*.csv")) + sorted((root / crepe.SYST_DIR).glob("*.csv")):
        with open(path, newline="") as f:
            yield from ((path, r) for r in csv.DictReader(f))


def test_world_files_true_captions_false_negatives(cache):
    root = cache / "world-s0-tiny" / "val"
    scenes = {int(Path(json.loads(line)["image_path"]).stem) + 1: json.loads(line)["scene"]
              for line in (root / "annotations.jsonl").read_text().splitlines()
              if not Path(json.loads(line)["image_path"]).name.startswith("zs_")}
    n = 0
    for path, row in _world_rows(root):
        scene = scenes[int(row["image_id"])]
        assert (root / "VG_100K" / f"{row['image_id']}.jpg").is_file()
        assert holds(scene, row["caption"]), (path.name, row["caption"])
        x, y, w, h = (int(row[k]) for k in ("x", "y", "width", "height"))
        named = {o["shape"] for o in scene["objects"] if re.search(rf"\b{o['shape']}\b", row["caption"])}
        for o in scene["objects"]:
            if o["shape"] in named:                   # the region holds every object the caption names
                assert x <= o["bbox"][0] and y <= o["bbox"][1] and o["bbox"][2] <= x + w and o["bbox"][3] <= y + h
        columns = [c for c in row if c.startswith(("hard_negs", "valid_hard_negs"))]
        for c in columns:
            for negative in crepe.list_cell(row[c]):
                assert not holds(scene, negative), (path.name, row["caption"], negative)
                n += 1
        if "complexity_" in path.name:
            assert atoms(row["caption"]) == int(path.stem.rsplit("_", 1)[1]), (path.name, row["caption"])
            kind = path.parent.name
            assert kind in writer.TYPES and all(("not " in t) == (kind == "negate")
                                                for t in crepe.list_cell(row["hard_negs"]))
    assert n > 500


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
        return torch.stack([torch.nn.functional.normalize(sum(self._vec(w) for w in sorted(t.split())), dim=0)
                            for t in texts])


def test_world_files_parse_whole_and_an_order_blind_tower_ties_every_swap(cache):
    root = cache / "world-s0-tiny" / "val"
    result = crepe.run(_BagOfWords(), Dataset("world", root))
    m = result.metrics
    assert not result.skipped and "crepe/world/skipped_rows" not in m
    assert {f"crepe/world/prod_{k}_{n}" for k in crepe.TYPES for n in crepe.COMPLEXITIES} <= set(m)
    assert {f"crepe/world/syst_world_{s}_{k}" for s in crepe.SYST_SPLITS for k in crepe.SYST_NEGATIVES} <= set(m)
    # the rules differ on ties only (a swap that keeps the caption's words ties it): negft shares the credit, the
    # reference's sort (rows of at most 5 options) puts the caption first
    records = result.records["crepe/world"]
    assert all(r["official"] == r["credit"] for r in records if r["credit"] in (0.0, 1.0))
    tied = [r for r in records if 0 < r["credit"] < 1]
    assert tied and all(r["official"] == 1.0 and len(r["scores"]) <= 1 + writer.PER_ROW for r in tied)
    assert m["crepe/world/prod_swap"] < m["crepe/world/prod_swap_official"]


def test_the_world_writer_is_deterministic(cache, tmp_path):
    root = cache / "world-s0-tiny" / "val"
    main = [json.loads(line) for line in (root / "annotations.jsonl").read_text().splitlines()
            if not Path(json.loads(line)["image_path"]).name.startswith("zs_")][:20]
    for out in (tmp_path / "a" / "val", tmp_path / "b" / "val"):
        out.mkdir(parents=True)
        (out / "images").symlink_to(root / "images")
        writer.write(out, main, [], seed=0)
    for path in sorted((tmp_path / "a" / "val").rglob("*.csv")):
        assert path.read_bytes() == (tmp_path / "b" / "val" / path.relative_to(tmp_path / "a" / "val")).read_bytes()
