"""Canaries made from the hidden test module's own tests, so that nothing tells them apart.

A canary of a fixed shape (a random name, arithmetic that never calls the package) is told
apart from the hidden tests by its name, its shape, or by running it once under a profiler
(it calls nothing of the package). Here each canary is a **copy of one of the module's own
test functions** that is known to pass at the base commit (its id is in PASS_TO_PASS, none in
FAIL_TO_PASS), with its decorators (parametrization, marks) and its fixtures:

* a copy left as it is (the *guard*), run right after its original;
* copies with one assertion negated (``==`` -> ``!=``, ``in`` -> ``not in``, ``x`` ->
  ``not x``, ``not x`` -> ``x``), run right after the guard: each must fail
  wherever its original and its guard passed (a test that does not pass twice in a row, as
  under a state leak of the code under test, leaves its copies unchecked rather than
  calling an honest run forged).

Only assertions that are statements of the function's own body (not in a loop, ``with``,
``if`` or ``try``), in a function with no ``return``/``yield``, are mutated: such an
assertion runs exactly once whenever the test passes, and it held, so its negation fails.
Each copy gets a name made of the words of the module's own test names
(never one the module uses) and goes in the module right after its original: every name its
decorators read is bound there, and it runs in the state its original ran in (tests that read
what earlier tests left in ``os.environ`` pass only there).

Only module-level functions are copied (methods of test classes are not). A module with no
such test that has a mutable assertion gets no copies: :mod:`.integrity` falls back to its
own canaries then.
"""

from __future__ import annotations

import ast
import functools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from patchgym.grading.pyast import parse as parse_python

_SKIPPING_MARKS = {"xfail", "skip", "skipif"}
# A comparison's operator as written, and its negation.
_INVERSE_OPS = {ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"),
                ast.IsNot: ("is not", "is"), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in")}


@dataclass(frozen=True)
class Copy:
    """One canary: ``source`` (a function definition named ``name``) goes before line ``line``
    (0-based) of the module, after its ``original``. An unchanged copy (``must_pass``) is the
    guard of the mutated ones that follow it: a mutated copy must fail wherever its original
    and its ``guard`` passed. (A test may not pass twice in a row: code with a state leak, as
    dotenvkit's at some commits, gives another result to the same call the second time. Where
    the guard fails, the run says nothing about the mutated copy, and the guard's own failure
    is no forgery either.)"""

    name: str
    source: str
    line: int
    original: str
    must_pass: bool
    guard: str | None = None  # a must-fail copy's unchanged copy, run just before it


def _mark_name(decorator: ast.expr) -> str | None:
    """``parametrize`` for ``@pytest.mark.parametrize(...)`` or ``@mark.parametrize``; None for a
    decorator that is not a pytest mark."""
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
        return node.attr
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "mark":
        return node.attr
    return None


def copyable(node: ast.stmt) -> bool:
    """A plain module-level test function whose only decorators are pytest marks that neither skip
    nor expect a failure (what the copy's outcome is compared with must be the test's own)."""
    if not isinstance(node, ast.FunctionDef):
        return False
    marks = [_mark_name(d) for d in node.decorator_list]
    return all(m is not None and m not in _SKIPPING_MARKS for m in marks)


def exits_early(node: ast.FunctionDef) -> bool:
    return any(isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await)) for n in ast.walk(node))


@dataclass(frozen=True)
class Mutation:
    start: tuple[int, int]  # (line, byte column) of the text replaced, 1-based lines as in ast
    end: tuple[int, int]
    text: str


def _mutations(node: ast.Assert, lines: Sequence[bytes]) -> list[Mutation]:
    """How to make ``assert ...`` fail where it held (a text replacement): its test negated, by
    the inverse operator where it is one comparison, else by ``not`` added or taken away. Never a
    changed constant: ``x == 3`` and ``x == 4`` can both hold (``mock.ANY``, dirty-equals'
    ``IsInt``, a wide ``approx``), ``x == 3`` and ``x != 3`` cannot while ``!=`` is the negation
    of ``==`` (Python's default)."""
    test = node.test
    out: list[Mutation] = []
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, right = test.ops[0], test.comparators[0]
        spellings = _INVERSE_OPS.get(type(op))
        if spellings is not None:
            start, end = (test.left.end_lineno, test.left.end_col_offset), (right.lineno, right.col_offset)
            between = _text(lines, start, end)
            spelled, inverse = spellings[0].encode(), spellings[1]
            if between.count(spelled) == 1 and b"#" not in between and b"\\" not in between:
                head, tail = between.split(spelled)
                out.append(Mutation(start, end, f"{head.decode()}{inverse}{tail.decode()}"))
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _text(lines, (test.operand.lineno, test.operand.col_offset),
                      (test.operand.end_lineno, test.operand.end_col_offset)).decode("utf-8", "replace")
        out.append(Mutation((test.lineno, test.col_offset), (test.end_lineno, test.end_col_offset), inner))
    if not out:
        inner = _text(lines, (test.lineno, test.col_offset),
                      (test.end_lineno, test.end_col_offset)).decode("utf-8", "replace")
        # ``not`` binds more loosely than everything but these (``not a < b`` is ``not (a < b)``).
        if isinstance(test, (ast.BoolOp, ast.IfExp, ast.NamedExpr, ast.Lambda)) or "\n" in inner:
            inner = f"({inner})"
        out.append(Mutation((test.lineno, test.col_offset), (test.end_lineno, test.end_col_offset),
                             f"not {inner}"))
    return out


def _text(lines: Sequence[bytes], start: tuple[int, int], end: tuple[int, int]) -> bytes:
    (l1, c1), (l2, c2) = start, end
    if l1 == l2:
        return lines[l1 - 1][c1:c2]
    return lines[l1 - 1][c1:] + b"".join(lines[l1:l2 - 1]) + lines[l2 - 1][:c2]


def function_text(node: ast.FunctionDef, lines: Sequence[bytes], name: str,
                   mutation: Mutation | None) -> str:
    """The function's source (decorators included) renamed to ``name``, with ``mutation`` made."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    own = list(lines[first - 1:node.end_lineno])
    if mutation is not None:
        (l1, c1), (l2, c2) = mutation.start, mutation.end
        a, b = l1 - first, l2 - first
        joined = own[a][:c1] + mutation.text.encode() + own[b][c2:]
        own[a:b + 1] = [joined]
    def_line = node.lineno - first
    own[def_line] = re.sub(rb"\bdef\s+" + re.escape(node.name.encode()) + rb"\b",
                           b"def " + name.encode(), own[def_line], count=1)
    text = b"".join(own).decode("utf-8")
    return text if text.endswith("\n") else text + "\n"


_WORD = re.compile(r"[A-Za-z][a-z0-9]*|[0-9]+")


@dataclass(frozen=True)
class ParsedModule:
    """A test module's source read once (:func:`read_module`): every grading of the same hidden
    file (thousands, in training) shares its tree and its names instead of walking it again (a
    walk of a large test module costs milliseconds). Nothing here is changed by its users."""

    tree: ast.Module
    lines: tuple[bytes, ...]  # keepends; the last one ends with a newline
    defined: tuple[str, ...]  # the module-level functions' and classes' names, in order
    uses: dict[str, int]  # each name's uses other than where it is defined (Name, attribute, identifier-like text)
    taken: frozenset[str]  # names bound anywhere in the module (Name, def, class)
    shapes: tuple[tuple[str, tuple[str, ...]], ...]  # each test name's separator and lowercase words
    follows: dict[str | None, tuple[str | None, ...]]  # which word follows which in them (None: the start, the end)
    source: bytes = b""  # as read

    def mentions(self, name: str) -> int:
        """How many times ``name`` appears in the source as a whole word (its definition included):
        in code, comments and texts alike (``"test_x.py::test_y"`` in pytester's expected output)."""
        return len(re.findall(rb"(?<![\w])" + re.escape(name.encode()) + rb"(?![\w])", self.source))

    def name_maker(self, rng: random.Random):
        """A function giving new test names in the module's own style: its prefix (``test_``,
        ``test``), its separator (``_`` or camel case), its words in the orders its names use them
        (a walk from word to a word that follows it in one of its names); never a name bound
        anywhere in the module, nor one given."""
        taken, shapes, follows = set(self.taken), self.shapes, self.follows
        vocabulary = [w for _, words in shapes for w in words]
        longest = max((len(words) for _, words in shapes), default=2)

        random_float = rng.random

        def pick(options):  # rng.choice's distribution at a fifth of its cost: a name takes ~20 walks
            return options[int(random_float() * len(options))]

        def walk() -> list[str]:
            words: list[str] = []
            word = pick(follows[None])
            while word is not None and word not in words and len(words) < longest:
                words.append(word)
                word = pick(follows.get(word) or (None,))
            return words

        def make() -> str:
            for attempt in range(400):
                sep, words = rng.choice(shapes)
                if attempt < 200:
                    chosen = walk()
                else:  # a module whose names a walk only repeats: its words in new orders
                    chosen = rng.sample(vocabulary, min(max(2, len(words)) + attempt // 100, len(vocabulary)))
                if len(chosen) < 2 or len(set(chosen)) < len(chosen):
                    continue
                name = ("test_" + "_".join(chosen)) if sep else ("test" + "".join(w.capitalize() for w in chosen))
                if name not in taken:
                    taken.add(name)
                    return name
            raise ValueError("no free name")

        return make


@functools.lru_cache(maxsize=16)  # a large test module's tree is megabytes: the files a run grades over and over
def read_module(source: bytes) -> ParsedModule | None:
    """``source`` parsed and its names read in one walk; None when it is not Python this
    interpreter parses, or empty."""
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError):
        return None
    lines = source.splitlines(keepends=True)
    if not lines:
        return None
    if not lines[-1].endswith(b"\n"):
        lines[-1] += b"\n"
    taken: set[str] = set()
    tests: list[str] = []
    uses: dict[str, int] = {}
    for node in ast.walk(tree):
        used = None
        if isinstance(node, ast.Name):
            taken.add(node.id)
            used = node.id
        elif isinstance(node, ast.Attribute):
            used = node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            used = node.value
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            taken.add(node.name)
            if not isinstance(node, ast.ClassDef) and node.name.startswith("test"):
                tests.append(node.name)
        if used is not None:
            uses[used] = uses.get(used, 0) + 1
    shapes: list[tuple[str, tuple[str, ...]]] = []
    for name in tests:
        rest = name[4:]
        words = [w for w in rest[1:].split("_") if w] if rest.startswith("_") else _WORD.findall(rest)
        if words:
            shapes.append(("_" if rest.startswith("_") else "", tuple(w.lower() for w in words)))
    # Which word follows which in the module's names (None: the name ends), for names that read
    # like its own: a walk through them joins two real names where they share a word.
    follows: dict[str | None, list[str | None]] = {}
    for _, words in shapes:
        for before, after in zip([None, *words], [*words, None], strict=True):
            follows.setdefault(before, []).append(after)
    defined = tuple(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    return ParsedModule(tree, tuple(lines), defined, uses, frozenset(taken), tuple(shapes),
                      {k: tuple(v) for k, v in follows.items()}, source)


def _starts_after(tree: ast.Module, line: int, total: int) -> list[int]:
    """0-based lines before each top-level statement that starts after ``line`` (1-based, the
    original's last), and the end of the module."""
    starts = []
    for node in tree.body:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", None) or [])])
        if first > line:
            starts.append(first - 1)
    return sorted({*starts, total})


def make_copies(source: bytes, passing: set[str], failing: set[str], rng: random.Random) -> list[Copy]:
    """Canaries for a module with content ``source``: copies of its module-level test functions
    named in ``passing`` (function names whose every graded id passes at the base commit) and not
    in ``failing``; empty when none of them has an assertion that can be made to fail."""
    module = read_module(source)
    if module is None:
        return []
    tree, lines, defined = module.tree, module.lines, module.defined
    candidates = [n for n in tree.body if copyable(n) and n.name in passing and n.name not in failing
                  and defined.count(n.name) == 1]
    mutable: list[tuple[ast.FunctionDef, list[Mutation]]] = []
    for node in candidates:
        if exits_early(node):
            continue
        found = [m for stmt in node.body if isinstance(stmt, ast.Assert) for m in _mutations(stmt, lines)]
        if found:
            mutable.append((node, found))
    if not mutable:
        return []
    try:
        new_name = module.name_maker(rng)
        rng.shuffle(mutable)
        wanted_fail = 3 + rng.randrange(4)
        count = 1 + rng.randrange(min(3, len(mutable)))
        while count < len(mutable) and sum(len(found) for _, found in mutable[:count]) < wanted_fail:
            count += 1
        groups = mutable[:count]
        fails: dict[str, list[Mutation]] = {node.name: [] for node, _ in groups}
        while sum(map(len, fails.values())) < wanted_fail and any(found for _, found in groups):
            for node, found in groups:
                if found and sum(map(len, fails.values())) < wanted_fail:
                    fails[node.name].append(found.pop(rng.randrange(len(found))))
        copies: list[Copy] = []
        for node, _ in groups:
            line = _starts_after(tree, node.end_lineno, len(lines))[0]
            guard = new_name()
            copies.append(Copy(guard, function_text(node, lines, guard, None), line, node.name, True))
            for mutation in fails[node.name]:
                name = new_name()
                copies.append(Copy(name, function_text(node, lines, name, mutation), line, node.name, False,
                                   guard))
    except (ValueError, IndexError, UnicodeDecodeError):
        return []
    return copies
