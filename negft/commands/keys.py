"""A command's keys: one dataclass per command, whose fields are its keys with their defaults, one-line docs and
allowed values (``negft.fields``). ``parse`` reads a command line into it (an unknown key is refused with the
nearest ones, as a recipe's override is: ``negft.config.unknown_key``), ``usage_keys`` writes its ``--help``.

Shared by the command modules, which import no other command module.
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import gc
import sys
import textwrap
import typing
from dataclasses import MISSING, field
from pathlib import Path
from typing import Any, Callable

from negft.config import ConfigError, parse_overrides, unknown_key
from negft.fields import bounded, doc, field_errors

HELP_FLAGS = ("-h", "--help")


def key(default: Any = MISSING, doc: str = "") -> Any:
    """A key with a one-line doc; without a default, one the command line must give."""
    return field(default=default, metadata={"doc": doc})


def markdown_digits(kept: str) -> int:
    """The decimals a command prints in its Markdown tables (``digits=``); ``kept``: the files that keep them all."""
    return bounded(3, lo=1, hi=6, doc=f"decimals printed in the Markdown ({kept})")


def wants_help(argv: list[str]) -> bool:
    return any(a in HELP_FLAGS for a in argv)


@functools.cache
def skip_the_last_collection() -> None:
    """When the process exits, freeze what is left (``gc.freeze``) so that the interpreter's last full garbage
    collection passes over it. That pass walks every object the imports made (torch's, open_clip's, DeepSpeed's:
    about half a million) and took about 3 s of each ``train.py`` run's or pytest worker's exit on a 2-core CPU
    (0.5 to 0.9 s with the freeze). By then the command has closed its files and writers; what stays uncollected
    goes with the process. Registered once per process, however many commands run in it."""
    atexit.register(gc.freeze)


CLOSED_PIPE = 141       # 128 + SIGPIPE: what a shell reports for a process that a closed pipe ended


def quiet_on_closed_pipe(main):
    """A command's ``main`` whose output may go to a reader that stops early (``train.py --help | head``): the
    closed pipe ends it with ``CLOSED_PIPE``, not a ``BrokenPipeError`` traceback, and the interpreter's last flush
    of stdout goes to /dev/null (else it prints "Exception ignored ... BrokenPipeError" on the way out)."""
    @functools.wraps(main)
    def run(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            import os
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError, AttributeError):       # a stdout with no file descriptor
                sys.stdout = open(os.devnull, "w")
            return CLOSED_PIPE
    return run


def fail(message: str) -> int:
    """Bad input: the message on stderr, exit status 2 (nothing was written)."""
    print(f"negft: error: {message}", file=sys.stderr)
    return 2


def write_failed(e: Exception) -> int:
    """A write that failed (a full disk, a read-only out): its ``WriteError`` names the path and what was kept;
    exit 1 (2 is for bad input)."""
    print(f"negft: error: {e}\nFree space or fix the permissions, then run the same command again.", file=sys.stderr)
    return 1


class Failed(Exception):
    """The command ran and could not do what it was asked (its files say why): exit 1 with this message."""


BAD_INPUT = (ConfigError, FileNotFoundError, FileExistsError, ValueError)     # a command's exit 2 (``fail``)


def outcome(action: Callable[[], Any], done: Callable[[Any], str | None] = lambda _: None) -> int:
    """A command's last step, its errors as every command reports them: ``action()``, then ``done``'s line for its
    result, exit 0; bad input (``BAD_INPUT``) exit 2, a failed write (``negft.io.WriteError``) or ``Failed``
    exit 1."""
    from negft.io import WriteError
    try:
        result = action()
    except BAD_INPUT as e:
        return fail(str(e))
    except WriteError as e:
        return write_failed(e)
    except Failed as e:
        print(f"negft: error: {e}", file=sys.stderr, flush=True)
        return 1
    line = done(result)
    if line:
        print(line, flush=True)
    return 0


def write_files(out: str, files: dict[str, str], what: str) -> int:
    """``files`` ({name: text}) written into the folder ``out`` (``outcome``'s exit status), each path printed."""
    from negft.io import atomic_write
    return outcome(lambda: [atomic_write(Path(out) / name, text) for name, text in files.items()],
                   lambda paths: "\n".join(f"[negft] {what}: {path}" for path in paths))


def required(f: dataclasses.Field) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _value(name: str, kind: Any, text: str) -> Any:
    """``text`` as a value of type ``kind`` (str, int, float, bool, or Optional of one: "" is None)."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is typing.Union and len(args) == 1:
        if text.strip().lower() in ("", "null", "none"):
            return None
        kind = args[0]
    if kind is bool:
        word = text.strip().lower()
        if word not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigError(f"bad value '{text}' for '{name}'. Valid choices: true, false")
        return word in ("true", "1", "yes")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise ConfigError(f"bad value '{text}' for '{name}': expected {'an integer' if kind is int else 'a number'}"
                              ) from None
    return text


def is_bare(word: str) -> bool:
    """Whether a command-line word is a positional value, not ``key=value`` (a path may hold ``=``)."""
    return "=" not in word or word.startswith(("/", "."))


def parse(cls: type, words: list[str], positional: bool = False) -> Any:
    """``cls`` from ``key=value`` words (and, with ``positional``, bare words filling its required keys in order),
    each value of its field's type and within its choices or range; ``ConfigError`` names what is wrong."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    bare = [w for w in words if positional and is_bare(w)]
    args = parse_overrides([w for w in words if w not in bare])
    for name in args:
        if not fields:
            raise ConfigError(f"unknown key '{name}': this command takes no keys")
        if name not in fields:
            raise unknown_key(name, list(fields), n=3, cutoff=0.5)
    needed = [n for n, f in fields.items() if required(f)]
    if len(bare) > len(needed):
        raise ConfigError(f"too many positional arguments: {' '.join(bare[len(needed):])}")
    for name, word in zip(needed, bare):
        if name in args:
            raise ConfigError(f"'{name}' given twice (positionally and as {name}=)")
        args[name] = word
    missing = [n for n in needed if n not in args]
    if missing:
        raise ConfigError(f"missing required key(s): {', '.join(f'{n}=...' for n in missing)}")
    kinds = typing.get_type_hints(cls)
    obj = cls(**{n: _value(n, kinds[n], text) for n, text in args.items()})
    errors = field_errors(obj)
    if errors:
        raise ConfigError("; ".join(errors))
    return obj


def shown(value: Any) -> str:
    """A default as the command line writes it."""
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def wrap(text: str, indent: int) -> str:
    """``text`` in lines of at most 110 characters, the later ones indented by ``indent``."""
    return textwrap.fill(text, 110, subsequent_indent=" " * indent, break_on_hyphens=False, break_long_words=False)


def usage_keys(cls: type) -> list[str]:
    """``--help``'s key lines: ``key=DEFAULT`` (``key=...``: required) and its doc, with its choices."""
    fields = dataclasses.fields(cls)
    if not fields:
        return ["keys: none"]
    words = {f.name: f"{f.name}=..." if required(f) else f"{f.name}={shown(f.default)}" for f in fields}
    width = max(map(len, words.values())) + 2
    lines = ["keys (key=DEFAULT; ... is required):"]
    for f in fields:
        text = doc(f)
        if "choices" in f.metadata:
            text += "; one of " + ", ".join(shown(c) or '""' for c in f.metadata["choices"])
        lines.append(wrap(f"  {words[f.name].ljust(width)}{text}", width + 2))
    return lines


def synopsis(command: str, cls: type, also: tuple[str, ...] = (), positional: bool = False) -> str:
    """``command``'s one-line usage read off its keys ``cls``: the required ones (``NAME`` where they may be given
    as bare words, else ``name=...``) and those of ``also`` (optional keys worth naming), then ``[key=value ...]``
    where it has others."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [n for n in also if n not in fields]
    if unknown:
        raise KeyError(f"{cls.__name__} has no key {', '.join(unknown)}")
    named = [f for f in fields.values() if required(f) or f.name in also]
    words = [f.name.upper() if positional and required(f) else f"{f.name}=..." if required(f)
             else f"[{f.name}={shown(f.default) or '...'}]" for f in named]
    rest = len(named) < len(fields)
    return " ".join([command, *words, *(["[key=value ...]"] if rest else [])])


def synopsis_rows(rows: list[tuple[str, str]]) -> list[str]:
    """(usage, what) rows as ``negft``'s usage lists them: the usage, then what it does, indented below."""
    return [line for use, what in rows for line in (f"  {use}", wrap(f"      {what}", 6))]


def sections(listed) -> list[str]:
    """README.md sections as ``--help`` cites them: ``"NAME"  what it covers``."""
    quoted = [(f'"{name}"', what) for name, what in listed]
    width = max(len(name) for name, _ in quoted) + 2
    return [f"  {name.ljust(width)}{what}" for name, what in quoted]


def help_text(usage: str | list[tuple[str, str]], what: str, cls: type, readme: tuple, code: str,
              extra: list[str] = ()) -> str:
    """A command's ``--help``: its usage (a line, or its ``synopses`` rows, each read off ``cls``), what it does, its
    keys (from ``cls``), and where to read more."""
    usage = usage if isinstance(usage, str) else "\n       ".join(use for use, _ in usage)
    return "\n".join([f"usage: {usage}", "", wrap(what, 0), "", *usage_keys(cls), *extra, "", f"code: {code}",
                      "README.md sections:", *sections(readme)])


def probe_suites() -> tuple[dict, tuple]:
    """({suite: probe names}, the default suite) as ``negft/probes/__init__.py`` declares them, read from its source:
    importing ``negft.probes`` imports every probe module, and torch, which ``--help`` does without."""
    import ast
    from importlib.util import find_spec
    tree = ast.parse(Path(find_spec("negft.probes").origin).read_text(encoding="utf-8"))
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id in ("SUITES", "DEFAULT_SUITE"):
            found[node.targets[0].id] = node.value
    default = ast.literal_eval(found["DEFAULT_SUITE"])
    suites = {ast.literal_eval(k): default if isinstance(v, ast.Name) else ast.literal_eval(v)
              for k, v in zip(found["SUITES"].keys, found["SUITES"].values)}
    return suites, default


def suites_line() -> list[str]:
    """The suites and probes ``suite=`` takes (eval and patch)."""
    suites, default = probe_suites()
    return ["", wrap(f"suites (suite=): none, all, {', '.join(suites)}, or probe names (the default suite's): "
                     f"{', '.join(default)}", 2)]


def recipes_line() -> str:
    """The recipes ``recipe=`` takes, for ``--help`` (``Config``'s default read off its field: building a
    ``Config`` imports the losses, and torch)."""
    from negft.config import RECIPES, Config, recipe_names
    listed = ", ".join(recipe_names()) or f"none found in {RECIPES}"
    default = {f.name: f.default for f in dataclasses.fields(Config)}["recipe"]
    return wrap(f"recipes (recipe=NAME, default {default}; negft recipes, README \"Recipes\"): {listed}", 2)
