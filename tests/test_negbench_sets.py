"""NegBench's evaluation sets in their released layouts (m1k2zoo/negbench): COCO / VOC2007 MCQ with NegBench's
positional option templates, HardNeg-Syn MCQ and retrieval, CheXpert's binary MCQ, MSR-VTT retrieval and MCQ from
4 uniformly sampled frames per video; stand-in features with known scores, tie-aware and official (argmax)."""
import ast
import csv
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from negft.probes.base import Dataset, EvalContext

MCQ_COLUMNS = ["correct_answer", "caption_0", "caption_1", "caption_2", "caption_3", "correct_answer_template",
               "image_path"]


def _unit(*weights, d=8):
    v = torch.zeros(d)
    for i, w in weights:
        v[i] += w
    return F.normalize(v, dim=0)


def _ctx(images: dict, texts: dict):
    ctx = EvalContext(torch.nn.Linear(1, 1), None, None, "cpu", n_boot=20)
    ctx._images.update({str(k): v for k, v in images.items()})
    ctx._texts.update(texts)
    return ctx


def _write_csv(path: Path, columns, rows):
    """As pandas' to_csv writes NegBench's files (index=False; lists as str(list))."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(rows)


def _world_images(cache, n, folder: Path):
    """``n`` world images copied into ``folder`` (a released set's image folder)."""
    src = cache / "world-s0-tiny" / "test" / "images"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        out.append(folder / f"{i:06d}.png")
        shutil.copyfile(src / f"{i:06d}.png", out[-1])
    return out


def test_coco_mcq_all_ties_answer_first_tie_aware_is_chance_official_wins_every_tie(tmp_path, cache):
    """COCO_val_mcq.csv as create_mcq.py writes it (answer at index 0); all option scores equal: negft's acc 1/4,
    NegBench's argmax 1.0, and the official pick is always the answer (its template)."""
    from negft.probes.mcq_neg import run
    imgs = _world_images(cache, 3, tmp_path / "val2017")
    rows, texts = [], {}
    for i, (img, tmpl) in enumerate(zip(imgs, ("positive", "negative", "hybrid"))):
        opts = [f"q{i} right", f"q{i} features N, but not B", f"q{i} features N", f"q{i} does not feature A"]
        rows.append([0, *opts, tmpl, str(img)])                  # absolute paths, as the release's CSVs hold
        texts.update({o: _unit((0, 1)) for o in opts})
    _write_csv(tmp_path / "COCO_val_mcq.csv", MCQ_COLUMNS, rows)
    res = run(_ctx({p: _unit((0, 1)) for p in imgs}, texts), Dataset("coco", tmp_path, "negbench_coco"))
    m = res.metrics
    assert m["mcq_neg/coco/acc"] == pytest.approx(0.25) and m["mcq_neg/coco/acc_official"] == 1.0
    for label in ("affirmation", "negation", "hybrid"):
        assert m[f"mcq_neg/coco/acc_{label}"] == pytest.approx(0.25) and m[f"mcq_neg/coco/acc_{label}_official"] == 1
        assert m[f"mcq_neg/coco/chose_{label}_official"] == pytest.approx(1 / 3)     # the pick is the answer
    assert not res.skipped


def test_coco_mcq_known_picks_and_positional_templates(tmp_path, cache):
    """Wrong options take NegBench's positional templates (1 hybrid, 2 affirmation, 3 negation), whatever
    their wording: here every option reads as an affirmation, yet picks of 1 / 3 count as hybrid / negation."""
    from negft.probes.mcq_neg import run
    imgs = _world_images(cache, 4, tmp_path / "val2017")
    opts = [[f"r{i} {j}" for j in range(4)] for i in range(4)]
    pick = [0, 1, 3, 2]                                # the option each image's features point at
    rows = [[0, *o, "negative", str(p)] for o, p in zip(opts, imgs)]
    texts = {o[j]: _unit((j, 1)) for o in opts for j in range(4)}
    images = {p: _unit((k, 1)) for p, k in zip(imgs, pick)}
    _write_csv(tmp_path / "COCO_val_mcq.csv", MCQ_COLUMNS, rows)
    res = run(_ctx(images, texts), Dataset("coco", tmp_path, "negbench_coco"))
    m = res.metrics
    assert m["mcq_neg/coco/acc"] == m["mcq_neg/coco/acc_official"] == pytest.approx(1 / 4)
    assert m["mcq_neg/coco/chose_negation"] == pytest.approx(2 / 4)      # the answer (negative) and index 3
    assert m["mcq_neg/coco/chose_hybrid"] == pytest.approx(1 / 4)
    assert m["mcq_neg/coco/chose_affirmation"] == pytest.approx(1 / 4)
    assert [r["option_templates"] for r in res.records["mcq_neg/coco"]][0] == \
        ["negative", "hybrid", "positive", "negative"]


def test_paraphrased_coco_reads_its_own_file_and_the_world_phrasings_by_wording():
    from negft import phrasings
    from negft.probes.mcq_neg import option_template
    for table in (phrasings.MCQ_TRAIN, phrasings.MCQ_HELD_OUT):
        for kind, templates in table.items():
            for t in templates:
                text = t.format(p="a small red star", q="a blue circle", qn="blue circle", Q="A blue circle")
                assert option_template(text) == kind, text
    assert option_template("This image features a dog, but not a cat") == "hybrid"
    assert option_template("This image does not feature a dog") == "negative"
    assert option_template("This image features a dog and a cat") == "positive"


def test_hardneg_syn_mcq_answer_anywhere_and_retrieval_v1_v2(tmp_path, cache):
    """synthetic_mcq.csv: the answer's index varies (NegBench's is_synthetic map 0 affirmation, 1-2 hybrid,
    3 negation); all ties: tie-aware 1/4, official only where the answer is first. synthetic_retrieval_v1/v2:
    filepath, captions (str(list)); all ties: r1 = 1/N; r1_official: the captions of the one image topk returns
    for every query (whichever it is, 2 of 8), i2t_r1_official: the image of the one caption it returns."""
    from negft.probes.mcq_neg import run
    from negft.probes.retrieval import run_retrieval, run_retrieval_neg
    imgs = _world_images(cache, 4, tmp_path / "hardneg")
    answers, templates = [0, 1, 2, 3], ["positive", "hybrid", "hybrid", "negative"]
    rows, texts = [], {}
    for i, (img, a) in enumerate(zip(imgs, answers)):
        opts = [f"s{i} option {j}" for j in range(4)]
        rows.append([a, *opts, templates[a], str(img)])
        texts.update({o: _unit((0, 1)) for o in opts})
    _write_csv(tmp_path / "synthetic_mcq.csv", MCQ_COLUMNS, rows)
    for name, word in (("synthetic_retrieval_v1.csv", "a"), ("synthetic_retrieval_v2.csv", "no")):
        _write_csv(tmp_path / name, ["filepath", "captions"],
                   [[str(p), str([f"{word} caption {i}", f"{word} other {i}"])] for i, p in enumerate(imgs)])
        texts.update({f"{word} {k} {i}": _unit((0, 1)) for i in range(4) for k in ("caption", "other")})
    ds = Dataset("hardneg_syn", tmp_path, "negbench_hardneg_syn")
    ctx = _ctx({p: _unit((0, 1)) for p in imgs}, texts)
    res = run(ctx, ds)
    m = res.metrics
    assert m["mcq_neg/hardneg_syn/acc"] == pytest.approx(0.25)
    assert m["mcq_neg/hardneg_syn/acc_official"] == pytest.approx(0.25)        # only the row with answer 0
    assert m["mcq_neg/hardneg_syn/chose_affirmation_official"] == 1.0          # argmax: index 0, positive
    assert res.records["mcq_neg/hardneg_syn"][3]["option_templates"] == ["positive", "hybrid", "hybrid", "negative"]
    for probe, run_probe in (("retrieval", run_retrieval), ("retrieval_neg", run_retrieval_neg)):
        m = run_probe(ctx, ds).metrics
        assert m[f"{probe}/hardneg_syn/r1"] == pytest.approx(1 / 4)
        assert m[f"{probe}/hardneg_syn/r1_official"] == pytest.approx(2 / 8)   # the 2 captions of topk's image
        assert m[f"{probe}/hardneg_syn/i2t_r1"] == pytest.approx(2 / 8)
        assert m[f"{probe}/hardneg_syn/i2t_r1_official"] == pytest.approx(1 / 4)   # the image of topk's caption
        assert m[f"{probe}/hardneg_syn/r5"] == 1.0


def test_chexpert_binary_mcq_two_options_no_template_column(tmp_path, cache):
    """chexpert_binary_mcq.csv: image_path, caption_0, caption_1, correct_answer (2 options, answer's index
    varies). Known picks, then all ties: tie-aware 1/2, official the share with the answer at index 0."""
    from negft.probes.mcq_neg import run
    imgs = _world_images(cache, 4, tmp_path / "chexpert")
    yes, no = "This image shows Lung Opacity.", "This image does not show Lung Opacity."
    answers = [0, 1, 0, 0]
    _write_csv(tmp_path / "chexpert_binary_mcq.csv", ["image_path", "caption_0", "caption_1", "correct_answer"],
               [[str(p), yes, no, a] for p, a in zip(imgs, answers)])
    ds = Dataset("chexpert", tmp_path, "negbench_chexpert")
    texts = {yes: _unit((0, 1)), no: _unit((1, 1))}
    picks = [0, 0, 1, 0]                                         # right, wrong, wrong, right
    m = run(_ctx({p: _unit((k, 1)) for p, k in zip(imgs, picks)}, texts), ds).metrics
    assert m["mcq_neg/chexpert/acc"] == m["mcq_neg/chexpert/acc_official"] == pytest.approx(0.5)
    assert not any(k.startswith("mcq_neg/chexpert/acc_affirmation") for k in m)     # no template column
    assert m["mcq_neg/chexpert/chose_negation"] == pytest.approx(0.25)              # the wording rule
    tied = run(_ctx({p: _unit((0, 1)) for p in imgs}, {yes: _unit((0, 1)), no: _unit((0, 1))}), ds).metrics
    assert tied["mcq_neg/chexpert/acc"] == pytest.approx(0.5)
    assert tied["mcq_neg/chexpert/acc_official"] == pytest.approx(3 / 4)


def test_msrvtt_frames_sampled_as_negbench_samples_them():
    from negft.probes.video import uniform_indices
    assert uniform_indices(100) == [12, 36, 62, 86]
    assert uniform_indices(6) == [0, 2, 2, 4]               # NegBench's rounding repeats a frame here


def test_msrvtt_retrieval_and_mcq_average_four_frames(tmp_path, cache):
    """data/videos/: msr_vtt_retrieval.csv and msr_vtt_mcq_rephrased_llama.csv name .mp4 files; their frames
    were extracted beside them (video<k>/<n>.png; the .mp4 files are absent); 4 are picked, their features
    averaged. A video with neither file nor frames is skipped with its reason."""
    from negft.probes.mcq_neg import run
    from negft.probes.retrieval import run_retrieval
    from negft.probes.video import frames, uniform_indices
    src = sorted((cache / "world-s0-tiny" / "test" / "images").glob("0000*.png"))
    videos = tmp_path / "videos"
    frame_feats = {}
    for v, n in ((0, 100), (1, 4)):                       # all 100 frames, or the 4 already sampled
        folder = videos / f"video{v}"
        folder.mkdir(parents=True)
        for k in range(n):
            path = folder / f"{k + 1:05d}.png"
            shutil.copyfile(src[k % len(src)], path)
            frame_feats[path] = _unit((v, 1)) if k % 2 == 0 else _unit((2, 1))    # half the frames show "2"
    picked = frames(str(videos / "video0.mp4"), {"frames": 4}, tmp_path)
    assert [Path(p).name for p in picked] == [f"{i + 1:05d}.png" for i in uniform_indices(100)]
    assert len(frames(str(videos / "video1.mp4"), {"frames": 4}, tmp_path)) == 4
    _write_csv(videos / "msr_vtt_retrieval.csv", ["filepath", "captions"],
               [["video0.mp4", str(["a man cooks"])], ["video1.mp4", str(["a dog runs"])],
                ["video9.mp4", str(["no frames here"])]])
    _write_csv(videos / "msr_vtt_mcq_rephrased_llama.csv", MCQ_COLUMNS,
               [[0, "a man cooks", "a man cooks, but not a dog", "a dog", "no man", "positive", "video0.mp4"]])
    mixed = lambda v: F.normalize(_unit((v, 1)) + _unit((2, 1)), dim=0)        # noqa: E731
    texts = {"a man cooks": mixed(0), "a dog runs": mixed(1), "a man cooks, but not a dog": _unit((0, 1)),
             "a dog": _unit((1, 1)), "no man": _unit((2, 1))}
    # video0's 4 picked frames (12, 36, 62, 86: even) all show video 0; video1's 4 alternate: the mean of 0 and 2
    ds = Dataset("msrvtt", videos, "negbench_msrvtt")
    ctx = _ctx(frame_feats, texts)
    res = run_retrieval(ctx, ds)
    assert res.metrics["retrieval/msrvtt/r1"] == 1.0 and res.metrics["retrieval/msrvtt/r1_official"] == 1.0
    assert res.metrics["retrieval/msrvtt/skipped_rows"] == 1
    assert (f"video file not found, nor frames extracted from it (relative paths are read under {videos}, not "
            "the working directory as NegBench's loader reads them): 1") in res.skipped["retrieval/msrvtt/rows"]
    m = run(ctx, ds).metrics
    assert m["mcq_neg/msrvtt/acc"] == 0.0                  # video0 (all "0" frames) picks "a man cooks, but..."
    assert m["mcq_neg/msrvtt/chose_hybrid"] == 1.0


def test_missing_and_malformed_files_are_skipped_with_their_reason(tmp_path, cache):
    from negft.probes.mcq_neg import run
    from negft.probes.retrieval import run_retrieval
    ctx = _ctx({}, {})
    res = run(ctx, Dataset("chexpert", tmp_path / "nowhere", "negbench_chexpert"))
    msg = res.skipped["mcq_neg/chexpert"]
    assert "nowhere/chexpert_binary_mcq.csv" in msg and "data_manifests/negbench_chexpert.yaml" in msg
    assert not res.metrics
    _write_csv(tmp_path / "chexpert_binary_mcq.csv", ["image_path", "caption_0", "caption_1"], [["a.png", "x", "y"]])
    assert "lacks column(s) correct_answer" in run(ctx, Dataset("chexpert", tmp_path, "negbench_chexpert")).skipped[
        "mcq_neg/chexpert"]
    # rows: an empty option and a missing image file (skipped: NegBench's evaluation fails on them), an answer out
    # of range (scored: a miss officially, left out of acc); the good row is scored
    imgs = _world_images(cache, 1, tmp_path / "img")
    _write_csv(tmp_path / "chexpert_binary_mcq.csv", ["image_path", "caption_0", "caption_1", "correct_answer"],
               [[str(imgs[0]), "x", "y", 0], [str(imgs[0]), "x", "y", 2], [str(imgs[0]), "", "y", 0],
                [str(tmp_path / "gone.png"), "x", "y", 1]])
    ctx = _ctx({imgs[0]: _unit((0, 1))}, {"x": _unit((0, 1)), "y": _unit((1, 1))})
    res = run(ctx, Dataset("chexpert", tmp_path, "negbench_chexpert"))
    assert res.metrics["mcq_neg/chexpert/acc"] == 1.0 and res.metrics["mcq_neg/chexpert/acc_official"] == 0.5
    assert res.metrics["mcq_neg/chexpert/skipped_rows"] == 2
    why = res.skipped["mcq_neg/chexpert/rows"]
    assert "empty option: 1" in why and "image file not found" in why and "2 of 4 rows" in why
    assert "1 of 2 questions have no right option" in res.skipped["mcq_neg/chexpert/acc"]
    _write_csv(tmp_path / "COCO_val_retrieval.csv", ["filepath", "captions"],
               [[str(imgs[0]), "['x']"], [str(imgs[0]), "not a list"], [str(imgs[0]), "[]"]])
    res = run_retrieval(ctx, Dataset("coco", tmp_path, "negbench_coco"))
    assert res.metrics["retrieval/coco/skipped_rows"] == 1
    assert res.metrics["retrieval/coco/r1"] == 0.5          # the [] row's image (the same file) ties with x's


def _topk_hits(scores, positive, k):
    """NegBench's recall_at_k(...) > 0, averaged: a hit when torch.topk(scores, k) returns a positive."""
    top = torch.topk(scores, min(k, scores.shape[1]), dim=1).indices
    return positive.gather(1, top).any(1).float().mean().item()


@pytest.mark.parametrize("d", [8, 512])
def test_retrieval_official_is_negbench_topk_on_a_duplicated_image(tmp_path, cache, d):
    """COCO_val_retrieval.csv naming one image in four rows: its four gallery columns tie exactly, also at a
    model's width (512, random features). The official recalls are NegBench's: a hit when torch.topk of
    texts @ images.T (or its transpose) returns a positive, whichever column topk returns (not the lower
    index); r<k> shares the tie (1/4 each at k = 1)."""
    from negft.probes.retrieval import run_retrieval
    a, b, c = (str(p) for p in _world_images(cache, 3, tmp_path / "val2014"))
    rows = [[a, ["a one"]], [b, ["b one"]], [a, ["a two", "a three", "a four"]], [c, ["c one"]], [a, ["a five"]],
            [a, ["a six", "a seven"]]]
    _write_csv(tmp_path / "COCO_val_retrieval.csv", ["filepath", "captions"], [[p, str(caps)] for p, caps in rows])
    if d == 8:
        images = {a: _unit((0, 1)), b: _unit((1, 1)), c: _unit((2, 1))}
    else:
        images = dict(zip((a, b, c), F.normalize(torch.randn(3, d, generator=torch.Generator().manual_seed(0)), dim=-1)))
    texts = {t: images[p] for p, caps in rows for t in caps}          # every caption equals its image
    if d > 8:                                                         # ... or lies near it
        noise = torch.randn(len(texts), d, generator=torch.Generator().manual_seed(1))
        texts = {t: F.normalize(v + 0.02 * e, dim=0) for (t, v), e in zip(texts.items(), noise)}
    m = run_retrieval(_ctx(images, texts), Dataset("coco", tmp_path, "negbench_coco")).metrics
    scores = torch.stack([texts[t] for _, caps in rows for t in caps]) @ torch.stack([images[p] for p, _ in rows]).T
    row_of = torch.tensor([i for i, (_, caps) in enumerate(rows) for _ in caps])
    positive = row_of.view(-1, 1) == torch.arange(len(rows)).view(1, -1)            # (caption, row)
    for k in (1, 5, 10):
        assert m[f"retrieval/coco/r{k}_official"] == pytest.approx(_topk_hits(scores, positive, k))
        assert m[f"retrieval/coco/i2t_r{k}_official"] == pytest.approx(_topk_hits(scores.T, positive.T, k))
    assert m["retrieval/coco/r1"] == pytest.approx((7 / 4 + 2) / 9)      # a's 7 captions: 1/4 each; b, c: 1
    assert m["retrieval/coco/i2t_r1"] == pytest.approx(0.5)   # a's rows: 1, 3, 1, 2 of the 7 tied captions; b, c: 1
    assert m["retrieval/coco/r5"] == m["retrieval/coco/r5_official"] == 1.0


def test_retrieval_row_without_captions_stays_in_the_gallery(tmp_path, cache):
    """A row whose captions are [] (NegBench keeps it): its image is a distractor for text→image and an
    image→text query with no positive, which NegBench's recall scores 0 / 0 = nan, not > 0: a miss in
    i2t_r<k>_official; negft's i2t_r<k> leaves it out and says so. An empty cell or a non-list, on which
    NegBench's loader fails, is skipped."""
    from negft.probes.retrieval import run_retrieval
    a, b, c, d = (str(p) for p in _world_images(cache, 4, tmp_path / "val2014"))
    _write_csv(tmp_path / "COCO_val_retrieval.csv", ["filepath", "captions"],
               [[a, str(["a one"])], [b, "[]"], [c, str(["c one"])], [d, ""], [d, "not a list"]])
    images = {a: _unit((0, 1)), b: _unit((1, 1)), c: _unit((2, 1)), d: _unit((3, 1))}
    texts = {"a one": _unit((0, 0.6), (1, 0.8)), "c one": _unit((2, 1))}      # "a one" is nearer b than a
    res = run_retrieval(_ctx(images, texts), Dataset("coco", tmp_path, "negbench_coco"))
    m = res.metrics
    assert m["retrieval/coco/r1"] == m["retrieval/coco/r1_official"] == pytest.approx(1 / 2)
    assert m["retrieval/coco/i2t_r1"] == 1.0                               # a and c find their caption
    assert m["retrieval/coco/i2t_r1_official"] == m["retrieval/coco/i2t_r5_official"] == pytest.approx(2 / 3)
    assert "1 of 3 images have no caption" in res.skipped["retrieval/coco/i2t"]
    assert m["retrieval/coco/skipped_rows"] == 2
    why = res.skipped["retrieval/coco/rows"]
    assert "empty captions cell: 1" in why and "captions not a list of strings: 1" in why


def test_mcq_cells_read_as_negbench_reads_them_with_pandas(tmp_path, cache):
    """synthetic_mcq.csv (answers anywhere). NegBench reads it with pandas: correct_answer "2.0" and " 1 " are
    2 and 1; an empty one (NaN) or 4 is no option: a miss in every _official (NegBench's argmax never equals it),
    left out of acc. An option that is empty or exactly a pandas NA string ("None", "null") is NaN, on which
    NegBench's evaluation fails, as on a correct_answer that is no number: skipped. An option of spaces is a
    string to pandas: scored."""
    from negft.probes.mcq_neg import PANDAS_NA, run
    assert {"", "NA", "None", "null", "n/a", "nan", "NaN"} <= PANDAS_NA and " NA" not in PANDAS_NA
    imgs = _world_images(cache, 9, tmp_path / "hardneg")
    # (correct_answer, template, the option the image points at, {option index: cell})
    plan = [("2.0", "hybrid", 2, {}), (" 1 ", "hybrid", 1, {}), ("", "positive", 0, {}), ("4", "negative", 3, {}),
            ("3", "negative", 3, {1: "   "}), ("0", "positive", 0, {2: "None"}), ("0", "positive", 0, {3: "null"}),
            ("two", "positive", 0, {}), ("0", "positive", 0, {0: ""})]
    rows, texts, images = [], {"   ": _unit((1, 1))}, {}
    for i, (img, (answer, template, pick, cells)) in enumerate(zip(imgs, plan)):
        opts = [cells.get(j, f"r{i} {j}") for j in range(4)]
        rows.append([answer, *opts, template, str(img)])
        texts.update({f"r{i} {j}": _unit((j, 1)) for j in range(4)})
        images[img] = _unit((pick, 1))
    _write_csv(tmp_path / "synthetic_mcq.csv", MCQ_COLUMNS, rows)
    res = run(_ctx(images, texts), Dataset("hardneg_syn", tmp_path, "negbench_hardneg_syn"))
    m = res.metrics
    assert m["mcq_neg/hardneg_syn/acc"] == 1.0                         # rows 0, 1, 4
    assert m["mcq_neg/hardneg_syn/acc_official"] == pytest.approx(3 / 5)     # and the misses 2, 3
    assert m["mcq_neg/hardneg_syn/acc_hybrid_official"] == 1.0
    assert m["mcq_neg/hardneg_syn/acc_negation"] == 1.0 and m["mcq_neg/hardneg_syn/acc_negation_official"] == 0.5
    assert m["mcq_neg/hardneg_syn/acc_affirmation_official"] == 0.0 and "mcq_neg/hardneg_syn/acc_affirmation" not in m
    assert "2 of 5 questions have no right option" in res.skipped["mcq_neg/hardneg_syn/acc"]
    assert m["mcq_neg/hardneg_syn/skipped_rows"] == 4
    why = res.skipped["mcq_neg/hardneg_syn/rows"]
    assert "option pandas reads as NaN (NA, None, null, ...): 2" in why and "empty option: 1" in why
    assert "correct_answer not a number: 1" in why
    assert [r["credit"] for r in res.records["mcq_neg/hardneg_syn"]] == [1.0, 1.0, None, None, 1.0]


def test_real_manifests_name_released_files_and_serve_their_probes(tmp_path, monkeypatch):
    """Every NegBench manifest names, for each probe it serves, a file it lists; on an empty $NEGFT_DATA each
    is skipped with its path."""
    from negft.data import manifests
    from negft.evaluation import datasets_for
    from negft.probes import PROBES
    monkeypatch.setenv("NEGFT_DATA", str(tmp_path))
    ctx = _ctx({}, {})
    seen = set()
    for ds in datasets_for(None):
        man = manifests.load(ds.manifest)
        if not ds.manifest.startswith(("negbench_", "imagenet")):
            continue
        seen.add(ds.name)
        for probe in ds.probes:
            if probe in man.get("probe_files", {}):
                assert man["probe_files"][probe] in man["files"]
            if probe in ("mcq_neg", "retrieval", "retrieval_neg", "zeroshot"):
                res = PROBES[probe](ctx, ds)
                assert not res.metrics and str(tmp_path) in res.skipped[f"{probe}/{ds.name}"]
    assert {"coco", "coco_paraphrased", "voc2007", "voc2007_paraphrased", "hardneg_syn", "hardneg_syn_paraphrased",
            "chexpert", "chexpert_control", "msrvtt", "imagenet", "imagenetv2"} <= seen


def test_no_probe_imports_the_worlds_text_or_annotation_code():
    root = Path(__file__).resolve().parent.parent / "negft" / "probes"
    for name in ("zeroshot", "mcq_neg", "retrieval", "video", "released", "imagenet_wnids"):
        tree = ast.parse((root / f"{name}.py").read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.startswith("negft.world.generator")], name
        assert "annotations.jsonl" not in (root / f"{name}.py").read_text(), name


def test_probes_run_on_the_tiny_world(cache):
    """mcq_neg / retrieval / zeroshot on the world's split: every metric present and in range; with no exact
    ties in a real model's scores, official and tie-aware agree."""
    from negft import models
    from negft.evaluation import run_suite
    torch.manual_seed(0)
    b = models.build("negft-tiny", "")
    res = run_suite(b.model, b.preprocess_val, b.tokenizer, [Dataset("world", cache / "world-s0-tiny" / "val")],
                   "mcq_neg,retrieval,retrieval_neg,zeroshot", n_boot=20)
    m = res.metrics
    assert not res.skipped
    for key in ("mcq_neg/world/acc", "retrieval/world/r5", "retrieval_neg/world/i2t_r5", "zeroshot/world/top1",
                "zeroshot/world/top5", "zeroshot/world/mean_per_class_recall"):
        assert 0 <= m[key] <= 1 and m[key] == pytest.approx(m[key + "_official"])
    assert m["mcq_neg/world/chose_affirmation"] + m["mcq_neg/world/chose_negation"] + \
        m["mcq_neg/world/chose_hybrid"] == pytest.approx(1.0)
