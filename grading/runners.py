"""Test runners other than pytest: Django's ``tests/runtests.py`` and SymPy's ``bin/test``.

A runner says two things: how a task's test ids become command-line arguments, and how each
test's outcome is read back. pytest writes junit XML (:mod:`.grading`); these two runners write no
structured results. patchgym starts them under its runtime (``pytest_runtime/script_runner.py``,
:func:`script_invocation`) and reads each test from a recorder inside the runner
(:func:`statuses_from_record` turns its ids into SWE-bench's). Where the runtime cannot be used
(:func:`.testrun._run_script` says when), their outcomes are read from their verbose output, the
way SWE-bench's log parsers read them; code under test can print lines that look like results, so
the verifier then only trusts a run whose exit code agrees with what was read
(:attr:`.testrun.TestRun.consistent`).

Test ids are SWE-bench's:

* django: ``test_name (module.ClassName)`` (``test_name (module.ClassName.test_name)`` when the
  tests ran under Python >= 3.11), or a docstring's first line for a test that has one. The first
  two become labels ``module.ClassName.test_name``; docstring ids cannot, so when a task has any,
  the modules its test patch touches are run instead (as SWE-bench runs every task).
* sympy: bare function names (``test_issue_12345``). ``bin/test`` takes files, not names, so the
  files the test patch touches are run.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from patchgym.grading.outcome import TestStatus
from patchgym.grading.patches import split_diff
from patchgym.grading.pyast import parse as parse_python

# Files of a test patch that are not tests to run (SWE-bench's NON_TEST_EXTS).
NON_TEST_EXTS = (".json", ".png", ".csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
FAILING = (TestStatus.FAILED, TestStatus.ERROR)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DJANGO_ID = re.compile(r"^(?P<name>\w+) \((?P<where>\w+(?:\.\w+)*)\)$")
_DJANGO_ID_PREFIX = re.compile(r"^(?P<id>\w+ \(\w+(?:\.\w+)*\))(?: .*)?$")
_DJANGO_STATUS = re.compile(
    r"^(?P<name>.*?) \.\.\.\s+(?P<status>ok|OK|FAIL|ERROR|skipped\b.*|expected failure|unexpected success)$")
_DJANGO_PENDING = re.compile(r"^(?P<name>.*?) \.\.\.(?: .*)?$")
_DJANGO_BARE = re.compile(r"^(?P<status>ok|OK|FAIL|ERROR|skipped\b.*|expected failure|unexpected success)$")
_DJANGO_SUMMARY = re.compile(r"^(?P<status>FAIL|ERROR): (?P<id>\w+ \(\w+(?:\.\w+)*\))")
_SYMPY_FILE = re.compile(r"^(?P<path>\S+\.py)\[(?P<count>\d+|\?)\]\s*(?P<rest>.*)$")
_SYMPY_TEST = re.compile(r"^(?P<name>test_\w+)(?:\s+(?P<rest>.*))?$")
_SYMPY_HEADER = re.compile(r"^_+ (?P<path>\S+\.py)::?(?P<name>test_\w+) _+$")
_SYMPY_FILE_MARK = re.compile(r"\s*\[(?:OK|FAIL)\]$")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PYTHON_WORD = re.compile(r"^(?:.*/)?python(?:\d+(?:\.\d+)?)?$")


def _status_word(word: str) -> TestStatus | None:
    if word in ("ok", "OK"):
        return TestStatus.PASSED
    if word == "FAIL" or word == "unexpected success":
        return TestStatus.FAILED
    if word == "ERROR":
        return TestStatus.ERROR
    if word == "expected failure":
        return TestStatus.XFAIL
    if word.startswith("skipped"):
        return TestStatus.SKIPPED
    return None


_SYMPY_CHARS = {
    "ok": TestStatus.PASSED, "F": TestStatus.FAILED, "E": TestStatus.ERROR, "f": TestStatus.XFAIL,
    "X": TestStatus.PASSED,  # an @XFAIL test that passed: sympy does not fail the run for it
    "s": TestStatus.SKIPPED, "w": TestStatus.SKIPPED, "T": TestStatus.SKIPPED, "K": TestStatus.SKIPPED,
}


def _record(statuses: dict[str, TestStatus], key: str, status: TestStatus) -> None:
    """A failure is never overwritten by a later pass (a line printed by the code under test, or a
    subtest's failure reported after its test's line)."""
    if statuses.get(key) in FAILING and status not in FAILING:
        return
    statuses[key] = status


def changed_test_files(test_patch: str) -> list[str]:
    """The files a test patch adds or changes, less data files (SWE-bench's test directives)."""
    paths = [s.new_path for s in split_diff(test_patch) if s.new_path]
    return list(dict.fromkeys(p for p in paths if not p.endswith(NON_TEST_EXTS)))


# --- django ---------------------------------------------------------------------------------------

def django_label(test_id: str) -> str | None:
    """``test_x (pkg.tests.C)`` or ``test_x (pkg.tests.C.test_x)`` → ``pkg.tests.C.test_x``;
    None for an id that names no test method (a docstring line)."""
    m = _DJANGO_ID.match(test_id.strip())
    if not m:
        return None
    name, where = m["name"], m["where"]
    return where if where.endswith(f".{name}") else f"{where}.{name}"


def django_module_label(path: str) -> str | None:
    """``tests/pkg/tests.py`` → ``pkg.tests`` (the label runtests.py takes for a test module)."""
    if not path.endswith(".py"):
        return None
    module = path[:-3]
    module = module[len("tests/"):] if module.startswith("tests/") else module
    parts = [p for p in module.split("/") if p]
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or None


def django_labels(tests: Sequence[str], files: Sequence[str] = ()) -> list[str]:
    """The labels to run ``tests``: one per test, or, when some id is a docstring line, the test
    patch's modules plus the tests outside them."""
    labels = [django_label(t) for t in tests]
    known = [x for x in labels if x]
    if len(known) == len(labels) and known:
        return list(dict.fromkeys(known))
    modules = [m for m in (django_module_label(f) for f in files) if m]
    outside = [x for x in known if not any(x == m or x.startswith(m + ".") for m in modules)]
    return list(dict.fromkeys([*modules, *outside]))


def django_aliases(test_id: str) -> list[str]:
    """The same test in the other Python's wording (``(m.C)`` before 3.11, ``(m.C.name)`` after)."""
    m = _DJANGO_ID.match(test_id)
    if not m:
        return []
    name, where = m["name"], m["where"]
    if where.endswith(f".{name}"):
        return [f"{name} ({where[: -len(name) - 1]})"]
    return [f"{name} ({where}.{name})"]


def _django_keys(name: str) -> list[str]:
    name = name.strip()
    if "..." in name:  # another line's output ran into this one ("Applying x...test_y (m.C)")
        tail = name.rsplit("...", 1)[1].strip()
        if _DJANGO_ID_PREFIX.match(tail):
            name = tail
    m = _DJANGO_ID_PREFIX.match(name)
    if m:  # "test_x (m.C) (i=2)": a subtest's line counts for its test
        name = m["id"]
    return [name, *django_aliases(name)]


def parse_django_log(text: str) -> dict[str, TestStatus]:
    """Each test's status from ``runtests.py --verbosity 2`` output (unittest's verbose lines
    ``test_x (m.C) ... ok``, a docstring's first line on the line after the id, output of the test
    between the id and its status, and the ``FAIL:``/``ERROR:`` summary)."""
    statuses: dict[str, TestStatus] = {}
    previous = ""  # the line before: an id whose docstring line carries the status
    pending: list[str] = []  # keys of a test whose status was pushed to a later line by its output
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).strip()
        if not line:
            continue
        summary = _DJANGO_SUMMARY.match(line)
        if summary:
            status = TestStatus.FAILED if summary["status"] == "FAIL" else TestStatus.ERROR
            for key in _django_keys(summary["id"]):
                _record(statuses, key, status)
            pending, previous = [], line
            continue
        m = _DJANGO_STATUS.match(line)
        bare = _DJANGO_BARE.match(line)
        if m:
            keys = _django_keys(m["name"])
            if not _DJANGO_ID_PREFIX.match(keys[0]) and _DJANGO_ID.match(previous):
                keys += _django_keys(previous)  # "Docstring line ... ok" after "test_x (m.C)"
            status = _status_word(m["status"])
            pending = []
        elif bare and pending:
            keys, status = pending, _status_word(bare["status"])
            pending = []
        else:
            p = _DJANGO_PENDING.match(line)
            if p and p["name"]:
                pending = _django_keys(p["name"])
                if not _DJANGO_ID_PREFIX.match(pending[0]) and _DJANGO_ID.match(previous):
                    pending += _django_keys(previous)
            elif line.startswith("=" * 10) or line.startswith("-" * 10):
                pending = []
            previous = line
            continue
        if status is not None:
            for key in keys:
                _record(statuses, key, status)
        previous = line
    return statuses


# --- sympy ----------------------------------------------------------------------------------------

def parse_sympy_log(text: str) -> dict[str, TestStatus]:
    """Each test's status from ``bin/test --verbose`` output: ``test_x ok`` (or ``F``, ``E``, ``f``,
    ``X``, a skip message then ``s``/``w``), a file's ``[OK]``/``[FAIL]`` mark after its last test,
    output of the test between its name and its status, the traceback headers
    ``___ path.py:test_x ___``, and a file that failed to import (keyed by its path)."""
    statuses: dict[str, TestStatus] = {}
    pending: str | None = None
    for raw in text.splitlines():
        line = _SYMPY_FILE_MARK.sub("", _ANSI.sub("", raw).rstrip()).strip()
        if not line:
            continue
        header = _SYMPY_HEADER.match(line)
        if header:
            if statuses.get(header["name"]) not in FAILING:
                _record(statuses, header["name"], TestStatus.FAILED)
            pending = None
            continue
        f = _SYMPY_FILE.match(line)
        if f:
            if f["count"] == "?" or "failed to import" in f["rest"].lower():
                _record(statuses, f["path"], TestStatus.ERROR)
            pending = None
            continue
        t = _SYMPY_TEST.match(line)
        if t:
            words = (t["rest"] or "").split()
            status = _SYMPY_CHARS.get(words[-1]) if words else None
            if status is None:
                pending = t["name"]
            else:
                _record(statuses, t["name"], status)
                pending = None
            continue
        if pending is not None:
            words = line.split()
            status = _SYMPY_CHARS.get(words[-1]) if words else None
            if status is not None:
                _record(statuses, pending, status)
                pending = None
    return statuses


# --- pytest ---------------------------------------------------------------------------------------

def pytest_selector(test_id: str) -> str:
    """The command-line argument that runs ``test_id``: the id itself, or, for a parametrized id
    that SWE-bench recorded shortened, its test function with every parameter: pytest refuses a
    partial id ("not found", exit 4) and runs nothing at all. SWE-bench's log parsers cut ids at
    the first space (``test_x[a b]`` is published as ``test_x[a``) and keep only the last
    component of an absolute-path parameter (``test_x[/testbed/m.py]`` as ``test_x[/m.py]``)."""
    head, bracket, param = test_id.partition("[")
    return head if bracket and (not test_id.endswith("]") or param.startswith("/")) else test_id


def pytest_selectors(test_ids: Iterable[str], selection: str = "ids") -> list[str]:
    """The arguments that run ``test_ids``: each id (:func:`pytest_selector`), or with ``selection``
    "files" the files that hold them, in the order they are first named (see ``TestSpec.selection``)."""
    if selection == "files":
        return list(dict.fromkeys(t.split("::", 1)[0] for t in test_ids))
    return list(dict.fromkeys(pytest_selector(t) for t in test_ids))


# --- commands -------------------------------------------------------------------------------------

def _has_option(command: str, *names: str) -> bool:
    try:
        tokens = shlex.split(command)
    except ValueError:
        tokens = command.split()
    return any(tok == n or tok.startswith(n + "=") for tok in tokens for n in names)


def _quoted(args: Iterable[str]) -> str:
    return " ".join(shlex.quote(a) for a in dict.fromkeys(args))


def django_command(command: str, tests: Sequence[str], files: Sequence[str] = ()) -> str:
    """``command`` (``--verbosity 2`` added when it sets none) followed by the labels to run."""
    if not _has_option(command, "--verbosity", "-v"):
        command += " --verbosity 2"
    labels = django_labels(tests, files) if tests else [m for m in map(django_module_label, files) if m]
    return f"{command} {_quoted(labels)}".rstrip()


def sympy_command(command: str, tests: Sequence[str], files: Sequence[str] = ()) -> str:
    """``command`` (``--verbose`` added when missing) followed by the test files: ``files``, or
    the ids that are paths; none (the whole suite) when neither names a file."""
    if not _has_option(command, "--verbose", "-v"):
        command += " --verbose"
    paths = [f for f in files if f.endswith(".py")] or [t for t in tests if t.endswith(".py") or "/" in t]
    return f"{command} {_quoted(paths)}".rstrip()


@dataclass(frozen=True)
class ScriptInvocation:
    """A runner command patchgym's runtime can start (``pytest_runtime/script_runner.py``): what runs
    before the interpreter (``VAR=value`` words), the ``-W`` options ``PYTHONWARNINGS`` asked for
    (``-I`` makes the interpreter ignore the variable), the script and its arguments, each
    shell-quoted."""

    env: str
    warnings: str
    python: str
    script: str
    args: str


_RUNNER_SCRIPTS = {"django": ("tests/runtests.py",), "sympy": ("bin/test",)}


def script_invocation(fmt: str, command: str) -> ScriptInvocation | None:
    """Split a Django or SymPy runner command (``[VAR=value ...] [python] ./tests/runtests.py ARGS``,
    ``[VAR=value ...] [python] bin/test ARGS``) for the runtime; None for anything else (a wrapper
    script, several steps), which is then run as written and read from its output."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    env = []
    while words and ENV_ASSIGNMENT.match(words[0]):
        env.append(words.pop(0))
    python = "python"
    if words and PYTHON_WORD.match(words[0]):
        python = words.pop(0)
    scripts = _RUNNER_SCRIPTS.get(fmt, ())
    if not words or words[0].removeprefix("./") not in scripts or any(w in ("&&", "||", ";", "|") for w in words):
        return None
    warnings = [f"-W {shlex.quote(option)}" for e in env if e.startswith("PYTHONWARNINGS=")
                for option in e.split("=", 1)[1].split(",") if option]
    return ScriptInvocation(env="".join(shlex.quote(e) + " " for e in env), warnings=" ".join(warnings),
                            python=shlex.quote(python), script=shlex.quote(words[0]),
                            args=" ".join(shlex.quote(a) for a in words[1:]))


def statuses_from_record(fmt: str, statuses: dict[str, TestStatus],
                         aliases: dict[str, list[str]]) -> dict[str, TestStatus]:
    """The runtime's records (ids in the runner's own words) as the ids SWE-bench's parsers give:
    Django's in both Pythons' wordings and by docstring line; SymPy's by bare function name (a
    file that failed to import, by its path)."""
    out: dict[str, TestStatus] = {}
    for nodeid, status in statuses.items():
        if fmt == "django":
            keys = [*_django_keys(nodeid), *aliases.get(nodeid, [])]
        else:
            path, _, name = nodeid.partition("::")
            keys = [name.split("[", 1)[0] if name else path]
        for key in keys:
            _record(out, key, status)
    return out


def _decorated(node: ast.AST, word: str) -> bool:
    for decorator in getattr(node, "decorator_list", ()):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == word:
            return True
    return False


def declares_xfail(fmt: str, test_id: str, sources: dict[str, bytes | None]) -> bool:
    """Whether the test files as written (``sources``, read before anything of the agent's ran)
    mark ``test_id`` as an expected failure: ``@expectedFailure`` on its method or class (Django;
    a docstring id: anywhere in the test files), ``@XFAIL`` on its function (SymPy). An expected
    failure set at run time (``__unittest_expecting_failure__`` on an instance, a test's outcome
    object) is the code under test's, and does not stand in for a pass."""
    trees = []
    for path, source in sources.items():
        try:
            trees.append((path, parse_python(source or b"")))
        except (SyntaxError, ValueError):
            continue
    if fmt == "sympy":
        return any(isinstance(node, ast.FunctionDef) and node.name == test_id and _decorated(node, "XFAIL")
                   for _, tree in trees for node in tree.body)
    label = django_label(test_id)
    if label is None:
        return any(_decorated(node, "expectedFailure") for _, tree in trees for node in ast.walk(tree))
    where, _, method = label.rpartition(".")
    module, _, class_name = where.rpartition(".")
    for path, tree in trees:
        if django_module_label(path) != module:
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                if _decorated(node, "expectedFailure"):
                    return True
                return any(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method
                           and _decorated(item, "expectedFailure") for item in node.body)
    return False


def parse_log(fmt: str, text: str) -> dict[str, TestStatus]:
    if fmt == "django":
        return parse_django_log(text)
    if fmt == "sympy":
        return parse_sympy_log(text)
    raise ValueError(f"no log parser for test format {fmt!r}")


def build_command(fmt: str, command: str, tests: Sequence[str], files: Sequence[str] = ()) -> str:
    if fmt == "django":
        return django_command(command, tests, files)
    if fmt == "sympy":
        return sympy_command(command, tests, files)
    raise ValueError(f"no command builder for test format {fmt!r}")
