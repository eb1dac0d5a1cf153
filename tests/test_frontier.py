"""experiments/frontier.py's protocol: a selection that reads val only, and the drift-guard lines read on one seed's
numbers (its statistics, negft.probes.stats.pooled_interval and pooled_paired, are tested in tests/test_stats.py)."""
from experiments import frontier


def summary(name, val, test, val_drift=(0.0, 0.0), val_rneg=0.5):
    """A point whose MCQ and negation-type are ``val`` on val and ``test`` on test, with (zero-shot, R@5) val drift
    and Retrieval-Neg R@5 ``val_rneg`` on val."""
    s = {"name": name, "settings": [], "seeds": [0, 1, 2]}
    for short in frontier.METRICS:
        v = val if short in ("mcq", "negation") else val_rneg if short == "rneg_r5" else 0.5
        t = test if short in ("mcq", "negation") else 0.5
        d = {"zeroshot": val_drift[0], "r5": val_drift[1]}.get(short, 0.0) / 100
        s[short] = {"val": {"epoch0": frontier.spread([0.5 + d] * 3 if short in ("zeroshot", "r5") else [0.2] * 3),
                            "last": frontier.spread([v] * 3)},
                    "test": {"epoch0": frontier.spread([0.2] * 3), "last": frontier.spread([t] * 3)}}
    return s


def test_selection_reads_val_only_and_keeps_the_drift_lines():
    # B is best on test, A on val: the protocol picks A
    chosen, rule = frontier.select([summary("A", 0.6, 0.5), summary("B", 0.5, 0.7)])
    assert chosen["name"] == "A" and "val" in rule
    # C is best on val but drifts 1.5 points in zero-shot on val: past the done-line, so D (within it) is chosen
    chosen, rule = frontier.select([summary("C", 0.7, 0.7, (1.5, 0.0)), summary("D", 0.6, 0.6, (0.5, 1.0))])
    assert chosen["name"] == "D" and "≤ 1" in rule
    # neither within the done-line: the drift-guard lines (≤ 2, ≤ 3) decide
    chosen, rule = frontier.select([summary("C", 0.7, 0.7, (1.5, 0.0)), summary("E", 0.8, 0.8, (2.5, 0.0))])
    assert chosen["name"] == "C" and "≤ 2" in rule
    # Retrieval-Neg counts beside MCQ and negation-type, by the three's mean: F (0.6, 0.6, 0.2: 0.467) loses to
    # G (0.5, 0.5, 0.5: 0.5), and wins (0.517) with Retrieval-Neg 0.35
    chosen, rule = frontier.select([summary("F", 0.6, 0.6, val_rneg=0.2), summary("G", 0.5, 0.5, val_rneg=0.5)])
    assert chosen["name"] == "G" and "Retrieval-Neg" in rule
    assert frontier.select([summary("F", 0.6, 0.6, val_rneg=0.35), summary("G", 0.5, 0.5, val_rneg=0.5)])[0][
        "name"] == "F"
    # a drift exactly on the line is within it, whatever the float sum of the seeds gives: three seeds drifting
    # -0.4, 2.8 and 3.6 points average 2.0000000000000009 in floats
    on_line = summary("H", 0.9, 0.9)
    on_line["zeroshot"]["val"] = {"epoch0": frontier.spread([0.908, 0.872, 0.893]),
                                  "last": frontier.spread([0.912, 0.844, 0.857])}
    assert frontier.drift(on_line, "zeroshot", "val") > 2.0
    chosen, rule = frontier.select([summary("C", 0.7, 0.7, (1.5, 0.0)), on_line])
    assert chosen["name"] == "H" and "≤ 2" in rule
    # NegBench's points are references, never selected while a negft point exists
    assert frontier.select([summary("negbench-a0.1", 0.9, 0.9), summary("A", 0.5, 0.5)])[0]["name"] == "A"


def test_seed_lines_read_one_seeds_numbers():
    def block(mcq, neg, rneg, rneg_ci, r5, zs):
        return {"metrics": {"mcq": mcq, "negation": neg, "rneg_r5": rneg, "r5": r5, "zeroshot": zs},
                "ci95": {"rneg_r5": rneg_ci}}
    row = {"test": {"epoch0": block(0.20, 0.01, 0.15, [0.14, 0.16], 0.48, 0.93),
                    "last": block(0.55, 0.40, 0.19, [0.18, 0.20], 0.46, 0.90)}}
    lines = {name: ok for name, ok, _ in frontier.seed_lines(row)}
    assert lines == {"MCQ +30 points": True, "negation-type ≥ 0.35": True, "Retrieval-Neg up, intervals apart": True,
                     "zero-shot drift ≤ 2": False, "R@5 drift ≤ 3": True}
    row["test"]["last"]["ci95"]["rneg_r5"] = [0.155, 0.2]                  # intervals overlap
    assert not dict((n, ok) for n, ok, _ in frontier.seed_lines(row))["Retrieval-Neg up, intervals apart"]


def test_select_from_reapplies_the_rule_to_recorded_rows(tmp_path, capsys):
    """A recorded frontier.jsonl (val numbers per point and seed) chosen again: only points with every asked seed
    count, and the choice is select()'s on their val seed means."""
    import json

    def row(name, seed, mcq, neg, rneg, zs_drop=0.0):
        e0 = {"mcq": 0.2, "negation": 0.0, "rneg_r5": 0.2, "r5": 0.5, "zeroshot": 0.9}
        last = {"mcq": mcq, "negation": neg, "rneg_r5": rneg, "r5": 0.5, "zeroshot": 0.9 - zs_drop}
        return {"name": name, "settings": [f"x={name}"], "seed": seed, "val": {"epoch0": e0, "last": last}}
    rows = [row("mcq-only", s, 0.6, 0.4, 0.2) for s in (0, 1)] + [row("both", s, 0.5, 0.3, 0.5) for s in (0, 1)] \
        + [row("drifts", s, 0.9, 0.9, 0.9, zs_drop=0.05) for s in (0, 1)] + [row("one-seed", 0, 1.0, 1.0, 1.0)]
    path = tmp_path / "frontier.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chosen, rule = frontier.select_from(path, [0, 1])
    assert chosen["name"] == "both" and chosen["settings"] == ["x=both"] and "Retrieval-Neg" in rule
    assert "one-seed" not in capsys.readouterr().out


def test_each_baselines_rate_is_chosen_among_its_own_points_on_val():
    """A baseline's grid points compete with each other only, by the rule that chooses negft's points: the rate
    within the done-line beats a better one past it; negft's selection never picks a baseline's point."""
    assert [frontier.method_of(n) for n in ("negclip", "negclip-lr1e-05", "ceclip-lr0.001", "emb-lr-0.1")] == \
        ["negclip", "negclip", "ceclip", None]
    assert frontier.GROUPS["baseline-grid"] == [f"{b}-lr{lr:g}" for b in frontier.BASELINES
                                                for lr in frontier.BASELINE_LRS]
    points = [summary("negclip-lr1e-05", 0.3, 0.3), summary("negclip-lr0.001", 0.6, 0.6, (5.0, 0.0)),
              summary("ceclip-lr1e-05", 0.2, 0.2), summary("ceclip-lr0.0001", 0.4, 0.1), summary("demo", 0.1, 0.1)]
    chosen = frontier.select_per_method(points)
    assert {m: c["name"] for m, (c, _) in chosen.items()} == {"negclip": "negclip-lr1e-05",
                                                               "ceclip": "ceclip-lr0.0001"}
    assert "val" in chosen["ceclip"][1]
    assert frontier.select(points)[0]["name"] == "demo"


def test_a_run_brought_back_without_checkpoints_is_read_not_rerun(tmp_path):
    """A GPU machine's runs come back with their ledgers and test files only: the protocol reads them (dry run:
    nothing would train or evaluate), and a run whose last epoch has no test file yet is not taken as done."""
    import json
    metrics = {k: 0.5 for k in frontier.METRICS.values()}
    test = {"metrics": {s: 0.5 for s in frontier.METRICS}, "ci95": {}, "values": {s: [1.0] for s in frontier.METRICS}}
    run = tmp_path / "s0" / "p"
    run.mkdir(parents=True)
    (run / "ledger.jsonl").write_text("".join(json.dumps({"epoch": e, "metrics": metrics}) + "\n" for e in (0, 4)))
    (run.parent / "base-test.json").write_text(json.dumps(test))
    assert not frontier.finished(run, 4)
    assert frontier.run_point("p", [], 0, tmp_path, [], 4, 1, dry=True) is None
    (run / "test.json").write_text(json.dumps(test))
    assert frontier.finished(run, 4) and not frontier.finished(run, 5)
    row = frontier.run_point("p", [], 0, tmp_path, [], 4, 1, dry=True)
    assert row["epoch"] == 4 and row["test"]["last"] == test and row["val"]["last"]["mcq"] == 0.5
