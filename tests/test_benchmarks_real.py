"""Every benchmark family read through its real manifest (data=real), on the world's files laid out as each
benchmark's authors released them: nothing is skipped but what this machine cannot build, and every metric
a probe emits for real data is one its probe declares (the names README's metric table shows)."""
import pytest

from negft.data import manifests
from negft.probes import valse, vl_checklist
from negft.world.formats import valse as valse_world, vl_checklist as vl_checklist_world
from negft.world.formats.tree import link_released_tree


# what this machine cannot build (no part-of-speech tagger installs offline), files the world does not write
# (VLU's adjective list and concreteness ratings, VALSE's pieces it cannot draw), ARO's macro average, which needs
# 25 rows per pair, What's Up's set accuracy, which needs an object pair in four relations (no world image has
# one object on another), and the VL-CheckList files the world has nothing for (actions, materials, ...)
EXPECTED_SKIPS = ("spaCy", "shape_association_adj", "Concreteness_ratings", "no group to average", "no complete set",
                  *(f"valse/data/{p}.json" for p in valse.PIECES if p not in valse_world.PIECES),
                  *(f for f, _ in vl_checklist.FILES.values() if f not in vl_checklist_world.WRITTEN))


def test_linking_a_released_tree_leaves_the_worlds_split_as_it_was(cache, tmp_path):
    """The data root's links point into the split and never write into it: a folder the manifest names under one of
    the split's linked entries (VALSE's data/...) made a link from the split into itself, a loop every copy follows."""
    split = cache / "world-s0-tiny" / "val"

    def tree():
        return sorted(str(p.relative_to(split)) for p in split.rglob("*"))

    before = tree()
    link_released_tree(split, tmp_path / "data")
    assert tree() == before
    assert not [p for p in split.rglob("*") if p.is_symlink() and p.resolve() in (split, *split.parents)]


@pytest.fixture(scope="module")
def real_eval(cache, tmp_path_factory):
    from negft import models
    from negft.evaluation import datasets_for, run_suite
    data = tmp_path_factory.mktemp("data")
    link_released_tree(cache / "world-s0-tiny" / "val", data)
    mp = pytest.MonkeyPatch()
    mp.setenv("NEGFT_DATA", str(data))
    # ImageNet's 1,000 names × 80 templates cost a minute of text encoding here: the world's 12 classes stand
    # in for the first 12 wnids (the reader, wnid order and templates are the real ones)
    import json
    from negft.probes import zeroshot
    world_classes = json.loads((cache / "world-s0-tiny" / "val" / "classes.json").read_text())
    mp.setattr(zeroshot, "_imagenet_names", lambda: list(world_classes))
    bundle = models.build("negft-tiny", "")
    datasets, covered = [], set()       # NegBench's eleven sets share their readers: those that add a probe
    for d in datasets_for(None):
        if not d.manifest.startswith("negbench_") or not set(d.probes) <= covered:
            datasets.append(d)
            covered |= set(d.probes)
    result = run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer, datasets, "all", n_boot=20)
    mp.undo()
    return result


def test_every_family_runs_on_released_layouts(real_eval):
    from negft import probes
    skipped = {k: v for k, v in real_eval.skipped.items() if not any(e in v for e in EXPECTED_SKIPS)}
    assert not skipped, skipped
    families = {k.split("/")[0] for k in real_eval.metrics}
    for name in probes.PROBES:
        assert any(f == name or f.startswith(name + "_") for f in families), name
    # every family also under the benchmark's official rule where it has one
    assert {"mcq_neg", "aro_vg_relation", "sugarcrepe", "winoground", "zeroshot", "snare_negation", "probe_c",
            "valse", "ccneg"} <= \
        {k.split("/")[0] for k in real_eval.metrics if k.endswith("_official")}


def test_the_registry_declares_every_metric_a_probe_emits(real_eval):
    """Each emitted name matches a name its probe declares for its family (register(metrics=...)), the source of
    README's metric table (tests/test_registry.py compares the table with the registry)."""
    from negft import probes
    for key in real_eval.metrics:
        family = key.split("/", 1)[0]
        assert probes.owner(family), f"{key}: no probe reports family {family}"
        assert family in probes.METRICS[probes.owner(family)], f"{key}: {family} is not in its probe's metrics="
        assert probes.declared(key), f"{key}: no name in {probes.owner(family)}'s metrics= matches"


def test_eval_on_an_empty_data_root_skips_every_dataset_with_its_path(tmp_path):
    import json
    from negft import models
    from conftest import run_here
    bundle = models.build("negft-tiny", "")
    ckpt = models.save(bundle.model, tmp_path / "ckpt", bundle.model_cfg, bundle.preprocess_cfg)
    data = tmp_path / "empty"
    # every family but geometry, which reads only ImageNet's class names (open_clip ships them: it needs no file,
    # and encoding 24,000 captions would take this test a minute)
    from negft import probes
    suite = ",".join(p for p in probes.PROBES if p != "geometry")
    proc = run_here(["eval.py", f"ckpt={ckpt}", f"suite={suite}", "data=real", f"out={tmp_path / 'out'}"],
                    env={"NEGFT_DATA": str(data)})
    # nothing scored: exit 1, the console naming why; results.json still says what was skipped
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "negft: error: nothing was scored" in proc.stderr and "negft data check all" in proc.stderr
    assert f"not found under $NEGFT_DATA ({data})" in proc.stdout
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert not result["metrics"]
    # its provenance: negft's version, the commit, the version of each probe behind a key (here every skip)
    import negft
    assert result["provenance"]["negft_version"] == negft.__version__ and "git_commit" in result["provenance"]
    assert result["provenance"]["probe_versions"] == {p: probes.VERSIONS[p] for p in suite.split(",")}
    assert "Provenance: negft " in (tmp_path / "out" / "results.md").read_text()
    for name in manifests.names():
        man = manifests.load(name)
        if man.get("probes"):
            assert any(f"data_manifests/{name}.yaml" in v and str(data / man["root"]) in v
                       for v in result["skipped"].values()), name


def _own(path):
    """Replace a link of the released tree by a copy of what it points to, to change it."""
    target = path.resolve()
    path.unlink()
    if target.is_dir():
        import shutil
        shutil.copytree(target, path)
    else:
        path.write_bytes(target.read_bytes())
    return path


def test_partial_and_malformed_released_files_skip_with_their_reasons_and_the_others_run(cache, tmp_path,
                                                                                         monkeypatch):
    """Released files partial or malformed: a CSV cut mid-row, a JSON with bad rows, a JSON cut short, an image
    folder gone and a reader that fails outright: each skips its rows or its probe with the reason; every other
    probe runs."""
    import json
    from negft import models, probes
    from negft.evaluation import datasets_for, run_suite
    data = tmp_path / "data"
    link_released_tree(cache / "world-s0-tiny" / "val", data)
    monkeypatch.setenv("NEGFT_DATA", str(data))
    mcq = _own(data / "negbench" / "images" / "COCO_val_mcq.csv")
    text = mcq.read_bytes()
    mcq.write_bytes(text[:text.index(b"\n", len(text) // 2) + 40])           # 40 bytes into a row
    vg = _own(data / "aro" / "visual_genome_relation.json")
    rows = json.loads(vg.read_text())
    rows[0], rows[1]["relation_name"] = {"image_id": 1}, 7
    vg.write_text(json.dumps(rows))
    add_obj = _own(data / "sugarcrepe" / "add_obj.json")
    add_obj.write_bytes(add_obj.read_bytes()[:100])
    (data / "relcomp" / "test" / "images").unlink()
    from negft.probes import zeroshot        # the world's 12 classes for ImageNet's first wnids (real_eval's note)
    world_classes = json.loads((cache / "world-s0-tiny" / "val" / "classes.json").read_text())
    monkeypatch.setattr(zeroshot, "_imagenet_names", lambda: list(world_classes))

    def fails(ctx, dataset):
        raise IndexError("a reader's bug or a file it did not expect")
    monkeypatch.setitem(probes.PROBES, "winoground", fails)
    wanted = ("negbench_coco", "aro_vg_relation", "sugarcrepe", "relcomp", "winoground", "imagenetv2")
    datasets = [d for d in datasets_for(None) if d.manifest in wanted]
    bundle = models.build("negft-tiny", "")
    result = run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer, datasets, "all", n_boot=5)
    skipped = result.skipped
    assert "cut short" in skipped["mcq_neg/coco/rows"] and "mcq_neg/coco/acc" in result.metrics
    assert "2 of " in skipped["aro_vg_relation/vg/rows"] and "aro_vg_relation/vg/acc" in result.metrics
    assert "unreadable JSON" in skipped["sugarcrepe/sugarcrepe/add_obj"]
    assert "sugarcrepe/sugarcrepe/add_att" in result.metrics
    assert "image file not found" in skipped["relcomp/relcomp/rows"] and "relcomp/relcomp" in skipped
    assert "IndexError" in skipped["winoground/winoground"] and "data_manifests/winoground.yaml" in skipped[
        "winoground/winoground"]
    assert "zeroshot/imagenetv2/top1" in result.metrics and "retrieval/coco/r5" in result.metrics
    # on the world's own split a failing probe is a bug: it is raised, not skipped
    with pytest.raises(IndexError):
        run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer, datasets_for(cache / "world-s0-tiny" / "val"),
                 "winoground", n_boot=5)
