"""Is a pytest run's result believable? Canary tests and cross-checks that reveal in-process forgery.

The code under test runs inside the test process, so it can rewrite whatever pytest reports
(a forced-pass plugin, a patched ``TestReport``, a forged junit file followed by ``os._exit(0)``).
It cannot do so *quietly* here:

* **Two sources.** pytest's junit XML and patchgym's own reporter (registered before any
  repository code runs, see :mod:`gym_envs.grading.pytest_runtime`) must agree on every requested test,
  and the reporter's record must be complete: ``start``, every test phase once, ``finish``, and an
  ``exit`` status equal to the process's. A runner ended early, a test reported twice, or a file
  that is not a regular file cannot pass.
* **Canaries.** Two tests with random names, appended to a hidden test module just before the
  run: one must pass and one must fail. Forcing every outcome to "passed" passes the failing canary;
  failing the whole run fails the passing one. Code under test would have to tell canaries from
  the hidden tests, whose names it has never seen.

Whatever fails these checks is ``tampering`` (reward 0, never an infrastructure failure). What a
forger can still do is written down in ``docs/grading.md``.
"""

from __future__ import annotations

import ast
import json
import secrets
from dataclasses import dataclass, field

from gym_envs.grading.outcome import TestStatus, lookup
from gym_envs.grading.pyast import parse as parse_python

PASSING = (TestStatus.PASSED, TestStatus.XFAIL)
FAILING = (TestStatus.FAILED, TestStatus.ERROR)
KILLED_EXIT_CODES = (-9, 137)  # SIGKILL: a memory or process limit, or the harness's timeout
KILLED_MARK = "[patchgym: command killed"
_WORDS = ("parse", "render", "value", "range", "width", "table", "entry", "token", "order", "scope",
          "limit", "match", "merge", "split", "cache", "field", "label", "index", "bound", "state")


@dataclass(frozen=True)
class Canaries:
    """One test that must pass and one that must fail, with random names, appended to ``path``."""

    path: str
    must_pass: str
    must_fail: str
    source: str

    @property
    def ids(self) -> list[str]:
        return [self.must_pass, self.must_fail]

    def written_into(self, existing: bytes | None) -> bytes:
        """The file's new content: its own (the hidden tests), then the canaries."""
        if not existing:
            return self.source.encode()
        sep = b"\n\n\n" if existing.endswith(b"\n") else b"\n\n\n\n"
        return existing + sep + self.source.encode()


def _name() -> str:
    return f"test_{secrets.choice(_WORDS)}_{secrets.choice(_WORDS)}_{secrets.token_hex(3)}"


def imported_names(source: bytes | None) -> list[str]:
    """The names a test module binds with its top-level imports (what the hidden tests use from
    the code under test), so the canaries can use them too."""
    try:
        tree = parse_python(source or b"")
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [a.asname or a.name for a in node.names if a.name != "*"]
    return list(dict.fromkeys(n for n in names if n.isidentifier()))


def make_canaries(path: str, module_source: bytes | None = None) -> Canaries:
    """Canaries to append to ``path`` (:func:`canary_path`), whose content is ``module_source``.
    Both use the names the module imports,
    as its tests do, so "spare whatever does not touch the code under test" spares no canary."""
    passing, failing = _name(), _name()
    a, b = secrets.randbelow(900) + 100, secrets.randbelow(900) + 100
    used = imported_names(module_source)
    touch = f"    assert ({', '.join(used)},)\n" if used else ""
    source = (f"def {passing}():\n{touch}    assert {a} * {b} == {a * b}\n\n\n"
              f"def {failing}():\n{touch}    assert {a} + {b} == {a + b + 1 + secrets.randbelow(9)}\n")
    return Canaries(path, f"{path}::{passing}", f"{path}::{failing}", source)


def canary_path(tests: list[str]) -> str:
    """The file the canaries go into for a run of ``tests``: the first requested test's own file,
    the hidden tests' module, so that neither their file nor their node ids tell them apart (a new
    module when no test names a Python file)."""
    first = next((t.split("::", 1)[0] for t in tests if "::" in t), "")
    return first if first.endswith(".py") else f"{_name()}.py"


def interleave(tests: list[str], canaries: Canaries) -> list[str]:
    """``tests`` with the canaries at random places (not always last, where a forger would look)."""
    ids = list(tests)
    for canary in canaries.ids:
        ids.insert(secrets.randbelow(len(ids) + 1), canary)
    return ids


@dataclass
class RunRecord:
    """What the reporter wrote: each test's status, and how the run ended."""

    statuses: dict[str, TestStatus] = field(default_factory=dict)
    started: bool = False
    finished: bool = False
    exit_code: int | None = None
    reported_twice: list[str] = field(default_factory=list)
    malformed: str | None = None
    undeclared_xfail: set[str] = field(default_factory=set)  # XFAIL with no xfail marker


def _phase_status(when: str, outcome: str, xfail: bool) -> TestStatus | None:
    if outcome == "failed":
        return TestStatus.FAILED if when == "call" else TestStatus.ERROR
    if outcome == "skipped":
        return TestStatus.XFAIL if xfail else TestStatus.SKIPPED
    if outcome == "passed" and when == "call":
        return TestStatus.PASSED
    return None


def parse_record(text: str) -> RunRecord:
    """Read the reporter's JSON lines. Statuses follow :func:`.grading.parse_junit`'s rules (a
    failed phase is never overwritten by a later pass); reruns (``pytest-rerunfailures``) are
    not repeats."""
    record = RunRecord()
    seen: set[tuple[str, str]] = set()
    for number, line in enumerate(text.splitlines(), 1):
        try:
            event = json.loads(line)
            kind = event["event"]
        except (ValueError, KeyError, TypeError):
            record.malformed = f"line {number} of the results is not a record"
            return record
        if number == 1 and kind != "start":
            record.malformed = "the results do not begin with the runner's start"
            return record
        if kind == "start":
            if record.started:
                record.malformed = "the runner started twice"
                return record
            record.started = True
        elif kind == "report":
            nodeid, when, outcome = str(event["nodeid"]), str(event["when"]), str(event["outcome"])
            if outcome == "rerun":
                continue
            if (nodeid, when) in seen:
                record.reported_twice.append(nodeid)
                continue
            seen.add((nodeid, when))
            status = _phase_status(when, outcome, bool(event.get("xfail")))
            if status is TestStatus.XFAIL and event.get("declared") is False:
                record.undeclared_xfail.add(nodeid)
            previous = record.statuses.get(nodeid)
            if status is None or (previous in FAILING and status not in FAILING):
                continue
            record.statuses[nodeid] = status
        elif kind == "finish":
            record.finished = True
        elif kind == "exit":
            record.exit_code = int(event["code"])
    return record


def _outcome(status: TestStatus | None) -> str:
    if status in PASSING:
        return "passed"
    if status in FAILING:
        return "failed"
    return "skipped" if status is TestStatus.SKIPPED else "missing"


def check_run(*, exit_code: int | None, output: str, junit: dict[str, TestStatus] | None,
              record: RunRecord | None, reporter: bool, requested: list[str],
              canaries: Canaries | None) -> str | None:
    """Why this run's results cannot be believed, or None. ``reporter`` says whether the run had
    patchgym's reporter (not for a test command patchgym could not take over); ``record`` is what
    it wrote (None: no file) and ``junit`` pytest's junit statuses (None: missing or unreadable)."""
    if reporter and record is None:
        return "the runner's results file is missing"
    if record is not None:
        killed = exit_code in KILLED_EXIT_CODES or KILLED_MARK in output
        if record.malformed:
            return f"the runner's results were rewritten: {record.malformed}"
        if not record.started:
            return "the runner's results are empty"
        if record.exit_code is None:
            return None if killed else "the test runner exited before its final record"
        if record.exit_code != exit_code:
            return f"the process exited with {exit_code}, but the test runner returned {record.exit_code}"
        if record.exit_code in (0, 1) and not record.finished:
            return "the test session never finished"
        if record.reported_twice:
            return f"a test was reported twice: {record.reported_twice[0]}"
        if junit is None:
            return "pytest's junit report is missing although the runner finished"
    for test_id in requested + (canaries.ids if canaries else []):
        if record is not None and junit is not None:
            ours, theirs = _outcome(lookup(test_id, record.statuses)), _outcome(lookup(test_id, junit))
            if ours != theirs:
                return f"the junit report says {test_id} {theirs}, the runner saw it {ours}"
    if canaries is not None and junit is not None:
        sources = [junit] + ([record.statuses] if record is not None else [])
        for statuses in sources:
            if lookup(canaries.must_pass, statuses) is not TestStatus.PASSED:
                return f"a canary test that must pass did not: {canaries.must_pass}"
            if lookup(canaries.must_fail, statuses) is not TestStatus.FAILED:
                return f"a canary test that must fail did not: {canaries.must_fail}"
        if exit_code == 0:
            return "the runner exited 0 although a canary test failed"
    return None
