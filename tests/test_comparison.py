"""experiments/comparison.py's protocol: the declared grid and budget, α at a drift budget along a sweep, the
rule's ranking, and the blocks' paired gains (the runs themselves are an experiment, not a test)."""
import numpy as np
import pytest

from experiments import comparison, frontier


def summary(name, val, val_drift=(0.0, 0.0)):
    """A point with MCQ, negation-type and Retrieval-Neg ``val`` on val and (zero-shot, R@5) val drift."""
    s = {"name": name, "settings": [], "seeds": [0]}
    for short in frontier.METRICS:
        d = {"zeroshot": val_drift[0], "r5": val_drift[1]}.get(short, 0.0) / 100
        last = 0.5 if short in ("zeroshot", "r5") else val
        s[short] = {"val": {"epoch0": frontier.spread([last + d]), "last": frontier.spread([last])}}
    return s


def test_the_grid_is_half_decades_around_the_recipes_rate_and_extends_past_an_edge():
    assert comparison.lr_grid(1e-4) == [1e-5, 3.16e-5, 1e-4, 3.16e-4, 1e-3]
    grid = comparison.lr_grid(1e-3)
    assert comparison.extend(grid, 1e-2) == [*grid, 3.16e-2]          # best at the top: one more above
    assert comparison.extend(grid, 1e-4) == [3.16e-5, *grid]          # at the bottom: one below
    assert comparison.extend(grid, 1e-3) == grid                      # inside: unchanged


def test_every_method_draws_the_demos_budget_in_samples():
    # the demo draws 64 NegCap + 64 NegMCQ samples a step; a baseline's one stream of 64 runs twice the steps
    assert comparison.budget_overrides("negft") == []
    assert comparison.budget_overrides("negclip") == ["train.steps_per_epoch=150"]
    assert comparison.overrides("negclip", 3.16e-5, "conv") == ["recipe=negclip", "data=world", "optim.lr=3.16e-05",
                                                                 "train.steps_per_epoch=150"]


def test_every_method_fine_tunes_the_vit_base_and_fscclip_keeps_its_token_patch_term_there():
    from negft.config import load_config
    vit = ["model.world_arch=negft-tiny", "model.world_pretrained=world-pretrain-vit"]
    for m in comparison.METHODS:
        assert all(k in comparison.overrides(m, 1e-4) for k in vit)
    dot = load_config(comparison.overrides("negft-dot", 1e-3))
    assert dot.loss.negfull.similarity == "dot" and dot.loss.name == "negfull" and dot.optim.lr == 1e-3
    assert load_config(comparison.overrides("negft", 1e-3)).loss.negfull.similarity == "cosine"
    fsc = load_config(comparison.overrides("fscclip", 1e-4))
    assert fsc.loss.fscclip.w_local == load_config(["recipe=fscclip"]).loss.fscclip.w_local > 0
    assert load_config(comparison.overrides("fscclip", 1e-4, "conv")).loss.fscclip.w_local == 0
    assert fsc.model.world_arch == "negft-tiny"


def test_alpha_at_a_budget_is_where_the_val_drift_first_reaches_it():
    sweep = [(0.0, 0.0), (0.25, 0.4), (0.5, 1.6), (0.75, 0.8), (1.0, 3.0)]
    # 1 point is crossed between 0.25 (0.4) and 0.5 (1.6): half way; the dip after it does not count
    assert comparison.alpha_at(sweep, 1.0) == pytest.approx(0.375)
    assert comparison.alpha_at(sweep, 2.0) == pytest.approx(0.75 + 0.25 * (2.0 - 0.8) / (3.0 - 0.8))
    assert comparison.alpha_at(sweep, 5.0) == 1.0                     # never reached: the fine-tuned model
    assert comparison.alpha_at([(0.0, 0.0), (0.5, 1.0), (1.0, 4.0)], 1.0) == 0.5    # exactly on the budget


def test_the_ranking_is_the_rule_applied_to_what_remains():
    pts = [summary("A", 0.6, (1.5, 0.0)), summary("B", 0.5), summary("C", 0.7, (3.0, 0.0)), summary("D", 0.55)]
    # within the done-line D then B; then A (drift-guard tier); C exceeds both tiers
    assert [p["name"] for p in comparison.rank(pts)] == ["D", "B", "A", "C"]


def _run(seed, base, at, key="mcq_neg/world/acc"):
    return {"seed": seed, "base": {"values": {key: base}, "metrics": {key: float(np.mean(base))}},
            "budgets": {"1": {"alpha": 0.5, "values": {key: at}, "metrics": {key: float(np.mean(at))}}}}


def test_block_gains_are_paired_to_the_base_and_to_negft_on_the_same_examples():
    chosen = {"negft": [_run(0, [0, 0, 1, 0], [1, 1, 1, 0])],
              "negclip": [_run(0, [0, 0, 1, 0], [0, 1, 1, 0])]}
    rows = {(r["method"], r["label"]): r for r in comparison.block_rows(chosen, "1")}
    assert rows[("negft", "MCQ")]["gain"]["mean"] == pytest.approx(0.5)
    assert rows[("negclip", "MCQ")]["gain"]["mean"] == pytest.approx(0.25)
    assert rows[("negclip", "MCQ")]["vs_ref"]["mean"] == pytest.approx(-0.25)
    assert "vs_ref" not in rows[("negft", "MCQ")]
    # a metric no run computed is kept as a row, marked, not dropped
    assert "gain" not in rows[("negft", "CC-Neg")] and rows[("negft", "CC-Neg")]["seeds"] == 0
    text = comparison.table(list(rows.values()), chosen, "1")
    assert "**negation**" in text and "**composition**" in text and "not computed" in text
    assert np.isclose(rows[("negclip", "MCQ")]["level"], 0.5)


def test_an_arm_is_paired_with_its_own_method_on_its_own_seeds(monkeypatch):
    monkeypatch.setattr(comparison, "BUDGETS_DRIFT", (1.0,))
    # negclip's chosen run on seeds 0-4; the arm on seeds 0 and 1 only: seed 2's run must not enter the pairing
    chosen = {"negclip": [_run(0, [0, 0, 0, 0], [1, 0, 0, 0]), _run(1, [0, 0, 0, 0], [0, 0, 0, 0]),
                          _run(2, [0, 0, 0, 0], [1, 1, 1, 1])],
              "negft": [_run(0, [0, 0, 0, 0], [1, 1, 1, 1])]}
    arm = {"negclip+guard": [_run(0, [0, 0, 0, 0], [1, 1, 0, 0]), _run(1, [0, 0, 0, 0], [1, 1, 0, 0])]}
    report, text = comparison.arms_report(arm, chosen)
    row = next(r for r in report["1"] if r["label"] == "MCQ")
    assert row["method"] == "negclip+guard" and row["gain"]["mean"] == pytest.approx(0.5)
    # against negclip on seeds 0 and 1: (0.5 - 0.25 + 0.5 - 0) / 2, not against negft
    assert row["vs_ref"]["mean"] == pytest.approx(0.375)
    assert all(r["method"] == "negclip+guard" for r in report["1"])
    assert "vs its method +37.5" in text


def test_pair_reads_two_runs_on_the_seeds_both_have(tmp_path, monkeypatch, capsys):
    import json
    monkeypatch.setattr(comparison, "BUDGETS_DRIFT", (1.0,))

    def put(seed, name, base, at):
        d = tmp_path / f"s{seed}" / name
        d.mkdir(parents=True)
        # a val sweep on which the rule's three targets go from 0 to ``at``'s mean: at α_b = 0.5 half of it
        sweep = [{"alpha": x, "metrics": {frontier.METRICS[k]: x * float(np.mean(at)) for k in frontier.SELECT_BY}}
                 for x in (0.0, 1.0)]
        run = {k: v for k, v in _run(seed, base, at).items() if k != "seed"}
        (d / "equal_drift.json").write_text(json.dumps({**run, "sweep": sweep}))

    put(0, "arm", [0, 0, 0, 0], [1, 1, 0, 0])
    put(1, "arm", [0, 0, 0, 0], [1, 1, 1, 0])
    put(2, "arm", [0, 0, 0, 0], [1, 1, 1, 1])         # the reference has no seed 2: left out of the pairing
    put(0, "ref", [0, 0, 0, 0], [1, 0, 0, 0])
    put(1, "ref", [0, 0, 0, 0], [1, 1, 1, 0])
    assert comparison.main(["--pair", "arm", "ref", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    # (0.5 - 0.25 + 0.75 - 0.75) / 2 = +12.5 over seeds 0 and 1
    assert "seeds 0, 1" in text and "vs ref +12.5" in text
    # val at α_b: arm (0.25 + 0.375) / 2, ref (0.125 + 0.375) / 2; no comparison.jsonl, so no reading before patching
    assert "- arm: before patching (the rule's reading) not recorded for every seed; at α_b along the val sweep " \
           "0.312 at ≤ 1" in text and "- ref: before patching (the rule's reading) not recorded for every seed; " \
           "at α_b along the val sweep 0.250 at ≤ 1" in text
    # the rule's reading: the runs' last-epoch val means in comparison.jsonl, over the paired seeds only
    rows = [{"name": "arm", "settings": [], "seed": seed, "val": {w: {k: v for k in frontier.METRICS.values()}
                                                                  for w in ("epoch0", "last")}}
            for seed, v in ((0, 0.4), (1, 0.6), (2, 0.9))]
    (tmp_path / "comparison.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    comparison.main(["--pair", "arm", "ref", "--out", str(tmp_path)])
    assert "- arm: before patching (the rule's reading) 0.500;" in capsys.readouterr().out
    comparison.main(["--pair", "arm", "ref", "--out", str(tmp_path), "--seeds", "1"])
    assert "seeds 1\n" in (text := capsys.readouterr().out) and "vs ref +0.0" in text
    with pytest.raises(SystemExit, match="no seed has both.*missing has seeds none, ref \\[0, 1\\]"):
        comparison.main(["--pair", "missing", "ref", "--out", str(tmp_path)])


def test_an_unknown_arm_is_named_with_the_known_ones(tmp_path, capsys):
    with pytest.raises(SystemExit):
        comparison.main(["--out", str(tmp_path), "--arms", "negclip+gaurd", "--dry-run"])
    err = capsys.readouterr().err
    assert "unknown arm(s) negclip+gaurd" in err and "negclip+guard" in err


def test_a_macro_metric_without_examples_is_compared_per_seed():
    key = "aro_vg_relation/world/acc_macro"
    runs = []
    for seed, (base, at) in enumerate(((0.5, 0.6), (0.4, 0.6))):
        runs.append({"seed": seed, "base": {"values": {}, "metrics": {key: base}},
                     "budgets": {"1": {"alpha": 1.0, "values": {}, "metrics": {key: at}}}})
    row = next(r for r in comparison.block_rows({"negft": runs}, "1") if r["metric"] == key)
    assert row["gain"]["seed_level"] and row["gain"]["mean"] == pytest.approx(0.15)
    assert row["gain"]["ci95"] == pytest.approx([0.1, 0.2])          # the seeds' min and max change
    assert "{+10.0, +20.0}" in comparison.table([row], {"negft": runs}, "1")


def test_every_arm_is_a_valid_run_of_its_method_and_says_what_it_changes():
    from negft.config import load_config
    assert set(comparison.ARMS) == {"negft-no-labels", "negclip-on-negmcq", "fscclip-on-negmcq",
                                    "negclip-on-negmcq-recipe-lr", "negft-negcap-0.5", "negft-negcap-0.85",
                                    *(f"{m}+guard" for m in comparison.BASELINES)}
    demo_guard = load_config(["recipe=demo"]).loss.guard.caption
    for arm, (method, extra) in comparison.ARMS.items():
        cfg = load_config([*comparison.overrides(method, 1e-4), *extra])
        if arm.endswith("+guard"):
            assert cfg.loss.guard.caption == demo_guard > 0 and cfg.loss.name == load_config(
                [f"recipe={method}"]).loss.name
        if "-on-negmcq" in arm:
            assert (cfg.streams["hard"].task, cfg.streams["hard"].field) == ("itm", "mcq")
            assert cfg.streams["hard"].redraw_negatives == "none"
        if arm.endswith("-recipe-lr"):     # the arm's rate wins over its method's chosen one, put before it
            chosen = load_config([*comparison.overrides(method, 9.99e-7), *extra])
            assert chosen.optim.lr == comparison.recipe_lr(method) != 9.99e-7
        if arm.startswith("negft-negcap-"):
            alpha = float(arm.rsplit("-", 1)[1])
            assert cfg.loss.negfull.alpha == alpha != load_config(["recipe=demo"]).loss.negfull.alpha


def test_the_preview_reads_only_finished_grid_points_extensions_included(tmp_path):
    import json

    def run(name, epochs, ckpt=True):
        d = tmp_path / "s0" / name
        (d / "checkpoints" / f"epoch_{epochs}").mkdir(parents=True) if ckpt else d.mkdir(parents=True)
        (d / "ledger.jsonl").write_text("".join(json.dumps({"epoch": e, "metrics": {"m": e}}) + "\n"
                                                for e in range(epochs + 1)))
    run("negclip-lr1e-05", 4)
    run("negclip-lr3.16e-06", 4)            # an extension below the declared grid
    run("negclip-lr0.0001", 2)              # stopped after epoch 2
    run("negclip-lr0.001", 4, ckpt=False)   # no checkpoint and no test file
    run("negclip-lr0.5", 4)                 # not a grid point
    rows = comparison.finished_grid_rows("negclip", tmp_path, "vit", 4)
    assert sorted(r["name"] for r in rows) == ["negclip-lr1e-05", "negclip-lr3.16e-06"]
    assert all(r["val"]["last"] == {"m": 4} and r["val"]["epoch0"] == {"m": 0} for r in rows)
    assert rows[0]["settings"] == comparison.overrides("negclip", float(rows[0]["name"].rsplit("lr", 1)[1]))


def test_the_grid_table_gives_each_points_val_levels_and_drifts_and_marks_the_chosen():
    def row(name, mcq, zs_last):
        m = {**{k: 0.5 for k in frontier.METRICS.values()}, frontier.METRICS["mcq"]: mcq,
             frontier.METRICS["zeroshot"]: zs_last}
        return {"name": name, "val": {"epoch0": {k: 0.5 for k in frontier.METRICS.values()}, "last": m}}
    text = comparison.grid_table({"negclip": [row("negclip-lr0.001", 0.7, 0.45), row("negclip-lr1e-05", 0.6, 0.5)]},
                                 {"negclip": "negclip-lr1e-05"})
    lines = text.splitlines()
    assert lines[2].startswith("| negclip | 1e-05 | 0.600 |") and lines[2].endswith("| +0.0 | +0.0 | chosen |")
    assert lines[3].startswith("| negclip | 0.001 | 0.700 |") and lines[3].endswith("| +0.0 | +5.0 |  |")


def test_a_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    import json
    for lr in ("1e-05", "3.16e-05"):        # two finished grid points: every stage reads them and goes on
        d = tmp_path / "s0" / f"negclip-lr{lr}"
        (d / "checkpoints" / "epoch_4").mkdir(parents=True)
        metrics = {k: 0.5 for k in frontier.METRICS.values()}
        (d / "ledger.jsonl").write_text("".join(json.dumps({"epoch": e, "metrics": metrics}) + "\n" for e in (0, 4)))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for stage in ("grid", "all", "preview"):
        assert comparison.main(["--out", str(tmp_path), "--methods", "negclip", "--stage", stage, "--arms",
                                "--dry-run"]) == 0
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    printed = capsys.readouterr().out
    assert "would run: train.py recipe=negclip" in printed and "negclip-lr0.0001" in printed
    assert "would read equal drift for negclip" in printed


def test_the_table_stage_trains_and_evaluates_nothing_and_writes_the_tables_of_what_is_there(tmp_path, monkeypatch):
    import json
    import subprocess

    def refuse(*a, **k):
        raise AssertionError(f"--stage table started {a[0]}")
    monkeypatch.setattr(subprocess, "run", refuse)
    d = tmp_path / "s0" / "negclip-lr1e-05"
    (d / "checkpoints" / "epoch_4").mkdir(parents=True)
    metrics = {k: 0.5 for k in frontier.METRICS.values()}
    (d / "ledger.jsonl").write_text("".join(json.dumps({"epoch": e, "metrics": metrics}) + "\n" for e in (0, 4)))
    assert comparison.main(["--out", str(tmp_path), "--methods", "negclip", "--stage", "table"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "comparison.jsonl").read_text().splitlines()]
    assert [r["name"] for r in rows] == ["negclip-lr1e-05"]
    assert json.loads((tmp_path / "summary.json").read_text())["chosen"] == {}   # seeds 1-2 not there: none chosen
    assert (tmp_path / "table.md").exists() and (tmp_path / "all_metrics.csv").exists()


def test_the_grid_block_table_gives_each_points_val_change_on_every_benchmark_of_the_block():
    keys = [k for b, _, k in comparison.BLOCKS if b == "composition"]
    first = {k: 0.5 for k in keys}
    last = {**first, keys[0]: 0.55, keys[1]: 0.42}
    del last[keys[2]]                                   # a benchmark the run did not compute
    text = comparison.grid_block_table({"negclip": [{"name": "negclip-lr0.001", "val": {"epoch0": first,
                                                                                      "last": last}}]}, "composition")
    lines = text.splitlines()
    assert len(lines[0].split("|")) - 2 == len(keys) + 2
    assert lines[2].startswith("| negclip | 0.001 | +5.0 | -8.0 | – | +0.0 |")


def test_stage_two_so_far_averages_the_finished_seeds_and_chooses_only_once_all_are_in(tmp_path):
    import json

    def run(seed, lr, mcq, zs_last=0.5):
        d = tmp_path / f"s{seed}" / f"negclip-lr{lr}"
        (d / "checkpoints" / "epoch_4").mkdir(parents=True)
        first = {k: 0.5 for k in frontier.METRICS.values()}
        last = {**first, frontier.METRICS["mcq"]: mcq, frontier.METRICS["zeroshot"]: zs_last}
        (d / "ledger.jsonl").write_text(json.dumps({"epoch": 0, "metrics": first}) + "\n"
                                        + json.dumps({"epoch": 4, "metrics": last}) + "\n")
    run(0, "1e-05", 0.7)
    run(0, "3.16e-05", 0.6)
    run(0, "0.0001", 0.1)                  # third on seed 0: not in stage 2
    run(1, "1e-05", 0.3)
    run(1, "3.16e-05", 0.6)
    run(2, "3.16e-05", 0.6)
    grids = {"negclip": comparison.finished_grid_rows("negclip", tmp_path, "vit", 4)}
    lines = comparison.stage2_table(grids, tmp_path, 4).splitlines()
    assert [line.split(" | ")[1:3] for line in lines[2:]] == [["1e-05", "0,1"], ["3.16e-05", "0,1,2"]]
    assert lines[2].split(" | ")[3] == "0.500" and not any("chosen" in line for line in lines)   # (0.7 + 0.3) / 2
    run(2, "1e-05", 0.2)                   # every seed in: the rule on seed means picks 3.16e-05 (0.6 > 0.4)
    lines = comparison.stage2_table(grids, tmp_path, 4).splitlines()
    assert lines[3].endswith("| chosen |") and not lines[2].endswith("| chosen |")


def test_a_lane_adds_its_rows_to_comparison_jsonl_and_keeps_the_other_lanes(tmp_path):
    import json
    comparison._write_rows(tmp_path, [{"name": "negclip-lr1e-05", "seed": 0, "v": 1}])
    comparison._write_rows(tmp_path, [{"name": "ceclip-lr1e-05", "seed": 0, "v": 2},
                                      {"name": "negclip-lr1e-05", "seed": 1, "v": 3}])
    comparison._write_rows(tmp_path, [{"name": "negclip-lr1e-05", "seed": 0, "v": 4}])   # the same run read again
    rows = [json.loads(line) for line in (tmp_path / "comparison.jsonl").read_text().splitlines()]
    assert sorted((r["name"], r["seed"], r["v"]) for r in rows) == [
        ("ceclip-lr1e-05", 0, 2), ("negclip-lr1e-05", 0, 4), ("negclip-lr1e-05", 1, 3)]
