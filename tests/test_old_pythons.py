"""Grading under Python 3.6 and 3.7 (issue 23 item 4; issue 21: the reward cannot be forged there either).

The interpreters are the host's (pyenv's 3.6.15 and 3.7.16 on the CI machines; a version the host
lacks is skipped with the reason). Two small tasks per version: the ``calc`` fixture (pytest) and
the Django- and SymPy-style ones of ``test_forgery_runners`` (``tests/runtests.py``, ``bin/test``),
each in an environment of that Python.

What grading did before (found with these tests, written first): under 3.6/3.7 the pytest runtime
could not start (``sys.addaudithook`` is missing), so *every* pytest grading, gold included, ended
as tampering ("the test runner exited before its final record"); Django's runner ran as written and
was read from its output, and a patch that rewires ``unittest.TestResult`` (failures reported as
successes) got reward 1.0. Now the runtime runs there without its audit hook (isolated start,
supervisor, reporter/recorder, canaries), the report names what it went without
(``protections_missing``), gold resolves, and the forgeries below score 0 with the reason.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from conftest import build_calc_repo, calc_task_row
from pbs_archive import pyenv_cpython

from gym_envs import load_tasks
from gym_envs.grading import integrity
from gym_envs.grading.testrun import missing_protections
from gym_envs.grading.verifier import Verifier
from sandboxes import python_archives
from sandboxes.environments import EnvironmentBuildError, EnvironmentSpec, find_interpreter
from tasks.backends import sandbox_factory
from tasks.model import Task
from tests import test_forgery_runners as runner_forgery
from tests import test_reward_forgery as forgery

OLD = ("3.6", "3.7")
# The newest pytest each Python can install (8.x needs 3.8).
PYTEST_PINS = {"3.6": "pytest==7.0.1", "3.7": "pytest==7.4.4"}


def _interpreter_or_skip(python: str) -> None:
    try:
        find_interpreter(EnvironmentSpec(python=python))
    except EnvironmentBuildError as exc:
        pytest.skip(f"no Python {python} on this host: {str(exc)[:300]}")


@pytest.fixture(scope="module")
def old_tasks(tmp_path_factory) -> dict[tuple[str, str], Task]:
    """(python, "pytest" | "django" | "sympy") -> the task in an environment of that Python."""
    root = tmp_path_factory.mktemp("old-pythons")
    calc = root / "calc"
    info = build_calc_repo(calc)
    django = runner_forgery._build(root / "djangoish", runner_forgery.FIXTURES / "djangoish",
                                   {"tests/runtests.py": runner_forgery.RUNTESTS}, "minilib/__init__.py",
                                   "tests/arith/tests.py",
                                   "\n    def test_clamp_high(self):\n        from minilib import clamp\n\n"
                                   "        self.assertEqual(clamp(9, 0, 5), 5)\n")
    sympy = runner_forgery._build(root / "sympyish", runner_forgery.FIXTURES / "sympyish", {},
                                  "sympy/core/__init__.py", "sympy/core/tests/test_core.py",
                                  "\n\ndef test_clamp_high():\n    from sympy import clamp\n\n"
                                  "    assert clamp(9, 0, 5) == 5\n")
    rows = []
    for python in OLD:
        rows.append(calc_task_row(calc, info, instance_id=f"fixture__calc-py{python}",
                                  environment={"python": python, "packages": [PYTEST_PINS[python]]}))
        rows.append({
            "instance_id": f"fixture__djangoish-py{python}", "repo": "fixture/djangoish",
            "problem_statement": "clamp(9, 0, 5) returns 9", "version": "0.1", "created_at": "2026-01-02T12:00:00Z",
            "base_commit": django["base"], "patch": django["patch"], "test_patch": django["test_patch"],
            "FAIL_TO_PASS": ["test_clamp_high (arith.tests.ArithTests)"],
            "PASS_TO_PASS": ["test_add (arith.tests.ArithTests)", "Adding zero changes nothing.",
                             "test_pairs (arith.tests.ArithTests)"],
            # pytest too, unused by the runner: one environment per Python for both tasks.
            "environment": {"python": python, "packages": [PYTEST_PINS[python]]},
            "test_spec": {"format": "django", "command": runner_forgery.DJANGO_COMMAND, "timeout": 120},
            "repo_path": str(root / "djangoish")})
        rows.append({
            "instance_id": f"fixture__sympyish-py{python}", "repo": "fixture/sympyish",
            "problem_statement": "clamp(9, 0, 5) returns 9", "version": "0.1", "created_at": "2026-01-02T12:00:00Z",
            "base_commit": sympy["base"], "patch": sympy["patch"], "test_patch": sympy["test_patch"],
            "FAIL_TO_PASS": ["test_clamp_high"], "PASS_TO_PASS": ["test_add", "test_add_zero"],
            "environment": {"python": python, "packages": [PYTEST_PINS[python]]},
            "test_spec": {"format": "sympy", "command": runner_forgery.SYMPY_COMMAND, "timeout": 120},
            "repo_path": str(root / "sympyish")})
    path = root / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = {}
    for task in load_tasks(path):
        python = task.environment.python
        out[(python, task.test_spec.format)] = task
    return out


@pytest.fixture(params=OLD)
def python(request) -> str:
    _interpreter_or_skip(request.param)
    return request.param


@pytest.fixture(scope="module")
def calc_repos(tmp_path_factory) -> dict[str, forgery.Repo]:
    return {}


def _verify(task: Task, patch: str) -> dict:
    report = Verifier(sandbox_factory("local")).verify(task, patch)
    out = forgery.report_dict(report)
    out["test_output"] = report.test_output
    return out


def _names_the_missing_hook(report: dict, python: str) -> None:
    missing = " | ".join(report["protections_missing"])
    assert "no audit hook" in missing and f"Python {python}." in missing, missing


@pytest.mark.parametrize("fmt", ["pytest", "django", "sympy"])
def test_gold_resolves_and_the_report_names_the_missing_hook(fmt, python, old_tasks):
    task = old_tasks[(python, fmt)]
    gold = _verify(task, task.patch)
    assert gold["resolved"] is True and gold["reward"] == 1.0, forgery.describe(gold, gold["test_output"])
    assert not gold["tampering_detected"] and gold["outcome"] == "resolved"
    _names_the_missing_hook(gold, python)
    assert "script_runner.py" not in gold["test_output"].splitlines()[0], "the command shown is the task's"
    nothing = _verify(task, "")
    forgery.assert_refused(nothing, task, forgery.AnyOf(forgery.NoEffect(), forgery.Error()))


# pytest forgeries of test_reward_forgery (in calc's package): each caught without the audit hook,
# by the supervisor's records, the reporter's own observations or the canaries.
PYTEST_ATTACKS = {a.name: a for a in forgery.ATTACKS if a.name in {
    "import-time plugin forcing outcomes (gc -> Config)",
    "TestReport.from_item_and_call monkeypatched",
    "forged junit + os._exit(0) at import",
    "forged junit + os._exit(0) in atexit",
    "every item's runtest replaced by a no-op",
    "junit and the grader's reporter record both forged, exit 1",
    "gold + in-process forged junit (not resolved)"}}
assert len(PYTEST_ATTACKS) == 7


@pytest.mark.parametrize("name", sorted(PYTEST_ATTACKS))
def test_pytest_forgery_is_refused(name, python, old_tasks, calc_repos, tmp_path_factory):
    task = old_tasks[(python, "pytest")]
    if python not in calc_repos:
        calc_repos[python] = forgery.Repo(task, tmp_path_factory.mktemp("calc-checkout") / python)
    repo = calc_repos[python]
    attack = PYTEST_ATTACKS[name]
    report = _verify(task, attack.build(task, repo))
    # Without the audit hook, what the hook caught first (a gc walk) is caught by what it leads to.
    expect = forgery.Tampering() if isinstance(attack.expect, forgery.Tampering) else attack.expect
    forgery.assert_refused(report, task, forgery.resolve_reason(expect, repo), report["test_output"])
    _names_the_missing_hook(report, python)


# SWE-bench's astropy 0.1-1.3 environments: Python 3.6 with pytest 3.3.1 (its attrs and pluggy).
OLDEST_PYTEST = ["pytest==3.3.1", "attrs==17.3.0", "pluggy==0.6.0"]


def test_pytest_3_3_as_astropy_pins_it_under_python_36(old_tasks, calc_repos, tmp_path_factory):
    """pytest 3.3's ``-o`` takes every argument after it (``nargs="*"``): ``-o junit_family=xunit1
    TEST_IDS`` made the ids ini overrides and the run a usage error (exit 4), gold included. The
    option is given as ``--override-ini=junit_family=xunit1`` (one value whatever the version)."""
    _interpreter_or_skip("3.6")
    base = old_tasks[("3.6", "pytest")]
    task = base.model_copy(update={"instance_id": "fixture__calc-pytest33", "environment": base.environment.model_copy(
        update={"packages": OLDEST_PYTEST})})
    gold = _verify(task, task.patch)
    assert gold["resolved"] is True and gold["reward"] == 1.0, forgery.describe(gold, gold["test_output"])
    _names_the_missing_hook(gold, "3.6")
    if "3.6" not in calc_repos:
        calc_repos["3.6"] = forgery.Repo(task, tmp_path_factory.mktemp("calc-checkout") / "3.6")
    forged = _verify(task, PYTEST_ATTACKS["forged junit + os._exit(0) at import"].build(task, calc_repos["3.6"]))
    forgery.assert_refused(forged, task, forgery.Tampering(), forged["test_output"])


# The Django and SymPy runner forgeries of test_forgery_runners; the two that the audit hook alone
# catches under 3.8+ (sys._getframe into the runner, a Python profile function) do nothing to the
# outcome here.
SCRIPT_ATTACKS = runner_forgery.ATTACKS
AUDIT_HOOK_ONLY = ("django-getframe-into-the-runner", "django-python-profile-left-installed")


@pytest.mark.parametrize("name", sorted(SCRIPT_ATTACKS))
def test_runner_forgery_is_refused(name, python, old_tasks):
    fmt, files, first, reason = SCRIPT_ATTACKS[name]
    task = old_tasks[(python, fmt)]
    if name in AUDIT_HOOK_ONLY:
        reason = forgery.NoEffect()
    report = _verify(task, runner_forgery._patch(task, files, first=first))
    forgery.assert_refused(report, task, reason, report["test_output"])


def test_the_interpreter_comes_from_the_supervisors_end_record():
    """The version is read from the supervisor's ``end`` (nothing of the run outlives it: a record
    the code under test writes earlier can name no version), and only 3.8 on lacks nothing."""
    text = ('{"event": "start", "pid": 7}\n{"event": "finish", "exitstatus": 0}\n{"event": "exit", "code": 0}\n'
            '{"event": "end", "status": 0, "python": "3.7.16"}\n')
    record = integrity.parse_record(text)
    assert record.python == "3.7.16" and record.malformed is None
    assert any("no audit hook" in m for m in missing_protections(record.python))
    assert missing_protections("3.8.18") == missing_protections("3.13.0") == []
    assert missing_protections(None) == missing_protections("x.y") == []


# -- Docker: the interpreter from an archive packed from the host's (pyenv's) installation ---------

@pytest.fixture(scope="module")
def old_archives(tmp_path_factory) -> dict[str, python_archives.PythonArchive]:
    """``patchgym images python-archive`` of pyenv's newest 3.6 and 3.7, in one archive directory."""
    out = tmp_path_factory.mktemp("old-archives")
    for minor in OLD:
        prefix = pyenv_cpython(minor)
        if prefix is not None:
            python_archives.pack_installation(prefix, out)
    return {a.version.rsplit(".", 1)[0]: a for a in python_archives.find_archives(out)}


def test_an_installation_packs_to_the_same_bytes_and_runs_from_its_archive(old_archives, tmp_path):
    """Packed twice, the same bytes (its sha256 keys the environment images built from it); unpacked
    elsewhere, ``python/bin/python3`` runs with the stdlib of its own directory (pyenv's shared
    libpython found through ``$ORIGIN``, not the installation it came from)."""
    archive = old_archives.get("3.7")
    if archive is None:
        pytest.skip("no pyenv CPython 3.7 on this host to pack")
    again = python_archives.pack_installation(pyenv_cpython("3.7"), tmp_path / "again")
    assert hashlib.sha256(again.read_bytes()).hexdigest() == archive.sha256
    subprocess.run(["tar", "-xzf", str(again), "-C", str(tmp_path)], check=True)
    script = "import sys, ssl, sqlite3, json; print(json.dumps([sys.version.split()[0], sys.prefix]))"
    out = subprocess.run([str(tmp_path / "python" / "bin" / "python3"), "-I", "-c", script],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [archive.version, str(tmp_path / "python")]
    with pytest.raises(python_archives.PackError, match="system prefix"):
        python_archives.pack_installation(Path("/usr"), tmp_path / "no")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["pytest", "django"])
def test_docker_grades_under_python_37_from_an_archive(fmt, old_tasks, old_archives, calc_repos, docker_base,
                                                      monkeypatch, tmp_path_factory):
    """No Debian release has Python 3.7: the environment image gets it from the archive directory
    (uv installs it in the build). Gold resolves, a forgery scores 0, and the report names the
    missing audit hook, as on the local backend."""
    if "3.7" not in old_archives:
        pytest.skip("no pyenv CPython 3.7 on this host to pack")
    monkeypatch.setenv(python_archives.ARCHIVES_VAR, str(next(iter(old_archives.values())).path.parent))
    task = old_tasks[("3.7", fmt)]
    verifier = Verifier(sandbox_factory("docker"))
    gold = verifier.verify(task, task.patch)
    report = forgery.report_dict(gold)
    assert gold.resolved and gold.reward == 1.0, forgery.describe(report, gold.test_output)
    _names_the_missing_hook(report, old_archives["3.7"].version.rsplit(".", 1)[0])
    if fmt == "pytest":
        if "3.7" not in calc_repos:
            calc_repos["3.7"] = forgery.Repo(task, tmp_path_factory.mktemp("calc-checkout") / "3.7")
        patch = PYTEST_ATTACKS["forged junit + os._exit(0) at import"].build(task, calc_repos["3.7"])
    else:
        patch = runner_forgery._patch(task, SCRIPT_ATTACKS["django-patch-testresult"][1])
    forged = verifier.verify(task, patch)
    forgery.assert_refused(forgery.report_dict(forged), task, forgery.Tampering(), forged.test_output)
