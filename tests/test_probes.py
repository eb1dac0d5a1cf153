"""Probe metrics on hand-built score matrices with known answers, and the CSV readers."""
import csv
import json

import numpy as np
import pytest
import torch

from negft.probes.base import Dataset, EvalContext, ProbeResult
from negft.probes.stats import bootstrap_ci, choice_credit, choice_shares, pair_credits, part_means, recall_at_k


def test_choice_credit_known_and_ties_give_chance():
    scores = torch.tensor([[0.9, 0.1, 0.2, 0.3],     # right (0) wins
                           [0.1, 0.9, 0.2, 0.3],     # right (3) loses
                           [0.5, 0.5, 0.1, 0.1],     # right (0) tied with one other → 1/2
                           [0.2, 0.2, 0.2, 0.2]])    # all equal → 1/4, never 1
    credit = choice_credit(scores, torch.tensor([0, 3, 0, 0]))
    assert credit.tolist() == [1.0, 0.0, 0.5, 0.25]
    assert choice_shares(scores)[3].tolist() == [0.25] * 4


def test_pair_credits_tie_is_half_for_negft_lost_under_strict_and_won_under_argmax_first():
    pos, neg = torch.tensor([0.9, 0.1, 0.5]), torch.tensor([0.1, 0.9, 0.5])     # win, loss, tie
    tie_aware, strict = pair_credits(pos, neg)
    assert tie_aware.tolist() == [1.0, 0.0, 0.5] and strict.tolist() == [1.0, 0.0, 0.0]
    assert pair_credits(pos, neg, tie_to_positive=True)[1].tolist() == [1.0, 0.0, 1.0]


def test_part_means_micro_over_examples_macro_over_parts():
    micro, macro = part_means([torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64),
                               torch.tensor([0.0], dtype=torch.float64)])
    assert micro.mean().item() == pytest.approx(0.75)
    assert macro.mean().item() == pytest.approx(0.5)      # (1 + 0) / 2, not 3 / 4


def test_skips_noted_per_file_and_counted_once_per_prefix(tmp_path):
    from collections import Counter
    from negft.probes.released import count_skips, file_rows
    result, n = ProbeResult(), 0
    for name, read in (("a", ([{"x": 1}], Counter({"bad": 2}), None)), ("b", ([], Counter({"odd": 1}), None)),
                       ("c", ([], Counter(), "c.json not found"))):
        rows, k = file_rows(result, f"p/{name}", read, tmp_path / f"{name}.json")
        n += k
    count_skips(result, "p", n)
    assert result.metrics == {"p/skipped_rows": 3.0}
    assert result.skipped["p/a/rows"] == f"2 of 3 rows skipped in {tmp_path / 'a.json'} (bad: 2)"
    assert result.skipped["p/b"] == f"no row to score in {tmp_path / 'b.json'}"
    assert result.skipped["p/c"] == "c.json not found" and "p/c/rows" not in result.skipped


def test_all_equal_scores_are_chance_whatever_the_answer_index():
    scores = torch.zeros(100, 4)
    answers = torch.zeros(100, dtype=torch.long)      # NegBench's CSVs: right answer always at index 0
    assert choice_credit(scores, answers).mean().item() == pytest.approx(0.25)


def test_recall_at_k_known_and_ties():
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.0],      # target 0 ranks 1st
                           [0.9, 0.8, 0.1, 0.0],      # target 2 ranks 3rd
                           [0.5, 0.5, 0.5, 0.5]])     # all tied: P(top-k) = k/4
    hits = recall_at_k(scores, torch.tensor([0, 2, 1]), ks=(1, 2, 3))
    assert hits[1].tolist() == [1.0, 0.0, 0.25]
    assert hits[2].tolist() == [1.0, 0.0, 0.5]
    assert hits[3].tolist() == [1.0, 1.0, 0.75]


def test_image_to_text_recall_counts_any_own_caption_and_ties_give_chance():
    from negft.probes.stats import recall_any_at_k
    scores = torch.tensor([[0.9, 0.2, 0.8, 0.1, 0.0],    # own captions 1 and 3: best ranks 3rd
                           [0.5, 0.5, 0.5, 0.5, 0.5]])   # all tied, 2 own of 5: chance
    own = torch.tensor([[False, True, False, True, False],
                        [True, True, False, False, False]])
    hits = recall_any_at_k(scores, own, ks=(1, 2, 3))
    assert hits[1].tolist() == [0.0, pytest.approx(2 / 5)]
    assert hits[2].tolist() == [0.0, pytest.approx(1 - 3 / 10)]          # 1 − C(3,2)/C(5,2)
    assert hits[3].tolist() == [1.0, pytest.approx(1 - 1 / 10)]          # 1 − C(3,3)/C(5,3)


def test_bootstrap_interval_brackets_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    small, large = rng.random(50) < 0.7, rng.random(5000) < 0.7
    lo_s, hi_s = bootstrap_ci(small, 500)
    lo_l, hi_l = bootstrap_ci(large, 500)
    assert lo_s <= small.mean() <= hi_s and lo_l <= large.mean() <= hi_l
    assert hi_l - lo_l < (hi_s - lo_s) / 4
    assert bootstrap_ci(np.ones(10)) == (1.0, 1.0)


def _ctx_with(features_by_path, features_by_text):
    ctx = EvalContext(torch.nn.Linear(1, 1), None, None, "cpu", n_boot=50)
    ctx._images.update({k: torch.nn.functional.normalize(torch.tensor(v, dtype=torch.float), dim=0)
                        for k, v in features_by_path.items()})
    ctx._texts.update({k: torch.nn.functional.normalize(torch.tensor(v, dtype=torch.float), dim=0)
                       for k, v in features_by_text.items()})
    return ctx


def test_mcq_neg_probe_reads_negbench_csv_and_breaks_down_by_template(tmp_path):
    from negft.probes.mcq_neg import run
    rows = [  # image a matches "yes a"; image b: all options equal → chance credit
        {"correct_answer": 1, "caption_0": "no a", "caption_1": "yes a", "caption_2": "x", "caption_3": "y",
         "correct_answer_template": "positive", "image_path": "a.png"},
        {"correct_answer": 0, "caption_0": "p", "caption_1": "q", "caption_2": "r", "caption_3": "s",
         "correct_answer_template": "negative", "image_path": "b.png"},
    ]
    with open(tmp_path / "mcq.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    ctx = _ctx_with({str(tmp_path / "a.png"): [1, 0], str(tmp_path / "b.png"): [0, 1]},
                    {"no a": [0.5, 1], "yes a": [1, 0], "x": [0, 1], "y": [-1, 0],
                     "p": [1, 0], "q": [1, 0], "r": [1, 0], "s": [1, 0]})
    result = run(ctx, Dataset("fx", tmp_path))
    assert result.metrics["mcq_neg/fx/acc_affirmation"] == 1.0
    assert result.metrics["mcq_neg/fx/acc_negation"] == 0.25
    assert result.metrics["mcq_neg/fx/acc"] == pytest.approx(0.625)
    assert "mcq_neg/fx/acc_hybrid" not in result.metrics


def test_missing_probe_data_is_skipped_with_path_and_manifest(tmp_path):
    from negft.probes.retrieval import run_retrieval_neg
    result = run_retrieval_neg(_ctx_with({}, {}), Dataset("coco", tmp_path / "nowhere", "negbench_coco"))
    msg = result.skipped["retrieval_neg/coco"]
    assert "nowhere/COCO_val_negated_retrieval.csv" in msg and "data_manifests/negbench_coco.yaml" in msg
    assert not result.metrics


def test_retrieval_probe_parses_python_style_lists(tmp_path):
    from negft.probes.retrieval import run_retrieval
    with open(tmp_path / "retrieval.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["filepath", "captions"])
        w.writerow(["a.png", "['cap a', 'other a']"])
        w.writerow(["b.png", json.dumps(["cap b"])])
    ctx = _ctx_with({str(tmp_path / "a.png"): [1, 0], str(tmp_path / "b.png"): [0, 1]},
                    {"cap a": [1, 0.1], "other a": [0, 1], "cap b": [0, 1]})
    result = run_retrieval(ctx, Dataset("fx", tmp_path))
    assert result.metrics["retrieval/fx/r1"] == pytest.approx(2 / 3)
    assert result.metrics["retrieval/fx/r5"] == 1.0


def test_winoground_scores_known_and_ties_give_chance():
    from negft.probes.relcomp import winoground_scores
    s = torch.tensor([[[0.9, 0.1], [0.2, 0.8]],     # s[caption, image]: all right
                      [[0.5, 0.1], [0.6, 0.9]],     # image 0 prefers caption 1: text wrong, image right
                      [[0.5, 0.5], [0.5, 0.5]]])    # all equal
    got = winoground_scores(s)
    assert got["text"].tolist() == pytest.approx([1.0, 0.0, 0.25])
    assert got["image"].tolist() == pytest.approx([1.0, 1.0, 0.25])
    assert got["group"].tolist() == pytest.approx([1.0, 0.0, 1 / 6])   # Winoground's chance level


@pytest.mark.parametrize("arch", ["negft-tiny", "ViT-B-32"])
def test_trimmed_text_encoding_equals_open_clip_encode_text(arch):
    """Cutting the padding after the last end-of-text token, and running the last block at the pooled
    positions only, change nothing but float rounding (causal text tower), in the features and (training)
    in the gradients."""
    from negft import models
    from negft.models import encode_text_trimmed
    torch.manual_seed(0)
    b = models.build(arch, "")
    model = b.model.eval()
    tokens = b.tokenizer(["a star", "there is no red circle to the left of a large striped hexagon", "no"])
    with torch.no_grad():
        want = model.encode_text(tokens)
        got = encode_text_trimmed(model, tokens)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    if arch == "negft-tiny":    # training encodes trimmed too: the gradients are the same
        grads = []
        for encode in (model.encode_text, lambda t: encode_text_trimmed(model, t)):
            model.zero_grad()
            encode(tokens).square().sum().backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        assert grads[0].keys() == grads[1].keys()
        for n, want_grad in grads[0].items():       # rounding relative to the largest entry (up to ~500)
            torch.testing.assert_close(grads[1][n], want_grad, rtol=1e-4, atol=1e-6 * float(want_grad.abs().max()),
                                       msg=n)


def test_length_groups_encode_the_fewest_positions():
    """The grouping is the cheapest of every split of the sorted rows into at most K groups (brute force), each
    row in exactly one group, the groups shortest first."""
    import itertools
    import random
    from negft.models import length_groups
    rng = random.Random(0)
    for _ in range(30):
        ends = [rng.randint(1, 12) for _ in range(rng.randint(1, 9))]
        for most in (1, 2, 3):
            groups = length_groups(ends, most)
            assert sorted(i for g in groups for i in g) == list(range(len(ends)))
            assert len(groups) <= most
            assert all(max(ends[i] for i in a) <= min(ends[i] for i in b) for a, b in zip(groups, groups[1:]))
            cost = sum(len(g) * (max(ends[i] for i in g) + 1) for g in groups)
            s = sorted(ends)
            best = min(sum((b - a) * (s[b - 1] + 1) for a, b in zip((0, *cuts), (*cuts, len(s))))
                       for k in range(min(most, len(s)))
                       for cuts in itertools.combinations(range(1, len(s)), k))
            assert cost == best, (ends, most, groups)


def test_grouped_text_encoding_equals_trimmed_in_features_and_gradients():
    """A step's texts in groups of similar length (on a CPU) give each row the features and the tower the
    gradients of one trimmed pass, up to float rounding, in the rows' own order."""
    from negft import models
    from negft.models import encode_text_grouped, encode_text_trimmed, length_groups
    torch.manual_seed(0)
    b = models.build("negft-tiny", "")
    model = b.model
    texts = ["no", "there is no red circle to the left of a large striped hexagon", "a star", "a blue ring",
             "this image does not show a heart", "no star", "a small gold cross above a ring", "ring"]
    tokens = b.tokenizer(texts)
    assert len(length_groups(models._text_ends(model, tokens).tolist())) > 1      # the grouped path runs
    grads = []
    for encode in (encode_text_trimmed, encode_text_grouped):
        model.zero_grad()
        feats = encode(model, tokens)
        (feats * torch.linspace(-1, 1, feats.numel()).view_as(feats)).sum().backward()
        grads.append((feats.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(grads[1][0], grads[0][0], atol=1e-5, rtol=1e-4)
    assert grads[0][1].keys() == grads[1][1].keys()
    # float32 sums in another order: torch 2.14.1 on one thread puts ln_2.bias of block 0 2.6e-6 apart with its
    # largest entry 1.98 (1.3e-6 of it), the others under 0.7e-6 of theirs
    for n, want in grads[0][1].items():
        torch.testing.assert_close(grads[1][1][n], want, rtol=1e-4, atol=1e-5 * float(want.abs().max()), msg=n)


class _TextOnlyContext:
    """A stand-in EvalContext whose text tower is a bag of words, optionally with a 'negation' direction."""
    n_boot = 50
    logit_scale = EvalContext.logit_scale      # read from ``self.model`` as the real context does

    def __init__(self, negation_weight: float):
        self.negation_weight = negation_weight
        self.vocab: dict[str, torch.Tensor] = {}
        self.gen = torch.Generator().manual_seed(0)      # one stream: every word its own vector

    def encode_texts(self, texts):
        import re
        gen = self.gen
        out = []
        for t in texts:
            words = re.findall(r"[a-z*]+", t.lower())
            v = torch.zeros(64)
            for w in sorted(words):          # summed in a fixed order: the same bag gives the same vector
                if w not in self.vocab:
                    self.vocab[w] = torch.randn(64, generator=gen)
                v += self.word(w, words, gen)
            out.append(torch.nn.functional.normalize(v, dim=0))
        return torch.stack(out)

    def word(self, w: str, words: list[str], gen) -> torch.Tensor:
        """A word's contribution to the embedding of its text."""
        is_neg = w in ("no", "not", "without", "cannot")
        return self.vocab[w] * (self.negation_weight if is_neg else 1.0)


def test_geometry_separates_negation_only_when_the_text_tower_uses_it(tmp_path):
    from negft.probes import geometry
    (tmp_path / "classes.json").write_text(json.dumps(["circle", "star", "heart", "ring"]))
    ds = Dataset("toy", tmp_path)
    blind = geometry.run(_TextOnlyContext(negation_weight=0.0), ds).metrics
    aware = geometry.run(_TextOnlyContext(negation_weight=8.0), ds).metrics
    assert blind["geometry/toy/negated_affirmed_cos"] > aware["geometry/toy/negated_affirmed_cos"] + 0.3
    assert aware["geometry/toy/negation_separation"] > 0.2 > blind["geometry/toy/negation_separation"]
    # the figure draws from the records
    res = geometry.run(_TextOnlyContext(1.0), ds)
    geometry.figure(res.records["geometry/toy"], tmp_path / "pca.png")
    assert (tmp_path / "pca.png").stat().st_size > 1000


def test_geometry_sees_negated_captions_collapse_to_one_point(tmp_path):
    """NegBench figure 6a's ConCLIP: every negated caption at one point whatever its object."""
    import re
    from negft.probes import geometry

    class Collapsed(_TextOnlyContext):
        def encode_texts(self, texts):
            out = super().encode_texts(texts)
            for i, t in enumerate(texts):
                if set(re.findall(r"[a-z]+", t)) & {"no", "not", "without", "cannot"}:
                    out[i] = torch.nn.functional.normalize(torch.ones(64), dim=0)
            return out

    (tmp_path / "classes.json").write_text(json.dumps(["circle", "star", "heart", "ring"]))
    ds = Dataset("toy", tmp_path)
    key = "geometry/toy/negated_object_separation"
    kept = geometry.run(_TextOnlyContext(negation_weight=1.0), ds).metrics[key]
    collapsed = geometry.run(Collapsed(negation_weight=1.0), ds).metrics[key]
    assert collapsed == pytest.approx(0.0, abs=1e-6) and kept > 0.05


def test_paired_test_finds_a_shift_on_the_same_examples_and_not_noise():
    from negft.probes.stats import paired_p_value
    rng = np.random.default_rng(0)
    before = rng.integers(0, 2, 400).astype(float)
    after = before.copy()
    flip = rng.choice(400, 60, replace=False)
    after[flip] = 1.0                                       # only gains: a real improvement
    assert paired_p_value(before, after) < 0.01
    shuffled = before[rng.permutation(400)]                 # same mean, different examples: no shift
    assert paired_p_value(before, shuffled) > 0.05
    assert paired_p_value(before, before) == 1.0
    # many metrics over the same examples are tested in one product: the same p-values as one at a time
    from negft.probes.stats import paired_p_values
    together = paired_p_values({"a": before, "b": before, "c": before, "d": before[:10]},
                               {"a": after, "b": shuffled, "c": before, "d": after[:10]})
    assert together == {"a": paired_p_value(before, after), "b": paired_p_value(before, shuffled), "c": 1.0,
                        "d": paired_p_value(before[:10], after[:10])}


class _AssociationContext(_TextOnlyContext):
    """A bag-of-words text tower that 'knows' some associations: a congruent word leaves the embedding of its
    prompt as the empty slot left it (the slot token ``*`` and the congruent word add nothing), an incongruent
    one moves it (the Stroop intuition), and a word moves it the less, the more concrete it is."""

    def __init__(self, congruent: set, concreteness: dict):
        super().__init__(negation_weight=1.0)
        self.congruent, self.concreteness = congruent, concreteness

    def word(self, w: str, words: list[str], gen) -> torch.Tensor:
        if w == "*" or any((w, o) in self.congruent for o in words):      # no disturbance at all
            return torch.zeros(64)
        if w in self.concreteness:
            return self.vocab.setdefault("<away>", torch.randn(64, generator=gen)) * (1 - self.concreteness[w] / 5)
        return self.vocab[w]


def test_vlu_loaders_and_stroop_probing_on_fixture_files(tmp_path):
    """ShapeIt and a colour list in the isbertblind repository's choice layout, Brysbaert's ratings as published."""
    from negft.data import layout_vlu as LV
    from negft.probes import vlu
    (tmp_path / "datasets").mkdir()
    options = "\"['triangle', 'rectangle', 'circle']\""
    (tmp_path / LV.SHAPE_CSV).write_text('"word","gt","options"\n' + "".join(
        f'"{w}","{g}",{options}\n' for w, g in (("wheel", "circle"), ("pyramid", "triangle"), ("door", "rectangle"))))
    colors = "\"['yellow', 'blue', 'green']\""
    (tmp_path / LV.COLOR_CSV).write_text('"word","gt","options"\n' + "".join(
        f'"{w}","{g}",{colors}\n' for w, g in (("banana", "yellow"), ("sky", "blue"), ("grass", "green"))))
    words = {"chair": 4.9, "table": 4.8, "idea": 1.5, "hope": 1.2, "stone": 4.7, "truth": 1.6}
    (tmp_path / LV.CONCRETENESS).write_text("Word\tBigram\tConc.M\tConc.SD\tDom_Pos\n" + "".join(
        f"{w}\t0\t{c}\t1.0\tNoun\n" for w, c in words.items()) + "run\t0\t3.0\t1.0\tVerb\n")
    congruent = {("circle", "wheel"), ("triangle", "pyramid"), ("rectangle", "door"), ("yellow", "banana"),
                 ("blue", "sky"), ("green", "grass")}
    ds = Dataset("vlu", tmp_path, "vlu")
    knows = vlu.run(_AssociationContext(congruent, words), ds)
    for task in ("vlu_shape", "vlu_color"):
        assert knows.metrics[f"{task}/vlu/acc"] == 1.0 and knows.metrics[f"{task}/vlu/acc_official"] == 1.0
    assert knows.metrics["vlu_concreteness/vlu/rho"] == pytest.approx(1.0)
    assert len(knows.records["vlu_concreteness/vlu"]) == len(vlu.CONCRETENESS_PROMPTS)
    assert "vlu_concreteness/vlu/skipped_rows" not in knows.metrics or \
        knows.metrics["vlu_concreteness/vlu/skipped_rows"] == 0.0          # the verb is left out, not a bad row
    blind = vlu.run(_AssociationContext(set(), {}), ds)
    assert blind.metrics["vlu_color/vlu/acc_mean"] < 0.8
    missing_files = vlu.run(_AssociationContext(set(), {}), Dataset("vlu", tmp_path / "none", "vlu"))
    assert set(missing_files.skipped) == {"vlu_shape/vlu", "vlu_shape_adj/vlu", "vlu_color/vlu",
                                          "vlu_concreteness/vlu"}
    assert "shape_association.csv" in missing_files.skipped["vlu_shape/vlu"]
    assert "data_manifests/vlu.yaml" in missing_files.skipped["vlu_shape/vlu"]


class _BagOfWordsModelContext(_TextOnlyContext):
    """Random image features and an order-blind (bag-of-words) text tower."""

    def __init__(self):
        super().__init__(negation_weight=1.0)
        self.images: dict[str, torch.Tensor] = {}

    def encode_images(self, paths):
        gen = torch.Generator().manual_seed(1)
        for p in paths:
            self.images.setdefault(p, torch.nn.functional.normalize(torch.randn(64, generator=gen), dim=0))
        return torch.stack([self.images[p] for p in paths])


def _fake_tagger(text):
    """Penn tags by a tiny rule (stand-in for spaCy's en_core_web_sm): the world's shapes and colours, and a few
    words, as nouns / adjectives / verbs; everything else DT."""
    from negft.probes import aro
    nouns = {"circle", "ring", "star", "heart", "square", "triangle", "hexagon", "diamond", "cross", "arrow",
             "pentagon", "crescent", "beach", "sand", "grass", "sky", "snow", "room", "field", "rendering", "artwork"}
    adjs = {"red", "green", "blue", "yellow", "orange", "purple", "cyan", "pink", "white", "black", "grey", "small",
            "large", "striped", "dotted", "solid"}
    verbs = {"depicts", "containing", "portrayed"}
    return [(t, "NN" if t.lower() in nouns else "JJ" if t.lower() in adjs else "VBZ" if t.lower() in verbs
             else "DT") for t in aro.regex_tokenize(text)]


def test_snare_on_the_world_an_order_blind_text_tower_splits_its_picks(cache, monkeypatch):
    """Shuffles and exchanges keep the bag of words, so a bag-of-words model cannot tell them apart:
    chance shares on semantic structure (SNARE's rule: every tie to the first option, the caption), and
    Cor = Exc on attribute ownership and relations (SNARE's rule: Cor, listed first, takes every tie)."""
    from negft.probes import aro, base, snare
    ds = Dataset("world", cache / "world-s0-tiny" / "val")
    monkeypatch.setattr(aro, "_TAGGER", [None, "they need spaCy's en_core_web_sm part-of-speech tagger"])
    monkeypatch.setattr(base, "_PARSED", {})
    res = snare.run(_BagOfWordsModelContext(), ds)
    assert "en_core_web_sm" in res.skipped["snare_structure/world"]
    m = res.metrics
    assert m["snare_attribute/world/cor"] == pytest.approx(m["snare_attribute/world/exc"])
    assert m["snare_attribute/world/cor"] > 0.1
    assert m["snare_attribute/world/exc_official"] == 0.0
    assert m["snare_attribute/world/cor_official"] == pytest.approx(2 * m["snare_attribute/world/cor"])
    assert m["snare_relation/world/cor"] == pytest.approx(m["snare_relation/world/exc"])
    assert m["snare_relation/world/exc_official"] == 0.0
    assert m["snare_negation/world/cor"] + m["snare_negation/world/wro"] == pytest.approx(1.0)
    assert 0.0 <= m["snare_spatial/world/acc"] <= 1.0
    assert sum(m[f"snare_spatial/world/chose_{p}"] for p in snare.SPATIAL) == pytest.approx(1.0)
    assert not [k for k in m if k.endswith("skipped_rows")]
    # with a tagger, semantic structure: all four options have one bag of words
    monkeypatch.setattr(aro, "_TAGGER", [_fake_tagger, None])
    monkeypatch.setattr(base, "_PARSED", {})
    m = snare.run(_BagOfWordsModelContext(), ds).metrics
    for name in snare.CLASSES["structure"]:
        assert m[f"snare_structure/world/{name}"] == pytest.approx(0.25)
    assert m["snare_structure/world/origin_official"] == 1.0


def test_snare_world_samples_are_built_from_the_worlds_aro_files_as_snare_builds_them(cache, monkeypatch):
    from negft.probes import aro, base, snare
    monkeypatch.setattr(aro, "_TAGGER", [_fake_tagger, None])
    monkeypatch.setattr(base, "_PARSED", {})
    ds = Dataset("world", cache / "world-s0-tiny" / "val")
    samples = snare.load_samples(ds)
    assert all(len(items) > 10 and why is None and not skipped for items, skipped, why in samples.values())
    for r, (cor, exc, none), right in samples["relation"][0]:
        assert (cor, exc, right) == (r["true"], r["false"], 0)
        x, y = cor.removeprefix("the ").split(f" is {r['relation']} the ")
        assert none == f"the {x} and the {y}"
    for r, opts, right in samples["spatial"][0]:
        assert r["relation"] in snare.SPATIAL.values() and opts[right] == r["true"] and len(opts) == 4
    assert len(samples["spatial"][0]) < len(samples["relation"][0])     # "above" is not one of SNARE's four
    for r, (cor, exc, sep), _ in samples["attribute"][0]:
        (a, b), x, y = r["attributes"], r["obj1_name"], r["obj2_name"]
        assert (cor, exc, sep) == (f"the {a} {x} and the {b} {y}", f"the {b} {x} and the {a} {y}",
                                   f"the {x} and the {y} are {a} and {b} respectively")
    for r, (cor, wro), _ in samples["negation"][0]:
        assert wro == cor.replace(" is ", " is not ")
    import re
    for case, options, _ in samples["structure"][0]:
        assert len({tuple(sorted(re.findall(r"\w+", o))) for o in options}) == 1      # the same words
    # shuffling content words keeps every other word in place, and vice versa (on the tagged tokens)
    tagged = _fake_tagger("A rendering that depicts a ring and a green striped circle on the sand")
    content = aro.shuffle_classes(tagged, (aro.NOUN, aro.VERB, aro.ADJ), aro.caption_rng(0, 0, 5)).split()
    other = aro.shuffle_others(tagged, aro.NOUN | aro.VERB | aro.ADJ, aro.caption_rng(0, 0, 6)).split()
    for (w, tag), c, n in zip(tagged, content, other):
        assert (n == w) if tag != "DT" else (c == w)


def _snare_vg_fixture(root, relation_rows, attribution_rows):
    from PIL import Image
    (root / "images").mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16)).save(root / "images" / "a.png")
    box = {"image_path": "a.png", "bbox_x": 1, "bbox_y": 2, "bbox_w": 8, "bbox_h": 9}
    (root / "visual_genome_relation.json").write_text(json.dumps([{**box, **r} for r in relation_rows]))
    (root / "visual_genome_attribution.json").write_text(json.dumps([{**box, **r} for r in attribution_rows]))
    from negft.probes import aro
    return aro.crop_key(str(root / "images" / "a.png"), (1, 2, 9, 11))


def test_snare_reads_aros_files_with_known_scores_official_and_tie_aware(tmp_path):
    from negft.probes import snare
    relation = [
        {"relation_name": "on", "true_caption": "the lemon is on the table",
         "false_caption": "the table is on the lemon"},
        {"relation_name": "near", "true_caption": "the dog is near the cat",
         "false_caption": "the cat is near the dog"},
        {"relation_name": "below", "true_caption": "the cat is below the mat",
         "false_caption": "the mat is below the cat"}]
    attribution = [{"attributes": ["white", "black"], "obj1_name": "bus", "obj2_name": "road",
                    "true_caption": "the white bus and the black road",
                    "false_caption": "the black bus and the white road"},
                   {"attributes": ["red", "blue"], "true_caption": "the red x and the blue y",
                    "false_caption": "the blue x and the red y"}]          # no obj1_name / obj2_name
    crop = _snare_vg_fixture(tmp_path, relation, attribution)
    good, bad, tie = [1.0, 0.0], [0.0, 1.0], [0.6, 0.8]
    texts = {"the white bus and the black road": tie, "the black bus and the white road": good,
             "the bus and the road are white and black respectively": tie,       # Exc wins
             "the bus is white and the road is black": tie, "the bus is not white and the road is not black": tie,
             "the lemon is on the table": tie, "the table is on the lemon": bad, "the lemon and the table": bad,
             "the cat is below the mat": bad, "the mat is below the cat": bad, "the cat and the mat": good,
             # multi-spatial: str.replace(relation_name, p) replaces every occurrence, as SNARE's code does
             "the lemto the left of is to the left of the table": bad,
             "the lemto the right of is to the right of the table": tie, "the lembelow is below the table": tie,
             "the cat is to the left of the mat": tie, "the cat is to the right of the mat": bad,
             "the cat is on the mat": tie}
    res = snare.run(_ctx_with({crop: [1.0, 0.0]}, texts), Dataset("vg", tmp_path, "snare"))
    m = res.metrics
    assert (m["snare_attribute/vg/cor"], m["snare_attribute/vg/exc"], m["snare_attribute/vg/sep"]) == (0, 1, 0)
    assert m["snare_negation/vg/cor"] == m["snare_negation/vg/wro"] == 0.5       # tie-aware: split
    assert m["snare_negation/vg/cor_official"] == 1.0                             # SNARE: the first option
    assert m["snare_attribute/vg/skipped_rows"] == m["snare_negation/vg/skipped_rows"] == 1
    assert "obj1_name" in res.skipped["snare_attribute/vg/rows"]
    # relation composition leaves "near" out: "on" picks Cor, "below" picks None
    assert (m["snare_relation/vg/cor"], m["snare_relation/vg/exc"], m["snare_relation/vg/none"]) == (0.5, 0, 0.5)
    assert m["snare_relation/vg/cor_official"] == 0.5
    # multi-spatial: "on" (right: index 2) ties with right-of and below; "below" (right: 3) loses to left-of and
    # on, which tie
    assert m["snare_spatial/vg/acc"] == pytest.approx((1 / 3 + 0) / 2)
    assert m["snare_spatial/vg/acc_official"] == 0.0                  # ties go to the first of the tied options
    assert m["snare_spatial/vg/chose_right_official"] == 0.5 and m["snare_spatial/vg/chose_left_official"] == 0.5
    assert m["snare_spatial/vg/chose_on"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    spatial = res.records["snare_spatial/vg"]
    assert spatial[0]["options"][0] == "the lemto the left of is to the left of the table"   # SNARE's str.replace


def test_snare_missing_files_and_structure_without_a_tagger(tmp_path, monkeypatch):
    from negft.probes import aro, base, snare
    res = snare.run(_BagOfWordsModelContext(), Dataset("vg", tmp_path, "snare"))
    for task in ("negation", "attribute", "relation", "spatial"):
        why = res.skipped[f"snare_{task}/vg"]
        assert "visual_genome_" in why and "snare.yaml" in why
    assert "snare_structure/vg" not in res.skipped           # the VG dataset serves the four VG tasks
    res = snare.run(_BagOfWordsModelContext(), Dataset("coco_order", tmp_path, "aro_coco_order"))
    assert list(res.skipped) == ["snare_structure/coco_order"]
    assert str(tmp_path / "coco_karpathy_test.json") in res.skipped["snare_structure/coco_order"]
    from PIL import Image
    (tmp_path / "val2014").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "val2014" / "1.jpg")
    (tmp_path / "coco_karpathy_test.json").write_text(json.dumps([{"image": "val2014/1.jpg",
                                                                   "caption": ["a red ball on the grass"]}]))
    monkeypatch.setattr(aro, "_TAGGER", [None, "they need spaCy's en_core_web_sm part-of-speech tagger"])
    monkeypatch.setattr(base, "_PARSED", {})
    res = snare.run(_BagOfWordsModelContext(), Dataset("coco_order", tmp_path, "aro_coco_order"))
    assert "en_core_web_sm" in res.skipped["snare_structure/coco_order"] and not res.metrics


def test_mcq_option_templates_and_which_template_the_picks_land_on(tmp_path, cache):
    from negft.probes.base import read_csv
    from negft.probes.mcq_neg import option_template, run
    # the world's own phrasings are recognised exactly; other captions by their wording
    rows = read_csv(cache / "world-s0-tiny" / "test" / "mcq.csv")
    for r in rows[:50]:
        kinds = [option_template(r[f"caption_{j}"]) for j in range(4)]
        assert sorted(kinds) == sorted(["positive", "negative", "hybrid", r["correct_answer_template"]])
        assert kinds[int(r["correct_answer"])] == r["correct_answer_template"]
    assert option_template("A dog on a sofa") == "positive"
    assert option_template("There is no cat here") == "negative"
    assert option_template("A dog, but no cat") == "hybrid"
    # an image that always matches the negated option: every pick on 'negative'
    row = {"correct_answer": 0, "caption_0": "There is a dog", "caption_1": "There is no dog",
           "caption_2": "A cat but no dog", "caption_3": "A cat", "correct_answer_template": "positive",
           "image_path": "a.png"}
    with open(tmp_path / "mcq.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    ctx = _ctx_with({str(tmp_path / "a.png"): [1, 0]},
                    {"There is a dog": [0, 1], "There is no dog": [1, 0], "A cat but no dog": [0, 1],
                     "A cat": [-1, 0]})
    m = run(ctx, Dataset("fx", tmp_path)).metrics
    assert m["mcq_neg/fx/chose_negation"] == 1.0 and m["mcq_neg/fx/chose_negation_on_affirmation"] == 1.0
    assert m["mcq_neg/fx/chose_affirmation"] == 0.0 and m["mcq_neg/fx/acc"] == 0.0


def test_scalable_analysis_recovers_a_planted_correlation():
    from negft.probes.analysis import correlate
    rng = np.random.default_rng(0)
    n = 400
    flag = (rng.random(n) < 0.5).astype(float)
    length = rng.integers(3, 20, n).astype(float)
    noise = rng.normal(0, 1, n)
    scores = {"D": 0.8 * flag + noise, "P": 0.2 * length + noise}
    rows = {(r["score"], r["feature"]): r for r in correlate(scores, {"flag": flag, "length": length,
                                                                      "null": rng.random(n)}, n_boot=200)}
    assert rows[("D", "flag")]["significant"] and rows[("D", "flag")]["ci95"][0] < 0.8 < rows[("D", "flag")]["ci95"][1]
    assert rows[("P", "length")]["significant"] and rows[("P", "length")]["effect"] > 0.5
    assert not rows[("D", "null")]["significant"] and not rows[("D", "length")]["significant"]
    assert "Welch" in rows[("D", "flag")]["kind"] and "Pearson" in rows[("P", "length")]["kind"]


def test_scalable_analysis_on_the_world(cache, tmp_path):
    from negft.probes import analysis
    res = analysis.run(_BagOfWordsModelContext(), Dataset("world", cache / "world-s0-tiny" / "val"))
    table = res.records["analysis/world"]
    assert {r["pairs"] for r in table} == {"relcomp", "mcq"} and {r["score"] for r in table} == {"P", "N", "D"}
    assert "analysis_mcq/world/D_answer_negation" in res.metrics
    analysis.figure(table, tmp_path / "a.png")
    assert (tmp_path / "a.png").stat().st_size > 1000
    # real data: the same CSVs without annotations keep the text features only
    import shutil
    real = tmp_path / "real"
    real.mkdir()
    root = cache / "world-s0-tiny" / "val"
    for name in ("mcq.csv", "relcomp.csv", "images"):
        (shutil.copytree if name == "images" else shutil.copy)(root / name, real / name)
    res = analysis.run(_BagOfWordsModelContext(), Dataset("coco", real))
    assert "analysis_mcq/coco/D_caption_words" in res.metrics and "analysis_relcomp/coco/D_kind_relation" in res.metrics
    assert not any(k.endswith(("D_objects", "D_horizontal")) for k in res.metrics)
    assert "analysis/none" in analysis.run(_BagOfWordsModelContext(), Dataset("none", tmp_path / "x")).skipped


def test_probe_r_swaps_are_false_and_ties_give_half(cache):
    """The world's relation_eval_*.json: the right prompt holds in the anchor image, its swaps do not; a text
    tower that maps every prompt to one point ties everywhere: half the credit (none by the release's strict
    rule), confidence 1/2."""
    import os
    from negft.data import layout_rcb
    from negft.world.generator import relations
    from negft.world.formats.probe_rcb import relation_prompt
    from negft.probes import probe_r
    root = cache / "world-s0-tiny" / "val"
    ann = [json.loads(line) for line in (root / "annotations.jsonl").read_text().splitlines()]
    scenes = {a["image_path"]: a["scene"] for a in ann}
    true_prompts = lambda objs: {relation_prompt(objs[i]["shape"], p, objs[j]["shape"]) for i, p, j in relations(objs)}
    for switch in layout_rcb.PROBE_R_SWITCHES:
        rows = json.loads((root / layout_rcb.probe_r_file(switch)).read_text())
        assert len(rows) == sum(bool(a["scene"]["relations"]) for a in ann)
        for image_id, r in rows.items():
            link = root / layout_rcb.VG_IMAGES / f"{image_id}.png"
            objs = scenes[os.path.relpath(os.path.realpath(link), os.path.realpath(root))]["objects"]
            assert r["positive_prompt"] in true_prompts(objs)
            for key in ("negative_prompt", "negative_predicate_prompt"):
                assert r[key] not in true_prompts(objs), (switch, r)
    ctx = _BagOfWordsModelContext()
    ctx.encode_texts = lambda texts: torch.nn.functional.normalize(torch.ones(len(texts), 64), dim=1)
    ctx.encode_images = lambda paths: torch.nn.functional.normalize(torch.ones(len(paths), 64), dim=1)
    ctx.model = torch.nn.Module()
    ctx.model.logit_scale = torch.nn.Parameter(torch.tensor([4.6]))
    m = probe_r.run(ctx, Dataset("world", root)).metrics
    for kind in ("predicate", "object", "subject", "subject_only"):
        assert m[f"probe_r_{kind}/world/acc"] == 0.5 and m[f"probe_r_{kind}/world/confidence"] == pytest.approx(0.5)
        assert m[f"probe_r_{kind}/world/acc_official"] == 0.0


def test_pixel_cache_keeps_to_its_budget_and_changes_no_feature(cache):
    from negft import models
    from negft.probes.base import PixelCache
    b = models.build("negft-tiny", "")
    paths = [str(p) for p in sorted((cache / "world-s0-tiny" / "val" / "images").glob("0000*.png"))[:6]]
    from PIL import Image
    one = b.preprocess_val(Image.open(paths[0]).convert("RGB"))
    pix = PixelCache(budget=3 * one.numel() * one.element_size())
    cached = EvalContext(b.model.eval(), b.preprocess_val, b.tokenizer, "cpu", pixel_cache=pix).encode_images(paths)
    plain = EvalContext(b.model.eval(), b.preprocess_val, b.tokenizer, "cpu").encode_images(paths)
    assert len(pix) == 3 and pix.bytes <= pix.budget
    assert torch.equal(cached, plain)
    again = EvalContext(b.model.eval(), b.preprocess_val, b.tokenizer, "cpu", pixel_cache=pix).encode_images(paths)
    assert torch.equal(again, plain)


def test_average_precision_matches_scikit_learn_and_all_equal_scores_give_the_share_of_positives():
    from sklearn.metrics import average_precision_score
    from negft.probes.probe_b import average_precision
    rng = np.random.default_rng(0)
    scores = torch.tensor(rng.integers(0, 4, (40, 6)), dtype=torch.float)    # many ties
    labels = torch.tensor(rng.random((40, 6)) < 0.4)
    labels[:, 0] = True
    ours = average_precision(scores, labels)
    for n in range(40):
        assert ours[n].item() == pytest.approx(average_precision_score(labels[n].numpy(), scores[n].numpy()))
    flat = average_precision(torch.zeros(1, 6), torch.tensor([[True, True, False, False, False, False]]))
    assert flat.item() == pytest.approx(2 / 6)


# Probe-B's and Probe-R's readers on fixtures in the release's layout: tests/test_probe_rcb.py


def test_world_probe_b_and_probe_c_images_follow_their_annotations():
    """The world's Probe-B variants and Probe-C pairs (before any writer lays them out) against the scene."""
    import io
    from PIL import Image
    from negft.world.generator import PROBE_B_SAMPLES, PROBE_C_SAMPLES, probe_sample
    pixels = lambda png: np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
    kinds = set()
    for i in range(max(PROBE_B_SAMPLES["tiny"], PROBE_C_SAMPLES["tiny"] // 2)):
        _, rec = probe_sample("val", 0, i, set(), "tiny")
        objs = rec["scene"]["objects"]
        if rec.get("probe_b"):
            images, kept = rec["probe_b"]["images"], objs[rec["probe_b"]["kept"]]
            assert {k.split("_")[0] for k in images} == {"black", "gray", "noise", "scene"}
            for filler in ("black", "gray", "noise", "scene"):
                if f"{filler}_one" not in images:
                    assert len(objs) == 1
                    continue
                every, one = pixels(images[f"{filler}_bg"]), pixels(images[f"{filler}_one"])
                for o in objs:    # the kept object is drawn alike in both; the others only where all are kept
                    x0_, y0_, x1_, y1_ = o["bbox"]
                    same = np.array_equal(every[y0_:y1_, x0_:x1_], one[y0_:y1_, x0_:x1_])
                    assert same == (o is kept), (i, filler, o)
        if rec.get("probe_c"):
            p = rec["probe_c"]
            kinds.add(p["kind"])
            words = lambda o: {o["size"] + " " + o["shape"], o["color"] + " " + o["shape"]}
            true_0 = set().union(*(words(o) for o in objs))
            phrase = lambda c: c.split(" ", 1)[1]           # drop the article
            assert phrase(p["caption_0"]) in true_0 and phrase(p["caption_1"]) not in true_0, p
    assert kinds == {"composition", "object"}


def test_probe_files_are_parsed_once_per_version(tmp_path):
    """Evaluations share parsed probe files, but a rewritten file (a regenerated world) is read again."""
    from negft.probes.base import read_csv, resolve
    path = tmp_path / "mcq.csv"
    path.write_text("image_path,label\nimages/a.png,0\n")
    first = read_csv(path)
    assert read_csv(path) is first and first[0]["label"] == "0"
    path.write_text("image_path,label\nimages/a.png,1\nimages/b.png,2\n")
    assert [r["label"] for r in read_csv(path)] == ["1", "2"]
    assert resolve(tmp_path, "images/a.png") == str(tmp_path / "images" / "a.png")
    assert resolve(tmp_path, "/data/x.png") == "/data/x.png"
    # two probes' parsers of one file are kept apart even when they share a name (snare's and probe_r's)
    from negft.probes.base import parse_once
    ann = tmp_path / "annotations.jsonl"
    ann.write_text('{"image_path": "images/a.png"}\n\n')

    def lines(p):
        return open(p).read().splitlines()
    first_lines = lines
    def lines(p):           # noqa: F811  (same __name__, another function)
        return ["other"]
    assert parse_once(ann, first_lines) == ('{"image_path": "images/a.png"}', "")
    assert parse_once(ann, lines) == ("other",)


def test_the_suite_declares_its_texts_and_encodes_them_in_one_pass(cache, monkeypatch):
    """Every text a world evaluation encodes is declared by its probe beforehand and encoded in one pass of
    full batches (the last one partial); an undeclared text would make a batch of its own."""
    from negft import models, probes
    from negft.evaluation import run_suite
    from negft.probes import base
    batches = []
    encode = base.encode_text_trimmed
    monkeypatch.setattr(base, "encode_text_trimmed", lambda model, tokens: batches.append(len(tokens)) or
                        encode(model, tokens))
    b = models.build("negft-tiny", "")
    data = [Dataset("world", cache / "world-s0-tiny" / "val")]
    encoded = {}
    run_suite(b.model, b.preprocess_val, b.tokenizer, data, "default", n_boot=20, batch_size=256, text_cache=encoded)
    declared = {t for name in probes.DEFAULT_SUITE if name in probes.TEXTS for t in probes.TEXTS[name](data[0])}
    assert declared == set(encoded)
    full, rest = divmod(len(encoded), 256)
    assert batches == [256] * full + [rest] * (rest > 0)


def test_the_registry_refuses_a_name_twice_and_records_each_metrics_direction(tmp_path):
    """A second probe under a registered name is an error naming both modules; the registry says which metrics
    are better lower or have no better direction; a probe whose whole input is absent is skipped by the
    registry, under <probe>/<dataset>, with the path it looked for."""
    from negft import probes
    from negft.probes import winoground
    before = dict(probes.PROBES)
    with pytest.raises(ValueError, match="'mcq_neg' is registered twice"):
        probes.register("mcq_neg")(lambda ctx, dataset: ProbeResult())
    assert probes.PROBES == before
    assert probes.direction("mcq_neg/coco/acc_negation_official") == 1
    assert probes.direction("geometry/world/negated_affirmed_cos") == -1
    assert probes.direction("snare_attribute/vg/exc") == -1 and probes.direction("snare_attribute/vg/cor") == 1
    assert probes.direction("mcq_neg/world/chose_negation_on_affirmation") == 0
    assert probes.direction("aro_vg_relation/vg/skipped_rows") == 0
    res = winoground.run(None, Dataset("wg", tmp_path, "winoground"))
    assert not res.metrics and list(res.skipped) == ["winoground/wg"]
    assert res.skipped["winoground/wg"] == (f"data not found: {tmp_path / winoground.FILE} "
                                            "(see negft/data_manifests/winoground.yaml)")
