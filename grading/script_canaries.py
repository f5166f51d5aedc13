"""Canary tests for Django's and SymPy's runners, written in their own test style.

The same idea as pytest's canaries (:mod:`.integrity`): several tests, some that must pass and
some that must fail (random counts), added to a hidden test module just before the run. Forcing
every outcome to "passed" passes a failing canary; failing the run fails a passing one. Here they
take the runner's shape: a Django canary is a method of the hidden test's own ``TestCase`` class
(``self.assertEqual``), run by a label of its own among the hidden tests' labels; a SymPy canary is
a plain ``test_`` function placed among the module's functions (``bin/test`` runs whole files, in
source order). Names are made of the words of the module's own test names, so neither the name
nor the body's shape tells a canary from a hidden test at a glance.
"""

from __future__ import annotations

import ast
import re
import secrets
from dataclasses import dataclass

from patchgym.grading import integrity, runners
from patchgym.grading.outcome import TestStatus
from patchgym.grading.pyast import parse as parse_python

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]{2,}")  # test_latex_Float -> latex, Float


@dataclass(frozen=True)
class ScriptCanaries:
    """Canaries written into ``path`` (its new content: ``content``), by the ids the runner's
    statuses give them (Django ``name (module.Class)``, which also makes their labels; SymPy
    ``name``: ``bin/test`` runs whole files)."""

    path: str
    must_pass: tuple[str, ...]
    must_fail: tuple[str, ...]
    content: bytes

    @property
    def ids(self) -> list[str]:
        return [*self.must_pass, *self.must_fail]

    def original(self, canary: str) -> str | None:
        """None: these canaries stand on their own (``integrity.interleave`` places a copy of a
        module's test after its original; these are no copies)."""
        return None

    def owns(self, test_id: str) -> bool:
        """Whether ``test_id`` is a canary, in any of the runner's wordings."""
        return test_id in self.ids or any(test_id == alias for c in self.ids for alias in runners.django_aliases(c))

    def problem(self, statuses: dict[str, TestStatus], exit_code: int | None) -> str | None:
        """Why the run's outcomes of the canaries show tampering, or None."""
        for kind, wanted, ids in (("pass", TestStatus.PASSED, self.must_pass),
                                  ("fail", TestStatus.FAILED, self.must_fail)):
            for canary in ids:
                if statuses.get(canary) is not wanted:
                    return f"a canary test that must {kind} did not: {canary}"
        if exit_code == 0:
            return "the runner exited 0 although a canary test failed"
        return None


def _kinds() -> list[bool]:
    kinds = [True] * (1 + secrets.randbelow(3)) + [False] * (3 + secrets.randbelow(4))
    secrets.SystemRandom().shuffle(kinds)
    return kinds


def _names(existing: set[str], count: int) -> list[str]:
    """``count`` new ``test_`` names made of the words of the module's own test names."""
    words = sorted({w for name in existing for w in name.split("_")[1:] if _WORD.fullmatch(w)}) or ["value", "case"]
    names: list[str] = []
    while len(names) < count:
        parts = [secrets.choice(words) for _ in range(2 + secrets.randbelow(2))]
        name = "test_" + "_".join(dict.fromkeys(parts))
        if secrets.randbelow(2):
            name += f"_{secrets.randbelow(30) + 2}"
        if name not in existing and name not in names:
            names.append(name)
    return names


def _arithmetic(passes: bool) -> tuple[str, str]:
    a, b = secrets.randbelow(900) + 100, secrets.randbelow(900) + 100
    op = secrets.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    if not passes:
        value += secrets.choice((-1, 1)) * (1 + secrets.randbelow(9))
    return f"{a} {op} {b}", str(value)


def _test_names(tree: ast.AST) -> set[str]:
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")}


def sympy_canaries(path: str, source: bytes, taken: set[str] = frozenset()) -> ScriptCanaries | None:
    """Plain ``test_`` functions placed among a SymPy test module's top-level statements, named
    unlike any of its tests and of ``taken`` (the requested ids: SymPy's ids are bare names)."""
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError):
        return None
    kinds = _kinds()
    names = _names(_test_names(tree) | set(taken), len(kinds))
    used = integrity.imported_names(source)
    touch = f"    assert ({', '.join(used)},) != ()\n" if used else ""
    functions = []
    for name, passes in zip(names, kinds, strict=True):
        expression, value = _arithmetic(passes)
        functions.append(f"def {name}():\n{touch}    assert {expression} == {value}\n")
    placed = integrity.Canaries(path, (), (), tuple(functions)).written_into(source, spread=True)
    return ScriptCanaries(path, tuple(n for n, p in zip(names, kinds, strict=True) if p),
                          tuple(n for n, p in zip(names, kinds, strict=True) if not p), placed)


def django_canaries(path: str, source: bytes, module: str, class_name: str) -> ScriptCanaries | None:
    """Methods added at the end of ``class_name`` (a top-level class of the hidden test module)."""
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError):
        return None
    target = next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name), None)
    end = getattr(target, "end_lineno", None)
    if target is None or end is None:
        return None
    kinds = _kinds()
    names = _names(_test_names(target), len(kinds))
    used = integrity.imported_names(source)
    touch = f"        self.assertTrue(({', '.join(used)},))\n" if used else ""
    # A class decorator can pass arguments to every test method: `@mock.patch(...)` on the class
    # gives each `test*` method its mocks (django__django-15252's TestDbCreationTests), and a
    # canary taking only `self` would raise TypeError there, a must-pass canary "failing".
    params = "self, *args, **kwargs" if target.decorator_list else "self"
    methods = []
    for name, passes in zip(names, kinds, strict=True):
        expression, value = _arithmetic(passes)
        methods.append(f"\n    def {name}({params}):\n{touch}        self.assertEqual({expression}, {value})\n")
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith(b"\n"):
        lines[-1] += b"\n"
    content = b"".join(lines[:end]) + "".join(methods).encode() + b"".join(lines[end:])
    ids = [f"{name} ({module}.{class_name})" for name in names]
    return ScriptCanaries(path, tuple(i for i, p in zip(ids, kinds, strict=True) if p),
                          tuple(i for i, p in zip(ids, kinds, strict=True) if not p), content)


def django_target(requested: list[str], files: list[str]) -> tuple[str, str, str] | None:
    """(path, module, class) of the first requested test whose module the test patch touches."""
    modules = {runners.django_module_label(f): f for f in files if f.endswith(".py")}
    for test_id in requested:
        label = runners.django_label(test_id)
        if not label:
            continue
        module, _, class_name = label.rsplit(".", 1)[0].rpartition(".")
        if module in modules and class_name:
            return modules[module], module, class_name
    return None


def sympy_target(files: list[str]) -> str | None:
    """The first test module the test patch touches."""
    return next((f for f in files if f.rsplit("/", 1)[-1].startswith("test_") and f.endswith(".py")), None)
