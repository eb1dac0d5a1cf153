"""Images/s of negft's loader alone (decode, transform, tokenise, batch), for PNG and JPEG shards.

    python bench/loader.py                                   # the demo world's PNG shards, 1 and 2 workers
    python bench/loader.py --arch ViT-B-32 --workers 8,15 --batches 40 --jpeg

What a training stream does without the model: ``EpochBatches`` over the embedded world's fine-tune shards (64-px
PNGs, resized to the model's image size by its transform), and with ``--jpeg`` over the same images as 256-px
JPEGs (quality 90, about what img2dataset writes), so both decode and resize as real shards do. Per workers
count: images/s from the second batch of epoch 1 to its last (worker start-up left out: it is given
separately), and the wait for epoch 2's first batch from the same loader (its workers persist, so it is
not a restart). ``--augment`` uses open_clip's random-resized-crop train transform instead of the world's
resize and centre crop.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from negft.config import default_cache  # noqa: E402


def to_jpeg_shard(src: str, dst: str, size: int = 256) -> int:
    """A copy of a world shard with each PNG as a ``size``-pixel JPEG."""
    from PIL import Image
    n = 0
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read()
            name = m.name
            if name.endswith(".png"):
                buf = io.BytesIO()
                Image.open(io.BytesIO(data)).convert("RGB").resize((size, size), Image.BICUBIC).save(
                    buf, "JPEG", quality=90)
                data, name, n = buf.getvalue(), name[:-4] + ".jpg", n + 1
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tout.addfile(info, io.BytesIO(data))
    return n


def measure(shards: list[str], bundle, preprocess, workers: int, batch: int, batches: int) -> dict:
    from negft.data.pipeline import EpochBatches, Stream, StreamSpec
    stream = Stream(StreamSpec(shards, "contrastive", "negcap", batch), preprocess, bundle.tokenizer, seed=0)
    source = EpochBatches(stream, workers)
    t0 = time.perf_counter()
    it = source.epoch(1, batches)
    next(it)
    t1 = time.perf_counter()
    n = sum(1 for _ in it)
    t2 = time.perf_counter()
    it = source.epoch(2, 2)
    next(it)
    t3 = time.perf_counter()
    for _ in it:
        pass
    return {"workers": workers, "images_s": n * batch / (t2 - t1), "startup_s": t1 - t0, "epoch2_first_s": t3 - t2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="negft-tiny")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--batches", type=int, default=20, help="batches timed per epoch (after the first)")
    ap.add_argument("--world-size", default="demo", choices=["tiny", "demo", "full"])
    ap.add_argument("--cache", default=default_cache())
    ap.add_argument("--jpeg", action="store_true", help="also 256-px JPEG copies of the shards")
    ap.add_argument("--augment", action="store_true")
    args = ap.parse_args()
    from negft import models
    from negft.world.generator import build_world
    root = Path(args.cache).expanduser() / f"world-s0-{args.world_size}"
    build_world(root, seed=0, size=args.world_size, progress=False)
    png = sorted(str(p) for p in (root / "finetune").glob("*.tar"))
    bundle = models.build(args.arch, "")
    preprocess = bundle.preprocess_train if args.augment else bundle.preprocess_val
    kinds = {"PNG 64 px": png}
    with tempfile.TemporaryDirectory(prefix="negft-loader-") as d:
        if args.jpeg:
            jpeg = [str(Path(d) / Path(p).name) for p in png]
            t0 = time.perf_counter()
            with ProcessPoolExecutor(min(len(png), os.cpu_count() or 1)) as pool:
                list(pool.map(to_jpeg_shard, png, jpeg))
            print(f"JPEG shards written in {time.perf_counter() - t0:.1f} s", flush=True)
            kinds["JPEG 256 px"] = jpeg
        size = getattr(bundle.model.visual, "image_size", 224)
        print(f"{args.arch} ({size} px, {'train' if args.augment else 'eval'} transform), batch {args.batch}, "
              f"{len(png)} shards, {os.cpu_count()} CPUs", flush=True)
        rows = []
        for kind, shards in kinds.items():
            for w in (int(x) for x in args.workers.split(",")):
                r = {"kind": kind, **measure(shards, bundle, preprocess, w, args.batch, args.batches)}
                rows.append(r)
                print(f"  {kind}, {w} workers: {r['images_s']:,.0f} images/s", flush=True)
    print("\n| shards | workers | images/s | first batch s | epoch 2 first batch s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['workers']} | {r['images_s']:,.0f} | {r['startup_s']:.2f} | {r['epoch2_first_s']:.2f} |")


if __name__ == "__main__":
    main()
