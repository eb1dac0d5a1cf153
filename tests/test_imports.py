"""The import graph of negft, read with ast (every import, those inside functions too): no cycle; the layers
library < negft.train < negft.release < negft.commands, none importing a higher one (negft.train imports config,
losses, models and data; none of those, nor the probes, imports negft.train back); and no command module imports
another (what two commands share lives below them)."""
import ast
from pathlib import Path

from tests.conftest import REPO

BELOW_TRAIN = ("negft.config", "negft.losses", "negft.models", "negft.io", "negft.text", "negft.phrasings",
               "negft.data", "negft.convert", "negft.world", "negft.probes", "negft.evaluation", "negft.patching",
               "negft.tables")


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
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
