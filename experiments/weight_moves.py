"""How far each part of the text tower moved in a run: ||W - W_base|| / ||W_base|| per group (token and
positional embeddings, each block, ln_final, the projection), from a checkpoint's open_clip weights and its base's.
Used to read why a lever changes drift (experiments/RESULTS.md, "The selection protocol").

    python experiments/weight_moves.py BASE_DIR RUN_CKPT [RUN_CKPT ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

from safetensors.torch import load_file

from negft.models import WEIGHTS_FILE
from negft.towers import tower_of


def group(name: str) -> str:
    if ".resblocks." in name:
        return "block" + name.split(".resblocks.")[1].split(".")[0]
    return name.split(".")[0]


def moves(base: dict, ckpt: dict) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for name, w in ckpt.items():
        if tower_of(name) != "t":
            continue
        s = sums.setdefault(group(name), [0.0, 0.0])
        s[0] += float((w.float() - base[name].float()).norm() ** 2)
        s[1] += float(base[name].float().norm() ** 2)
    return {g: (d / n) ** 0.5 for g, (d, n) in sums.items()}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    base = load_file(str(Path(argv[0]) / WEIGHTS_FILE))
    rows = {ckpt: moves(base, load_file(str(Path(ckpt) / WEIGHTS_FILE))) for ckpt in argv[1:]}
    groups = sorted({g for r in rows.values() for g in r})
    print("| checkpoint | " + " | ".join(groups) + " |")
    print("|---|" + "---|" * len(groups))
    for ckpt, r in rows.items():
        print(f"| {ckpt} | " + " | ".join(f"{r.get(g, 0.0):.3f}" for g in groups) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
