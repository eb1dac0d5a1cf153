"""Training streams: malformed samples are skipped and counted; resampled streams are seeded and endless."""
import json
import tarfile

import torch

from negft import models
from negft.data.pipeline import EpochBatches, Stream, StreamSpec, loader
from tests.conftest import write_shard


def _good_samples(cache, n, split="finetune"):
    """The first ``n`` samples (name -> {ext: bytes}) of the tiny world's first shard of ``split``."""
    shard = sorted((cache / "world-s0-tiny" / split).glob("*.tar"))[0]
    samples = {}
    with tarfile.open(shard) as tf:
        for m in tf.getmembers():
            key, ext = m.name.split(".", 1)
            samples.setdefault(key, {})[ext] = tf.extractfile(m).read()
    return list(samples.items())[:n]


def _bundle():
    return models.build("negft-tiny", "")


def test_malformed_samples_are_skipped_and_counted(cache, tmp_path):
    """(Each fault by its reason: tests/test_faults_data.py.) A sample without the stream's field is another
    stream's, passed over and counted apart, not a fault."""
    good = _good_samples(cache, 12)
    png = good[0][1]["png"]
    meta = json.loads(good[0][1]["json"])
    bad = [
        ("bad-no-mcq", {"png": png, "json": json.dumps({k: v for k, v in meta.items() if k != "mcq"}).encode()}),
        ("bad-answer", {"png": png, "json": json.dumps({**meta, "mcq": {**meta["mcq"], "answer": 7}}).encode()}),
        ("bad-three-options", {"png": png, "json": json.dumps(
            {**meta, "mcq": {**meta["mcq"], "options": meta["mcq"]["options"][:3]}}).encode()}),
        ("bad-json", {"png": png, "json": b"{not json"}),
        ("bad-image", {"png": b"\x89PNG broken", "json": good[0][1]["json"]}),
        ("bad-no-image", {"json": good[0][1]["json"]}),
    ]
    mixed = [x for pair in zip(good[:6], bad) for x in pair] + good[6:]
    write_shard(tmp_path / "shard-000000.tar", mixed)
    b = _bundle()
    spec = StreamSpec([str(tmp_path / "shard-000000.tar")], "mcq", "mcq", batch_size=1)
    # in shard order (no shuffle) every bad sample comes before the 12th good one
    batches = EpochBatches(Stream(spec, b.preprocess_val, b.tokenizer, seed=0, shuffle_buffer=1), workers=0)
    got = list(batches.epoch(1, steps=12))
    assert len(got) == 12 and all(x["options"].shape[:2] == (1, 4) for x in got)
    assert batches.skipped == len(bad) - 1 and batches.tally.other_stream == 1
    assert batches.tally.read == 12 + len(bad) - 1
    # shuffled, a whole pass still reports every skip, including those after the last full batch
    stream = Stream(spec, b.preprocess_val, b.tokenizer, seed=0)
    stream.set_epoch(1)
    items = list(loader(stream, workers=0))
    assert sum("images" in x for x in items) == 12
    assert sum(int(x["skipped"]) for x in items) == len(bad) - 1
    assert sum(x["tally"]["other_stream"] for x in items) == 1


def test_resampled_stream_is_seeded_and_never_runs_dry(cache):
    shards = sorted(str(p) for p in (cache / "world-s0-tiny" / "finetune").glob("*.tar"))
    b = _bundle()

    def first_batches(epoch, steps):
        stream = Stream(StreamSpec(shards, "contrastive", "caption", batch_size=32, resampled=True),
                        b.preprocess_val, b.tokenizer, seed=0)
        return [x["texts"] for x in EpochBatches(stream, workers=0).epoch(epoch, steps)]

    n_samples = 300                    # the tiny world's finetune split
    long = first_batches(1, steps=n_samples // 32 + 5)        # more batches than one exact pass holds
    assert len(long) == n_samples // 32 + 5
    again = first_batches(1, steps=3)
    assert all(torch.equal(a, b_) for a, b_ in zip(long[:3], again))
    other = first_batches(2, steps=3)
    assert not all(torch.equal(a, b_) for a, b_ in zip(again, other))


def test_itm_batches_pad_negatives_and_flag_negative_images(cache, tmp_path):
    from negft.data.pipeline import MAX_NEGATIVES
    good = _good_samples(cache, 6, split="relcomp")
    with_image = [(k, m) for k, m in good if "neg.png" in m]
    key, members = with_image[0]
    meta = json.loads(members["json"])
    rel = meta["relcomp"]
    one_negative = {**meta, "relcomp": {**rel, "negatives": rel["negatives"][:1], "negative_image": None}}
    samples = [   # in shard order: the malformed ones first, so the one batch counts them
        ("a-bad-no-negatives", {"png": members["png"],
                                "json": json.dumps({**meta, "relcomp": {**rel, "negatives": []}}).encode()}),
        ("b-bad-no-relcomp", {"png": members["png"], "json": json.dumps(
            {k: v for k, v in meta.items() if k != "relcomp"}).encode()}),
        ("c-full", members),                                                   # 3 negatives + image
        ("d-one-neg-no-image", {"png": members["png"], "json": json.dumps(one_negative).encode()}),
    ]
    write_shard(tmp_path / "shard-000000.tar", samples)
    b = _bundle()
    spec = StreamSpec([str(tmp_path / "shard-000000.tar")], "itm", "relcomp", batch_size=2)
    batches = EpochBatches(Stream(spec, b.preprocess_val, b.tokenizer, seed=0, shuffle_buffer=1), workers=0)
    (batch,) = list(batches.epoch(1, steps=1))
    assert batches.skipped == 1 and batches.tally.other_stream == 1      # no negatives; no relcomp field
    assert batch["negatives"].shape[:2] == (2, MAX_NEGATIVES)
    assert len(rel["negatives"]) == 3 < MAX_NEGATIVES                    # the world's three kinds, padded
    assert batch["negative_mask"].tolist() == [[True] * 3 + [False], [True] + [False] * (MAX_NEGATIVES - 1)]
    assert batch["has_negative_image"].tolist() == [True, False]
    assert torch.equal(batch["texts"][0], b.tokenizer([rel["caption"]])[0])
    assert torch.equal(batch["negatives"][0, 2], b.tokenizer([rel["negatives"][2]["text"]])[0])
    assert not torch.equal(batch["negative_images"][0], batch["images"][0])   # the hard negative, decoded
    assert not batch["negative_images"][1].any()                               # absent: zeros


def test_an_itm_stream_reads_negmcq_questions_as_the_right_answer_against_the_other_options(cache, tmp_path):
    """field=mcq on an itm stream (a baseline's loss on NegMCQ's negatives): each question's right answer is the
    caption, the other three options its hard negatives in order, no negative image; a sample without ``mcq`` is
    another stream's and a broken question is skipped and counted, as on an mcq stream."""
    from negft.data.pipeline import MAX_NEGATIVES
    good = _good_samples(cache, 3)
    metas = [json.loads(m["json"]) for _, m in good]
    broken = {**metas[2], "mcq": {**metas[2]["mcq"], "answer": 9}}
    samples = [("a-broken", {"png": good[2][1]["png"], "json": json.dumps(broken).encode()}),
               ("b-no-mcq", {"png": good[2][1]["png"], "json": json.dumps(
                   {k: v for k, v in metas[2].items() if k != "mcq"}).encode()}),
               *good[:2]]
    write_shard(tmp_path / "shard-000000.tar", samples)
    b = _bundle()
    spec = StreamSpec([str(tmp_path / "shard-000000.tar")], "itm", "mcq", batch_size=2)
    batches = EpochBatches(Stream(spec, b.preprocess_val, b.tokenizer, seed=0, shuffle_buffer=1), workers=0)
    (batch,) = list(batches.epoch(1, steps=1))
    assert batches.skipped == 1 and batches.tally.other_stream == 1
    for row, meta in enumerate(metas[:2]):
        options, answer = meta["mcq"]["options"], meta["mcq"]["answer"]
        assert torch.equal(batch["texts"][row], b.tokenizer([options[answer]])[0])
        others = [o for i, o in enumerate(options) if i != answer]
        assert torch.equal(batch["negatives"][row, :3], b.tokenizer(others))
    assert batch["negative_mask"].tolist() == [[True] * 3 + [False] * (MAX_NEGATIVES - 3)] * 2
    assert not batch["has_negative_image"].any()


def test_a_baseline_on_negmcq_is_a_valid_recipe():
    from negft.config import load_config
    cfg = load_config(["recipe=negclip", "data=world", "streams.hard.field=mcq", "streams.hard.world_split=finetune"])
    assert (cfg.streams["hard"].task, cfg.streams["hard"].field) == ("itm", "mcq")
