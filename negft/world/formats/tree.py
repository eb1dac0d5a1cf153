"""The world's probe split as ``$NEGFT_DATA`` holds the released benchmarks: each real manifest's folder
links to the world's files under the names that benchmark's release uses, so ``data=real`` runs every
released-format reader on world images (tests, ``bench/eval_cost.py``)."""
from __future__ import annotations

from pathlib import Path

from negft.data import manifests
from negft.probes.imagenet_wnids import WNIDS

# the world's file a NegBench probe reads where the release names its own (negft/probes/released.py)
WORLD_NAMES = {"mcq_neg": "mcq.csv", "retrieval": "retrieval.csv", "retrieval_neg": "retrieval_neg.csv"}


def link_released_tree(split: Path, data: Path) -> None:
    """Fill ``data`` (a ``$NEGFT_DATA``) with links into the world split ``split``, one folder per manifest."""
    split, data = Path(split), Path(data)
    for name in manifests.names():
        man = manifests.load(name)
        if man.get("layout") == "clip_benchmark_wds":     # a collection: the world's example of each kind in it
            _write_clip_benchmark(split, data / man["root"])
            continue
        if not man.get("probes"):
            continue
        root = data / man["root"]
        root.mkdir(parents=True, exist_ok=True)
        links = {f: split / WORLD_NAMES[p] for p, f in (man.get("probe_files") or {}).items()}
        # the image folders: the world writes SugarCrepe's (val2017/) and VALSE's (data/...) as their releases place
        # them, which the split's own entries link; NegRefCOCOg's file names start images/ (the split is its
        # folder); one outside the dataset's root (VALSE's FOIL-it COCO) is not linked
        images = man.get("images") or {}
        for folder in (images.values() if isinstance(images, dict) else [images]):
            # a folder under one of the split's own entries (VALSE's data/...) is that entry's, which is linked
            # whole: a link made inside it would be written into the world's split through the entry's link
            inside = (split / Path(folder).parts[0]).exists() if folder else False
            if not (split / folder).exists() and not folder.startswith(("..", "/")) and not inside:
                links[folder] = split
        zs = man.get("zeroshot") or {}
        if zs.get("labels") == "index":        # ImageNet-V2: folders named by class index, as the world's
            links[zs["images"]] = split / "zeroshot"
        # a name the manifest links itself is not also the split's entry
        for entry in split.iterdir():
            if entry.name not in links and not (root / entry.name).exists():
                (root / entry.name).symlink_to(entry)
        for target, source in links.items():
            if not (root / target).exists():
                (root / target).parent.mkdir(parents=True, exist_ok=True)
                (root / target).symlink_to(source)
        if zs.get("labels") == "wnid":         # ImageNet val/<wnid>/: the world's classes as the first wnids
            for k in (split / "zeroshot").iterdir():
                if k.is_dir():
                    (root / zs["images"]).mkdir(exist_ok=True)
                    (root / zs["images"] / WNIDS[int(k.name)]).symlink_to(k)


def _write_clip_benchmark(split: Path, root: Path) -> None:
    """CLIP_benchmark's webdataset folders (two classification sets, one retrieval set) drawn from the split's
    world (its seed), small: they are scored after every epoch of a data=real run on the world."""
    import json
    from negft.world.formats.clip_benchmark_wds import write_clip_benchmark_example
    if root.exists():
        return
    meta = split.parent / "world.json"
    seed = json.loads(meta.read_text()).get("seed", 0) if meta.exists() else 0
    drawn_from = split.name if split.name in ("val", "test") else "test"
    write_clip_benchmark_example(root, seed=seed, n=12, odd=False, world_split=drawn_from)
