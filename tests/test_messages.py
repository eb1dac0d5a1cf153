"""Messages that say what to do: the key the user gave named in a hint, where the default world is looked for, a
patch's choice in words (α = 1: not patched), a report that lists as missing only what the run meant to read."""
import json
import socket

import pytest

from negft.commands import cli


def test_offline_eval_names_evals_own_key_for_a_weights_file(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: (_ for _ in ()).throw(socket.gaierror("offline")))
    assert cli.main(["eval", "model=ViT-B-32", "pretrained=laion2b_s34b_b79k", f"out={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert "pass the file: pretrained=/path/to/weights.safetensors" in err and "model.pretrained" not in err
    assert not (tmp_path / "o").exists()


def test_the_world_defaults_to_the_demos_in_the_cache_or_says_where_it_looked(monkeypatch, tmp_path):
    from negft.evaluation import world_root
    monkeypatch.setenv("NEGFT_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        world_root({})
    demo = tmp_path / "world-s0-demo"
    assert f"world data not found at '{demo}', the demo's world in the cache" in str(err.value)
    assert "python train.py recipe=demo" in str(err.value) and "world_dir=DIR" in str(err.value)
    demo.mkdir()
    (demo / "world.json").write_text("{}")
    assert world_root({}) == demo
    assert world_root({"world_dir": str(tmp_path / "other")}, str(demo)) == demo       # given wins over recorded
    with pytest.raises(FileNotFoundError, match=f"'{tmp_path / 'other'}':"):
        world_root({"world_dir": str(tmp_path / "other")})


@pytest.mark.parametrize("alpha, words", [(1.0, "not patched (α = 1"), (0.0, "the base model itself (α = 0"),
                                          (0.4, "patched toward the base with α = 0.4")])
def test_a_patchs_choice_in_words_in_the_report_and_on_the_console(alpha, words, tmp_path):
    from negft.commands.patch import chosen
    from negft.tables import headline
    line = {"epoch": 3, "metrics": {"mcq_neg/world/acc": 0.5}, "paired_p": {}}
    released = {"metrics": {"mcq_neg/world/acc": 0.6}, "alpha": alpha, "tower": "vt"}
    text = "\n".join(headline({**line, "epoch": 0}, line, released))
    assert f"Released: the last epoch, {words}" in text
    assert alpha == 1.0 or "not patched" not in text
    sel = tmp_path / "selected.json"
    sel.write_text(json.dumps({"alpha": alpha, "tower": "vt", "checkpoint": str(tmp_path / "selected")}))
    assert chosen(sel).startswith(f"[negft] selected: {words}") and str(tmp_path / "selected") in chosen(sel)


def test_the_reports_headline_groups_gains_composition_and_costs_one_line_each():
    from negft.tables import headline
    keys = ["mcq_neg/world/acc", "mcq_neg/world/acc_negation", "retrieval_neg/world/r5", "relcomp/world/group",
            "retrieval/world/r5", "zeroshot/world/top1", "geometry/world/negated_affirmed_cos"]
    first = {"epoch": 0, "metrics": {k: 0.5 for k in keys}}
    last = {"epoch": 2, "metrics": {k: 0.75 for k in keys}, "paired_p": {"mcq_neg/world/acc": 0.01}}
    lines = [line for line in headline(first, last) if line.startswith("- **")]
    assert [line.split("**")[1] for line in lines] == ["Gains", "Composition", "Costs"]
    assert ("MCQ-Neg accuracy (`mcq_neg/world/acc`) 0.500 → 0.750 (+0.250 \\*); negation-type MCQ "
            "(`mcq_neg/world/acc_negation`) 0.500 → 0.750 (+0.250);") in lines[0]
    assert "RelComp group" in lines[1] and "zero-shot top-1" in lines[2] and "geometry" not in "".join(lines)


def test_the_report_lists_as_skipped_only_what_the_run_was_meant_to_read():
    from negft.train.ledger import skipped_lines
    text = "\n".join(skipped_lines({
        "valse/world/existence": "data not found: /w/test/valse/existence.json",
        "vlu/world": "data not found: /w/test/vlu/vlu.csv",
        "aro/world/order": "they need spaCy's en_core_web_sm part-of-speech tagger, which cannot be loaded here "
                           "(OSError: x); install spaCy and the model with: python -m spacy download en_core_web_sm",
        "mcq_neg/coco": "data not found: /data/coco/mcq.csv (see negft/data_manifests/negbench_coco.yaml)",
        "mcq_neg/world/rows": "3 rows skipped: answer out of range"}))
    meant, rest = text.split("Not run:")
    assert "`mcq_neg/coco`: data not found" in meant and "`mcq_neg/world/rows`" in meant
    assert "valse" not in meant and "vlu" not in meant and "aro" not in meant
    assert "Not in this world" in rest and "`valse/world/existence`, `vlu/world`" in rest
    assert "Needs spaCy's en_core_web_sm, not installed here" in rest and "spacy download" not in rest
    assert skipped_lines({}) == []
