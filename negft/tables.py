"""Markdown tables of metrics: the one renderer behind a run's ``report.md``, ``eval.py``'s ``results.md`` and a
release's ``README.md`` (its model card).

One row per metric, one column per evaluation (a value with its 95% interval), and, against a reference
evaluation (epoch 0, the base model), the change of the last column, starred where a paired test gives
p < 0.05. A metric's better side is its probe's record (``negft.probes.direction``): ``↓`` marks a metric that is
better lower, ``·`` one with no better direction; every other metric is better higher.

Also the two tables between models: the one papers print (``paper_table``: one row per model, one column per
benchmark score of ``PAPER_COLUMNS``; ``negft table``) and a paired comparison of two evaluations
(``compare_table``: per metric A, B, B − A, the paired test's p and which is better; ``negft compare``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MARKS = {-1: " ↓", 0: " ·", 1: ""}
LEGEND = ("↓: better lower; ·: no better direction (a count, a share of picks, a feature effect); every other "
          "metric is better higher.")


def cell(value, ci=None, digits: int = 3) -> str:
    """``value [lo, hi]``; ``–`` for a value that is absent or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{value:.{digits}f}"
    if ci:
        text += f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    return text


SIGNIFICANT = 0.05      # the level a paired test's p must be below for a change to count (starred, better / worse)


def p_text(p: float | None, n_boot: int | None = None) -> str:
    """A paired bootstrap test's p as its resampling resolves it: ``–`` where there is none, and a p of 0 (every
    resample on one side) as ``<2/n_boot`` (the smallest p it can tell from 0), never ``0``."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    if p == 0:
        return f"<{2 / n_boot:.2g}" if n_boot else "<1/n_boot"
    return f"{p:.3g}"


def metric_table(columns: list[tuple[str, dict, dict | None]], keys: list[str] | None = None,
                 reference: dict | None = None, p_values: dict | None = None, p_column: bool = False,
                 digits: int = 3, n_boot: int | None = None) -> list[str]:
    """The markdown lines of a metric table.

    ``columns``: (header, metrics, ci95) per evaluation. ``keys``: the rows (default: every metric of every
    column, sorted). ``reference``: adds the column Δ = last column − reference, with `` \\*`` where
    ``p_values`` gives p < 0.05; ``p_column``: the p-values in a column of their own. A legend follows the
    table when a row is marked.
    """
    from negft.probes import direction
    keys = sorted({k for _, metrics, _ in columns for k in metrics}) if keys is None else keys
    p_values = p_values or {}
    headers = ["metric", *(h for h, _, _ in columns)] + (["Δ"] if reference is not None else []) \
        + (["p"] if p_column else [])
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    marked = False
    for k in keys:
        mark = MARKS[direction(k)]
        marked = marked or bool(mark)
        cells = [k + mark] + [cell(metrics.get(k), (ci or {}).get(k), digits) for _, metrics, ci in columns]
        if reference is not None:
            first, last = reference.get(k), columns[-1][1].get(k)
            delta = f"{last - first:+.{digits}f}" if first is not None and last is not None else "–"
            cells.append(delta + (" \\*" if p_values.get(k, 1.0) < SIGNIFICANT else ""))
        if p_column:
            cells.append(p_text(p_values.get(k), n_boot))
        lines.append("| " + " | ".join(cells) + " |")
    return lines + (["", LEGEND] if marked else [])


def patch_choice(alpha: float, tower: str) -> str:
    """What a patching sweep chose, in words: not patched at α = 1, the base itself at α = 0."""
    if alpha == 1.0:
        return "not patched (α = 1: the fine-tuned model as it is)"
    if alpha == 0.0:
        return "the base model itself (α = 0: nothing of the fine-tuning kept)"
    return f"patched toward the base with α = {alpha} (the weight of the fine-tuned model; tower `{tower}`)"


# a report's opening lines: its metrics grouped by what they measure, one line a group (a metric the run did not
# report is left out, a group with none of its metrics too)
HEADLINE = (
    ("Gains", "negation, what the fine-tuning is for", (
        ("mcq_neg/world/acc", "MCQ-Neg accuracy"), ("mcq_neg/world/acc_negation", "negation-type MCQ"),
        ("retrieval_neg/world/r5", "Retrieval-Neg R@5"))),
    ("Composition", "attributes and relations bound to the right objects", (
        ("relcomp/world/group", "RelComp group"), ("winoground/world/group", "Winoground-style group"),
        ("aro_vg_relation/world/acc", "ARO VG-Relation"), ("sugarcrepe/world/swap_macro", "SugarCrepe swap"))),
    ("Costs", "what the model knew before, that fine-tuning may lose", (
        ("retrieval/world/r5", "affirmative R@5"), ("zeroshot/world/top1", "zero-shot top-1"))),
)


def _change(name: str, key: str, first: dict, last: dict, released: dict | None, digits: int) -> str:
    """One metric's ``name a → b (Δ) [→ released (Δ)]``, starred where its paired test gives p < 0.05."""
    a, b = first["metrics"][key], last["metrics"][key]
    star = " \\*" if last.get("paired_p", {}).get(key, 1.0) < SIGNIFICANT else ""
    text = f"{name} (`{key}`) {a:.{digits}f} → {b:.{digits}f} ({b - a:+.{digits}f}{star})"
    if released and key in released["metrics"]:
        r = released["metrics"][key]
        star = " \\*" if released.get("p", {}).get(key, 1.0) < SIGNIFICANT else ""
        text += f" → {r:.{digits}f} ({r - a:+.{digits}f}{star})"
    return text


def drift_keys(patterns, metrics: dict) -> list[str]:
    """The keys of ``metrics`` that the drift patterns (``patch.drift``: ``*`` for the dataset) name, in order,
    but for ``_official`` twins a bare pattern does not name and those already in ``HEADLINE``."""
    import fnmatch
    shown = {k for _, _, metrics in HEADLINE for k, _ in metrics}
    return sorted({k for p in patterns for k in metrics if fnmatch.fnmatchcase(k, p) and k not in shown})


def headline(first: dict, last: dict, released: dict | None = None, frontier: str | None = None,
             digits: int = 3, drift: tuple = ()) -> list[str]:
    """A report's opening lines: whether negation was learnt (gains), what became of composition, and what it cost
    (the run's drift metrics among the costs), one line each, epoch 0 → last epoch (→ released model), each metric
    with Δ from epoch 0 and `` *`` where a paired test gives p < 0.05; then what the patching sweep chose.

    ``first`` / ``last``: ledger lines (``epoch``, ``metrics``, ``paired_p``); ``released``: {metrics, alpha, tower,
    p} of the patching sweep's choice (its test-split values); ``frontier``: a link to experiments/frontier.py's plot;
    ``drift``: the run's drift metric patterns (``patch.drift``), whose other metrics follow as drift lines."""
    out = [f"Headline (test split; epoch 0 → epoch {last['epoch']}" + (" → released" if released else "")
           + "; Δ from epoch 0, \\* where a paired bootstrap test gives p < 0.05):", ""]
    extra = tuple((k, "drift") for k in drift_keys(drift, last["metrics"]))
    for group, what, metrics in HEADLINE:
        shown = [_change(name, key, first, last, released, digits)
                 for key, name in (*metrics, *(extra if group == "Costs" else ()))
                 if key in first["metrics"] and key in last["metrics"]]
        if shown:
            out.append(f"- **{group}** ({what}): " + "; ".join(shown))
    if released:
        out += ["", f"Released: the last epoch, {patch_choice(released['alpha'], released['tower'])}, chosen on the "
                    "val split by the rule in [patch/selected.json](patch/selected.json)."]
    if frontier:
        out += ["", f"NegBench's MCQ-vs-drift frontier and negft's objective on this world: [frontier.png]({frontier}) "
                    "(experiments/frontier.py)."]
    return out + [""]


@dataclass(frozen=True)
class Column:
    """A column of the table papers print: its header, the metric under negft's rule (``key``) and under the
    benchmark's own (``official``, by default ``key`` + ``_official``). Keys name the real dataset; a world
    evaluation's results are read at the same family's ``world`` key, in a column of its own (``column_keys``)."""
    header: str
    key: str
    official: str = ""

    def metric(self, rule: str) -> str:
        return self.key if rule == "negft" else self.official or self.key + "_official"


# The benchmark scores papers print, in the order they print them: the one list ``negft table`` reads; a column no
# results file has is left out. tests/test_table.py checks that each key is one its probe declares.
PAPER_COLUMNS = (
    Column("ARO VG-R", "aro_vg_relation/vg/acc_macro", "aro_vg_relation/vg/acc_official"),
    Column("ARO VG-A", "aro_vg_attribution/vg/acc_macro", "aro_vg_attribution/vg/acc_official"),
    Column("ARO COCO-Order", "aro_coco_order/coco/acc"),
    Column("ARO Flickr-Order", "aro_flickr30k_order/flickr30k/acc"),
    Column("SugarCrepe replace", "sugarcrepe/sugarcrepe/replace_macro"),
    Column("SugarCrepe swap", "sugarcrepe/sugarcrepe/swap_macro"),
    Column("SugarCrepe add", "sugarcrepe/sugarcrepe/add_macro"),
    Column("SugarCrepe++ replace ITT", "sugarcrepe_pp/sugarcrepe_pp/replace_itt_macro"),
    Column("SugarCrepe++ replace TOT", "sugarcrepe_pp/sugarcrepe_pp/replace_tot_macro"),
    Column("SugarCrepe++ swap ITT", "sugarcrepe_pp/sugarcrepe_pp/swap_itt_macro"),
    Column("SugarCrepe++ swap TOT", "sugarcrepe_pp/sugarcrepe_pp/swap_tot_macro"),
    Column("VALSE avg", "valse/valse/avg_macro"),
    Column("VALSE existence", "valse/valse/existence"),
    Column("CREPE atom", "crepe/crepe/prod_atom"),
    Column("CREPE swap", "crepe/crepe/prod_swap"),
    Column("CREPE negate", "crepe/crepe/prod_negate"),
    Column("SPEC I2T", "spec/spec/i2t"),
    Column("SPEC T2I", "spec/spec/t2i"),
    Column("What's Up A", "whatsup/whatsup/controlled_a"),
    Column("What's Up B", "whatsup/whatsup/controlled_b"),
    Column("MMVP-VLM", "mmvp_vlm/mmvp_vlm/average"),
    Column("SVO-Probes", "svo_probes/svo_probes/acc"),
    Column("VL-CheckList attribute", "vl_checklist/vl_checklist/attribute"),
    Column("VL-CheckList object", "vl_checklist/vl_checklist/object"),
    Column("VL-CheckList relation", "vl_checklist/vl_checklist/relation"),
    Column("ImageCoDe video", "imagecode/imagecode/videos"),
    Column("ImageCoDe static", "imagecode/imagecode/static"),
    Column("NegBench MCQ", "mcq_neg/coco/acc"),
    Column("NegBench Retrieval-Neg R@5", "retrieval_neg/coco/r5"),
    Column("CC-Neg", "ccneg/ccneg/acc"),
    Column("NegRefCOCOg", "negrefcocog/negrefcocog/acc"),
    Column("ImageNet top-1", "zeroshot/imagenet/top1"),
)
RULES = ("official", "negft")


def column_keys(column: Column, rule: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """(header, key) of ``column`` under ``rule`` on its real dataset, and on the world (a world evaluation names
    every dataset ``world``): the world's is headed by its key, since its numbers are not the benchmark's."""
    key = column.metric(rule)
    family, _, metric = key.split("/", 2)
    world = f"{family}/world/{metric}"
    return (column.header, key), (world, world)


def paper_rows(results: list[tuple[str, dict, dict]], rule: str = "official") -> tuple[list[str], list[list]]:
    """The table papers print of ``results`` ((name, metrics, ci95) per model): the headers of the
    ``PAPER_COLUMNS`` that some model has, each beside its world twin where a model was evaluated on the world
    (headed by its metric key, so that a world number is never labelled as the benchmark's), and per model its
    name and, per column, (value, ci95) or None."""
    wanted = [pair for c in PAPER_COLUMNS for pair in column_keys(c, rule)]
    cells = [[(metrics[k], (ci95 or {}).get(k)) if k in metrics else None for _, k in wanted]
             for _, metrics, ci95 in results]
    kept = [i for i in range(len(wanted)) if any(row[i] for row in cells)]
    return ([wanted[i][0] for i in kept],
            [[name, *(row[i] for i in kept)] for (name, _, _), row in zip(results, cells)])


def paper_table(headers: list[str], rows: list[list], ci: bool = False, digits: int = 3) -> list[str]:
    """``paper_rows`` as markdown lines: one row per model, each value a ``cell`` (with its interval where
    ``ci``)."""
    lines = ["| " + " | ".join(["model", *headers]) + " |", "|" + "---|" * (len(headers) + 1)]
    for name, *cells in rows:
        shown = [cell(*(c if ci else (c[0], None)), digits) if c else "–" for c in cells]
        lines.append("| " + " | ".join([name.replace("|", "\\|"), *shown]) + " |")
    return lines


VERDICTS = {1: "better", -1: "worse", 0: "="}
NOT_SIGNIFICANT = "no significant change"
UNTESTED = "untested"


def verdict(row: dict) -> str:
    """Whether B is better or worse than A: only where the paired test finds the change (p < ``SIGNIFICANT``);
    ``untested`` where there is no test (no per-example values), ``·`` for a metric with no better side."""
    from negft.probes import direction
    if direction(row["metric"]) == 0:
        return "·"
    if row["better"] == 0:
        return VERDICTS[0]
    if row["p"] is None:
        return f"{VERDICTS[row['better']]}? ({UNTESTED})"
    return VERDICTS[row["better"]] if row["p"] < SIGNIFICANT else NOT_SIGNIFICANT


def compare_table(rows: list[dict], a: str, b: str, digits: int = 3, n_boot: int | None = None) -> list[str]:
    """``negft.results.compare``'s rows as markdown lines: metric (marked as ``metric_table`` marks it), A, B,
    B − A with `` \\*`` where p < 0.05, p (``p_text``: ``–`` without per-example values), and whether B is better
    or worse than A by the metric's direction, said only where the test finds it (``verdict``)."""
    from negft.probes import direction
    lines = [f"| metric | A: {a} | B: {b} | B − A | p | B vs A |", "|---|---|---|---|---|---|"]
    marked = False
    for r in rows:
        mark = MARKS[direction(r["metric"])]
        marked = marked or bool(mark)
        p = r["p"]
        star = " \\*" if p is not None and p < SIGNIFICANT else ""
        delta = "–" if math.isnan(r["delta"]) else f"{r['delta']:+.{digits}f}{star}"
        lines.append(f"| {r['metric']}{mark} | {cell(r['a'], digits=digits)} | {cell(r['b'], digits=digits)} | "
                     f"{delta} | {p_text(p, n_boot)} | {verdict(r)} |")
    return lines + (["", LEGEND] if marked else [])
