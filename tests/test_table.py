"""``negft table`` (the table papers print) and ``negft compare`` (a paired comparison of two evaluations): the
cells are the results files' numbers (Markdown to its printed digits, CSV exactly), compare's B − A is the files'
difference and its p the paired test's (``negft.probes.stats.paired_p_values``) on the per-example values eval.py
keeps beside its results.json; an unknown key exits 2 naming the nearest."""
import csv
import json
import re

import numpy as np
import pytest

from negft import results
from negft.commands import cli
from negft.probes import direction
from negft.probes.stats import bootstrap_ci, paired_p_values
from negft.tables import PAPER_COLUMNS

N_BOOT = 200
# metrics that exist today, real dataset names: (key, per-example values of A, of B)
RNG = np.random.default_rng(0)
VALUES = {
    "aro_vg_relation/vg/acc_macro": (RNG.random(40), RNG.random(40)),
    "aro_vg_relation/vg/acc_official": ((RNG.random(40) < 0.5) * 1.0, (RNG.random(40) < 0.6) * 1.0),
    "aro_coco_order/coco/acc_official": ((RNG.random(50) < 0.3) * 1.0, (RNG.random(50) < 0.35) * 1.0),
    "sugarcrepe/sugarcrepe/replace_macro_official": (RNG.random(30), RNG.random(30)),
    "sugarcrepe/sugarcrepe/swap_macro_official": (RNG.random(30), RNG.random(30)),
    "sugarcrepe/sugarcrepe/add_macro_official": (RNG.random(30), RNG.random(30)),
    "mcq_neg/coco/acc_official": ((RNG.random(60) < 0.2) * 1.0, (RNG.random(60) < 0.9) * 1.0),   # B far better
    "retrieval_neg/coco/r5_official": ((RNG.random(45) < 0.4) * 1.0, (RNG.random(45) < 0.4) * 1.0),
    "zeroshot/imagenet/top1_official": ((RNG.random(70) < 0.5) * 1.0, (RNG.random(70) < 0.5) * 1.0),
    "geometry/imagenet/negated_affirmed_cos": (RNG.random(20), RNG.random(20) + 0.5),   # better lower: B worse
}
EXPECTED_HEADERS = ["ARO VG-R", "ARO COCO-Order", "SugarCrepe replace", "SugarCrepe swap", "SugarCrepe add",
                    "NegBench MCQ", "NegBench Retrieval-Neg R@5", "ImageNet top-1"]


def _write(folder, ckpt, values, keep_values=True, world=False):
    """A results.json as eval.py writes it (metrics, ci95 from the per-example values), with examples/values.npz."""
    if world:
        values = {k.split("/")[0] + "/world/" + k.split("/", 2)[2]: v for k, v in values.items()}
    payload = {"ckpt": ckpt, "metrics": {k: float(np.mean(v)) for k, v in values.items()},
               "ci95": {k: list(bootstrap_ci(v, N_BOOT)) for k, v in values.items()}, "skipped": {}}
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    if keep_values:
        results.write_values(folder / results.VALUES_FILE, values)
    return folder / "results.json"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    return {"a": _write(root / "a", "runs/a/checkpoints/epoch_0", {k: a for k, (a, _) in VALUES.items()}),
            "b": _write(root / "b", "runs/b/checkpoints/epoch_3", {k: b for k, (_, b) in VALUES.items()}),
            "bare": _write(root / "c", "runs/c/checkpoints/epoch_3", {k: b for k, (_, b) in VALUES.items()},
                           keep_values=False),
            "world": _write(root / "w", "runs/w/checkpoints/epoch_1", {k: b for k, (_, b) in VALUES.items()},
                            world=True)}


def _markdown_rows(text):
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in text.splitlines() if line.startswith("|")]
    return rows[0], rows[2:]


CELL = re.compile(r"(-?\d+\.\d+)(?: \[(-?\d+\.\d+), (-?\d+\.\d+)\])?\Z")


def test_every_column_is_a_metric_its_probe_declares():
    """A column's key under either rule is one its benchmark's probe reports (a renamed metric fails here, not as
    a silently empty column)."""
    from negft.probes import declared
    from negft.tables import PAPER_COLUMNS, RULES
    for column in PAPER_COLUMNS:
        for rule in RULES:
            assert declared(column.metric(rule)), (column.header, column.metric(rule))


def test_the_table_cells_are_the_results_numbers(files, tmp_path, capsys):
    out = tmp_path / "table"
    assert cli.main(["table", str(files["a"]), str(files["b"].parent), f"out={out}", "ci=true", "digits=4"]) == 0
    printed = capsys.readouterr().out
    headers, rows = _markdown_rows((out / "table.md").read_text())
    assert (out / "table.md").read_text() in printed
    assert headers == ["model", *EXPECTED_HEADERS]      # columns of absent families (VALSE, ...) left out
    columns = {c.header: c for c in PAPER_COLUMNS}
    with open(out / "table.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["model"] for r in table] == [r[0] for r in rows] == ["runs/a/checkpoints/epoch_0",
                                                                  "runs/b/checkpoints/epoch_3"]
    for path, md_row, csv_row in zip((files["a"], files["b"]), rows, table):
        written = json.loads(path.read_text())
        for header, text in zip(headers[1:], md_row[1:]):
            key = columns[header].metric("official")
            value, (lo, hi) = written["metrics"][key], written["ci95"][key]
            got = [float(x) for x in CELL.match(text).groups()]
            assert got == pytest.approx([value, lo, hi], abs=0.5e-4 + 1e-12), (header, text)
            assert (float(csv_row[header]), float(csv_row[f"{header}_lo"]), float(csv_row[f"{header}_hi"])) == (
                value, lo, hi)


def test_rule_names_and_a_world_evaluation(files, capsys):
    assert cli.main(["table", str(files["a"]), str(files["world"]), "rule=negft", "names=base,tuned"]) == 0
    headers, rows = _markdown_rows(capsys.readouterr().out)
    # negft's rule: the only negft-rule key written; the world's number in a column of its own, named by its key
    assert headers == ["model", "ARO VG-R", "aro_vg_relation/world/acc_macro"]
    a = json.loads(files["a"].read_text())["metrics"]["aro_vg_relation/vg/acc_macro"]
    w = json.loads(files["world"].read_text())["metrics"]["aro_vg_relation/world/acc_macro"]
    assert rows == [["base", f"{a:.3f}", "–"], ["tuned", "–", f"{w:.3f}"]]
    assert cli.main(["table", str(files["a"]), "names=x,y"]) == 2
    assert "names= gives 2 names for 1 results files" in capsys.readouterr().err


def test_compare_gives_b_minus_a_and_the_paired_test(files, tmp_path, capsys):
    out = tmp_path / "compare"
    assert cli.main(["compare", str(files["a"]), str(files["b"]), f"out={out}", f"bootstrap={N_BOOT}"]) == 0
    printed = capsys.readouterr().out
    a, b = (json.loads(files[x].read_text())["metrics"] for x in "ab")
    p = paired_p_values({k: v[0] for k, v in VALUES.items()}, {k: v[1] for k, v in VALUES.items()}, N_BOOT)
    rows = json.loads((out / "compare.json").read_text())["rows"]
    assert [r["metric"] for r in rows] == sorted(VALUES)
    with open(out / "compare.csv", newline="") as f:
        table = {r["metric"]: r for r in csv.DictReader(f)}
    for r in rows:
        k = r["metric"]
        assert (r["a"], r["b"], r["delta"], r["p"]) == (a[k], b[k], b[k] - a[k], p[k])
        assert (float(table[k]["delta"]), float(table[k]["p"])) == (b[k] - a[k], p[k])
        assert r["better"] == direction(k) * int(np.sign(b[k] - a[k]))
    lines = {line.split(" | ")[0].lstrip("| ").split(" ")[0]: line for line in printed.splitlines()}
    mcq = lines["mcq_neg/coco/acc_official"]
    assert p["mcq_neg/coco/acc_official"] < 0.05 and f"{b['mcq_neg/coco/acc_official'] - a['mcq_neg/coco/acc_official']:+.3f} \\*" in mcq
    assert mcq.endswith("| better |")
    cos = "geometry/imagenet/negated_affirmed_cos"                                  # up, better lower
    assert lines[cos].endswith("| worse |" if p[cos] < 0.05 else "| no significant change |")
    assert all(r["significant"] == (p[r["metric"]] < 0.05) for r in rows)


def test_compare_calls_a_change_better_only_where_the_test_finds_it_and_never_prints_p_0():
    from negft.tables import compare_table, p_text
    assert (p_text(0.0, 1000), p_text(0.0004, 1000), p_text(0.546, 1000), p_text(None)) == ("<0.002", "0.0004",
                                                                                            "0.546", "–")
    rows = [{"metric": "mcq_neg/world/acc", "a": 0.5, "b": 0.52, "delta": 0.02, "p": 0.546, "better": 1},
            {"metric": "retrieval/world/r5", "a": 0.5, "b": 0.7, "delta": 0.2, "p": 0.0, "better": 1},
            {"metric": "zeroshot/world/top1", "a": 0.5, "b": 0.4, "delta": -0.1, "p": None, "better": -1}]
    cells = [line.split(" | ")[-2:] for line in compare_table(rows, "a", "b", n_boot=1000)[2:5]]
    assert cells == [["0.546", "no significant change |"], ["<0.002", "better |"], ["–", "worse? (untested) |"]]


def test_compare_without_per_example_values_says_so(files, capsys):
    assert cli.main(["compare", str(files["a"]), f"b={files['bare']}"]) == 0
    out = capsys.readouterr().out
    assert "No per-example values for runs/c/checkpoints/epoch_3" in out
    a, b = (json.loads(files[x].read_text())["metrics"] for x in ("a", "bare"))
    _, rows = _markdown_rows(out)
    assert [r[3] for r in rows] == [f"{b[k] - a[k]:+.3f}" for k in sorted(VALUES)] and {r[4] for r in rows} == {"–"}
    assert cli.main(["compare", str(files["a"]), str(files["a"].parent)]) == 0     # A against itself: p = 1
    _, rows = _markdown_rows(capsys.readouterr().out)
    assert {tuple(r[3:]) for r in rows} == {("+0.000", "1", "=")}


@pytest.mark.parametrize("argv, near", [
    (["table", "a/results.json", "nmes=x"], "names"),
    (["table", "a/results.json", "rul=negft"], "rule"),
    (["compare", "a", "b", "bootstrp=10"], "bootstrap"),
])
def test_an_unknown_key_exits_2_naming_the_nearest(capsys, argv, near):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"unknown key '{argv[-1].split('=')[0]}'. Did you mean: " in err and near in err.split("Did you mean:")[1]


def test_a_missing_or_foreign_results_file_exits_2(tmp_path, capsys):
    (tmp_path / "x.json").write_text('{"epoch": 1}')
    assert cli.main(["table", str(tmp_path / "none.json")]) == 2
    assert "no results file at" in capsys.readouterr().err
    assert cli.main(["compare", str(tmp_path / "x.json"), str(tmp_path / "x.json")]) == 2
    assert "not an evaluation's results.json" in capsys.readouterr().err


def test_eval_keeps_the_values_compare_reproduces_its_paired_test_from(tmp_path, cache, capsys):
    """Two checkpoints evaluated on the tiny world: compare's p over their results.json is eval.py base='s."""
    import torch

    from negft import models
    from negft.commands.eval import EvalKeys, evaluate_checkpoint
    ckpts = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        b = models.build("negft-tiny", "")
        ckpts.append(tmp_path / f"m{seed}")
        models.save(b.model, ckpts[-1], b.model_cfg, b.preprocess_cfg)
    common = dict(suite="mcq_neg,zeroshot", data="world", batch_size=64, bootstrap=50,
                  world_dir=str(cache / "world-s0-tiny"))
    evaluate_checkpoint(EvalKeys(ckpt=str(ckpts[0]), out=str(tmp_path / "a"), **common))
    evaluate_checkpoint(EvalKeys(ckpt=str(ckpts[1]), out=str(tmp_path / "b"), base=str(ckpts[0]), **common))
    capsys.readouterr()
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "bootstrap=50", f"out={tmp_path / 'c'}"]) == 0
    rows = json.loads((tmp_path / "c" / "compare.json").read_text())["rows"]
    written = json.loads((tmp_path / "b" / "results.json").read_text())
    assert written["paired_p"] and {r["metric"]: r["p"] for r in rows if r["p"] is not None} == written["paired_p"]
    assert all(r["delta"] == written["metrics"][r["metric"]] - written["base_metrics"][r["metric"]] for r in rows)
    capsys.readouterr()
    assert cli.main(["table", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    headers, _ = _markdown_rows(capsys.readouterr().out)
    # the world's mcq_neg and zeroshot, named by their keys: not NegBench's MCQ nor ImageNet
    assert headers == ["model", "mcq_neg/world/acc_official", "zeroshot/world/top1_official"]
