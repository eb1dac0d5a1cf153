"""The fast step's guarantees on CPU: aligned flat buffers, skipped non-finite steps, synthetic data, loaders."""
import os

import pytest
import torch
from safetensors.torch import load_file

from negft import models
from tests.conftest import process_state, run_here

def _alignment() -> dict:
    """{"<autocast>-<regroup>": the optimizer DeepSpeed wraps, the misaligned flat-buffer offsets, dtype, count}
    of ZeRO-1 engines over the tiny model, with negft's parameter groups and with the grouping before."""
    import deepspeed
    from negft.config import Config
    from negft.train.engine import deepspeed_config, init_distributed, make_optimizer
    from negft.train.task import build_task
    init_distributed()
    out = {}
    for autocast in (False, True):
        for regroup in (True, False):
            torch.manual_seed(0)
            task = build_task(models.build("negft-tiny", "").model, Config().loss)
            cfg = Config()
            cfg.train.precision, cfg.train.autocast, cfg.train.zero_stage = "bf16", autocast, 1
            if regroup:
                optimizer = make_optimizer(task, cfg, 0.0)
            else:       # the grouping before: the 1-element logit_scale first in the no-decay group
                decay = [p for n, p in task.named_parameters() if p.ndim >= 2 and "logit_scale" not in n]
                rest = [p for n, p in task.named_parameters() if not (p.ndim >= 2 and "logit_scale" not in n)]
                rest.sort(key=lambda p: p.numel() != 1)
                optimizer = torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}])
            engine, opt, *_ = deepspeed.initialize(model=task, optimizer=optimizer,
                                                   config=deepspeed_config(cfg, 4, world_size=2))
            flat = [p for p in engine.module.parameters() if p.requires_grad]
            out[f"{autocast}-{regroup}"] = {"wrapped": type(opt).__name__,
                                           "misaligned": [p.data_ptr() % 16 for p in flat if p.data_ptr() % 16],
                                           "dtype": str(flat[0].dtype), "n": len(flat)}
    return out


def test_every_parameter_is_16_byte_aligned_in_deepspeeds_flat_buffers():
    """ZeRO-1 flattens each parameter group into one buffer; the 1-element logit_scale ahead of the biases put
    every later tensor off a 16-byte boundary (cuBLAS's slow bias GEMMs). Its own group, last, keeps all aligned,
    with the weights cast by DeepSpeed (bf16) and under autocast (fp32)."""
    with process_state():
        result = _alignment()
    for key, r in result.items():
        assert r["wrapped"] != "SkipNonFiniteAdamW", f"{key}: ZeRO-1 should wrap the client optimizer"
    assert result["False-True"]["dtype"] == "torch.bfloat16" and result["True-True"]["dtype"] == "torch.float32"
    assert result["False-True"]["misaligned"] == [] and result["True-True"]["misaligned"] == []
    # the check is not vacuous: with logit_scale first in its group, the rest of the group is misaligned
    assert len(result["False-False"]["misaligned"]) > 10 and len(result["True-False"]["misaligned"]) > 10


def test_param_groups_put_odd_sized_parameters_last_and_keep_weight_decay():
    from negft.train.engine import param_groups
    clip = models.build("negft-tiny", "").model
    groups = param_groups(clip, 0.1)
    names = {id(p): n for n, p in clip.named_parameters()}
    assert [names[id(p)] for p in groups[-1]["params"]] == ["logit_scale"] and groups[-1]["weight_decay"] == 0.0
    assert all(p.numel() % 8 == 0 for g in groups[:-1] for p in g["params"])
    assert sum(len(g["params"]) for g in groups) == len(list(clip.parameters()))
    decayed = {names[id(p)] for g in groups if g["weight_decay"] for p in g["params"]}
    assert "visual.conv1.weight" in decayed and not any("bias" in n or "ln" in n for n in decayed)


def test_embedding_lr_scale_scales_the_embeddings_step_and_no_other():
    """optim.embedding_lr_scale: one AdamW step from the same gradients moves the embeddings by the scale times
    what it moves them at scale 1 (Adam's step and the decay are both proportional to the rate), every other
    parameter by the same amount; at 1 the groups are the old ones (a checkpoint's optimizer layout)."""
    from negft.config import load_config
    from negft.train.engine import param_groups, make_optimizer
    moved = {}
    for scale in (1.0, 0.1):
        torch.manual_seed(0)
        clip = models.build("negft-tiny", "").model
        before = {n: p.detach().clone() for n, p in clip.named_parameters()}
        cfg = load_config(["recipe=demo", "data=world", f"optim.embedding_lr_scale={scale}"])
        optimizer = make_optimizer(clip, cfg, 0.0)
        for n, p in clip.named_parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
        moved[scale] = {n: (p.detach() - before[n]).abs().sum().item() for n, p in clip.named_parameters()}
    embeddings = {"token_embedding.weight", "positional_embedding", "visual.positional_embedding",
                  "visual.class_embedding"}
    for n, d in moved[1.0].items():
        assert d > 0, n
        if any(e in n for e in ("token_embedding", "positional_embedding", "class_embedding")):
            embeddings.discard(n)
            assert moved[0.1][n] == pytest.approx(0.1 * d, rel=1e-4), n
        else:
            assert moved[0.1][n] == pytest.approx(d, rel=1e-6), n
    assert not embeddings        # every embedding was checked (the model has them all)
    assert len(param_groups(clip, 0.1)) == len(param_groups(clip, 0.1, 1.0)) == 3


@pytest.mark.parametrize("fused", [False, True])
def test_skip_non_finite_adamw_skips_a_non_finite_step_and_clips_the_global_norm(fused):
    """Fused (what negft steps on every device) skips on the device through ``found_inf``; the multi-tensor form
    skips on the host."""
    from negft.train.engine import SkipNonFiniteAdamW
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(16, 8)), torch.nn.Parameter(torch.randn(1))]
    opt = SkipNonFiniteAdamW([{"params": ps}], clip=1.0, lr=0.1, fused=fused)
    for p in ps:
        p.grad = torch.randn_like(p) * 10
    opt.step()
    state = {k: v.clone() for k, v in opt.state[ps[0]].items()}
    before = [p.detach().clone() for p in ps]
    ps[0].grad = torch.randn_like(ps[0])
    ps[1].grad = torch.tensor([float("nan")])
    opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, ps)), "a non-finite gradient changed a weight"
    assert all(torch.equal(state[k], opt.state[ps[0]][k]) for k in state), "it changed the optimizer state"
    assert int(opt.skipped) == 1 and int(opt.bad_run) == 1
    for p in ps:                  # a finite gradient but a NaN loss: skipped too
        p.grad = torch.randn_like(p)
    opt.note_loss(torch.tensor(float("inf")))
    opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, ps)) and int(opt.bad_run) == 2
    opt.step()                    # a good step resets the run and clips the global norm to 1
    assert int(opt.skipped) == 2 and int(opt.bad_run) == 0
    assert not torch.equal(before[0], ps[0])
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in ps))
    assert norm.item() == pytest.approx(1.0, rel=1e-5)


SYNTHETIC = ["recipe=negcap", "train.synthetic=true", "model.arch=negft-tiny", "model.pretrained=",
             "streams.negcap.batch_size=8", "train.precision=fp32", "epochs=1", "optim.lr=1e-3",
             "optim.warmup_steps=1", "optim.min_lr_ratio=1.0"]      # a constant learning rate


def _run_poisoned(bad, args, monkeypatch):
    """train.py's run with the loss of the steps numbered in ``bad`` (from 1) made NaN."""
    from negft.train import task
    bad, calls, forward = set(bad), [0], task.Task.forward

    def poisoned(self, *args, **kwargs):
        total, logs = forward(self, *args, **kwargs)
        calls[0] += 1
        return (total * float("nan"), logs) if calls[0] in bad else (total, logs)
    with monkeypatch.context() as m:
        m.setattr(task.Task, "forward", poisoned)
        return run_here(["train.py", *SYNTHETIC, *args])


# who skips a non-finite step at ZeRO-0: SkipNonFiniteAdamW over fp32 weights (fp32, and bf16 under torch.autocast),
# or, for bf16 weights cast by DeepSpeed, DeepSpeed's 16-bit wrapper (FP16_UnfusedOptimizer) over fp32 masters
PRECISIONS = {"fp32": ["train.precision=fp32"],
              "bf16-autocast": ["train.precision=bf16", "train.autocast=true"],
              "bf16-deepspeed": ["train.precision=bf16", "train.autocast=false"]}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_nan_loss_skips_its_step_and_is_counted(precision, micro_arch, tmp_path, monkeypatch):
    """ZeRO-0: the step with a NaN loss changes no weight (the saved fp32 weights equal a run that stopped
    before it); the run goes on, and says it skipped one."""
    a, b = tmp_path / "nan", tmp_path / "clean"
    precision = [f"model.arch={micro_arch}", *PRECISIONS[precision]]
    proc = _run_poisoned({3}, [f"out={a}", "train.steps_per_epoch=3", *precision], monkeypatch)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "step 3: 1 step(s) skipped for a non-finite loss or gradient (1 in a row, 1 in all)" in proc.stdout
    clean = _run_poisoned(set(), [f"out={b}", "train.steps_per_epoch=3", "max_steps=2", *precision], monkeypatch)
    assert clean.returncode == 0, clean.stdout[-2000:] + clean.stderr[-2000:]
    after_nan = load_file(str(a / "checkpoints" / "epoch_1" / models.WEIGHTS_FILE))
    after_two = load_file(str(b / "checkpoints" / "epoch_1" / models.WEIGHTS_FILE))
    for k in after_two:
        assert torch.equal(after_nan[k], after_two[k]), k


@pytest.mark.parametrize("precision", PRECISIONS)
def test_max_bad_steps_in_a_row_stop_the_run_without_a_checkpoint(precision, micro_arch, tmp_path, monkeypatch):
    """Steps 3 and 4 non-finite with train.max_bad_steps=2: the run stops at step 4, where step_4 was due, with a
    negft error and exit 1; step_2, written before the bad run, is the only checkpoint."""
    out = tmp_path / "run"
    proc = _run_poisoned(range(3, 100), [f"out={out}", "train.steps_per_epoch=10", "train.max_bad_steps=2",
                                         "train.checkpoint_every=2", f"model.arch={micro_arch}",
                                         *PRECISIONS[precision]], monkeypatch)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "negft: error: 2 optimizer steps in a row had a non-finite loss" in proc.stderr
    assert "stopped at step 4 without writing a checkpoint" in proc.stderr
    assert f"The last complete checkpoint is {out / 'checkpoints' / 'step_2'}" in proc.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2"]


def test_synthetic_data_needs_no_shards_and_reports_its_rate(tmp_path):
    """train.synthetic: a recipe whose shards do not exist here runs on random batches of its streams' shapes."""
    proc = run_here(["train.py", "recipe=negfull", "train.synthetic=true", "model.arch=negft-tiny", "model.pretrained=",
                     "streams.negcap.batch_size=4", "streams.negmcq.batch_size=2", "train.precision=fp32",
                     "epochs=1", "train.steps_per_epoch=7", f"out={tmp_path / 'run'}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "epoch 1: 2 steps after the first 5:" in proc.stdout and "samples/s" in proc.stdout
    assert (tmp_path / "run" / "checkpoints" / "epoch_1" / models.WEIGHTS_FILE).exists()


def test_synthetic_batches_have_the_streams_shapes_and_full_length_texts():
    from negft.data.pipeline import SyntheticBatches, StreamSpec
    bundle = models.build("negft-tiny", "")
    for task, keys in [("contrastive", {"images", "texts"}), ("mcq", {"images", "options", "answers"}),
                       ("itm", {"images", "texts", "negatives", "negative_mask", "negative_images",
                                "has_negative_image"})]:
        s = SyntheticBatches(StreamSpec([], task, "caption", 3), (64, 64), bundle.tokenizer, "cpu", torch.float32, 0)
        batches = list(s.epoch(1, 2))
        assert len(batches) == 2 and set(batches[0]) == keys and batches[0]["images"].shape == (3, 3, 64, 64)
        texts = batches[0]["options" if task == "mcq" else "texts"]
        assert texts.shape[-1] == 32 and (texts.argmax(-1) == 31).all()       # end of text last
        assert torch.equal(list(s.epoch(1, 2, start=1))[0]["images"], batches[1]["images"])


def test_persistent_workers_serve_every_pass_and_epoch_as_fresh_ones_would(cache):
    """One loader for the run: its workers persist across passes and epochs, yet each pass's data (order and
    augmentations) is what a new loader for that (epoch, pass) gives."""
    from negft.data.pipeline import EpochBatches, Stream, StreamSpec
    bundle = models.build("negft-tiny", "")
    shards = sorted(str(p) for p in (cache / "world-s0-tiny" / "finetune").glob("*.tar"))
    spec = StreamSpec(shards, "contrastive", "negcap", batch_size=32)

    def draw(batches, epoch):           # the tiny world's 300 samples are 9.4 batches: step 10 starts a second pass
        return [(b["texts"], b["images"]) for b in batches.epoch(epoch, 10)]

    persistent = EpochBatches(Stream(spec, bundle.preprocess_train, bundle.tokenizer, seed=0), workers=2)
    got = [draw(persistent, 1), draw(persistent, 2)]
    assert persistent._loader is not None and persistent._loader.persistent_workers
    for epoch, batches in zip((1, 2), got):
        fresh = draw(EpochBatches(Stream(spec, bundle.preprocess_train, bundle.tokenizer, seed=0), workers=2), epoch)
        assert len(fresh) == len(batches) == 10
        for (t1, i1), (t2, i2) in zip(batches, fresh):
            assert torch.equal(t1, t2) and torch.equal(i1, i2)      # images: random crops seeded per pass
    assert not torch.equal(got[0][0][0], got[1][0][0])


class _WorkerReport(torch.utils.data.IterableDataset):
    """What a loader worker runs as: its priority and its SIGTERM handler."""
    seed, epoch, pass_ = 0, 1, 0

    def __iter__(self):
        import signal
        yield {"nice": os.nice(0), "sigterm_ignored": signal.getsignal(signal.SIGTERM) == signal.SIG_IGN}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the workers keep their priority")
def test_cpu_loader_workers_run_at_the_lowest_priority_and_outlive_sigterm():
    """Without a GPU the workers share the step's cores: they run at nice 19, so the step's threads are not
    stalled. Everywhere, they ignore SIGTERM (the training process stops after its step and ends them)."""
    from negft.data.pipeline import loader
    report = next(iter(loader(_WorkerReport(), workers=1)))
    assert report["sigterm_ignored"] and report["nice"] == 19
    assert os.nice(0) < 19                 # the training process keeps its priority


def test_shard_note_names_uneven_splits():
    from negft.data.pipeline import shard_note
    assert shard_note(["a"] * 16, 8, False) is None and shard_note(["a"] * 3, 8, True) is None
    assert "every reader decodes every shard" in shard_note(["a"] * 3, 8, False)
    assert "4 reader(s) read one shard more" in shard_note(["a"] * 12, 8, False)


def _same_as_deepspeed() -> tuple[bool, int, bool]:
    """(the two engines' weights equal, how many weights moved, the unreached parameter decayed) after three
    fp32 steps: SkipNonFiniteAdamW on the one-rank engine without its all-reduce, and the loop before."""
    import deepspeed
    from negft.config import Config
    from negft.train.engine import (deepspeed_config, init_distributed, make_optimizer, own_clipping,
                                    skip_one_rank_allreduce)
    from negft.train.task import build_task
    init_distributed()
    g = torch.Generator().manual_seed(1)
    batches = [{"contrastive": {"images": torch.randn(4, 3, 64, 64, generator=g) * 3,
                                "texts": torch.randint(1, 400, (4, 32), generator=g)}} for _ in range(3)]
    weights = []
    for ours in (True, False):
        torch.manual_seed(0)
        task = build_task(models.build("negft-tiny", "").model, Config().loss)
        task.unreached = torch.nn.Parameter(torch.ones(4, 8))    # trained, but the loss never reaches it
        cfg = Config()
        cfg.optim.lr, cfg.optim.grad_clip = 1e-2, 0.5
        assert own_clipping(cfg, 1)
        ds = deepspeed_config(cfg, 4)
        if ours:
            optimizer = make_optimizer(task, cfg, cfg.optim.grad_clip)
        else:   # the loop before: PyTorch's fused AdamW over two groups, DeepSpeed clipping
            decay = [p for n, p in task.named_parameters() if p.ndim >= 2 and "logit_scale" not in n]
            rest = [p for n, p in task.named_parameters() if not (p.ndim >= 2 and "logit_scale" not in n)]
            optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                           {"params": rest, "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.98), eps=1e-6,
                                          fused=True)
            ds["gradient_clipping"] = cfg.optim.grad_clip
        engine, *_ = deepspeed.initialize(model=task, optimizer=optimizer, config=ds)
        if ours:
            skip_one_rank_allreduce(engine, optimizer, 1)
            assert not engine.enable_backward_allreduce
        for b in batches:
            loss, _ = engine(b)
            engine.backward(loss)
            engine.step()
        weights.append([p.detach().clone() for p in task.parameters()])
    same = all(torch.equal(a, b) for a, b in zip(*weights))
    torch.manual_seed(0)
    initial = list(models.build("negft-tiny", "").model.parameters())
    moved = sum(not torch.equal(a, b) for a, b in zip(weights[0], initial))
    decayed = bool((weights[0][-1] < 1).all())
    return same, moved, decayed


def test_fp32_steps_are_bit_identical_to_deepspeeds_clipping_and_pytorchs_adamw():
    """fp32 on CPU keeps its results: SkipNonFiniteAdamW's clipping (the global norm summed in the module's order), the
    regrouped parameters, its skip through ``found_inf`` and the one-rank engine without its all-reduce give the
    weights DeepSpeed's clipping and all-reduce with PyTorch's fused two-group AdamW gave, bit for bit, a parameter the
    loss never reaches included (the all-reduce gives it a zero gradient, so its weight decays)."""
    with process_state():
        same, moved, decayed = _same_as_deepspeed()
    assert same is True and moved > 10 and decayed is True
