"""The import graph of negft, read with ast (every import, those inside functions too): no cycle; the layers
library < negft.train < negft.release < negft.commands, none importing a higher one (negft.train imports config,
losses, models and data; none of those, nor the probes, imports negft.train back); and no command module imports
another (what two commands share lives below them)."""
import ast
import functools
from pathlib import Path

from tests.conftest import REPO

BELOW_TRAIN = ("negft.config", "negft.losses", "negft.models", "negft.io", "negft.text", "negft.phrasings",
               "negft.data", "negft.convert", "negft.world", "negft.probes", "negft.evaluation", "negft.patching",
               "negft.tables")


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once for every test of this file."""
    return ast.parse(path.read_text(), str(path))


def import_graph(root: Path = REPO / "negft") -> dict[str, set[str]]:
    """{module: the negft modules it imports}, modules named as Python names them (a package by its name)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names}      # from negft import models
        graph[name] = {m for m in found if m in names and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_negft_has_no_import_cycle_and_nothing_below_train_imports_it():
    graph = import_graph()
    assert "negft.train.task" in graph and "negft.losses" in graph["negft.train.task"]
    assert cycles(graph) == []
    below = {m: sorted(d for d in deps if d.startswith("negft.train"))
             for m, deps in graph.items() if m.startswith(BELOW_TRAIN)}
    assert {m: d for m, d in below.items() if d} == {}
    # the loss registry sits below config: config asks it for the loss schema, and it asks nothing of negft but
    # the shard schema and the fields' declarations (negft.fields, which imports nothing of negft)
    assert "negft.losses" in graph["negft.config"]
    assert graph["negft.losses"] <= {"negft.data", "negft.data.schema", "negft.fields"}
    assert graph["negft.fields"] == set()


# from the bottom: a module belongs to the last layer whose prefix it starts with (the library: every other one)
LAYERS = (("library", ("negft",)), ("train", ("negft.train",)), ("release", ("negft.release",)),
          ("commands", ("negft.commands", "negft.__main__")))
# the command modules; negft.commands.keys (what they share) and negft.commands.cli (which dispatches to them by
# name) are not commands
COMMANDS = ("negft.commands.train", "negft.commands.eval", "negft.commands.patch", "negft.commands.release",
            "negft.commands.data", "negft.commands.recipes")


def layer(module: str) -> int:
    return max(i for i, (_, prefixes) in enumerate(LAYERS)
               if any(module == p or module.startswith(p + ".") for p in prefixes))


def test_no_module_imports_a_higher_layer_and_no_command_imports_another():
    graph = import_graph()
    assert set(COMMANDS) <= set(graph) and "negft.commands.keys" in graph["negft.commands.eval"]
    upward = {m: sorted(d for d in deps if layer(d) > layer(m)) for m, deps in graph.items()}
    assert {m: d for m, d in upward.items() if d} == {}
    sideways = {m: sorted(d for d in graph[m] if d in COMMANDS) for m in COMMANDS}
    assert {m: d for m, d in sideways.items() if d} == {}
    assert not any(d.startswith("negft.commands") for d in graph["negft.commands.keys"] if d != "negft.commands")


def test_the_loader_the_converters_and_the_world_are_three_rooms():
    """negft.data (the training loader and the released layouts it and the probes read), negft.convert (released
    files to shards) and negft.world (the embedded world, which also writes the examples the converters' tests
    read): the world may import the other two; the loader imports neither, the converters not the world."""
    graph = import_graph()

    def reaches(room, other):
        return {m: sorted(d for d in deps if d.startswith(other)) for m, deps in graph.items()
                if m.startswith(room) and any(d.startswith(other) for d in deps)}
    assert reaches("negft.data", "negft.convert") == {}
    assert reaches("negft.data", "negft.world") == {}
    assert reaches("negft.convert", "negft.world") == {}
    assert reaches("negft.probes", "negft.world") == {}


def test_the_graph_reader_sees_a_cycle(tmp_path):
    pkg = tmp_path / "negft"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from negft import b\n")
    (pkg / "b.py").write_text("def f():\n    from negft.sub.c import x\n")
    (pkg / "sub" / "c.py").write_text("from ..a import y\n")
    graph = import_graph(pkg)
    assert graph["negft.sub.c"] == {"negft.a"} and graph["negft.b"] == {"negft.sub.c"}
    assert cycles(graph) == [["negft.a", "negft.b", "negft.sub.c"]]


@functools.cache
def defined_names(path: Path) -> frozenset[str]:
    """The names a module defines at its top level: functions, classes, assignments and what it imports."""
    names = set()
    for node in parsed(path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return frozenset(names)


def unresolved(scripts: list[Path], root: Path = REPO / "negft") -> list[str]:
    """Every ``import negft.X`` / ``from negft.X import Y`` of ``scripts`` (inside functions too) whose module or
    name negft does not have: what a moved module leaves behind in a script no test runs."""
    modules = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in root.rglob("*.py")}
    bad = []
    for script in scripts:
        name = script.relative_to(root.parent)
        for node in ast.walk(parsed(script)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            where = f"{name}:{node.lineno}"
            if isinstance(node, ast.Import):
                bad += [f"{where} import {a.name}" for a in node.names
                        if a.name.split(".")[0] == "negft" and a.name not in modules]
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "negft":
                if node.module not in modules:
                    bad.append(f"{where} from {node.module}: no such module")
                    continue
                have = defined_names(modules[node.module])
                bad += [f"{where} from {node.module} import {a.name}" for a in node.names
                        if a.name != "*" and a.name not in have and f"{node.module}.{a.name}" not in modules]
    return bad


def test_every_script_imports_what_negft_has():
    """bench/, experiments/ and the tests import only modules and names that exist (a module moved under
    negft.commands once left bench/step_ops.py importing negft.cli)."""
    scripts = [p for d in ("bench", "experiments", "tests") for p in sorted((REPO / d).rglob("*.py"))]
    scripts += sorted((REPO / "negft").rglob("*.py")) + [REPO / "train.py", REPO / "eval.py"]
    assert len(scripts) > 200 and unresolved(scripts) == []


def test_the_import_checker_sees_a_moved_module_and_a_missing_name(tmp_path):
    pkg = tmp_path / "negft"
    (pkg / "commands").mkdir(parents=True)
    for name in ("__init__.py", "commands/__init__.py"):
        (pkg / name).write_text("")
    (pkg / "commands" / "train.py").write_text("import os\nRUNS = 1\ndef main(): pass\n")
    script = tmp_path / "bench.py"
    script.write_text("from negft.commands.train import main, RUNS, os\nfrom negft.commands import train\n"
                      "def f():\n    from negft.cli import run_train\n    from negft.commands.train import gone\n"
                      "    import negft.nope\n")
    assert unresolved([script], pkg) == ["bench.py:4 from negft.cli: no such module",
                                         "bench.py:5 from negft.commands.train import gone", "bench.py:6 import negft.nope"]
