"""The demo's stages as library calls (negft.commands.train): world → base (cached) → fine-tune → sweep → release."""
import ast
import contextlib
import io
import json

from tests.conftest import REPO, process_state

# a short base recipe: the world-pretrain recipe's model and data, two steps
BASE = """data: world
epochs: 1
model: {world_pretrained: ""}
streams:
  corpus: {task: contrastive, field: caption, world_split: pretrain, batch_size: 32}
loss: {name: clip}
optim: {lr: 2.0e-3, warmup_steps: 1}
train: {workers: 0, steps_per_epoch: 2}
eval: {split: val, suite: zeroshot, bootstrap: 20}
"""


def _spy(calls: list, name: str, fn):
    """``fn``, recording [name, its arguments] in ``calls`` (paths and objects as "Type:str")."""
    def wrapped(*args, **kwargs):
        calls.append([name, [a if isinstance(a, (str, int, float, list)) else f"{type(a).__name__}:{a}"
                             for a in args]])
        return fn(*args, **kwargs)
    return wrapped


def _run_twice(cache, out, base, monkeypatch) -> tuple[list, str]:
    """The stages run twice (two fine-tunes from the same base), in this process: the stages it called, with
    their arguments, and what it printed."""
    from negft import patching, release
    from negft.commands import train as stages
    from negft.config import load_config
    from negft.train import loop, world_base
    calls = []
    monkeypatch.setattr(loop, "setup", _spy(calls, "setup", loop.setup))
    monkeypatch.setattr(loop, "train", _spy(calls, "train", loop.train))
    monkeypatch.setattr(world_base, "train", _spy(calls, "train", world_base.train))
    monkeypatch.setattr(patching, "patch", _spy(calls, "patch", patching.patch))
    monkeypatch.setattr(release, "release", _spy(calls, "release", release.release))
    printed = io.StringIO()
    with process_state(), contextlib.redirect_stdout(printed):
        for run in ("a", "b"):
            cfg = load_config(["recipe=demo", "data=world", "world.size=tiny", f"world.cache={cache}",
                               f"model.world_pretrained={base}", f"out={out}/{run}", "epochs=1",
                               "train.steps_per_epoch=2", "train.workers=0", "eval.bootstrap=20",
                               "eval.suite=mcq_neg,zeroshot,retrieval", "patch.alphas=0,1", "patch.towers=t",
                               "streams.negcap.batch_size=16", "streams.negmcq.batch_size=16"])
            calls.append(["run", [str(stages.run(cfg))]])
    return calls, printed.getvalue()


def test_stages_run_the_demos_stages_and_reuses_the_cached_base(cache, tmp_path, monkeypatch):
    base_recipe = tmp_path / "tiny-pretrain.yaml"
    base_recipe.write_text(BASE)
    calls, stdout = _run_twice(cache, tmp_path / "runs", base_recipe, monkeypatch)
    names = [c[0] for c in calls]
    # one process group and world per run; the base is trained once, from random weights, then reused by the
    # second run
    assert names == ["setup", "train", "train", "patch", "release", "run", "setup", "train", "patch", "release", "run"]
    (_, (_, base_from, *_)), (_, (_, demo_from, *_)) = calls[1], calls[2]
    assert base_from == "" and demo_from.startswith("local-dir:") and demo_from.endswith("/model")
    assert calls[7][1][1] == demo_from
    # typed arguments: paths, the parsed α grid and tower modes, the recipe's rule
    patch_args, release_args = calls[3][1], calls[4][1]
    assert patch_args[0] == demo_from and patch_args[1].endswith("/a/checkpoints/epoch_1")
    assert patch_args[1].split(":")[0] in ("PosixPath", "WindowsPath")
    assert patch_args[3:5] == [[0.0, 1.0], ["t"]] and patch_args[5].startswith("Rule:")
    assert release_args[0].endswith("/a/patch/selected") and release_args[1].endswith("/a/release")

    base_dirs = list((cache / "base").glob("tiny-pretrain-s0-tiny-*"))
    assert len(base_dirs) == 1 and (base_dirs[0] / "model" / "open_clip_model.safetensors").exists()
    assert (base_dirs[0] / "run" / "ledger.jsonl").exists()
    assert stdout.count("base model not cached") == 1
    for run in ("a", "b"):
        run_dir = tmp_path / "runs" / run
        ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
        assert [entry["epoch"] for entry in ledger] == [0, 1]
        assert (run_dir / "patch" / "selected.json").exists() and (run_dir / "release" / "SHA256SUMS").exists()
        report = (run_dir / "report.md").read_text()
        assert "(patch/sweep.png)" in report and "(release/README.md)" in report
        assert f"base={demo_from}" in report and "mcq_neg/world/acc" in report
    assert stdout.rstrip().splitlines()[-1].startswith("[negft] done:")


def test_the_training_loop_does_not_reach_back_into_the_stages():
    """train() fine-tunes what it is given: it neither builds its own base (calls itself) nor patches or releases."""
    tree = ast.parse((REPO / "negft" / "train" / "loop.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not imported & {"negft.patching", "negft.release", "negft.commands.train", "negft.config.load_config"}
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    called = {n.func.id for n in ast.walk(train) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "train" not in called and "load_config" not in called


def test_no_function_in_negft_is_longer_than_120_lines():
    longest = []
    for path in (REPO / "negft").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                longest.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(REPO)}:{node.name}"))
    assert max(longest)[0] < 120, sorted(longest)[-5:]


def test_the_epoch_stream_sets_the_epoch_length(cache):
    """An epoch is one pass over train.epoch_stream (default: the first stream), at its batch size."""
    from negft.config import load_config
    from negft.train.loop import plan_steps
    world = cache / "world-s0-tiny"
    n = json.loads((world / "world.json").read_text())["counts"]["finetune"]
    args = ["recipe=demo", "data=world", "world.size=tiny", f"world.cache={cache}", "train.steps_per_epoch=null",
            "streams.negcap.batch_size=16", "streams.negmcq.batch_size=32"]
    first = plan_steps(load_config(args), world, world_size=1)
    chosen = plan_steps(load_config([*args, "train.epoch_stream=negmcq"]), world, world_size=1)
    assert (first.epoch_stream, first.steps_per_epoch) == ("negcap", n // 16)
    assert (chosen.epoch_stream, chosen.steps_per_epoch) == ("negmcq", n // 32)
