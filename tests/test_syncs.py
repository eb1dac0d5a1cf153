"""No host round trip between two log intervals: every recipe's training steps on the world, counted on the CPU as
they would run on a GPU (negft.train.syncs), ask the device for no value between log steps: the objective (the
drift guard and the hard negatives included), the batch's transfer, the optimizer and the loop."""
import pytest
import torch

from negft.train.syncs import RUNS, HostSyncs, host_sync
from tests.conftest import run_here

STEPS, LOG_EVERY = 3, 3         # steps 1 and 2 lie between two log intervals (0 and 3); step 3 logs
BATCH = 8                       # per stream: what a step runs does not depend on it (16 cost a quarter more time)


def test_the_counter_flags_what_would_wait_for_the_device():
    x = torch.randn(6, requires_grad=True)
    mask = torch.tensor([True, False] * 3)
    with HostSyncs() as count:
        count.begin("step")
        x[mask].sum().backward()                 # nonzero in the forward, and again in the backward
        x.detach().sum().item()
        torch.repeat_interleave(torch.tensor([1, 2]))
        x.detach()[torch.tensor([0, 2])].sum() * 2      # an integer index: no sync
    ops = [s.op.split(".")[1] for s in count.syncs]
    assert ops == ["index", "index_put", "_local_scalar_dense", "repeat_interleave"]
    assert all("test_syncs.py" in s.stack[0] for s in count.syncs)
    assert count.ops > len(ops) and count.buckets[-1].by_op["sum"] == 3
    assert host_sync(torch.ops.aten.nonzero.default, (mask,), {})
    with HostSyncs() as count:                  # what reads the host's own tensors alone waits for no device
        with count.on_host():
            host_mask = torch.tensor([True, False] * 3)
        rows = host_mask.nonzero().flatten()
        x.detach()[rows].sum() * 2
    assert count.syncs == [] and count.buckets[0].host_ops >= 2


def _counted(monkeypatch, count: HostSyncs) -> dict:
    """Run the loop's epochs under ``count`` as on a GPU: the host reads the device at log steps only
    (``loop.reads_freely``). A bucket per step, begun before the step's batch is read."""
    from negft.train import loop
    monkeypatch.setattr(loop, "reads_freely", lambda device: False)
    steps = {"n": 0}

    class Counted:
        def __init__(self, inner, first):
            self.inner, self.first = inner, first

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def epoch(self, *args, **kwargs):
            it = self.inner.epoch(*args, **kwargs)
            while True:
                if self.first:
                    steps["n"] += 1
                    count.begin(f"step {steps['n']}")
                try:
                    with count.on_host():       # read and collated on the host, before the transfer
                        batch = next(it)
                except StopIteration:
                    return
                yield batch

    open_streams, run_epochs, batch_to = loop.open_streams, loop.run_epochs, loop.batch_to

    def to_device(batch, device, dtype):
        """The transfer: on a GPU the step's tensors are the device's, not the host's (a CPU's ``to`` is a no-op)."""
        out = batch_to(batch, device, dtype)
        with count.pause():
            return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()}

    def streams(*args, **kwargs):
        out = open_streams(*args, **kwargs)
        return {name: Counted(s, i == 0) for i, (name, s) in enumerate(out.items())}

    def epochs(*args, **kwargs):
        with count:
            return run_epochs(*args, **kwargs)

    monkeypatch.setattr(loop, "open_streams", streams)
    monkeypatch.setattr(loop, "batch_to", to_device)
    monkeypatch.setattr(loop, "run_epochs", epochs)
    return steps


@pytest.mark.parametrize("recipe", RUNS)
def test_no_host_round_trip_between_log_steps(recipe, cache, monkeypatch, tmp_path):
    count = HostSyncs()
    _counted(monkeypatch, count)
    from negft.config import load_config
    batches = [f"streams.{s}.batch_size={BATCH}" for s in load_config([*RUNS[recipe], "data=world"]).streams]
    proc = run_here(["train.py", *RUNS[recipe], *batches, "data=world", "world.size=tiny", f"world.cache={cache}",
                     "model.world_pretrained=", "eval.suite=none", "patch.sweep=false", "train.workers=0",
                     "epochs=1", f"train.steps_per_epoch={STEPS}", f"train.log_every={LOG_EVERY}",
                     f"out={tmp_path / 'run'}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [b for b in count.buckets if b.label.startswith("step ")]
    assert len(steps) == STEPS and all(b.ops > 0 for b in steps)
    logs = {n for n in range(1, STEPS + 1) if n % LOG_EVERY == 0 or n == STEPS}       # the loop's log steps
    between = [s for n, b in enumerate(steps, 1) if n not in logs for s in b.syncs]
    assert not between, f"{recipe}: host syncs between log steps:\n{count.report(between)}"
    # the log steps read the device, as they should: the loss, and the logs
    assert all(b.syncs for n, b in enumerate(steps, 1) if n in logs)


def test_the_hosts_trim_width_is_the_devices(bundle):
    """``models.trim_width`` of the host's copy of the tokens cuts where ``encode_text_trimmed`` would read the
    device: the same features, bit for bit; ``losses.rows_of`` selects what the boolean mask does."""
    from negft import models
    from negft.losses import rows_of
    tokens = bundle.tokenizer(["a red cube", "a cat but no dog left of a blue ball", ""])
    model = bundle.model.eval()
    width = models.trim_width(model, [tokens[:1], tokens[1:]])
    assert width == int(tokens.argmax(-1).max()) + 1
    with torch.no_grad():
        assert torch.equal(models.encode_text_trimmed(model, tokens, width), models.encode_text_trimmed(model, tokens))
    mask = torch.tensor([False, True, True])
    assert torch.equal(tokens[rows_of(mask, "cpu")], tokens[mask])
