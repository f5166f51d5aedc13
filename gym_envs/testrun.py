"""Running a task's tests and reading their outcomes: one runner for grading and for making tasks.

The verifier runs exactly FAIL_TO_PASS + PASS_TO_PASS; task makers (mining, synthesis,
validation of a new repository) run a whole suite or a few files at a commit with patches applied
and need each test's outcome. Both go through :func:`run_tests`, so a test id means the same thing
when a task is made and when it is graded.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from sandboxes import Sandbox, SandboxError

from . import runners
from .backends import SandboxFactory, make_sandbox
from .grading import JunitError, TestStatus, parse_junit
from .task import EnvironmentConfig, Task, TestSpec

LOG_LIMIT = 512 * 1024
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

    @property
    def passed(self) -> set[str]:
        return {t for t, s in self.statuses.items() if s in (TestStatus.PASSED, TestStatus.XFAIL)}

    @property
    def failed(self) -> set[str]:
        return {t for t, s in self.statuses.items() if s in FAILING}

    @property
    def consistent(self) -> bool:
        """pytest (like runtests.py and bin/test) exits 0 exactly when nothing failed; results that
        say otherwise were tampered with, or the run broke after writing them."""
        return bool(self.statuses) and ((self.exit_code == 0) == (not self.failed))


def run_tests(sandbox: Sandbox, spec: TestSpec, tests: Sequence[str] = (), *,
              files: Sequence[str] = ()) -> TestRun:
    """Run ``tests`` (node ids or paths; the whole suite when empty) with ``spec``'s command.

    pytest writes its results as junit XML to a path nothing in the sandbox can predict. Django's
    and SymPy's runners are read from their verbose output (see :mod:`.runners`); ``files`` (the
    files the task's test patch touches) are what they run when test ids do not name files.
    """
    if spec.format != "pytest":
        return _run_logged(sandbox, spec, tests, files)
    junit = f".patchgym-junit-{uuid.uuid4().hex}.xml"
    command = (f"{spec.command} -rA --junitxml={junit} -o junit_family=xunit1 "
               + " ".join(shlex.quote(t) for t in dict.fromkeys(tests))).rstrip()
    result = sandbox.exec(command, timeout=spec.timeout, output_limit=LOG_LIMIT)
    run = TestRun(statuses={}, command=command, output=f"$ {command}\n{result.output}",
                  exit_code=result.exit_code, timed_out=result.timed_out)
    try:
        run.statuses = parse_junit(sandbox.read_file(junit))
    except (OSError, JunitError) as exc:
        run.error = f"no test results: {exc}" + (" (the test run timed out)" if result.timed_out else "")
    return run


def _run_logged(sandbox: Sandbox, spec: TestSpec, tests: Sequence[str], files: Sequence[str]) -> TestRun:
    """A runner without structured results: its whole output is kept in a file (the output
    returned by ``exec`` is capped, and the middle of a long log would lose tests) and parsed."""
    command = runners.build_command(spec.format, spec.command, tests, files)
    log_file = f".patchgym-log-{uuid.uuid4().hex}.txt"
    script = f'{{ {command}\n}} 2>&1 | tee {log_file}; exit "${{PIPESTATUS[0]}}"'
    result = sandbox.exec(script, timeout=spec.timeout, output_limit=LOG_LIMIT)
    run = TestRun(statuses={}, command=command, output=f"$ {command}\n{result.output}",
                  exit_code=result.exit_code, timed_out=result.timed_out)
    try:
        text = sandbox.read_file(log_file).decode("utf-8", errors="replace")
    except OSError:
        text = result.output
    run.statuses = runners.parse_log(spec.format, text)
    if not run.statuses:
        run.error = (f"no test results in the {spec.format} runner's output"
                     + (" (the test run timed out)" if result.timed_out else ""))
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
    from .verifier import apply_patch  # the verifier builds on this module

    sandbox = (factory or make_sandbox)(task)
    try:
        applied = []
        for patch in patches:
            ok = not patch.strip() or apply_patch(sandbox, patch, fuzzy=False) is not None
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
