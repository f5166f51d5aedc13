"""Which tests *declare* an expected failure or a skip, read from their file as written.

SWE-bench grading counts XFAIL as a pass and keeps a skipped PASS_TO_PASS test. Whether a test's
XFAIL or skip was *meant* must not be decided by anything that runs with the code under test: a
plugin that code registers can add ``pytest.mark.xfail`` to every item at collection, and code under
test can call ``pytest.xfail()`` or ``pytest.skip()`` from inside a test. pytest would report both
as the test's own. So the harness decides from the test file's source, read from the sandbox just
before the run (the base commit plus the test patch: the agent's changes to the hidden test files
are dropped before grading, and none of its code has run yet), parsed here, outside the sandbox.

A test declares an expected failure when its file says so about it (each an AST check, no code run):

* a decorator of the function, or of a class around it, that mentions ``xfail`` or
  ``expectedFailure`` (``@pytest.mark.xfail``, ``@mark.xfail(...)``, ``@unittest.expectedFailure``,
  a name bound at module level to such an expression, and ``pytest.param(..., marks=...xfail)``
  inside ``@pytest.mark.parametrize``: the whole function then counts as declared, as telling
  which generated id a case gets would mean running pytest's id rules);
* ``pytestmark`` of the module or of a class around it mentions ``xfail``;
* the function's own body mentions ``xfail`` (``pytest.xfail(...)``, ``request.applymarker(...)``),
  or a fixture defined in the same file that the function takes as a parameter does.

A test the file does not define (inherited from another module, generated) counts as declared
when the file mentions ``xfail`` anywhere: it is never told apart from a file that does. Every test
below a ``conftest.py`` that mentions ``xfail`` counts as declared (see :class:`DeclaredTests`).

Skips (:func:`declares_skip`) follow the same rules with ``skip``, ``skipif``, ``importorskip``,
``SkipTest``, ``skipTest``, ``skipIf``, ``skipUnless``; they are only consulted for a test skipped in
its *call* phase (see :func:`patchgym.grading.outcome.grade`), where a marker or fixture (setup) or a
module-level ``importorskip`` (collection) cannot act: only code the test calls can.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from patchgym.grading.pyast import parse as parse_python

XFAIL_WORDS = frozenset({"xfail", "expectedFailure"})
SKIP_WORDS = frozenset({"skip", "skipif", "importorskip", "SkipTest", "skipTest", "skipIf", "skipUnless",
                        "Skipped"})


def _mentions(node: ast.AST | None, words: frozenset[str], aliases: frozenset[str] = frozenset()) -> bool:
    if node is None:
        return False
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in words:
            return True
        if isinstance(sub, ast.Name) and (sub.id in words or sub.id in aliases):
            return True
        if isinstance(sub, ast.alias) and (sub.asname or sub.name).split(".")[-1] in words:
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value in words:
            return True  # add_marker("xfail"), getattr(pytest.mark, "xfail")
    return False


@dataclass
class _Scope:
    """What one file declares for ``words``."""

    tests: dict[str, bool] = field(default_factory=dict)  # "Class::test" or "test" -> declared
    anywhere: bool = False


def _analyse(tree: ast.Module, words: frozenset[str]) -> _Scope:
    scope = _Scope(anywhere=_mentions(tree, words))
    # Module-level names bound to an expression that mentions the words: `xfail_py = pytest.mark.xfail(...)`.
    aliases: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _mentions(node.value, words):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            aliases.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            aliases.update(a.asname for a in node.names if a.asname and a.name.split(".")[-1] in words)
    frozen = frozenset(aliases)

    def marked(body: list[ast.stmt]) -> bool:
        return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                     for t in n.targets) and _mentions(n.value, words, frozen)
                   for n in body)

    fixtures = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def function_declares(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        if any(_mentions(d, words, frozen) for d in fn.decorator_list):
            return True
        if any(_mentions(stmt, words, frozen) for stmt in fn.body):
            return True
        params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]
        return any(p in fixtures and fixtures[p] is not fn
                   and any(_mentions(stmt, words, frozen) for stmt in fixtures[p].body) for p in params)

    def visit(body: list[ast.stmt], prefix: str, inherited: bool, classes: dict[str, ast.ClassDef]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope.tests[prefix + node.name] = inherited or function_declares(node)
            elif isinstance(node, ast.ClassDef):
                declares = (inherited or marked(node.body)
                            or any(_mentions(d, words, frozen) for d in node.decorator_list))
                visit(node.body, f"{prefix}{node.name}::", declares, classes)
                # Test methods of a base class defined in this file run under this class too.
                for base in node.bases:
                    if isinstance(base, ast.Name) and base.id in classes:
                        for key, value in list(scope.tests.items()):
                            head = f"{prefix}{base.id}::"
                            if key.startswith(head):
                                name = f"{prefix}{node.name}::{key[len(head):]}"
                                scope.tests.setdefault(name, value or declares)
                classes[node.name] = node

    visit(tree.body, "", marked(tree.body), {})
    return scope


@functools.lru_cache(maxsize=128)
def _scopes_of(source: bytes | str) -> tuple[_Scope, _Scope] | None:
    """What a file's text declares (xfail, skip), or None where it does not parse. Cached by the text:
    a task's hidden test files are the same on every grading of it (an RL run grades one task many
    times), and reading them is pure CPU in the harness (~20 ms for ten files)."""
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError):
        return None
    return _analyse(tree, XFAIL_WORDS), _analyse(tree, SKIP_WORDS)


def conftests_of(paths: Iterable[str]) -> list[str]:
    """The ``conftest.py`` files that could apply to test files at ``paths`` (their directories and
    every directory above, up to the repository's root)."""
    out: list[str] = []
    for path in paths:
        parts = path.split("/")[:-1]
        for depth in range(len(parts), -1, -1):
            out.append("/".join([*parts[:depth], "conftest.py"]))
    return list(dict.fromkeys(out))


class DeclaredTests:
    """The expected failures and skips that a set of test files declare.

    ``conftests`` are the ``conftest.py`` files above them (:func:`conftests_of`): a repository's
    conftest can mark tests at collection (a list of known failures), and the agent cannot change
    it (the patch filter drops conftest.py), so where one mentions ``xfail`` (or a skip), every test
    below it counts as declaring one. This spares the gold patch of such repositories; it also
    lets a forger's run-time XFAIL pass there, which the audit hook is left to stop."""

    def __init__(self, sources: Mapping[str, bytes | str | None],
                 conftests: Mapping[str, bytes | str | None] | None = None) -> None:
        self._xfail: dict[str, _Scope | None] = {}
        self._skip: dict[str, _Scope | None] = {}
        self._xfail_dirs: set[str] = set()
        self._skip_dirs: set[str] = set()
        for path, source in (conftests or {}).items():
            scopes = _scopes_of(source) if source is not None else None
            if scopes is None:
                continue
            where = path.rsplit("/", 1)[0] if "/" in path else ""
            if scopes[0].anywhere:
                self._xfail_dirs.add(where)
            if scopes[1].anywhere:
                self._skip_dirs.add(where)
        for path, source in sources.items():
            scopes = _scopes_of(source) if source is not None else None
            self._xfail[path], self._skip[path] = scopes or (None, None)

    @staticmethod
    def _declared(scopes: Mapping[str, _Scope | None], node_id: str, dirs: set[str] = frozenset()) -> bool:
        path, sep, rest = node_id.partition("::")
        if not sep:
            return False
        if any(d == "" or path.startswith(d + "/") for d in dirs):
            return True
        scope = scopes.get(path)
        if scope is None:  # a file that was not read or does not parse: nothing is declared
            return False
        key = rest.split("[", 1)[0]
        if key in scope.tests:
            return scope.tests[key]
        return scope.anywhere

    def declares_xfail(self, node_id: str) -> bool:
        """Whether the file of ``node_id`` declares that the test may fail expectedly."""
        return self._declared(self._xfail, node_id, self._xfail_dirs)

    def declares_skip(self, node_id: str) -> bool:
        """Whether the file of ``node_id`` declares that the test may skip itself."""
        return self._declared(self._skip, node_id, self._skip_dirs)


def files_of(test_ids: Iterable[str]) -> list[str]:
    """The Python files that ``test_ids`` (pytest node ids) live in, in order."""
    paths = (t.split("::", 1)[0] for t in test_ids if "::" in t)
    return list(dict.fromkeys(p for p in paths if p.endswith(".py")))
