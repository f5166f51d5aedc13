"""Running a task's tests and reading their outcomes: one runner for grading and for making tasks.

The verifier runs exactly FAIL_TO_PASS + PASS_TO_PASS; task makers (mining, synthesis,
validation of a new repository) run a whole suite or a few files at a commit with patches applied
and need each test's outcome. Both go through :func:`run_tests`, so a test id means the same thing
when a task is made and when it is graded.
"""

from __future__ import annotations

import functools
import json
import random
import secrets
import shlex
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from patchgym.grading import integrity, labels, runner_twins, runners, script_canaries
from patchgym.grading.declared import DeclaredTests, conftests_of, files_of
from patchgym.grading.outcome import JunitError, TestStatus, parse_junit
from patchgym.grading.patch_apply import apply_patch, stage_patch
from patchgym.grading.patches import FilePatch, parse_patch
from patchgym.grading.pytest_runtime import RUNTIME_DIR, RUNTIME_FILES
from patchgym.grading.pytest_runtime.bootstrap import NO_BYTECODE, START_FAILED
from patchgym.grading.twins import make_twins
from patchgym.sandboxes import PathOutsideWorkspaceError, Sandbox, SandboxError
from patchgym.sandboxes.bytecode import PREFIX_ENV
from patchgym.tasks.backends import SandboxFactory, make_sandbox
from patchgym.tasks.model import EnvironmentConfig, Task, TestSpec

LOG_LIMIT = 512 * 1024
# A failure's traceback in a graded run, unless the task's command chooses a style: Python's own
# (``native``). pytest's default (long) parses the test file's source for every failure, ~5 ms each
# on a loaded 2-core machine, and a graded run has several failures that must happen (twins,
# canaries); the outcome is read from the results, never from the traceback. Not ``line``: pytest
# 6.0.x (and pytest's own tree before 6.1, SWE-bench's pytest-7168) raises INTERNALERROR writing a
# line-style failure into junit (pytest #7707), ending the run at the first twin that fails.
TRACEBACK_STYLE = "--tb=native"
# Every test run reads no bytecode cache from the tree: a .pyc there (the image's own, or one slipped
# past the patch filter) is never used in place of its source. Its pycache prefix is the
# environment's read-only bytecode prefix where the sandbox names one (sandboxes.bytecode: checked-hash
# pycs, used only for a source of the same hash), else NO_BYTECODE. pytest started by the runtime
# gets it from the runtime once pytest is loaded (Django's and SymPy's runners once unittest is);
# commands it cannot take over (tox, a runner under Python < 3.6) get it here, for the whole run.
# Not passed to the runtime's run: its test processes' own children would then compile the whole
# stdlib each where there is no prefix (pytester, CLI tests); the patch filter keeps the agent's
# bytecode out of their way.
BYTECODE_PREFIX = f'export PYTHONPYCACHEPREFIX="${{{PREFIX_ENV}:-{NO_BYTECODE}}}"\n'
FAILING = (TestStatus.FAILED, TestStatus.ERROR)


@dataclass
class TestRun:
    """The outcome of one test command: each test's status (node id → status) and the run itself."""

    __test__ = False  # not a pytest test class

    statuses: dict[str, TestStatus]
    command: str
    output: str
    exit_code: int | None
    timed_out: bool
    error: str | None = None
    applied: list[bool] = field(default_factory=list)
    tampering: str | None = None
    canaries: bool = False  # the run included a canary or twin that must fail, so it must exit 1
    undeclared_xfail: set[str] = field(default_factory=set)  # XFAIL its file does not declare
    undeclared_skip: set[str] = field(default_factory=set)  # skipped in its call, its file says no skip
    # CPU time of the test command's whole process tree (None where the backend cannot measure it):
    # the tests' own cost, kept apart from the environment's (grading.cost).
    cpu_seconds: float | None = None
    # The runner ran but no test did (a collection, import or usage error): its first error line
    # (grading.labels.TESTS_COULD_NOT_START).
    could_not_start: str | None = None
    # Protections of patchgym's runtime this run went without, each with why (an old interpreter,
    # a command the runtime cannot take over): :func:`missing_protections`, :func:`_run_logged`.
    protections_missing: list[str] = field(default_factory=list)

    @property
    def passed(self) -> set[str]:
        return {t for t, s in self.statuses.items() if s in (TestStatus.PASSED, TestStatus.XFAIL)}

    @property
    def failed(self) -> set[str]:
        return {t for t, s in self.statuses.items() if s in FAILING}

    @property
    def consistent(self) -> bool:
        """pytest (like runtests.py and bin/test) exits 0 exactly when nothing failed; results that
        say otherwise were tampered with, or the run broke after writing them. With canaries, one
        test always fails, so only exit status 1 is consistent."""
        if self.canaries:
            return bool(self.statuses) and self.exit_code == 1
        return bool(self.statuses) and ((self.exit_code == 0) == (not self.failed))


# Whether the runtime installs its audit hook (pytest_runtime/audit.py). Off only to measure what
# the canaries alone catch (bench/canary_forger.py, tests/test_canary_forgers.py): a setting of the
# harness's own process, which nothing in a task, a patch or a sandbox can reach.
AUDIT_HOOK = True


@dataclass(frozen=True)
class HarnessFiles:
    """The harness's own files in a sandbox: the test runtime, its results and junit files, and
    its copy of the test patch, all at random names. A grader places them (:func:`place_harness_files`)
    *before* the agent's patch is applied, so the patch can neither predict their names nor take
    their place or the quota they need; what runs later can reach them, which the runtime's
    supervisor and the record checks are for (:mod:`.integrity`)."""

    runtime: str
    results: str
    junit: str
    test_patch: str | None = None  # the staged copy (:func:`.patch_apply.stage_patch`), if any


def place_harness_files(sandbox: Sandbox, test_patch: Sequence[FilePatch] = ()) -> HarnessFiles:
    """Write the runtime, empty results and junit files and a copy of ``test_patch`` (parsed; when
    not empty) into ``sandbox`` under fresh random names."""
    nonce = uuid.uuid4().hex
    files = HarnessFiles(runtime=f".patchgym-rt-{nonce}", results=f".patchgym-results-{nonce}.jsonl",
                         junit=f".patchgym-junit-{nonce}.xml",
                         test_patch=stage_patch(sandbox, test_patch) if test_patch else None)
    for name in RUNTIME_FILES:
        data = runtime_file(name)
        if name == "audit.py" and not AUDIT_HOOK:
            data += b"\n\ndef install(policy):  # AUDIT_HOOK is off (bench/canary_forger.py)\n    return None\n"
        sandbox.write_file(f"{files.runtime}/{name}", data)
    sandbox.write_file(files.results, b"")
    sandbox.write_file(files.junit, b"")
    return files


def runtime_file(name: str) -> bytes:
    """A runtime file's bytes, read from disk once per version of the file (every grading writes
    them into its sandbox; a checkout edited while a server runs is still seen)."""
    path = RUNTIME_DIR / name
    stat = path.stat()
    return _read_runtime_file(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_runtime_file(path: Path, mtime_ns: int, size: int) -> bytes:
    return path.read_bytes()


def _place_canaries(sandbox: Sandbox, spec: TestSpec, requested: list[str], passing: set[str],
                    sources: dict[str, bytes | None], seed: int | None) -> integrity.Canaries:
    """Write canaries (:mod:`.integrity`) into the module of the first of ``requested`` (ids in the
    run; ``passing`` those known to pass), whose content is in ``sources`` when the run changes it."""
    path = integrity.canary_path(requested)
    existing = sources.get(path)  # the hidden test module, as it will run
    if existing is None:
        try:
            existing = sandbox.read_file(path)
        except FileNotFoundError:
            existing = None
        except (PathOutsideWorkspaceError, IsADirectoryError):  # not a regular file: a module of their own
            path, existing = integrity.canary_path([]), None
    canaries = integrity.make_canaries(path, existing, passing=sorted(passing),
                                       failing=[t for t in requested if t not in passing], seed=seed)
    sandbox.write_file(canaries.path, canaries.written_into(existing, spread=spec.selection == "files"))
    return canaries


def run_tests(sandbox: Sandbox, spec: TestSpec, tests: Sequence[str] = (), *,
              files: Sequence[str] = (), harness: HarnessFiles | None = None,
              known_passing: Sequence[str] = (), canary_seed: int | None = None) -> TestRun:
    """Run ``tests`` (node ids or paths; the whole suite when empty) with ``spec``'s command.

    pytest is started by patchgym's runtime (:mod:`.pytest_runtime`) so that nothing in the
    repository changes how it runs, under a supervisor that writes the results once every process
    of the run is dead; the results — junit XML and patchgym's reporter, both at paths nothing in
    the sandbox can predict — must agree, as must canary tests (:mod:`.integrity`); a run that
    fails those checks has ``tampering`` set. ``harness``: the files a grader placed before the
    agent's patch (placed now when not given). Django's and SymPy's runners are read from their
    verbose output (see :mod:`.runners`); ``files`` (the files the task's test patch touches) are
    what they run when test ids do not name files. ``known_passing``: the ``tests`` that pass at
    the base commit (PASS_TO_PASS), which the canaries copy; ``canary_seed``: what decides the
    canaries (a fresh secret when None).
    """
    if spec.format != "pytest":
        return _run_script(sandbox, spec, tests, files, harness, known_passing, canary_seed)
    harness = harness or place_harness_files(sandbox)
    junit, results, runtime = harness.junit, harness.results, harness.runtime
    requested = list(dict.fromkeys(tests))  # official ids; the run's own names once twins are made
    # What the hidden tests' files declare, read before anything of the agent's has run (see
    # grading.declared): an XFAIL or a skip they do not declare is not the test's own.
    test_files = files_of(requested)
    sources = {path: _read_source(sandbox, path) for path in test_files}
    declared = DeclaredTests(sources, {path: _read_source(sandbox, path) for path in conftests_of(test_files)})
    canaries = twins = None
    if requested:
        # The hidden tests renamed, and conflicting twins of the failing ones (grading.twins), then
        # the canaries: from here on the run knows its tests by their names in the run.
        passing = set(known_passing)
        failing = [t for t in requested if t not in passing]
        twins = make_twins(sources, failing, _rng(canary_seed, "twins"))
        for path, content in twins.files.items():
            sandbox.write_file(path, content)
        sources_now = {**sources, **twins.files}
        requested = twins.run_ids(requested)
        passing = {twins.run_id(t) for t in passing}
        # Canaries only where a failing test has no twins (as when none can be made): twins are
        # must-fail tests told from their test by nothing but the right answer, where a copy of a
        # passing test is told by its shape; they would add failing tests, not protection.
        if not twins.cover(failing):
            canaries = _place_canaries(sandbox, spec, requested, passing, sources_now, canary_seed)
    invocation = pytest_invocation(spec.command)
    if invocation is not None:
        env, python, args = invocation
        start = f"{env}PATCHGYM_RESULTS={results} {python} -I -B {runtime}/bootstrap.py {args}".rstrip()
        if not any(word == "--tb" or word.startswith("--tb=") for word in shlex.split(args)):
            start += f" {TRACEBACK_STYLE}"
    else:  # a command patchgym cannot take over (e.g. tox): junit and canaries only
        start = spec.command
    if spec.selection == "files":  # the canaries' places in their file are their places in the run
        selectors = runners.pytest_selectors(requested + (canaries.ids if canaries else []), "files")
    else:
        selectors = runners.pytest_selectors(integrity.interleave(requested, canaries) if canaries else requested)
    command = (f"{start} -rA --junitxml={junit} --override-ini=junit_family=xunit1 "
               + " ".join(shlex.quote(t) for t in selectors)).rstrip()
    result = sandbox.exec(command if invocation is not None else BYTECODE_PREFIX + command, timeout=spec.timeout,
                          output_limit=LOG_LIMIT)
    run = TestRun(statuses={}, command=command, output=f"$ {command}\n{result.output}",
                  exit_code=result.exit_code, timed_out=result.timed_out,
                  canaries=canaries is not None or bool(twins and twins.twins),
                  cpu_seconds=result.cpu_seconds)
    junit_statuses = _read_results(sandbox, junit, run, parse_junit, "junit report")
    record = (_read_results(sandbox, results, run, integrity.parse_record, "results")
              if invocation is not None else None)
    if invocation is not None and (record is None or not record.started) and START_FAILED in result.output:
        _check_runner_starts(sandbox, invocation[1])
    if invocation is None:
        run.protections_missing = ["pytest not started by patchgym's runtime (a command it cannot take over): "
                                   "results from junit XML and canaries only"]
    elif record is not None:
        run.protections_missing = missing_protections(record.python)
    if run.tampering is None and not result.timed_out:
        run.tampering = integrity.check_run(exit_code=result.exit_code, output=result.output,
                                            junit=junit_statuses, record=record,
                                            reporter=invocation is not None, requested=requested,
                                            canaries=canaries, twins=twins)
    if invocation is not None and (record is None or record.exit_code is None):
        # The runner never returned (killed, timed out, or ended by the code under test): no
        # result it wrote before that is evidence of anything.
        run.error = run.error or "the test runner did not finish" + (" (the test run timed out)"
                                                                      if result.timed_out else "")
        return run
    to_official = twins.official_id if twins is not None else str
    run.undeclared_xfail = {to_official(t) for t in record.undeclared_xfail} if record is not None else set()
    if record is not None and run.tampering is None and not result.timed_out:
        run.could_not_start = labels.could_not_start(record.exit_code, bool(record.statuses), result.output)
    if junit_statuses is not None:
        run.statuses = {to_official(t): s for t, s in junit_statuses.items()
                        if not (canaries and canaries.owns(t)) and not (twins and twins.owns(t))}
        run.undeclared_xfail |= {t for t, s in run.statuses.items()
                                 if s is TestStatus.XFAIL and not declared.declares_xfail(t)}
        in_call = {to_official(t) for t in record.skipped_in_call} if record is not None else set()
        run.undeclared_skip = {t for t, s in run.statuses.items() if s is TestStatus.SKIPPED
                               and t in in_call and not declared.declares_skip(t)}
    elif run.error is None:
        run.error = "no test results" + (" (the test run timed out)" if result.timed_out else "")
    return run


def _rng(seed: int | None, purpose: str) -> random.Random:
    """What decides ``purpose`` for a run: a fresh secret where ``seed`` is None (grading), else
    reproducible from it (tests, benchmarks)."""
    return random.Random(secrets.randbits(128) if seed is None else f"{seed}-{purpose}")


def _read_source(sandbox: Sandbox, path: str) -> bytes | None:
    """A test file's content, or None when it is missing or not a regular file."""
    try:
        data = sandbox.read_file(path)
    except (OSError, PathOutsideWorkspaceError):
        return None
    return data if isinstance(data, bytes) else data.encode()


def _check_runner_starts(sandbox: Sandbox, python: str) -> None:
    """The runner printed that it could not start, and wrote no results. Code under test can print
    that line too (and delete the results file), and an agent must never get its sample masked:
    so the failure is infrastructure only if pytest cannot be imported with the repository out of
    the way, which nothing the agent wrote can cause."""
    probe = sandbox.exec(f"cd / && {python} -I -c 'import pytest'", timeout=120)
    if not probe.ok:
        raise SandboxError(f"the test environment cannot import pytest: {probe.output[-2000:]}")


def _read_results(sandbox: Sandbox, path: str, run: TestRun, parse, what: str):
    """Parse a results file the runner wrote, or None when there is none. A path that is not a
    regular file (a symlink, a FIFO, a directory) was put there by the code under test; an empty
    one was never written."""
    try:
        data = sandbox.read_file(path)
    except FileNotFoundError:
        return None
    except (PathOutsideWorkspaceError, IsADirectoryError):
        run.tampering = run.tampering or f"the {what} is not a regular file"
        return None
    except OSError as exc:
        run.error = f"cannot read the {what}: {exc}"
        return None
    if not data:  # placed empty by the harness, and never written
        return None
    try:
        return parse(data if isinstance(data, str) else data.decode("utf-8", errors="replace"))
    except JunitError as exc:
        run.error = f"no test results: {exc}"
        return None


def pytest_invocation(command: str) -> tuple[str, str, str] | None:
    """Split a pytest command into (what runs before pytest, interpreter, pytest arguments), each
    shell-quoted, for ``python -m pytest ...``, ``pytest ...`` and ``py.test ...`` (with leading
    ``VAR=value`` words); None for anything else. Steps joined before it with `` && `` (a spec's
    list of test commands: a service the tests talk to, started on the sandbox's loopback) run
    first, as written."""
    setup, joined, last = command.rpartition(" && ")
    tail = pytest_invocation(last) if joined else None
    if tail is not None:
        return f"{setup} && {tail[0]}", tail[1], tail[2]
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    env = []
    while words and runners.ENV_ASSIGNMENT.match(words[0]):
        env.append(words.pop(0))
    if len(words) >= 3 and runners.PYTHON_WORD.match(words[0]) and words[1:3] == ["-m", "pytest"]:
        python, args = words[0], words[3:]
    elif words and words[0] in ("pytest", "py.test"):
        python, args = "python", words[1:]
    else:
        return None
    prefix = "".join(shlex.quote(e) + " " for e in env)
    return prefix, shlex.quote(python), " ".join(shlex.quote(a) for a in args)


# Python the runtime runs under (its syntax: f-strings); older interpreters (SWE-bench's Django 1.7-2.2
# environments run 3.5) run the runner as written, read from its output.
RUNTIME_MIN_PYTHON = (3, 6)
# Python from which the runtime has everything: PEP 578 audit hooks and sys.pycache_prefix.
RUNTIME_FULL_PYTHON = (3, 8)
OUTPUT_TRUSTED = "results read from the runner's output, which the code under test can forge"


def missing_protections(python: str | None) -> list[str]:
    """What the runtime could not do under the interpreter the supervisor's ``end`` record names
    (:data:`RUNTIME_FULL_PYTHON`): nothing missing for 3.8 on, or when the version is unknown
    (a run without that record is judged by the record checks already)."""
    try:
        version = tuple(int(part) for part in (python or "").split(".")[:2])
    except ValueError:
        return []
    if len(version) < 2 or version >= RUNTIME_FULL_PYTHON:
        return []
    return [f"no audit hook (PEP 578 needs Python 3.8): Python {python}"]


# The runner modules the runtime's recorder wraps (pytest_runtime/script_runner.py's SYMPY_RUNNERS):
# test-support files, so the agent's patch cannot add, change or remove them.
RECORDED_RUNNER_FILES = {"sympy": ("sympy/testing/runtests.py", "sympy/utilities/runtests.py")}


def _runtime_refusal(sandbox: Sandbox, fmt: str, python: str) -> str | None:
    """Why patchgym's runtime cannot run this runner, or None when it can: ``python`` must be recent
    enough (asked with ``-I`` from ``/``, so nothing of the repository's takes part in the answer),
    and for SymPy the repository must have SymPy's runner module, whose reporter the runtime records
    from."""
    check = ("import sys; print('python', '.'.join(map(str, sys.version_info[:3]))); "
             f"sys.exit(0 if sys.version_info[:2] >= {RUNTIME_MIN_PYTHON!r} else 1)")
    command = f"(cd / && {python} -I -c {shlex.quote(check)})"
    files = RECORDED_RUNNER_FILES.get(fmt)
    if files:
        tests = " || ".join(f"test -f {shlex.quote(f)}" for f in files)
        command += f" && {{ {tests} || {{ echo no-runner; exit 1; }}; }}"
    probe = sandbox.exec(command, timeout=120)
    if probe.ok:
        return None
    words = probe.output.split()
    if words[-1:] == ["no-runner"]:
        return "no SymPy runner module for the runtime to record from"
    found = words[words.index("python") + 1] if "python" in words[:-1] else "unknown"
    return f"the runtime needs Python {'.'.join(map(str, RUNTIME_MIN_PYTHON))}: Python {found}"


def _run_script(sandbox: Sandbox, spec: TestSpec, tests: Sequence[str], files: Sequence[str],
                harness: HarnessFiles | None, known_passing: Sequence[str] = (),
                canary_seed: int | None = None) -> TestRun:
    """Run Django's or SymPy's runner under patchgym's runtime (``pytest_runtime/script_runner.py``:
    the pytest runtime's isolated start, supervisor and audit hook, and a recorder inside the
    runner's result objects), its outcomes read from the runtime's records alone: what the
    runner prints is never read. A command the runtime cannot take over (not the runner script
    itself: a wrapper, several steps), an interpreter older than :data:`RUNTIME_MIN_PYTHON`, or a
    SymPy-style runner without SymPy's runner module runs as written, its outcomes read from its
    output (:func:`_run_logged`)."""
    command = runners.build_command(spec.format, spec.command, tests, files)
    invocation = runners.script_invocation(spec.format, command)
    refusal = ("a command the runtime cannot take over" if invocation is None
               else _runtime_refusal(sandbox, spec.format, invocation.python))
    if refusal is not None:
        return _run_logged(sandbox, spec, tests, files, refusal)
    harness = harness or place_harness_files(sandbox)
    requested = list(dict.fromkeys(tests))
    # The test files as written, read before anything of the agent's has run: what XFAIL they declare.
    sources = {f: _read_source(sandbox, f) for f in files if f.endswith(".py")}
    # The hidden tests renamed and given twins (grading.runner_twins), then canaries where a failing
    # test has none (as for pytest's runs, above).
    make = runner_twins.django_twins if spec.format == "django" else runner_twins.sympy_twins
    passing = set(known_passing)
    twins = make(sources, requested, passing, _rng(canary_seed, "twins")) if requested else None
    for path, content in (twins.twins.files if twins else {}).items():
        sandbox.write_file(path, content)
    in_run = twins.run_ids(requested) if twins else requested
    failing = [t for t in requested if t not in passing]
    canaries = (_place_script_canaries(sandbox, spec.format, requested, list(files))
                if requested and (twins is None or not twins.cover(failing)) else None)
    if canaries is not None or twins is not None:  # their labels among the hidden tests' (Django; SymPy runs files)
        shown = command
        command = runners.build_command(spec.format, spec.command,
                                        integrity.interleave(in_run, canaries) if canaries else in_run, files)
        invocation = runners.script_invocation(spec.format, command) or invocation
        command = shown  # the command reported is the task's, without the run's own labels
    hidden = " ".join(f"--hidden {shlex.quote(f)}" for f in files if f.endswith(".py"))
    parts = [f"{invocation.env}PATCHGYM_RESULTS={harness.results}", invocation.python, "-I -B", invocation.warnings,
             f"{harness.runtime}/script_runner.py --format {spec.format}", hidden, "--", invocation.script,
             invocation.args]
    start = " ".join(p for p in parts if p)
    result = sandbox.exec(start, timeout=spec.timeout, output_limit=LOG_LIMIT)
    run = TestRun(statuses={}, command=command, output=f"$ {command}\n{result.output}",
                  exit_code=result.exit_code, timed_out=result.timed_out, cpu_seconds=result.cpu_seconds,
                  canaries=canaries is not None or bool(twins and twins.twins.twins))
    text = _read_results(sandbox, harness.results, run, lambda t: t, "results")
    record = integrity.parse_record(text) if text is not None else None
    if (record is None or not record.started) and START_FAILED in result.output:
        _check_script_runtime_starts(sandbox, invocation.python)
    if run.tampering is None and not result.timed_out:
        run.tampering = integrity.check_script_run(exit_code=result.exit_code, output=result.output, record=record)
    if record is not None:
        run.protections_missing = missing_protections(record.python)
    if record is None or record.exit_code is None:
        run.error = run.error or "the test runner did not finish" + (" (the test run timed out)"
                                                                      if result.timed_out else "")
        return run
    # A twin's docstring line is its test's too: it names the test alone.
    aliases = {t: a for t, a in _record_aliases(text or "").items() if not (twins and twins.owns(t))}
    statuses = runners.statuses_from_record(spec.format, record.statuses, aliases)
    if canaries is not None:
        if run.tampering is None and not result.timed_out and record.exit_code in (0, 1):
            run.tampering = canaries.problem(statuses, record.exit_code)
        statuses = {t: s for t, s in statuses.items() if not canaries.owns(t)}
    if twins is not None:
        if run.tampering is None and not result.timed_out and record.exit_code in (0, 1):
            run.tampering = twins.problem(statuses)
        statuses = twins.to_official(statuses)
    run.statuses = statuses
    run.undeclared_xfail = {t for t in requested if statuses.get(t) is TestStatus.XFAIL
                            and not runners.declares_xfail(spec.format, t, sources)}
    if not run.statuses:
        run.error = f"no test results from the {spec.format} runner"
        if run.tampering is None and not result.timed_out and result.exit_code:
            run.could_not_start = labels.first_error_line(result.output) or run.error
    return run


def _place_script_canaries(sandbox: Sandbox, fmt: str, requested: list[str],
                           files: list[str]) -> script_canaries.ScriptCanaries | None:
    """Write canaries into the hidden tests' module (:mod:`.script_canaries`); None where there is
    no module of the test patch's to put them in, or it is not a regular file."""
    if fmt == "django":
        target = script_canaries.django_target(requested, files)
        path = target[0] if target else None
    else:
        path = script_canaries.sympy_target(files)
    if path is None:
        return None
    source = _read_source(sandbox, path)
    if source is None:
        return None
    if fmt == "django":
        assert target is not None
        canaries = script_canaries.django_canaries(path, source, target[1], target[2])
    else:
        canaries = script_canaries.sympy_canaries(path, source, set(requested))
    if canaries is not None:
        sandbox.write_file(path, canaries.content)
    return canaries


def _record_aliases(text: str) -> dict[str, list[str]]:
    """Each reported test's other names (a unittest test's docstring line), from the records."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "report" and isinstance(event.get("nodeid"), str):
            names = event.get("aliases")
            if isinstance(names, list):
                out.setdefault(event["nodeid"], []).extend(n for n in names if isinstance(n, str) and n)
    return out


def _check_script_runtime_starts(sandbox: Sandbox, python: str) -> None:
    """The runtime printed that it could not start, and wrote no results: infrastructure only if
    the interpreter cannot import what the runtime needs with the repository out of the way."""
    probe = sandbox.exec(f"cd / && {python} -I -c 'import unittest, runpy, json'", timeout=120)
    if not probe.ok:
        raise SandboxError(f"the test environment's interpreter cannot start the runtime: {probe.output[-2000:]}")


def _run_logged(sandbox: Sandbox, spec: TestSpec, tests: Sequence[str], files: Sequence[str],
                why: str) -> TestRun:
    """A runner without structured results (``why``: the runtime could not take it over): its whole
    output is kept in a file (the output returned by ``exec`` is capped, and the middle of a long
    log would lose tests) and parsed. The run says so (``protections_missing``): only an exit
    status that agrees with what was read stands between a forger and the reward."""
    command = runners.build_command(spec.format, spec.command, tests, files)
    log_file = f".patchgym-log-{uuid.uuid4().hex}.txt"
    script = f'{{ {command}\n}} 2>&1 | tee {log_file}; exit "${{PIPESTATUS[0]}}"'
    result = sandbox.exec(BYTECODE_PREFIX + script, timeout=spec.timeout, output_limit=LOG_LIMIT)
    run = TestRun(statuses={}, command=command, output=f"$ {command}\n{result.output}",
                  exit_code=result.exit_code, timed_out=result.timed_out, cpu_seconds=result.cpu_seconds,
                  protections_missing=[f"{OUTPUT_TRUSTED} ({why})"])
    try:
        text = sandbox.read_file(log_file).decode("utf-8", errors="replace")
    except OSError:
        text = result.output
    run.statuses = runners.parse_log(spec.format, text)
    if not run.statuses:
        run.error = (f"no test results in the {spec.format} runner's output"
                     + (" (the test run timed out)" if result.timed_out else ""))
        if not result.timed_out and result.exit_code:
            run.could_not_start = labels.first_error_line(text) or run.error
    return run


def probe_task(*, repo: str, base_commit: str, repo_path: str | None = None,
               environment: EnvironmentConfig | None = None, test_spec: TestSpec | None = None,
               instance_id: str = "probe") -> Task:
    """A stand-in task for running a repository's tests at a commit before any task exists (it
    has no FAIL_TO_PASS yet: that is what the run is for). Never saved or graded."""
    return Task.model_construct(
        instance_id=instance_id, repo=repo, base_commit=base_commit, problem_statement="", patch=None,
        test_patch="", FAIL_TO_PASS=[], PASS_TO_PASS=[], version="", created_at="",
        environment_setup_commit=None, hints_text="", environment=environment or EnvironmentConfig(),
        test_spec=test_spec or TestSpec(), repo_path=repo_path)


def probe(task: Task, patches: Sequence[str] = (), tests: Sequence[str] = (),
          factory: SandboxFactory | None = None, *, files: Sequence[str] = ()) -> TestRun:
    """Run ``tests`` at ``task.base_commit`` with ``patches`` applied in order (strictly: a patch
    that does not apply leaves ``applied`` False and runs nothing), in a fresh sandbox. ``files``
    are passed on to :func:`run_tests` (Django and SymPy runners)."""

    sandbox = (factory or make_sandbox)(task)
    try:
        applied = []
        for patch in patches:
            ok = not patch.strip() or apply_patch(sandbox, parse_patch(patch), fuzzy=False) is not None
            applied.append(ok)
            if not ok:
                return TestRun({}, "", "", None, False, error="a patch does not apply", applied=applied)
        run = run_tests(sandbox, task.test_spec, tests, files=files)
        run.applied = applied
        return run
    finally:
        try:
            sandbox.close()
        except SandboxError:
            pass
