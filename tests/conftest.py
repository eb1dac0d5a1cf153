import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """A private negft cache holding the tiny world (built once per test session)."""
    path = tmp_path_factory.mktemp("negft-cache")
    from negft.data.world import build_world
    build_world(path / "world-s0-tiny", seed=0, size="tiny", progress=False)
    return path


def run_cli(args, cwd=REPO, env=None, timeout=900):
    """Run a repo entry point in a fresh process; returns the CompletedProcess."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def bundle():
    """The tiny ViT with its transforms and tokenizer (random weights): what streams preprocess with."""
    from negft import models
    return models.build("negft-tiny", "")


def read_shards(folder) -> dict[str, dict[str, bytes]]:
    """{key: {ext: bytes}} of every sample in a folder's shards, in shard order."""
    samples: dict[str, dict[str, bytes]] = {}
    for shard in sorted(Path(folder).glob("shard-*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf:
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, {})[ext] = tf.extractfile(m).read()
    return samples


def write_shard(path, samples) -> str:
    """A webdataset tar of ``samples`` ([(key, {ext: bytes})], in that order) at ``path``; returns it as a str."""
    import io
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return str(path)
