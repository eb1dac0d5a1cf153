"""Run a probe suite over a model and its datasets (``run_suite``, the one evaluation used by train.py, eval.py and
patching) and write its results (``write_results``: eval.py's files). ``evaluate`` is both for a notebook: any model
with ``encode_image`` / ``encode_text``, exposed as ``negft.evaluate``."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from negft import probes
from negft.config import EvalCfg
from negft.data import manifests
from negft.io import atomic_write
from negft.probes.base import Dataset, EvalContext, ProbeResult
from negft.probes.stats import one_blas_thread
from negft.provenance import code, describe, now, provenance
from negft.results import VALUES_FILE, write_values
from negft.tables import metric_table


def world_root(info: dict, world_dir: str = "") -> Path:
    """The world a checkpoint was trained on (``world_dir`` wins over its record; with neither, the demo's world in
    the cache, ``negft.config.demo_world``), checked to exist."""
    from negft.config import demo_world
    given = str(world_dir or info.get("world_dir", ""))
    root = Path(given) if given else demo_world()
    if not (root / "world.json").exists():
        where = f"'{root}'" if given else (f"'{root}', the demo's world in the cache ($NEGFT_CACHE), where it looks "
                                           "when neither world_dir= is given nor the checkpoint records one")
        raise FileNotFoundError(f"world data not found at {where}: pass world_dir=DIR of a world built by `negft data "
                                f"world out=DIR` (`python train.py recipe=demo` builds the demo's at {demo_world()})")
    return root


def datasets_for(world_split_dir: Path | None, data_root: Path | None = None) -> list[Dataset]:
    """The world's probe split (every probe reads its files there), or each real evaluation dataset whose
    manifest lists the probes it serves, at its folder under ``data_root`` (default ``$NEGFT_DATA``, read now,
    not at import). A manifest of a collection (``layout: clip_benchmark_wds``) stands for every dataset folder
    found under its root."""
    if world_split_dir is not None:
        return [Dataset("world", Path(world_split_dir))]
    from negft.probes import clip_benchmark_wds
    root = manifests.data_root() if data_root is None else Path(data_root)
    found, collections = [], []
    for name in manifests.names():
        man = manifests.load(name)
        if man.get("layout") == clip_benchmark_wds.LAYOUT:
            collections.append((name, man))
        elif man.get("probes"):
            found.append(Dataset(man["dataset"], root / man["root"], name, tuple(man["probes"])))
    taken = {d.name for d in found}
    for name, man in collections:
        found += (clip_benchmark_wds.discover(root / man["root"], name, man, taken)
                  or [clip_benchmark_wds.absent(root / man["root"], name, man)])
    return found


@torch.no_grad()
def run_suite(model, preprocess, tokenizer, datasets: list[Dataset], suite: str = "default",
             batch_size: int = 256, n_boot: int = 1000, device="cpu", image_cache: dict | None = None,
             text_cache: dict | None = None, token_cache: dict | None = None, pixel_cache=None) -> ProbeResult:
    """The suite's metrics on ``datasets``; the texts the probes declare are encoded first, in one pass."""
    # restore each module's own mode: a frozen tower stays in eval mode (its norm statistics fixed); a wrapper
    # that is no torch module has no mode
    modes = {m: m.training for m in model.modules()} if isinstance(model, torch.nn.Module) else {}
    if modes:
        model.eval()
    ctx = EvalContext(model, preprocess, tokenizer, device, batch_size, n_boot, datasets,
                      image_cache=image_cache, text_cache=text_cache, token_cache=token_cache,
                      pixel_cache=pixel_cache)
    plan = [(name, dataset) for name in probes.suite(suite) for dataset in datasets
            if dataset.probes is None or name in dataset.probes]
    result = ProbeResult()
    failed = {}
    declared = []
    for name, dataset in plan:
        if name in probes.TEXTS:
            try:
                declared += [t for t in probes.TEXTS[name](dataset) if isinstance(t, str)]
            except Exception as e:
                _failed(result, failed, name, dataset, e)
    if declared:
        ctx.encode_texts(declared)
    with one_blas_thread():
        for name, dataset in plan:
            if (name, dataset.name) in failed:
                continue
            try:
                result.update(probes.PROBES[name](ctx, dataset))
            except Exception as e:
                _failed(result, failed, name, dataset, e)
    for m, training in modes.items():
        m.training = training
    return result


def _failed(result: ProbeResult, failed: dict, name: str, dataset: Dataset, error: Exception) -> None:
    """A probe that fails on a real dataset's files (partial or malformed beyond what its reader checks) is
    skipped with the error, and the other probes run; on the world's split (no manifest) it is a bug: raised."""
    if not dataset.manifest:
        raise error
    why = (f"failed on the files under {dataset.root}: {type(error).__name__}: {str(error)[:300]} (see "
           f"{manifests.shown(dataset.manifest)}; `negft data check {dataset.manifest}` checks them); the "
           "other probes ran")
    failed[(name, dataset.name)] = why
    result.skipped[f"{name}/{dataset.name}"] = why
    print(f"[negft] probe {name} on {dataset.name} skipped: {why}", flush=True)


def skipped_rows_summary(result: ProbeResult) -> list[str]:
    """The console's account of the rows the readers left out, from the same records as ``results.md``: per
    benchmark (``<family>/<dataset>``) how many (its ``skipped_rows``) and why (its ``.../rows`` entries in
    ``skipped``: file, count, reasons). [] when no row was skipped. Numbers computed without those rows are not
    the benchmark's whole file: a user who reads only the console must see that."""
    why: dict[str, list[str]] = {}
    for key, message in sorted(result.skipped.items()):
        if key.endswith("/rows"):
            why.setdefault("/".join(key.split("/")[:2]), []).append(message)
    counts = {key.removesuffix("/skipped_rows"): int(v) for key, v in result.metrics.items()
              if key.endswith("/skipped_rows")}
    benchmarks = sorted(set(why) | set(counts))
    if not benchmarks:
        return []
    total = sum(counts.values())
    lines = [f"[negft] rows skipped{f' ({total})' if total else ''} in {len(benchmarks)} benchmark(s); their numbers "
             "leave them out (the written results list them under 'skipped'):"]
    for bench in benchmarks:
        n = f"{counts[bench]} row(s)" if bench in counts else "rows"
        lines.append(f"[negft]   {bench}: {n} skipped")
        lines += [f"[negft]     {message}" for message in why.get(bench, [])]
    return lines


def print_skipped_rows(result: ProbeResult) -> None:
    """``skipped_rows_summary`` on the console (nothing when no row was skipped)."""
    for line in skipped_rows_summary(result):
        print(line, flush=True)


def write_figures(result: ProbeResult, out_dir: Path) -> list[Path]:
    """Each probe's figure drawn from its records into ``out_dir/<probe>__<dataset>.png`` (whole or not at all)."""
    written = []
    for prefix, records in result.records.items():
        draw = probes.FIGURES.get(prefix.split("/")[0])
        if draw and records:
            path = out_dir / (prefix.replace("/", "__") + ".png")
            written.append(atomic_write(path, lambda p: draw(records, p), suffix=".png"))
    return written


def write_results(out_dir: Path, named: dict, suite: str, result: ProbeResult, base: tuple | None = None,
                  n_boot: int | None = None) -> Path:
    """eval.py's files under ``out_dir``: ``results.json`` (``named``: how the model was given, then the metrics,
    intervals, skipped and provenance), ``results.md``, ``examples/`` and ``figures/``. ``base`` = (name, its
    ``ProbeResult``, paired p-values from ``n_boot`` resamples): the base model's columns beside this one's."""
    payload = {**named, "time": now(), "suite": suite, "metrics": result.metrics, "ci95": result.ci95,
               "skipped": result.skipped, "provenance": provenance([*result.metrics, *result.skipped])}
    lines = [f"# Evaluation of `{' '.join(str(v) for v in named.values())}`", ""]
    if base:
        name, base_result, p = base
        payload.update(base=name, base_metrics=base_result.metrics, base_ci95=base_result.ci95, paired_p=p)
        lines += [f"Against the base model `{name}` on the same examples (mean [95% bootstrap interval]); "
                  "Δ = this model − base, \\* where a paired bootstrap test gives p < 0.05.", ""]
        lines += metric_table([("base", base_result.metrics, base_result.ci95),
                               ("this model", result.metrics, result.ci95)], sorted(result.metrics),
                              reference=base_result.metrics, p_values=p, p_column=True, digits=4,
                              n_boot=n_boot)
    else:
        lines += ["Mean [95% bootstrap interval].", ""]
        lines += metric_table([("value", result.metrics, result.ci95)], digits=4)
    atomic_write(out_dir / "results.json", json.dumps(payload, indent=2) + "\n")
    if result.skipped:
        lines += ["", "Skipped:", ""] + [f"- `{k}`: {v}" for k, v in sorted(result.skipped.items())]
    lines += ["", f"Provenance: {describe(payload['provenance'])}."]
    atomic_write(out_dir / "results.md", "\n".join(lines) + "\n")
    for prefix, records in result.records.items():
        atomic_write(out_dir / "examples" / (prefix.replace("/", "__") + ".jsonl"),
                     "".join(json.dumps(r) + "\n" for r in records))
    write_values(out_dir / VALUES_FILE, result.values)      # negft compare's paired tests
    write_figures(result, out_dir / "figures")
    return out_dir / "results.json"


def datasets_of(data: str | Path, world_dir: str | Path = "", split: str = EvalCfg.split) -> list[Dataset]:
    """``data`` = ``world`` (the world at ``world_dir``, its ``split``), ``real`` (the datasets under
    ``$NEGFT_DATA``) or a folder: a world (it holds ``world.json``; its ``split``) or a root of real datasets laid out
    as ``$NEGFT_DATA`` is."""
    if str(data) == "world":
        return datasets_for(world_root({}, str(world_dir)) / split)
    if str(data) == "real":
        return datasets_for(None)
    folder = Path(data)
    if not folder.is_dir():
        raise FileNotFoundError(f"data='{data}' is neither world, real nor a folder")
    return datasets_for(folder / split if (folder / "world.json").exists() else None, data_root=folder)


def _device_of(model) -> torch.device | str:
    """Where ``model``'s weights are: its inputs go there."""
    params = model.parameters() if isinstance(model, torch.nn.Module) else iter(())
    return next((p.device for p in params), "cpu")


def evaluate(model, preprocess, tokenizer, suite: str = EvalCfg.suite, data: str | Path = "world",
             world_dir: str | Path = "", split: str = EvalCfg.split, out: str | Path | None = None,
             batch_size: int = EvalCfg.batch_size, bootstrap: int = EvalCfg.bootstrap, device=None,
             name: str = "") -> ProbeResult:
    """A probe suite over any model, in a notebook: eval.py's numbers (``metrics``, ``ci95`` intervals, ``skipped``;
    ``records`` per example) and, with ``out``, its files (``write_results``).

    ``model``: anything with ``encode_image(pixels)`` and ``encode_text(tokens)`` returning one feature row per
    input (an open_clip model, or a thin wrapper of another library's); it is used where its weights are
    (``device``: elsewhere) and left in the mode it was in. A ``logit_scale`` (log of the temperature, as open_clip
    and Hugging Face keep it) is read where a probe scores confidences; without one CLIP's 100 is used.
    ``preprocess``: a PIL image to a (3, H, W) tensor; ``tokenizer``: a list of texts to a (N, L) tensor of token
    ids. ``data``, ``world_dir``, ``split``: ``datasets_of``; ``name``: how the files name the model (default
    its class)."""
    code()                  # the code's provenance, read before anything else runs (negft.provenance)
    probes.suite(suite)
    for method in ("encode_image", "encode_text"):
        if not callable(getattr(model, method, None)):
            raise TypeError(f"{type(model).__name__} has no {method}(): wrap the model in an object that has "
                            "encode_image(pixels) and encode_text(tokens)")
    datasets = datasets_of(data, world_dir, split)
    result = run_suite(model, preprocess, tokenizer, datasets, suite, batch_size, bootstrap,
                       device or _device_of(model))
    if out is not None:
        write_results(Path(out), {"model": name or type(model).__name__}, suite, result)
    print_skipped_rows(result)
    return result
