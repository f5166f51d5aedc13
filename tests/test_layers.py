"""The layers import one way, and no modules import each other (docs/architecture.md):

    sandboxes -> tasks -> gym_envs.grading -> gym_envs.envs | gym_envs.making -> gym_envs.rollouts
      -> server -> cli

A module may import its own layer and the ones before it, never one after it (imports inside
functions included: a lazy import that runs up a layer is still a dependency that runs up);
``gym_envs.envs`` and ``gym_envs.making`` are side by side and do not import each other. The
top-level folders show the same order: each holds a run of consecutive layers, and no folder
imports one after it.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sandboxes", "tasks", "gym_envs", "server", "cli")  # the folders, in the layers' order
# (module prefix, layer, group): the longest matching prefix decides.
LAYERS = [
    ("sandboxes", 0, "sandboxes"),
    ("tasks", 1, "tasks"),
    ("gym_envs.grading", 2, "grading"),
    ("gym_envs.envs", 3, "envs"),
    ("gym_envs.making", 3, "making"),
    ("gym_envs.rollouts", 4, "rollouts"),
    ("server", 5, "server"),
    ("cli", 6, "cli"),
]


def layer_of(module: str) -> tuple[int, str] | None:
    best = None
    for prefix, layer, group in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer, group)
    return None if best is None else best[1:]


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name: str, path: Path, known: set[str], *, top_level_only: bool) -> set[str]:
    """The project modules ``name`` imports (``from a import b`` counts as ``a.b`` when that is a
    module); only module-level statements with ``top_level_only`` (what runs at import time)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        out |= {t for t in targets if t.split(".")[0] in PACKAGES}
    return out


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer_of(m) is None] == ["gym_envs"], \
        "a module outside every layer (only the gym_envs package itself may be)"


def test_the_gym_envs_package_imports_nothing_of_the_project():
    """``import gym_envs`` happens before any of its layers is imported; it must not pull them in."""
    known = set(modules())
    assert imports("gym_envs", ROOT / "gym_envs" / "__init__.py", known, top_level_only=False) == set()


def test_imports_point_down_the_layers():
    found = modules()
    known = set(found)
    wrong = []
    for name, path in sorted(found.items()):
        mine = layer_of(name)
        if mine is None:
            continue
        for target in sorted(imports(name, path, known, top_level_only=False)):
            theirs = layer_of(target)
            if theirs is None:
                wrong.append(f"{name} imports {target} (the gym_envs package: import from its layers)")
            elif theirs[0] > mine[0] or (theirs[0] == mine[0] and theirs[1] != mine[1]):
                wrong.append(f"{name} ({mine[1]}) imports {target} ({theirs[1]})")
    assert not wrong, "\n".join(wrong)


def test_each_folder_holds_consecutive_layers_in_order():
    spans = {}
    for name in modules():
        found = layer_of(name)
        if found is not None:
            low, high = spans.get(name.split(".")[0], (found[0], found[0]))
            spans[name.split(".")[0]] = (min(low, found[0]), max(high, found[0]))
    ordered = [spans[p] for p in PACKAGES]
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ordered)), f"folders overlap or run back: {spans}"


def test_folders_import_down():
    found = modules()
    known = set(found)
    rank = {p: i for i, p in enumerate(PACKAGES)}
    wrong = [f"{name} imports {target}" for name, path in sorted(found.items())
             for target in sorted(imports(name, path, known, top_level_only=False))
             if rank[target.split(".")[0]] > rank[name.split(".")[0]]]
    assert not wrong, "\n".join(wrong)


def test_no_import_circles():
    found = modules()
    known = set(found)
    graph = {n: imports(n, p, known, top_level_only=True) & known for n, p in found.items()}
    cycles = strongly_connected(graph)
    assert not cycles, "modules that import each other: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm: the components with more than one module, or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("graph, expected", [({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [{"a", "b"}]),
                                             ({"a": {"b"}, "b": set()}, [])])
def test_the_circle_finder_finds_circles(graph, expected):
    assert strongly_connected(graph) == expected
