"""The floors of the house import one way, and no modules import each other (docs/architecture.md):

    sandboxes -> tasks -> grading -> gym_envs | making -> rollouts -> server -> cli

Each folder is one floor of the one import package ``patchgym``. A module may import its own floor
and the ones below it, never one above (imports inside functions included: a lazy import that runs
up is still a dependency that runs up); ``gym_envs`` and ``making`` are side by side and do not
import each other. The package itself (the root ``__init__.py``) imports none of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "patchgym"
# folder -> floor; floors side by side share a number.
FLOORS = {"sandboxes": 0, "tasks": 1, "grading": 2, "gym_envs": 3, "making": 3, "rollouts": 4, "server": 5, "cli": 6}
# Modules copied into sandboxes and run there by another interpreter, as scripts or as the package
# ``pgrt``: they import nothing of patchgym by name (what they share, they import relatively).
SANDBOX_SIDE = ("patchgym.grading.pytest_runtime", "patchgym.sandboxes.sandbox_init",
                "patchgym.sandboxes.docker.diff_helper", "patchgym.sandboxes.bytecode_compile",
                "patchgym.making.synth.reach_plugin", "patchgym.sandboxes.base", "patchgym.sandboxes.files",
                "patchgym.sandboxes.output", "patchgym.sandboxes.process", "patchgym.sandboxes.gitops",
                "patchgym.sandboxes.wire", "patchgym.rollouts.harnesses.sandbox_launcher")


def floor_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == PACKAGE and parts[1] in FLOORS else None


def modules() -> dict[str, Path]:
    """Every module of the package, by its installed name."""
    found = {PACKAGE: ROOT / "__init__.py", f"{PACKAGE}.__main__": ROOT / "__main__.py"}
    for folder in FLOORS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join((PACKAGE, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def imports(name: str, path: Path, known: set[str], *, top_level_only: bool) -> set[str]:
    """The names ``name`` imports (``from a import b`` counts as ``a.b`` when that is a module);
    only module-level statements with ``top_level_only`` (what runs at import time)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out |= {f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names}
    return out


def project_imports(name: str, path: Path, known: set[str], *, top_level_only: bool = False) -> set[str]:
    return {t for t in imports(name, path, known, top_level_only=top_level_only) if t.split(".")[0] == PACKAGE}


def test_every_module_is_on_a_floor():
    assert sorted(m for m in modules() if floor_of(m) is None) == [PACKAGE, f"{PACKAGE}.__main__"]


def test_the_package_itself_imports_nothing_of_its_floors():
    """``import patchgym.sandboxes`` runs the root ``__init__.py`` first: it must pull in no floor
    (its public names load on first use)."""
    known = set(modules())
    assert project_imports(PACKAGE, ROOT / "__init__.py", known) == set()


def test_imports_name_the_one_package():
    """The folders are ``patchgym``'s subpackages once installed: ``import sandboxes`` works only
    from the checkout's root, and would shadow (or be shadowed by) a user's own ``tasks``."""
    names = set(FLOORS) | {"gym_envs"}
    wrong = [f"{name} imports {target}" for name, path in sorted(modules().items())
             for target in sorted(imports(name, path, set(), top_level_only=False))
             if target.split(".")[0] in names]
    assert not wrong, "\n".join(wrong)


def test_imports_point_down_the_floors():
    found = modules()
    known = set(found)
    wrong = []
    for name, path in sorted(found.items()):
        mine = floor_of(name)
        if mine is None:
            continue
        for target in sorted(project_imports(name, path, known)):
            theirs = floor_of(target)
            if theirs is None:
                wrong.append(f"{name} imports {target} (the package itself: import from its floors)")
            elif FLOORS[theirs] > FLOORS[mine] or (FLOORS[theirs] == FLOORS[mine] and theirs != mine):
                wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
    assert not wrong, "\n".join(wrong)


BACKENDS = {"local": ("patchgym.sandboxes.local",), "docker": ("patchgym.sandboxes.docker",),
            "ray": ("patchgym.sandboxes.ray_cluster",)}


def backend_of(module: str) -> str | None:
    return next((name for name, prefixes in BACKENDS.items()
                 if any(module == p or module.startswith(p + ".") for p in prefixes)), None)


def test_the_sandbox_backends_are_siblings():
    """Each backend imports what they share (``sandboxes/base.py`` and the helpers beside it), never
    another backend; only the ray backend, which hosts a local or docker sandbox on its node (and
    its guard reaps what they left), imports them, and only when it does (inside a function)."""
    found = modules()
    known = set(found)
    wrong = []
    for name, path in sorted(found.items()):
        mine = backend_of(name)
        if mine is None:
            continue
        at_import = project_imports(name, path, known, top_level_only=True)
        for target in sorted(project_imports(name, path, known)):
            theirs = backend_of(target)
            if theirs is None or theirs == mine:
                continue
            if mine == "ray" and target not in at_import:
                continue
            wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
    assert not wrong, "\n".join(wrong)


def test_code_run_inside_sandboxes_imports_nothing_of_patchgym_by_name():
    wrong = [f"{name} imports {target}" for name, path in sorted(modules().items())
             if name.startswith(SANDBOX_SIDE) and name != "patchgym.grading.pytest_runtime"
             for target in sorted(imports(name, path, set(), top_level_only=False))
             if target.split(".")[0] == PACKAGE and not _relative(path)]
    assert not wrong, "\n".join(wrong)


def _relative(path: Path) -> bool:
    """Whether every import of the package in ``path`` is relative (``from .base import ...``)."""
    return not any(isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").split(".")[0] == PACKAGE
                   for n in ast.walk(ast.parse(path.read_text())))


def test_no_import_circles():
    found = modules()
    known = set(found)
    graph = {n: project_imports(n, p, known, top_level_only=True) & known for n, p in found.items()}
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
