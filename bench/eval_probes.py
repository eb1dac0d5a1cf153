"""Where a per-epoch evaluation spends its time: seconds per probe, and the share spent encoding text.

    python bench/eval_probes.py runs/demo/checkpoints/epoch_3 [split=test] [suite=default]

Runs the suite once to warm the caches the training loop keeps between epochs (pixels, tokens, and the image
features of a frozen image tower), then times each probe alone and the whole suite, as an evaluation after
an epoch of ``tower=t`` fine-tuning costs.
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from negft import models  # noqa: E402
from negft.evaluation import datasets_for, run_suite, world_root  # noqa: E402
from negft.probes import base, suite  # noqa: E402


def main(ckpt: str, split: str = "test", names: str = "default") -> None:
    bundle = models.build("", ckpt)
    datasets = datasets_for(world_root(models.negft_info(ckpt)) / split)
    caches = dict(pixel_cache=base.PixelCache(), image_cache={}, token_cache={})
    run = lambda s: run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer, datasets, s, **caches)
    run(names)
    text = [0.0]
    encode = base.EvalContext.encode_texts

    def timed(self, texts):
        t0 = time.perf_counter()
        out = encode(self, texts)
        text[0] += time.perf_counter() - t0
        return out

    base.EvalContext.encode_texts = timed
    for name in suite(names):
        t0 = time.perf_counter()
        run(name)
        print(f"{name:16s} {time.perf_counter() - t0:6.2f} s")
    text[0] = 0.0
    t0 = time.perf_counter()
    run(names)
    total = time.perf_counter() - t0
    print(f"{'suite ' + names:16s} {total:6.2f} s, of which encoding text {text[0]:.2f} s "
          f"({100 * text[0] / total:.0f}%)")


if __name__ == "__main__":
    opts = dict(a.split("=", 1) for a in sys.argv[2:])
    main(sys.argv[1], opts.get("split", "test"), opts.get("suite", "default"))
