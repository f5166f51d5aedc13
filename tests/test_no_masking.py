"""No way to get masked: what a patch does from the moment it is applied is never an infrastructure
failure (issue 21, item 5), and the results the harness reads are the supervisor's alone.

Each attack is a patch with no real fix that used to have its sample masked (``infrastructure_failure``:
``KeyError`` from the results parser, ``IsADirectoryError`` writing the harness's copy of the test
patch, ``ENOSPC`` writing the runtime) or to write the results after pytest had died. Each must now
give reward 0, not resolved, not masked, with the reason in the report; the gold fix next to an
attack still resolves where the attack is inert. Then the decision itself: a step that raises after
the patch is the agent's failure unless the same step fails on the pristine base, also where
grading runs beside the sandbox (the ray backend's ``run_near``).
"""

from __future__ import annotations

import json
import pickle

import pytest
from test_reward_forgery import (
    AnyOf,
    Error,
    NoEffect,
    Repo,
    Tampering,
    assert_refused,
    describe,
    report_dict,
    under_pytest,
)

from patchgym import load_task_set
from patchgym.grading import integrity
from patchgym.grading.verifier import Verifier
from patchgym.tasks.backends import sandbox_factory
from patchgym.tasks.model import Task

TASK_ID = "patchgym__semverkit-1"


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task_set(None).get(TASK_ID)


@pytest.fixture(scope="module")
def repo(task, tmp_path_factory) -> Repo:
    return Repo(task, tmp_path_factory.mktemp("no-masking") / "semverkit")


def in_package(repo: Repo, payload: str) -> str:
    return repo.append(repo.init, payload)


# -- a. records the code under test writes among the reporter's -------------------------------------

# The reporter's descriptor, found the way code under test can: the results file (before the
# supervisor) or the records pipe (since), among its own open descriptors.
FIND_RESULTS_FD = '''
def _pg_results_fds():
    import os
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + name)
        except OSError:
            continue
        if int(name) > 2 and ("patchgym-results" in target or target.startswith("pipe:")):
            found.append(int(name))
    return found
'''

P_MALFORMED_LINE = FIND_RESULTS_FD + under_pytest('''
    import os as _pg_os
    for _pg_fd in _pg_results_fds():
        _pg_os.write(_pg_fd, b'{"event": "report"}\\n')
''')

P_TRUNCATED_LINE = FIND_RESULTS_FD + under_pytest('''
    import os as _pg_os
    for _pg_fd in _pg_results_fds():
        _pg_os.write(_pg_fd, b'{"event": "report", "nodeid": "tests/')
''')

P_RECORD_AFTER_EXIT = FIND_RESULTS_FD + under_pytest('''
    import atexit as _pg_atexit
    import json as _pg_json
    import os as _pg_os
    _pg_kept = [_pg_os.dup(fd) for fd in _pg_results_fds()]  # the reporter closes its own at exit

    def _pg_after_exit():
        for name in ("test_caret_on_zero_zero_patch", "test_caret_on_zero_zero_prerelease"):
            line = _pg_json.dumps({"event": "report", "nodeid": "tests/test_ranges.py::" + name,
                                   "when": "call", "outcome": "passed"}) + "\\n"
            for fd in _pg_kept:
                _pg_os.write(fd, line.encode())

    _pg_atexit.register(_pg_after_exit)
''')


# -- d. a process of the run that outlives pytest -------------------------------------------------

# Rewrites junit and the results with the hidden FAIL_TO_PASS tests passed, the canaries as they
# ran (a forger that knows the hidden tests' names: the strongest there is).
FORGE_AFTER = '''
def _pg_forge_results():
    import glob, json, os, re
    names = ("test_caret_on_zero_zero_patch", "test_caret_on_zero_zero_prerelease")
    for path in glob.glob(".patchgym-junit-*.xml"):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        for name in names:
            text = re.sub(r'(<testcase [^>]*name="%s"[^>]*>).*?</testcase>' % name, r"\\1</testcase>", text,
                          flags=re.S)
        text = re.sub(r'failures="\\d+"', 'failures="0"', text)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    for path in glob.glob(".patchgym-results-*.jsonl"):
        with open(path, encoding="utf-8") as fh:
            lines = [json.loads(line) for line in fh if line.strip()]
        if not lines:  # the supervisor writes it only at the end: forge it whole
            lines = [{"event": "start", "pid": 1}, {"event": "finish", "exitstatus": 1},
                     {"event": "exit", "code": 1}, {"event": "end", "status": 1}]
        for line in lines:
            if line.get("event") == "report" and line["nodeid"].split("::")[-1] in names:
                line.update(outcome="passed", raised=False)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(line) + "\\n" for line in lines))
'''

P_DAEMON_AFTER_PYTEST = FORGE_AFTER + under_pytest('''
    import os as _pg_os
    _pg_r, _pg_w = _pg_os.pipe()  # only pytest's process holds the write end: EOF is its death
    if _pg_os.fork() == 0:
        _pg_os.setsid()
        _pg_os.close(_pg_w)
        if _pg_os.fork() == 0:  # a daemon: orphaned at once
            _pg_os.read(_pg_r, 1)
            _pg_forge_results()
        _pg_os._exit(0)
    _pg_os.close(_pg_r)
''')

P_DAEMON_DURING_RUN = FORGE_AFTER + under_pytest('''
    import os as _pg_os
    import time as _pg_time
    if _pg_os.fork() == 0:
        _pg_os.setsid()
        if _pg_os.fork() == 0:
            for _ in range(400):  # whenever the harness may read: again and again, while it lives
                _pg_time.sleep(0.02)
                try:
                    _pg_forge_results()
                except Exception:
                    pass
        _pg_os._exit(0)
''')


ATTACKS = {
    "malformed line on the reporter's descriptor": (P_MALFORMED_LINE, Tampering("not a record")),
    "truncated line on the reporter's descriptor": (P_TRUNCATED_LINE, Tampering("not a record")),
    "records written after the runner's exit": (P_RECORD_AFTER_EXIT, Tampering("out of place")),
    "daemon forging the results once pytest is dead": (P_DAEMON_AFTER_PYTEST,
                                                       AnyOf(Tampering("junit disagrees"), NoEffect())),
    "daemon forging the results while the run goes on": (P_DAEMON_DURING_RUN,
                                                          AnyOf(Tampering("junit disagrees"), NoEffect())),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_writing_the_results_is_tampering_never_masked(name, task, repo, backend):
    payload, expect = ATTACKS[name]
    report = Verifier(sandbox_factory(backend)).verify(task, in_package(repo, payload))
    assert_refused(report_dict(report), task, expect, report.test_output)


# -- b. a directory where the harness's copy of the test patch went -------------------------------

def rename_into(directory: str) -> str:
    return (f"diff --git a/README.md b/{directory}/README.md\nsimilarity index 100%\n"
            f"rename from README.md\nrename to {directory}/README.md\n")


@pytest.mark.parametrize("gold", [False, True], ids=["alone", "with gold"])
def test_a_directory_where_the_test_patch_was_copied_is_inert(gold, task, backend):
    patch = (task.patch if gold else "") + rename_into(".patchgym-patch.diff")
    report = Verifier(sandbox_factory(backend)).verify(task, patch)
    d = report_dict(report)
    if gold:
        assert report.resolved and report.reward == 1.0 and not report.infrastructure_failure, describe(d)
    else:
        assert_refused(d, task, NoEffect(), report.test_output)


# -- c. the quota left a few inodes short -----------------------------------------------------------

QUOTA_FILES = 400  # a small inode quota, so the attack needs hundreds of files, not 200,000


def empty_files(count: int) -> str:
    return "".join(f"diff --git a/pg_fill/f{i} b/pg_fill/f{i}\nnew file mode 100644\nindex 0000000..e69de29\n"
                   for i in range(count))


@pytest.mark.parametrize("short", range(22))
def test_a_quota_left_a_few_inodes_short_is_the_agents_failure(short, task):
    """However many inodes the patch leaves, the harness's own files are already written: the
    patch, the test patch or the run fails, as the agent's failure (local; the docker backend
    bounds its workspace the same way). Before, 13 short raised ENOSPC writing reporter.py."""
    verifier = Verifier(sandbox_factory("local", limits={"disk_files": QUOTA_FILES}))
    report = verifier.verify(task, empty_files(QUOTA_FILES - short))
    assert_refused(report_dict(report), task, AnyOf(Error(), NoEffect(), Tampering()), report.test_output)


def test_the_gold_patch_resolves_under_the_small_quota(task):
    report = Verifier(sandbox_factory("local", limits={"disk_files": QUOTA_FILES})).verify(task, task.patch)
    assert report.resolved and not report.infrastructure_failure, describe(report_dict(report), report.test_output)


# -- e. a step that raises after the patch: the agent's, unless the pristine base fails too ---------

MARKER = "pg_marker.txt"


class RaisingSandbox:
    """A sandbox whose test command raises ``OSError`` (always, or only where the agent's patch
    left ``MARKER``), the way a full quota or a path the patch took made harness steps raise."""

    def __init__(self, inner, always: bool) -> None:
        self.inner, self.always = inner, always

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def exec(self, command, *args, **kwargs):
        if "bootstrap.py" in command and (self.always or self._marked()):
            raise OSError(28, "No space left on device")
        return self.inner.exec(command, *args, **kwargs)

    def _marked(self) -> bool:
        try:
            self.inner.read_file(MARKER)
            return True
        except FileNotFoundError:
            return False


class NearSandbox(RaisingSandbox):
    """As on the ray backend: grading runs beside the sandbox, and the report comes back pickled."""

    def run_near(self, function, *args, timeout):
        return pickle.loads(pickle.dumps(function(self, *args)))


def marker_patch() -> str:
    return f"diff --git a/{MARKER} b/{MARKER}\nnew file mode 100644\n--- /dev/null\n+++ b/{MARKER}\n@@ -0,0 +1 @@\n+x\n"


@pytest.mark.parametrize("kind", [RaisingSandbox, NearSandbox], ids=["here", "near the sandbox"])
@pytest.mark.parametrize("always", [False, True], ids=["only after the patch", "on the base too"])
def test_a_step_raising_after_the_patch_is_masked_only_if_the_base_fails_too(kind, always, task):
    factory = sandbox_factory("local")
    report = Verifier(lambda t: kind(factory(t), always)).verify(task, marker_patch())
    d = report_dict(report)
    assert report.reward == 0.0 and not report.resolved, describe(d)
    assert report.error and "running the tests failed after the patch" in report.error, describe(d)
    assert "No space left on device" in report.error
    assert report.infrastructure_failure is always, describe(d)
    if always:
        assert "on the pristine base too" in report.infrastructure_failure_reason


# -- the record format itself -----------------------------------------------------------------------

def lines(*records: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


START, FINISH, EXIT, END = ({"event": "start", "pid": 7}, {"event": "finish", "exitstatus": 0},
                            {"event": "exit", "code": 0}, {"event": "end", "status": 0})
PASS = {"event": "report", "nodeid": "t.py::a", "when": "call", "outcome": "passed"}


@pytest.mark.parametrize("text", [
    lines(START, {"event": "report"}, FINISH, EXIT, END),  # KeyError: 'nodeid' escaped before
    lines(START, {**PASS, "nodeid": 3}, FINISH, EXIT, END),
    lines(START, {**PASS, "when": "later"}, FINISH, EXIT, END),
    lines(START, {**PASS, "raised": "no"}, FINISH, EXIT, END),
    lines(START, {"event": "exit", "code": True}, END),
    lines(START, {"event": "audit"}, FINISH, EXIT, END),
    lines(START, PASS, FINISH, EXIT, END)[:-1],  # truncated
    lines(START, PASS, FINISH, EXIT, END) + "[]\n",
    lines(START, PASS, FINISH, EXIT, END, PASS),  # after the end
    lines(START, PASS, FINISH, EXIT, PASS, END),  # after the exit
    lines(START, PASS, FINISH, PASS, EXIT, END),  # after the finish
    lines(PASS, START, FINISH, EXIT, END),
    lines(START, START, PASS, FINISH, EXIT, END),
    lines(START, PASS, FINISH, EXIT, END, END),
    "\x00\n",
])
def test_a_malformed_or_misplaced_record_is_tampering(text):
    record = integrity.parse_record(text)
    assert record.malformed
    reason = integrity.check_run(exit_code=0, output="", junit={"t.py::a": integrity.TestStatus.PASSED},
                                 record=record, reporter=True, requested=["t.py::a"], canaries=None)
    assert reason and "tampered" in reason


def test_a_whole_record_is_believed_and_one_without_the_supervisors_end_is_not():
    junit = {"t.py::a": integrity.TestStatus.PASSED}
    whole = integrity.parse_record(lines(START, PASS, FINISH, EXIT, END))
    assert not whole.malformed and whole.ended and whole.end_status == 0
    assert integrity.check_run(exit_code=0, output="", junit=junit, record=whole, reporter=True,
                               requested=["t.py::a"], canaries=None) is None
    unended = integrity.parse_record(lines(START, PASS, FINISH, EXIT))
    reason = integrity.check_run(exit_code=0, output="", junit=junit, record=unended, reporter=True,
                                 requested=["t.py::a"], canaries=None)
    assert reason and "end record" in reason
    # the supervisor saw another status than the process's
    reason = integrity.check_run(exit_code=0, output="", junit=junit, record=integrity.parse_record(
        lines(START, PASS, FINISH, EXIT, {"event": "end", "status": 1})), reporter=True,
        requested=["t.py::a"], canaries=None)
    assert reason and "supervisor saw" in reason
    # a run killed whole (memory limit) leaves the file empty: not tampering, not believed either
    assert integrity.check_run(exit_code=137, output="", junit=None, record=None, reporter=True,
                               requested=["t.py::a"], canaries=None) is None


def test_a_parser_crash_on_the_agents_text_is_not_masked(task, monkeypatch):
    """The patch is the agent's text: even a parser bug it triggers is never an infrastructure failure."""
    import patchgym.grading.verifier as verifier_module

    def crash(diff, protected):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(verifier_module, "filter_agent_patch", crash)
    report = Verifier(sandbox_factory("local")).verify(task, marker_patch())
    assert_refused(report_dict(report), task, Error("cannot be parsed"))


@pytest.mark.parametrize("always", [False, True], ids=["only with the patch", "on the base too"])
def test_a_grading_that_raises_is_masked_only_if_grading_no_patch_raises_too(always, task, monkeypatch):
    """Whatever escapes the grading steps (a harness bug some patch finds) is the agent's failure
    with the exception in ``error``, unless grading no patch at all on the pristine base raises too."""
    import patchgym.grading.verifier as verifier_module

    real = verifier_module._grade

    def crash(sandbox, task, files, report, meter):
        if files or always:
            raise KeyError("a harness bug")
        return real(sandbox, task, files, report, meter)

    monkeypatch.setattr(verifier_module, "_grade", crash)
    report = Verifier(sandbox_factory("local")).verify(task, marker_patch())
    d = report_dict(report)
    assert report.reward == 0.0 and not report.resolved, describe(d)
    assert "grading failed on this patch: KeyError" in report.error, describe(d)
    assert report.infrastructure_failure is always, describe(d)
    assert str(report.outcome) == ("infrastructure_failure" if always else "agent_failure")


DAEMON_TESTS = '''\
import os
import subprocess
import sys


def test_leaves_a_daemon_behind():
    code = "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(600)\\n"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_leaves_a_child_behind():
    subprocess.Popen(["sleep", "600"])
'''


def test_the_supervisor_ends_what_the_run_left_and_then_writes_the_results(calc_sandbox, calc_task):
    """An honest run that leaves a double-forked daemon and a child behind: both are killed before
    the supervisor writes the results (its end record counts them), and the run is believed."""
    from patchgym.grading.testrun import place_harness_files, run_tests

    harness = place_harness_files(calc_sandbox)
    calc_sandbox.write_file("tests/test_daemons.py", DAEMON_TESTS)
    ids = ["tests/test_daemons.py::test_leaves_a_daemon_behind", "tests/test_daemons.py::test_leaves_a_child_behind"]
    run = run_tests(calc_sandbox, calc_task.test_spec, ids, harness=harness)
    assert run.tampering is None and run.error is None and set(ids) <= run.passed, run.output[-3000:]
    records = [json.loads(line) for line in calc_sandbox.read_file(harness.results).decode().splitlines()]
    end = records[-1]
    assert end["event"] == "end" and end["status"] == 1 and end["killed"] >= 2, records[-3:]
    assert end["subreaper"] is True
