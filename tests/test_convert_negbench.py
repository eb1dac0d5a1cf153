"""NegBench's CC12M-NegCap / NegMCQ CSVs and img2dataset downloads → shards: counts, skips by reason,
samples equal to their rows, loadable by the training stream, column errors and overrides, the CLI."""
import ast
import csv
import json
from pathlib import Path

import pytest

from negft import models
from negft.commands.cli import main as cli
from negft.data import schema
from negft.convert import img2dataset as i2d
from negft.convert import negbench as nb
from negft.world.formats import img2dataset as i2d_example
from negft.world.formats import negbench_csv
from negft.data.pipeline import Stream, StreamSpec, loader

from conftest import read_shards


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _counts(manifest) -> dict:
    return {"good": manifest["counts"]["samples"], "skipped": manifest["skipped"]}


def _stream(out, task, field, batch_size=4):
    b = models.build("negft-tiny", "")
    shards = [str(p) for p in sorted(Path(out).glob("shard-*.tar"))]
    stream = Stream(StreamSpec(shards, task, field, batch_size), b.preprocess_val, b.tokenizer, seed=0,
                    shuffle_buffer=1)
    return list(loader(stream, workers=0))


def test_negcap_counts_skips_and_samples_equal_their_rows(tmp_path):
    ex = negbench_csv.write_negcap_example(tmp_path / "src", 24)
    m = nb.convert_negcap(ex["csv"], ex["images"], tmp_path / "out", maxcount="10")
    assert _counts(m) == {"good": ex["good"] + ex["kept_without_negcap"], "skipped": ex["skipped"]}
    assert m["kept_without_negcap"] == ex["kept_without_negcap"] == 1 and m["fields"]["negcap"] == ex["good"]
    assert m["counts"]["shards"] == 3 and m["layout_source"].startswith(nb.REPO)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]["samples"] == 25
    samples = read_shards(tmp_path / "out")
    assert len(samples) == 25
    row = _rows(ex["csv"])[0]
    got = samples[Path(row["filepath"]).stem]
    meta = json.loads(got["json"])
    assert meta["caption"] == row["caption"]
    assert meta["negcap"] == ast.literal_eval(row["negative_captions"])
    assert meta["objects"] == {"positive": ast.literal_eval(row["extracted_objects"]),
                               "negative": ast.literal_eval(row["negative_objects"])}
    assert got["jpg"] == (Path(ex["images"]) / row["filepath"]).read_bytes()      # bytes copied, not re-encoded


def test_negcap_row_without_negated_captions_keeps_its_caption_and_objects(tmp_path):
    """generate_negative_captions.py writes negative_captions = '[]' when the LLM gave nothing and keeps the row:
    its caption and objects make a sample without negcap (counted in the summary); the caption stream reads it,
    the NegCap stream passes over it, neither counts a fault. Merged with NegMCQ, it is still a NegCap sample."""
    ex = negbench_csv.write_negcap_example(tmp_path / "src", 6, bad=False)
    rows = _rows(ex["csv"])
    rows[2]["negative_captions"] = str([])
    negbench_csv.write_csv(Path(ex["csv"]), schema.NEGCAP_CSV_COLUMNS, rows)
    mcq = negbench_csv.write_mcq_example(tmp_path / "src", 6, bad=False, start=2)        # images 2..7; NegCap 0..5
    m = nb.convert_negcap(ex["csv"], ex["images"], tmp_path / "out", mcq=mcq["csv"])
    assert _counts(m) == {"good": 8, "skipped": {}} and m["kept_without_negcap"] == 1
    assert m["fields"]["negcap"] == 5 and m["fields"]["caption"] == 6
    assert m["merged"] == {"negcap_and_mcq": 4, "negcap_only": 2, "mcq_only": 2}
    meta = json.loads(read_shards(tmp_path / "out")[Path(rows[2]["filepath"]).stem]["json"])
    assert "negcap" not in meta and meta["caption"] == rows[2]["caption"] and "mcq" in meta
    assert meta["objects"] == {"positive": ast.literal_eval(rows[2]["extracted_objects"]),
                               "negative": ast.literal_eval(rows[2]["negative_objects"])}
    for field, n in (("negcap", 5), ("caption", 6)):
        batches = _stream(tmp_path / "out", "contrastive", field, batch_size=n)
        assert [len(b["images"]) for b in batches if "images" in b] == [n], field
        assert sum(int(b["skipped"]) for b in batches) == 0, field


def test_mcq_counts_skips_templates_and_samples(tmp_path):
    ex = negbench_csv.write_mcq_example(tmp_path / "src", 24)
    m = nb.convert_mcq(ex["csv"], ex["images"], tmp_path / "out")
    assert _counts(m) == {"good": ex["good"], "skipped": ex["skipped"]}
    assert m["answer_templates"] == ex["templates"] and ex["templates"]["modified_positive"] > 0
    samples = read_shards(tmp_path / "out")
    for row in _rows(ex["csv"])[:6]:
        key = Path(row["image_path"]).stem
        if key not in samples:
            continue
        mcq = json.loads(samples[key]["json"])["mcq"]
        assert mcq["options"] == [row[f"caption_{k}"] for k in range(4)]
        assert mcq["answer"] == int(row["correct_answer"])
        assert mcq["answer_template"] == nb.TEMPLATES[row["correct_answer_template"]]
        assert mcq.get("released_template", mcq["answer_template"]) == row["correct_answer_template"]


def test_png_stays_png_and_absolute_paths_with_prefix(tmp_path):
    ex = negbench_csv.write_negcap_example(tmp_path / "src", 6, bad=False)
    rows = _rows(ex["csv"])
    png = Path(ex["images"]) / "00000" / "000000003.png"
    from negft.world.generator import train_sample
    png.write_bytes(train_sample("finetune", 0, 3, held_out=set())[0])
    rows[3]["filepath"] = "00000/000000003.png"
    for r in rows:                     # the authors' absolute cluster paths
        r["filepath"] = "/data/healthy-ml/cc12m/" + r["filepath"]
    negbench_csv.write_csv(Path(ex["csv"]), schema.NEGCAP_CSV_COLUMNS, rows)
    m = nb.convert_negcap(ex["csv"], ex["images"], tmp_path / "out", prefix="/data/healthy-ml/cc12m/")
    assert _counts(m) == {"good": 6, "skipped": {}}
    assert read_shards(tmp_path / "out")["000000003"]["png"] == png.read_bytes()
    m = nb.convert_negcap(ex["csv"], ex["images"], tmp_path / "out2")      # without prefix: none found
    assert _counts(m) == {"good": 0, "skipped": {nb.MISSING_IMAGE: 6}}


def test_negcap_with_mcq_merges_one_sample_per_image(tmp_path):
    cap = negbench_csv.write_negcap_example(tmp_path / "src", 12, bad=False)
    mcq = negbench_csv.write_mcq_example(tmp_path / "src", 12, bad=False, start=4)       # images 4..15; NegCap 0..11
    m = nb.convert_negcap(cap["csv"], cap["images"], tmp_path / "out", mcq=mcq["csv"])
    assert m["counts"]["samples"] == 16 and m["skipped"] == {}
    assert m["merged"] == {"negcap_and_mcq": 8, "negcap_only": 4, "mcq_only": 4}
    samples = read_shards(tmp_path / "out")
    both = json.loads(samples["000000005"]["json"])
    row = next(r for r in _rows(mcq["csv"]) if r["image_path"].endswith("000000005.jpg"))
    assert both["mcq"]["options"] == [row[f"caption_{k}"] for k in range(4)] and both["negcap"]
    assert set(json.loads(samples["000000014"]["json"])) == {"mcq", "source"}


def test_shards_load_through_the_training_stream(tmp_path):
    cap = negbench_csv.write_negcap_example(tmp_path / "src", 8, bad=False)
    mcq = negbench_csv.write_mcq_example(tmp_path / "src", 8, bad=False)
    nb.convert_negcap(cap["csv"], cap["images"], tmp_path / "out", mcq=mcq["csv"])
    for task, field in (("contrastive", "negcap"), ("mcq", "mcq"), ("contrastive", "caption")):
        batches = _stream(tmp_path / "out", task, field)
        full = [b for b in batches if "images" in b]
        assert len(full) == 2 and sum(int(b["skipped"]) for b in batches) == 0, field
        if task == "mcq":
            assert full[0]["options"].shape[:2] == (4, 4) and full[0]["answers"].shape == (4,)


def test_missing_column_names_the_file_columns_and_override_works(tmp_path):
    ex = negbench_csv.write_negcap_example(tmp_path / "src", 5, bad=False)
    rows = [{("text" if k == "caption" else "image" if k == "filepath" else k): v for k, v in r.items()}
            for r in _rows(ex["csv"])]
    renamed = tmp_path / "renamed.csv"
    negbench_csv.write_csv(renamed, list(rows[0]), rows)
    with pytest.raises(ValueError, match=r"no column 'filepath' \(pass img_key=COLUMN.*columns: image, text, "
                                         r"extracted_objects"):
        nb.convert_negcap(renamed, ex["images"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    m = nb.convert_negcap(renamed, ex["images"], tmp_path / "out", img_key="image", caption_key="text")
    assert _counts(m) == {"good": 5, "skipped": {}}
    # a tab-separated copy reads with sep=tab
    tsv = tmp_path / "rows.tsv"
    with open(tsv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(schema.NEGCAP_CSV_COLUMNS), delimiter="\t")
        w.writeheader()
        w.writerows(_rows(ex["csv"]))
    with pytest.raises(ValueError, match="sep=tab"):
        nb.convert_negcap(tsv, ex["images"], tmp_path / "out3")
    assert nb.convert_negcap(tsv, ex["images"], tmp_path / "out3", sep="tab")["counts"]["samples"] == 5


def test_mcq_column_override(tmp_path):
    ex = negbench_csv.write_mcq_example(tmp_path / "src", 5, bad=False)
    rows = [{("img" if k == "image_path" else "label" if k == "correct_answer" else k): v for k, v in r.items()}
            for r in _rows(ex["csv"])]
    path = tmp_path / "mcq.csv"
    negbench_csv.write_csv(path, list(rows[0]), rows)
    with pytest.raises(ValueError, match="no column 'image_path'.*correct_answer_template, img$"):
        nb.convert_mcq(path, ex["images"], tmp_path / "out")
    m = nb.convert_mcq(path, ex["images"], tmp_path / "out", img_key="img", answer_key="label")
    assert _counts(m) == {"good": 5, "skipped": {}}


@pytest.mark.parametrize("output_format", ["webdataset", "files"])
def test_img2dataset_join_counts(tmp_path, output_format):
    ex = i2d_example.write_img2dataset_example(tmp_path / "src", 30, output_format=output_format)
    for name, kwargs in (("negcap", {}), ("mcq", {}), ("negcap+mcq", {"mcq": ex["mcq"]})):
        annotations = ex["mcq"] if name == "mcq" else ex["negcap"]
        m = i2d.convert(ex["folder"], annotations, tmp_path / f"out-{name}", **kwargs)
        got = {**_counts(m), "annotations_without_image": m["annotations_without_image"],
               "images_without_annotation": m["images_without_annotation"]}
        assert got == ex["expected"][name], name
    assert m["join"] == {"negcap negcap.csv": "url", "mcq mcq.csv": "key"}
    # the same images joined by key (the image path's stem) instead of URL
    m = i2d.convert(ex["folder"], ex["negcap"], tmp_path / "out-key", join="key")
    assert _counts(m) == {k: ex["expected"]["negcap"][k] for k in ("good", "skipped")}
    # a sample equals its img2dataset image and its CSV row
    samples = read_shards(tmp_path / "out-negcap+mcq")
    row = _rows(ex["negcap"])[3]
    key = Path(row["filepath"]).stem
    meta = json.loads(samples[key]["json"])
    assert meta["negcap"] == ast.literal_eval(row["negative_captions"]) and meta["source"]["url"] == row["url"]
    assert meta["mcq"]["answer"] == int(_rows(ex["mcq"])[3]["correct_answer"])
    if output_format == "files":
        image = next(Path(ex["folder"]).glob(f"*/{key}.jpg")).read_bytes()
        assert samples[key]["jpg"] == image


def test_img2dataset_join_url_needs_a_url_column(tmp_path):
    ex = i2d_example.write_img2dataset_example(tmp_path / "src", 4, bad=False)
    with pytest.raises(ValueError, match="no column 'url' .*url_key=COLUMN"):
        i2d.convert(ex["folder"], ex["mcq"], tmp_path / "out", join="url")
    assert not (tmp_path / "out").exists()


def test_cli_converts_once_and_refuses_to_overwrite(tmp_path, capsys):
    ex = negbench_csv.write_negcap_example(tmp_path / "src", 6)
    out = tmp_path / "out"
    assert cli(["data", "convert", "negbench-negcap", ex["csv"], ex["images"], f"out={out}"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["counts"]["samples"] == 6 + ex["kept_without_negcap"] and summary["skipped"] == ex["skipped"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"].startswith("negft data convert negbench-negcap ")
    assert cli(["data", "convert", "negbench-negcap", ex["csv"], ex["images"], f"out={out}"]) == 2
    mcq = negbench_csv.write_mcq_example(tmp_path / "src", 6)
    assert cli(["data", "convert", "negbench-mcq", mcq["csv"], mcq["images"], f"out={tmp_path / 'm'}"]) == 0
    i2 = i2d_example.write_img2dataset_example(tmp_path / "i2d", 6, bad=False)
    assert cli(["data", "convert", "img2dataset", i2["folder"], i2["negcap"], f"out={tmp_path / 'i'}",
                f"mcq={i2['mcq']}"]) == 0
    assert cli(["data", "convert", "negbench-negcap", ex["csv"], ex["images"], f"out={tmp_path / 'x'}",
                "caption_key=nope"]) == 2


def test_mcq_parts_by_glob_and_a_short_row(tmp_path):
    """The release's MCQ comes as one file per paraphrase job; a truncated row is skipped, not fatal."""
    ex = negbench_csv.write_mcq_example(tmp_path / "src", 10, bad=False)
    rows = _rows(ex["csv"])
    for part, chunk in (("0_6", rows[:6]), ("6_10", rows[6:])):
        negbench_csv.write_csv(tmp_path / f"cc12m_mcq_captions_llama3.1_rephrased_{part}.csv", schema.MCQ_CSV_COLUMNS,
                               chunk)
    with open(tmp_path / "cc12m_mcq_captions_llama3.1_rephrased_6_10.csv", "a") as f:
        f.write("2,This image features a cat.\n")
    m = nb.convert_mcq(tmp_path / "cc12m_mcq_captions_llama3.1_rephrased_*.csv", ex["images"], tmp_path / "out")
    assert _counts(m) == {"good": 10, "skipped": {nb.MISSING_FIELD: 1}}
    assert m["skipped_examples"][nb.MISSING_FIELD] == ["cc12m_mcq_captions_llama3.1_rephrased_6_10.csv line 6"]


def test_img2dataset_keeps_a_negcap_row_without_negative_captions_and_counts_it(tmp_path):
    """NegBench's generator writes negative_captions [] when the LLM gave nothing: the image, its caption and
    objects are still a sample (for the caption stream), counted under kept_without_negcap."""
    ex = i2d_example.write_img2dataset_example(tmp_path / "src", 4, bad=False)
    rows = _rows(ex["negcap"])
    rows[1]["negative_captions"] = "[]"
    with open(ex["negcap"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    m = i2d.convert(ex["folder"], ex["negcap"], tmp_path / "out")
    assert m["kept_without_negcap"] == 1 and _counts(m) == {"good": 4, "skipped": {}}
    meta = json.loads(read_shards(tmp_path / "out")[Path(rows[1]["filepath"]).stem]["json"])
    assert "negcap" not in meta and meta["caption"] == rows[1]["caption"]
    assert meta["objects"]["positive"] == ast.literal_eval(rows[1]["extracted_objects"])
