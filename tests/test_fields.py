"""negft.fields: allowed values declared on the fields, one checker, one dotted-key walker."""
from dataclasses import dataclass, field
from typing import Dict, Optional

from negft.fields import bounded, choice, field_errors, leaves


@dataclass
class Inner:
    task: str = choice("contrastive", ("contrastive", "mcq"), doc="what the stream trains")
    batch_size: int = bounded(64, lo=1, fix="samples per rank and step")


@dataclass
class Outer:
    alpha: Optional[float] = bounded(None, lo=0.0, hi=1.0)
    streams: Dict[str, Inner] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)
    name: str = "x"


def test_defaults_pass_and_every_bad_value_is_named_with_its_dotted_key():
    assert field_errors(Outer()) == []
    bad = Outer(alpha=1.5, streams={"neg": Inner(task="itm", batch_size=0)})
    errors = field_errors(bad)
    assert errors == ["bad value 1.5 for 'alpha': must lie in [0, 1]; e.g. alpha=1",
                      "bad value 'itm' for 'streams.neg.task'. Valid choices: contrastive, mcq",
                      "bad value 0 for 'streams.neg.batch_size': samples per rank and step; e.g. streams.neg.batch_size=1"]


def test_leaves_walks_dataclasses_and_dicts():
    flat = leaves(Outer(streams={"a": Inner()}))
    assert flat == {"alpha": None, "streams.a.task": "contrastive", "streams.a.batch_size": 64,
                    "inner.task": "contrastive", "inner.batch_size": 64, "name": "x"}
    assert leaves({"a": {"b": 1, "c": {}}, "d": [1]}) == {"a.b": 1, "a.c": {}, "d": [1]}
