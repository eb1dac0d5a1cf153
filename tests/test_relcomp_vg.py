"""negft data relcomp: Visual Genome (in VG's released layout, drawn by the world) → RelComp shards."""
import json
from pathlib import Path

import pytest

from negft.convert import relcomp_vg
from negft.data.schema import MAX_NEGATIVES, RELCOMP_NEGATIVE_KINDS
from negft.world.formats import visual_genome

from conftest import read_shards

N = 40


@pytest.fixture(scope="module")
def vg(tmp_path_factory):
    root = tmp_path_factory.mktemp("vg")
    ex = visual_genome.write_vg_example(root / "vg", N, seed=0)
    ex["root"] = root
    return ex


def _build(ex, out, **kw):
    return relcomp_vg.relcomp(ex["relationships"], ex["images"], str(out), exclude=",".join(ex["exclude"]),
                     progress="false", **kw)


@pytest.fixture(scope="module")
def built(vg):
    return _build(vg, vg["root"] / "out")


@pytest.fixture(scope="module")
def every(vg):
    """Every relationship of every image (max_per_image large): many more negatives to check."""
    return _build(vg, vg["root"] / "out-all", max_per_image="100")


def _samples(manifest) -> dict[str, dict[str, bytes]]:
    return read_shards(manifest["out"])


def _annotations(ex):
    """The fixture's own annotations, read independently of the converter: triples and attributes."""
    def name(o):
        return (o.get("name") if "name" in o else (o.get("names") or [""])[0]).strip().lower()
    triples, attrs = {}, {}
    for img in json.loads(Path(ex["relationships"]).read_text()):
        triples[img["image_id"]] = {(name(r["subject"]), r["predicate"].strip().lower(), name(r["object"]))
                                    for r in img["relationships"]}
    for img in json.loads(Path(ex["attributes"]).read_text()):
        for a in img["attributes"]:
            attrs[a["object_id"]] = set(a.get("attributes", []))
    return triples, attrs


def _file(ex, iid) -> bytes:
    hits = [p for d in relcomp_vg.IMAGE_DIRS for p in [Path(ex["images"]) / d / f"{iid}.jpg"] if p.exists()]
    assert len(hits) == 1
    return hits[0].read_bytes()


def test_counts_and_planted_skips(vg, built):
    exp = vg["expected"]
    assert built["counts"]["samples"] == exp["samples"]
    assert built["skipped"] == exp["skipped"]
    assert built["images"] == {"in_relationships": exp["images"], "excluded": exp["excluded"],
                               "missing": len(exp["missing_ids"]), "with_samples": exp["samples"]}
    assert built["exclusion"]["images_excluded"] == exp["excluded"]
    assert built["exclusion"]["vg_ids_listed"] == exp["excluded"] + 1       # one listed id is not in VG
    assert set(built["layout_source"]) >= {"relationships.json", "attributes.json", "image_data.json", "aro_exclusion"}
    assert "missing_ids" in exp and all(f"image_id {i}" in built["skipped_examples"][relcomp_vg.MISSING_FILE]
                                        for i in exp["missing_ids"])


def test_excluded_images_never_appear(vg, built, every):
    for manifest in (built, every):
        for key, s in _samples(manifest).items():
            meta = json.loads(s["json"])
            assert meta["vg"]["image_id"] not in vg["excluded_ids"]
            assert meta["relcomp"]["negative_image_id"] not in vg["excluded_ids"]
            assert meta["vg"]["image_id"] not in vg["expected"]["no_sample_ids"] + vg["expected"]["missing_ids"]


def test_every_negative_is_false_of_its_image(vg, every):
    triples, attrs = _annotations(vg)
    kinds, symmetric_seen = set(), 0
    for key, s in _samples(every).items():
        meta = json.loads(s["json"])
        rel, iid = meta["relcomp"], meta["vg"]["image_id"]
        subj, obj = meta["vg"]["subject"], meta["vg"]["object"]
        (sn, p, on), (sa, oa) = rel["triple"], rel["attributes"]
        assert (sn, p, on) in triples[iid]                                   # the caption is true
        assert sa in attrs[subj["object_id"]] and oa in attrs[obj["object_id"]]
        assert 1 <= len(rel["negatives"]) <= 3
        assert len({n["text"] for n in rel["negatives"]} | {rel["caption"]}) == len(rel["negatives"]) + 1
        symmetric_seen += p == "next to"
        for n in rel["negatives"]:
            kinds.add(n["kind"])
            assert n["kind"] in RELCOMP_NEGATIVE_KINDS
            (ns, np_, no), (nsa, noa) = n["triple"], n["attributes"]
            if n["kind"] == "exchange":
                assert (ns, np_, no) == (on, p, sn) and (nsa, noa) == (oa, sa)
                assert (on, p, sn) not in triples[iid] and not relcomp_vg.is_symmetric(p) and p != "next to"
            elif n["kind"] == "predicate":
                assert (ns, no) == (sn, on) and np_ != p and (sn, np_, on) not in triples[iid]
            else:
                assert (ns, np_, no) == (sn, p, on) and (nsa, noa) != (sa, oa)
                for new, old, o in ((nsa, sa, subj), (noa, oa, obj)):
                    if new != old:
                        assert new not in attrs[o["object_id"]]
    assert kinds == set(RELCOMP_NEGATIVE_KINDS)
    assert symmetric_seen > 0          # symmetric relations were captioned, and never exchanged


def test_hard_negative_images_hold_the_swapped_triple(vg, built, every):
    triples, _ = _annotations(vg)
    found = 0
    for manifest in (built, every):
        for key, s in _samples(manifest).items():
            meta = json.loads(s["json"])
            rel = meta["relcomp"]
            if rel["negative_image"] is None:
                assert "neg.jpg" not in s and rel["negative_image_id"] is None
                continue
            found += 1
            b = rel["negative_image_id"]
            assert b != meta["vg"]["image_id"]
            neg = next(n for n in rel["negatives"] if n["kind"] == rel["negative_image"])
            assert rel["negative_image"] in ("predicate", "exchange")
            assert tuple(neg["triple"]) in triples[b] and tuple(rel["triple"]) not in triples[b]
            assert s["neg.jpg"] == _file(vg, b)
    assert found > 0


def test_sample_reads_back_as_its_source(vg, built):
    samples = _samples(built)
    assert len(samples) == vg["expected"]["samples"]
    for key, s in samples.items():
        meta = json.loads(s["json"])
        iid = meta["vg"]["image_id"]
        assert key == f"vg{iid}_{meta['relcomp']['relationship_id']}"
        assert s["jpg"] == _file(vg, iid)                     # bytes copied unchanged
        assert meta["caption"] == meta["relcomp"]["caption"]
        assert meta["vg"]["file"] == f"{relcomp_vg.IMAGE_DIRS[iid % 2 == 0]}/{iid}.jpg"   # the url's folder
        sn, p, on = meta["relcomp"]["triple"]
        sa, oa = meta["relcomp"]["attributes"]
        assert meta["caption"].lower().endswith(f"{sa} {sn} {p} a {oa} {on}".lower()) or \
            meta["caption"].lower().endswith(f"{sa} {sn} {p} an {oa} {on}".lower())


def test_shards_load_through_the_itm_stream(built):
    from negft import models
    from negft.data.pipeline import Stream, StreamSpec, loader
    b = models.build("negft-tiny", "")
    urls = [str(Path(built["out"]) / s) for s in built["shards"]]
    stream = Stream(StreamSpec(urls, "itm", "relcomp", batch_size=4), b.preprocess_val, b.tokenizer, seed=0)
    items = list(loader(stream, workers=0))
    batches = [x for x in items if "images" in x]
    assert len(batches) == built["counts"]["samples"] // 4
    assert sum(int(x["skipped"]) for x in items) == 0
    assert all(x["negatives"].shape[:2] == (4, MAX_NEGATIVES) for x in batches)
    assert sum(int(x["has_negative_image"].sum()) for x in batches) > 0


def test_same_seed_same_shards(vg, built, tmp_path):
    again = _build(vg, tmp_path / "again")
    assert again["sha256"] == built["sha256"]
    other = _build(vg, tmp_path / "other", seed="1")
    assert other["counts"] == built["counts"] and other["sha256"] != built["sha256"]


def test_cli_dispatch_and_exclusion_formats(vg, tmp_path, capsys):
    from negft.commands.cli import main
    out = tmp_path / "cli"
    rc = main(["data", "relcomp", vg["relationships"], vg["images"], f"out={out}",
               f"exclude={','.join(vg['exclude'])}", "progress=false"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["counts"]["samples"] == vg["expected"]["samples"]
    assert json.loads((out / "manifest.json").read_text())["counts"] == summary["counts"]
    # ARO rows by image_id or image_path, CSV columns, COCO file names, plain lists
    rows = [{"image_id": 3, "image_path": "99.jpg"}, {"image_path": "images/12.jpg"}, 7, "VG_100K_2/8.jpg",
            "COCO_val2014_000000000042.jpg"]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "b.csv").write_text("image_0,image_1,caption_0,caption_1,kind\n20.jpg,21.jpg,x,y,relation\n")
    got = relcomp_vg.exclusion_ids([tmp_path / "a.json", tmp_path / "b.csv"])
    assert got == {"vg": {3, 12, 7, 8, 20, 21}, "coco": {42}, "unparsed": 0}
    with pytest.raises(FileNotFoundError):
        relcomp_vg.relcomp(vg["relationships"], vg["images"], str(tmp_path / "x"), exclude=str(tmp_path / "nope.json"))
    assert not (tmp_path / "x").exists()


def test_rules_on_a_handmade_graph(tmp_path):
    """Non-spatial predicates: Probe-R's fallback swap, symmetric predicates, same-name pairs, plurals."""
    import io

    from PIL import Image

    def obj(oid, name, **kw):
        return {"object_id": oid, "names": [name], "synsets": [], "x": 1, "y": 2, "w": 3, "h": 4, **kw}

    def rel(rid, s, p, o):
        return {"relationship_id": rid, "predicate": p, "synsets": [], "subject": s, "object": o}

    man, horse, dog, woman = obj(11, "man"), obj(12, "horse"), obj(21, "dog"), obj(31, "woman")
    rels = [
        {"image_id": 1, "relationships": [rel(1, man, "riding", horse)]},
        {"image_id": 2, "relationships": [rel(2, obj(22, "man"), "feeding", dog)]},
        {"image_id": 3, "relationships": [rel(3, woman, "feeding", obj(32, "horse"))]},
        {"image_id": 4, "relationships": [rel(4, obj(41, "horse"), "riding", obj(42, "man"))]},
        {"image_id": 5, "relationships": [rel(5, obj(51, "clouds", attributes=["white"]), "next to",
                                              obj(52, "car")),
                                          rel(6, obj(53, "car"), "parked next to", obj(54, "car"))]},
    ]
    attrs = [{"image_id": 1, "attributes": [{**man, "attributes": ["Tall "]}, {**horse, "attributes": ["brown"]}]},
             {"image_id": 5, "attributes": [{**obj(52, "car"), "attributes": ["red", "parked"]},
                                            {**obj(53, "car"), "attributes": ["red"]},
                                            {**obj(54, "car"), "attributes": ["blue"]}]}]
    (tmp_path / "VG_100K").mkdir()
    for iid in range(1, 6):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (iid * 40, 0, 0)).save(buf, format="JPEG")
        (tmp_path / "VG_100K" / f"{iid}.jpg").write_bytes(buf.getvalue())
    (tmp_path / "relationships.json").write_text(json.dumps(rels))
    (tmp_path / "attributes.json").write_text(json.dumps(attrs))
    m = relcomp_vg.relcomp(tmp_path / "relationships.json", tmp_path, str(tmp_path / "out"), max_per_image="5",
                  progress="false")
    got = {json.loads(s["json"])["relcomp"]["relationship_id"]: (json.loads(s["json"]), s)
           for s in _samples(m).values()}
    one, s1 = got[1]
    negs = {n["kind"]: n for n in one["relcomp"]["negatives"]}
    assert one["caption"] in ("A tall man riding a brown horse", "A picture of a tall man riding a brown horse")
    # "feeding" is frequent with "man" and never annotated with (man, horse): Probe-R's unlikely predicate
    assert negs["predicate"]["triple"] == ["man", "feeding", "horse"]
    assert negs["exchange"]["triple"] == ["horse", "riding", "man"]
    assert negs["attribute"]["attributes"] == ["brown", "tall"]
    assert one["relcomp"]["negative_image"] == "exchange" and one["relcomp"]["negative_image_id"] == 4
    assert s1["neg.jpg"] == (tmp_path / "VG_100K" / "4.jpg").read_bytes()
    assert m["predicate_rule"].get("unseen with the pair", 0) >= 1
    # symmetric predicates are never exchanged; plural names take no article
    five = got[5][0]
    assert "exchange" not in {n["kind"] for n in five["relcomp"]["negatives"]}
    assert "White clouds next to a" in five["caption"] or "of white clouds next to a" in five["caption"]
    # "car parked next to car": symmetric and one name: only attribute negatives, none naming an owned colour
    six = got[6][0]
    assert [n["kind"] for n in six["relcomp"]["negatives"]] == ["attribute"]
    assert six["relcomp"]["negatives"][0]["attributes"] != ["blue", "red"]     # the car 53 is red, 54 blue


def test_the_probe_r_and_probe_c_releases_exclude_their_images(tmp_path):
    """Probe-R's relation_eval_*.json (VG ids as keys and in its image lists) and Probe-C's pairs (COCO ids)."""
    probe_r = tmp_path / "relation_eval_subject.json"
    probe_r.write_text(json.dumps({"11": {"positive_image_ids": [12, 13], "negative_image_ids": ["14"],
                                          "positive_prompt": "a dog on a mat"}}))
    probe_c = tmp_path / "data_object_switch.json"
    probe_c.write_text(json.dumps([{"img1_id": "391895", "img2_id": 522418, "img1_prompt": "a red car"}]))
    got = relcomp_vg.exclusion_ids([probe_r, probe_c])
    assert got["vg"] == {11, 12, 13, 14} and got["coco"] == {391895, 522418} and got["unparsed"] == 0
