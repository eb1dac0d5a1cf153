"""Allowed values live on the fields they constrain: a dataclass field declares its one-line doc, its choices or
its range in its metadata (``choice`` / ``bounded`` below), and ``field_errors`` is the one checker that reads them,
for a recipe, a command's keys and a loss term's settings alike. ``leaves`` is the one walker over dotted keys."""
from __future__ import annotations

import dataclasses
from dataclasses import MISSING, field
from typing import Any, Iterator


def choice(default: Any, options: tuple, doc: str = "") -> Any:
    """A field whose value must be one of ``options``."""
    return field(default=default, metadata={"choices": tuple(options), "doc": doc})


def bounded(default: Any = MISSING, lo: float | None = None, hi: float | None = None, fix: str = "", doc: str = "",
            default_factory: Any = MISSING) -> Any:
    """A numeric field that must lie in [lo, hi] (None: unbounded on that side; a None value is never checked).
    ``fix`` says what the value means or how to choose one; the error adds the nearest bound as an example."""
    return field(default=default, default_factory=default_factory, metadata={"range": (lo, hi), "fix": fix, "doc": doc})


def doc(f: dataclasses.Field) -> str:
    return f.metadata.get("doc", "")


def items(node: Any, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field | None, Any]]:
    """(dotted key, its dataclass field or None, value) of every leaf under ``node``: dataclass instances and
    dicts are walked (a dict's keys become part of the dotted key, ``streams.NAME.task``); an empty dict is a
    leaf."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            key = f"{prefix}{f.name}"
            if (dataclasses.is_dataclass(value) and not isinstance(value, type)) or (isinstance(value, dict) and value):
                yield from items(value, key + ".")
            else:
                yield key, f, value
    elif isinstance(node, dict) and node:
        for k, value in node.items():
            key = f"{prefix}{k}"
            if (dataclasses.is_dataclass(value) and not isinstance(value, type)) or (isinstance(value, dict) and value):
                yield from items(value, key + ".")
            else:
                yield key, None, value
    else:
        yield prefix.rstrip("."), None, node


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of every leaf under ``node`` (a dataclass instance or a nested dict)."""
    return {k: v for k, _, v in items(node, prefix)}


def value_error(key: str, value: Any, f: dataclasses.Field) -> str | None:
    """The error for ``value`` of field ``f`` at ``key`` if its metadata rules it out, else None."""
    if value is None:
        return None
    if "choices" in f.metadata and value not in f.metadata["choices"]:
        return f"bad value {value!r} for '{key}'. Valid choices: {', '.join(map(str, f.metadata['choices']))}"
    if "range" in f.metadata:
        lo, hi = f.metadata["range"]
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            near = lo if lo is not None and value < lo else hi
            what = f.metadata.get("fix") or (f"must lie in [{lo:g}, {hi:g}]" if lo is not None and hi is not None
                                              else f"must be >= {lo:g}" if lo is not None else f"must be <= {hi:g}")
            return f"bad value {value} for '{key}': {what}; e.g. {key}={near:g}"
    return None


def field_errors(node: Any, prefix: str = "") -> list[str]:
    """Every value under ``node`` that its field's choices or range rule out, each named with its dotted key."""
    return [e for key, f, value in items(node, prefix) if f is not None and (e := value_error(key, value, f))]
