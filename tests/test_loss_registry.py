"""The loss package's registry: a baseline with settings of its own is one module and one line in OBJECTIVES (its
``loss.<block>`` joins the schema by itself); a block that joins several terms' settings must be written."""
import dataclasses
from dataclasses import dataclass, field

import pytest

from negft.fields import bounded
from negft.losses import OBJECTIVES, MCQCfg, NegFullCfg, Objective, Term, registry, setting_errors


@dataclass
class ToyCfg:
    w: float = bounded(0.5, lo=0.0, fix="must be >= 0", doc="a weight")


class Toy(Term):
    name = block = "toy"
    Settings = ToyCfg


def _schema():
    """A ``loss`` schema written as LossCfg is, made by the registry's decorator over the current OBJECTIVES."""
    class Cfg:
        name: str = "clip"
        mcq: MCQCfg = field(default_factory=MCQCfg)
        negfull: NegFullCfg = field(default_factory=NegFullCfg)
    return registry._with_single_term_blocks(Cfg)


def test_a_baseline_with_settings_of_its_own_needs_one_registry_line(monkeypatch):
    monkeypatch.setitem(OBJECTIVES, "toy", Objective("toy", (Toy,)))
    monkeypatch.setattr(registry, "BLOCKS", registry._block_terms())
    cfg = _schema()
    assert [f.name for f in dataclasses.fields(cfg)] == ["name", *registry.BLOCKS]
    assert registry.BLOCKS["toy"] == (Toy,) and cfg().toy == ToyCfg()
    assert setting_errors(cfg(toy=ToyCfg(w=-1))) == [
        "bad value -1 for 'loss.toy.w': must be >= 0; e.g. loss.toy.w=0"]
    # without the line, no block
    monkeypatch.delitem(OBJECTIVES, "toy")
    monkeypatch.setattr(registry, "BLOCKS", registry._block_terms())
    assert "toy" not in {f.name for f in dataclasses.fields(_schema())}


def test_a_block_joining_several_terms_settings_must_be_written(monkeypatch):
    @dataclass
    class OtherCfg:
        v: float = bounded(1.0, lo=0.0, doc="another weight")

    class Own(Term):
        name, Settings = "own", ToyCfg

    class Other(Term):
        name, Settings = "other", OtherCfg

    monkeypatch.setitem(OBJECTIVES, "pair", Objective("pair", (Own, Other)))
    monkeypatch.setattr(registry, "BLOCKS", registry._block_terms())
    with pytest.raises(TypeError, match="loss.pair joins the settings of Own, Other: write its dataclass"):
        _schema()
