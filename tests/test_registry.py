"""The probe registry declares each probe's metric names, directions and version, and README's metric table is
made from it (``negft.docs``): the two cannot disagree."""
import pytest

from negft import docs, probes
from negft.probes.base import ProbeResult

from conftest import REPO


def test_the_readme_metric_table_is_the_registrys():
    """README.md holds exactly what ``python -m negft.docs`` writes: every declared family in one row, its names
    and marks as registered, the prose of negft/probes/benchmarks.yaml."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert docs.with_table(text) == text, "README.md's metric table is stale: run python -m negft.docs"
    assert docs.row_errors(docs.rows()) == []


def test_the_table_check_fails_on_a_stale_readme_and_the_command_rewrites_it(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    text = (REPO / "README.md").read_text(encoding="utf-8")
    readme.write_text(text.replace("`snare_negation/<d>/{cor, wro ↓}`", "`snare_negation/<d>/{cor, wro}`"))
    monkeypatch.setattr(docs, "README", readme)
    assert docs.main(["--check"]) == 1
    assert "-| SNARE" in capsys.readouterr().out
    assert docs.main([]) == 0 and readme.read_text(encoding="utf-8") == text
    assert docs.main(["--check"]) == 0
    readme.write_text(text.replace(docs.END, ""))
    with pytest.raises(ValueError, match="marker"):
        docs.main(["--check"])


def test_a_family_missing_from_the_prose_or_undeclared_is_named():
    rows = docs.rows()
    errors = docs.row_errors([r for r in rows if "zeroshot" not in r["families"]])
    assert errors == ["family zeroshot (probe zeroshot) is in no row"]
    errors = docs.row_errors(rows + [{**rows[0], "families": ["mcq_neg", "nope"]}])
    assert any("mcq_neg is in rows 1 and" in e for e in errors) and any("family nope" in e for e in errors)


def test_every_declared_family_belongs_to_the_probe_that_declares_it():
    for name, families in probes.METRICS.items():
        assert families, f"{name} declares no metrics"
        for family in families:
            assert probes.owner(family) == name, (family, name)


@pytest.mark.parametrize("kwargs, message", [
    ({"version": 0}, "version=0"),
    ({"version": "2"}, "version='2'"),
    ({"metrics": ("acc",), "lower": ("accc",)}, "accc, which its metrics= does not declare"),
    ({"metrics": {"other_family": ("acc",)}}, "must be 'tmp_probe' or start with 'tmp_probe_'"),
])
def test_a_malformed_registration_is_refused_and_registers_nothing(kwargs, message):
    before = dict(probes.PROBES)
    with pytest.raises(ValueError, match=message):
        probes.register("tmp_probe", **kwargs)(lambda ctx, dataset: ProbeResult())
    assert probes.PROBES == before and "tmp_probe" not in probes.VERSIONS


def test_declared_names_directions_and_versions_follow_the_registration(monkeypatch):
    """``<x>`` stands for a name; ``_official`` and ``skipped_rows`` go with every family; the versions of a set
    of keys are those of the probes that report them."""
    for name in ("PROBES", "DIRECTIONS", "METRICS", "VERSIONS"):
        monkeypatch.setattr(probes, name, dict(getattr(probes, name)))
    probes.register("tmp_probe", version=3, metrics={"tmp_probe_a": ("acc", "acc_<x>", "chose_<x>", "loss")},
                    lower=("loss",), unordered=("chose_<x>",))(lambda ctx, dataset: ProbeResult())
    assert probes.declared("tmp_probe_a/d/acc_negation_official") and probes.declared("tmp_probe_a/d/skipped_rows")
    assert not probes.declared("tmp_probe_a/d/acc_") and not probes.declared("tmp_probe_a/d/top1")
    assert not probes.declared("tmp_probe_b/d/acc")                 # a family the probe does not declare
    assert not probes.declared("nobody/d/acc")
    assert [probes.direction(f"tmp_probe_a/d/{m}") for m in ("acc_x", "loss_official", "chose_a_on_b", "top1")] == \
        [1, -1, 0, 1]
    keys = ["tmp_probe_a/d/acc", "mcq_neg/d/acc", "snare_structure/d", "stream/negcap/rows"]
    assert probes.versions(keys) == {"mcq_neg": probes.VERSIONS["mcq_neg"], "snare": probes.VERSIONS["snare"],
                                     "tmp_probe": 3}
