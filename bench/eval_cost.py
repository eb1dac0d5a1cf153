"""What a real-size evaluation costs: seconds per 1,000 examples of each benchmark family, ViT-B-32 on CPU.

    python bench/eval_cost.py [--split ~/.cache/negft/world-s0-demo/test] [--arch ViT-B-32] [--threads N]

Lays a world split out as ``$NEGFT_DATA`` holds the released benchmarks (every reader a real run uses), builds
the architecture with random weights (the cost does not depend on them), and times each family three ways:

- ``cold``: the first evaluation of a run: images decoded and both towers run;
- ``vt epoch``: a later evaluation of a ``tower=vt`` run: decoded pixels and tokens kept, both towers re-run;
- ``t epoch``: a later evaluation of a ``tower=t`` run: the frozen image tower's features kept too.

An example is one scored item of the family (an MCQ question, a retrieval query, a SugarCrepe pair, a
Winoground group, ...). ImageNet's class embeddings (1,000 names × 80 templates, once per evaluation and not
per image) are timed on a sample of its prompts and reported apart; the world's classes stand in for the
per-image part.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import open_clip  # noqa: E402
import torch  # noqa: E402

from negft import models, probes  # noqa: E402
from negft.world.formats.tree import link_released_tree  # noqa: E402
from negft.evaluation import datasets_for, run_suite  # noqa: E402
from negft.probes import base, zeroshot  # noqa: E402


def one_per_reader(datasets):
    """NegBench's eleven sets share three readers: keep the sets that add a probe, as the tests do."""
    kept, covered = [], set()
    for d in datasets:
        if not d.manifest.startswith("negbench_") or not set(d.probes) <= covered:
            kept.append(d)
            covered |= set(d.probes)
    return kept


def examples(result) -> int:
    """Scored items: the longest per-example value list any of the family's metrics holds."""
    return max((len(v) for v in result.values.values()), default=0)


def class_prompt_rate(bundle, n: int) -> tuple[float, int]:
    """Seconds to encode ``n`` of ImageNet's class prompts, and how many prompts ImageNet-1k has in all."""
    names, templates = open_clip.IMAGENET_CLASSNAMES, open_clip.OPENAI_IMAGENET_TEMPLATES
    prompts = [t(c) for c in names for t in templates]
    ctx = base.EvalContext(bundle.model, bundle.preprocess_val, bundle.tokenizer, "cpu", 256, 0, [])
    t0 = time.perf_counter()
    ctx.encode_texts(prompts[:: len(prompts) // n][:n])
    return time.perf_counter() - t0, len(prompts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", default=str(Path.home() / ".cache/negft/world-s0-demo/test"))
    ap.add_argument("--arch", default="ViT-B-32")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--prompts", type=int, default=1024, help="ImageNet prompts timed for the class embeddings")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    bundle = models.build(args.arch, "", quick_gelu=False)
    bundle.model.eval()
    with tempfile.TemporaryDirectory() as data:
        link_released_tree(Path(args.split), Path(data))
        os.environ["NEGFT_DATA"] = data
        datasets = one_per_reader(datasets_for(None))
        names = json.loads((Path(args.split) / "classes.json").read_text())
        zeroshot._imagenet_names = lambda: list(names)
        print(f"{args.arch}, {args.threads} threads, split {args.split}")
        print(f"{'family':18s} {'examples':>8s} {'cold':>8s} {'vt epoch':>9s} {'t epoch':>8s}   (s / 1,000 examples)")
        for name in probes.suite("all"):
            served = [d for d in datasets if d.probes is None or name in d.probes]
            if not served:
                continue
            pixels, tokens, images = base.PixelCache(), {}, {}
            run = lambda image_cache: run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer, served,
                                               name, n_boot=1, pixel_cache=pixels, token_cache=tokens,
                                               image_cache=image_cache)
            times = []
            for image_cache in ({}, images, images):      # cold; vt epoch (fills images); t epoch (reuses)
                t0 = time.perf_counter()
                result = run(image_cache)
                times.append(time.perf_counter() - t0)
            n = examples(result)
            if not n:
                print(f"{name:18s} {'-':>8s} skipped: {'; '.join(result.skipped.values())[:100]}")
                continue
            print(f"{name:18s} {n:8d} " + " ".join(f"{1000 * t / n:8.2f}" for t in times))
        seconds, total = class_prompt_rate(bundle, args.prompts)
        print(f"ImageNet-1k class embeddings: {total:,} prompts, {seconds:.1f} s for {args.prompts} "
              f"-> {seconds * total / args.prompts:.0f} s per evaluation (extrapolated), once per evaluation")


if __name__ == "__main__":
    main()
