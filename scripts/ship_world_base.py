"""Ship the world base a recipe starts from with negft (negft/world/bases/), so a first run does not train it.

    python scripts/ship_world_base.py [recipe=demo] [world.seed=0] [world.size=demo]

Builds the recipe's world if needed, trains its base if it is not cached (``negft.train.world_base``: the same
path a run takes), then copies the cached base (fp16, a ``local-dir`` layout) into negft/world/bases/<name>/ and
records it in bases.json: its key, its weights' SHA256, the command that makes it, the machine, torch and thread
count it was trained with, the date and negft's commit. A run whose world base has that key loads it from there.
"""
from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from negft import models  # noqa: E402
from negft.config import load_config  # noqa: E402
from negft.io import atomic_path, atomic_write, sha256_file  # noqa: E402
from negft.train import world_base as wb  # noqa: E402
from negft.train.loop import setup  # noqa: E402
from negft.world.generator import GENERATOR_VERSION, ensure_world  # noqa: E402


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str]) -> None:
    cfg = load_config(["recipe=demo", "data=world", *argv])
    source = Path(wb.world_base(cfg, setup(cfg)).removeprefix(models.LOCAL_DIR))
    pre = wb.base_recipe(cfg)
    ensure_world(pre, 0, wb.base_splits(pre))        # its shards' bytes are recorded, so they must be drawn
    key = wb.base_key(pre, wb.world_dir(cfg))
    name = wb.cache_name(pre, key)
    if source == wb.SHIPPED / name:
        print(f"already shipped: {source}")
        return
    dest = wb.SHIPPED / name
    with atomic_path(dest, directory=True) as staged:
        for f in (models.WEIGHTS_FILE, models.CONFIG_FILE):
            shutil.copy2(source / f, staged / f)
        wb.round_to_fp16(staged)            # a base cached by a negft that kept fp32
        cfg_file = staged / models.CONFIG_FILE          # this machine's folders are not shipped
        config = json.loads(cfg_file.read_text())
        for k in ("world_dir", "run_dir"):
            config.get("negft", {}).pop(k, None)
        cfg_file.write_text(json.dumps(config, indent=2))
    # the commit checked out now: ship a base right after the run that trained it, before the code moves on
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=wb.SHIPPED).stdout.strip()
    index = wb.SHIPPED / "bases.json"
    entries = json.loads(index.read_text()) if index.exists() else {}
    entries[name] = {
        "recipe": Path(pre.recipe).stem, "world": {"seed": pre.world.seed, "size": pre.world.size, "generator_version": GENERATOR_VERSION},
        "key": key, "shards": wb.shards_digest(wb.world_dir(cfg), wb.base_splits(pre)),
        "sha256": sha256_file(dest / models.WEIGHTS_FILE),
        "bytes": (dest / models.WEIGHTS_FILE).stat().st_size, "dtype": "float16",
        "made_by": f"the base stage of a world run (recipe {Path(pre.recipe).stem} on world seed {pre.world.seed}, "
                   f"size {pre.world.size}, cached), rounded to fp16 by `python scripts/ship_world_base.py`",
        "trained_on": f"{cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}",
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "negft": commit}
    atomic_write(index, json.dumps(entries, indent=1, sort_keys=True) + "\n")
    print(f"shipped {dest} ({entries[name]['bytes'] / 1e6:.1f} MB, sha256 {entries[name]['sha256']})")


if __name__ == "__main__":
    main(sys.argv[1:])
