"""Images per second of each `negft data` converter on released-layout examples with world images.

    python bench/bench_convert.py [N]        # N images per example (default 2000)

Why: a real conversion (10M CC12M images) is bound by reading images and writing shards, and a user plans
its hours from this rate. The examples are written first (not timed); each conversion then runs as
`negft data ...` would, in this process, and its rate is the samples written over its wall time. The
world's images are small (3-6 KB), so real images, 30-100 KB each, convert slower where the disk binds.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from negft.convert import coco, img2dataset, negbench  # noqa: E402
from negft.convert import negate, relcomp_vg  # noqa: E402
from negft.world.formats import coco as coco_example, img2dataset as i2d_example, negbench_csv, \
    visual_genome  # noqa: E402


def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        t0 = time.perf_counter()
        cap = negbench_csv.write_negcap_example(src / "nb", n, bad=False)
        mcq = negbench_csv.write_mcq_example(src / "nb", n, bad=False)
        i2d = i2d_example.write_img2dataset_example(src / "i2d", n, bad=False)
        c = coco_example.write_coco_example(src / "coco", n, bad=False)
        vg = visual_genome.write_vg_example(src / "vg", n, bad=False)
        print(f"examples of {n} images written in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        runs = {
            "convert negbench-negcap": lambda o: negbench.convert_negcap(cap["csv"], cap["images"], o),
            "convert negbench-negcap mcq=": lambda o: negbench.convert_negcap(cap["csv"], cap["images"], o,
                                                                              mcq=mcq["csv"]),
            "convert negbench-mcq": lambda o: negbench.convert_mcq(mcq["csv"], mcq["images"], o),
            "convert img2dataset mcq=": lambda o: img2dataset.convert(i2d["folder"], i2d["negcap"], o,
                                                                      mcq=i2d["mcq"]),
            "convert coco": lambda o: coco.convert(c["captions"], c["instances"], c["images"], o),
            "negate (coco)": lambda o: negate.negate(c["captions"], c["images"], o, labels=c["instances"]),
            "relcomp (visual genome)": lambda o: relcomp_vg.relcomp(vg["relationships"], vg["images"], o),
        }
        print("| command | samples | seconds | images/s |\n|---|---|---|---|")
        for k, (name, run) in enumerate(runs.items()):
            t0 = time.perf_counter()
            result = run(out / str(k))
            seconds = time.perf_counter() - t0
            samples = result["counts"]["samples"] if "counts" in result else sum(
                m["counts"]["samples"] for m in (negate_split(out / str(k), s) for s in ("train", "val")))
            print(f"| {name} | {samples} | {seconds:.2f} | {samples / seconds:,.0f} |", flush=True)


def negate_split(out: Path, split: str) -> dict:
    import json
    return json.loads((out / split / "manifest.json").read_text())


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
