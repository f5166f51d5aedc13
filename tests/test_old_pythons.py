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

Found on the way: without ``sys.pycache_prefix`` (3.8), a pyc the code under test wrote during the
run for a module imported later was read (reward 1.0: ``test_bytecode_planted_during_the_run_is_not_read``);
pytest 3.3's ``-o`` swallowed the test ids after it (every grading a usage error). Both fixed.
Docker: the interpreter from ``patchgym images python-archive`` of pyenv's installation.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from conftest import build_calc_repo, calc_task_row
from pbs_archive import pyenv_cpython

from patchgym import load_tasks
from patchgym.grading import integrity
from patchgym.grading.testrun import missing_protections
from patchgym.grading.verifier import Verifier
from patchgym.sandboxes import python_archives
from patchgym.sandboxes.base import EnvironmentSpec
from patchgym.sandboxes.environments import EnvironmentBuildError, find_interpreter
from patchgym.tasks.backends import sandbox_factory
from patchgym.tasks.model import Task
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
    report = Verifier(sandbox_factory("local")).verify(task, patch, run_empty=not patch)
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
    nothing = _verify(task, "")  # the tests run, and fail
    forgery.assert_refused(nothing, task, forgery.NoEffect())
    assert not nothing["tampering_detected"], forgery.describe(nothing, nothing["test_output"])


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


# -- bytecode written into the tree during the run (no sys.pycache_prefix before 3.8) --------------

# A repository whose tests import a test-support module (``tests/expected.py``) and whose
# ``tests/conftest.py`` imports the package: the package's code runs before any test module is
# imported, which is when a forger plants bytecode for what is imported next.
PLANT_REPO = {
    "calc/__init__.py": "def double(x):\n    return x * 3\n",
    "tests/__init__.py": "",
    "tests/conftest.py": "import calc  # noqa: F401\n",
    "tests/expected.py": "DOUBLE_OF_2 = 4\n",
    "tests/test_double.py": "from calc import double\n\n\ndef test_other():\n    assert double(0) == 0\n",
}
PLANT_TEST = ("\n\ndef test_double():\n    from tests.expected import DOUBLE_OF_2\n\n"
              "    assert double(2) == DOUBLE_OF_2\n")

# Writes ``pyc`` as the interpreter and pytest's assertion rewriter write their caches (magic, flags
# from 3.7, the source's mtime and size, the code): a pyc that matches ``source`` as it is on disk.
PLANT_FN = '''\
def _pg_plant(source, code, pyc):
    import importlib.util, marshal, os, struct, sys
    st = os.stat(source)
    head = importlib.util.MAGIC_NUMBER + (b"\\0\\0\\0\\0" if sys.version_info >= (3, 7) else b"")
    try:
        os.makedirs(os.path.dirname(pyc), exist_ok=True)
        with open(pyc, "wb") as fh:
            fh.write(head + struct.pack("<II", int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)
                     + marshal.dumps(code))
    except OSError:
        pass
'''

PLANTS = {
    # The test-support module's cache, for the import system: the expected value the bug gives.
    "support module": PLANT_FN + '''
import importlib.util as _pg_util
import os as _pg_os

_pg_src = _pg_os.path.join(_pg_os.getcwd(), "tests", "expected.py")
_pg_plant(_pg_src, compile("DOUBLE_OF_2 = 6\\n", _pg_src, "exec"), _pg_util.cache_from_source(_pg_src))
''',
    # The hidden test module's cache, for pytest's assertion rewriter: the module as it is on disk
    # (canaries included) with the body of the test it wants passed emptied.
    "rewritten test module": PLANT_FN + '''
import ast as _pg_ast
import os as _pg_os
import sys as _pg_sys

_pg_rw = _pg_sys.modules.get("_pytest.assertion.rewrite")
_pg_src = _pg_os.path.join(_pg_os.getcwd(), "tests", "test_double.py")
if _pg_rw is not None and hasattr(_pg_rw, "PYC_TAIL"):
    with open(_pg_src) as _pg_fh:
        _pg_tree = _pg_ast.parse(_pg_fh.read())
    for _pg_node in _pg_tree.body:
        if isinstance(_pg_node, _pg_ast.FunctionDef) and _pg_node.name == "test_double":
            _pg_node.body = [_pg_ast.Pass()]
    _pg_plant(_pg_src, compile(_pg_ast.fix_missing_locations(_pg_tree), _pg_src, "exec"),
              _pg_os.path.join(_pg_os.path.dirname(_pg_src), "__pycache__", "test_double" + _pg_rw.PYC_TAIL))
''',
}


@pytest.fixture(scope="module")
def plant_tasks(tmp_path_factory) -> dict[str, Task]:
    """python -> the double() task in an environment of that Python (3.8 too: the control)."""
    from conftest import git

    repo = tmp_path_factory.mktemp("plant") / "doubling"
    for name, text in PLANT_REPO.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc/__init__.py").write_text("def double(x):\n    return x * 2\n")
    patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    (repo / "tests/test_double.py").write_text(PLANT_REPO["tests/test_double.py"] + PLANT_TEST)
    test_patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    pins = {**PYTEST_PINS, "3.8": "pytest==8.3.5"}
    rows = [{"instance_id": f"fixture__doubling-py{python}", "repo": "fixture/doubling", "base_commit": base,
             "problem_statement": "double(2) is 6", "version": "0.1", "created_at": "2026-01-02T12:00:00Z",
             "patch": patch, "test_patch": test_patch, "FAIL_TO_PASS": ["tests/test_double.py::test_double"],
             "PASS_TO_PASS": ["tests/test_double.py::test_other"],
             "environment": {"python": python, "packages": [pins[python]]},
             "test_spec": {"command": "python -m pytest -p no:cacheprovider", "format": "pytest", "timeout": 120},
             "repo_path": str(repo)} for python in (*OLD, "3.8")]
    path = repo.parent / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {t.environment.python: t for t in load_tasks(path)}


def _plant_patch(task: Task, payload: str) -> str:
    from conftest import git

    repo = Path(task.repo_path)
    try:
        (repo / "calc/__init__.py").write_text(PLANT_REPO["calc/__init__.py"] + "\n\n" + payload)
        return git(repo, "diff")
    finally:
        git(repo, "checkout", "-q", "--", ".")


@pytest.mark.parametrize("plant", sorted(PLANTS))
@pytest.mark.parametrize("version", [*OLD, "3.8"])
def test_bytecode_planted_during_the_run_is_not_read(plant, version, plant_tasks):
    """Python < 3.8 has no ``sys.pycache_prefix``: before the defense, a pyc the code under test
    wrote at run time for a module imported later (a test-support module; the hidden test module's
    assertion-rewritten cache) was read, and the bug scored 1.0 (3.6 and 3.7; 3.8, the control,
    reads no bytecode from the tree). The runtime now sends the cache lookups of every source in
    the workspace to a path that holds nothing, as the prefix does from 3.8."""
    _interpreter_or_skip(version)
    task = plant_tasks[version]
    gold = _verify(task, task.patch)
    assert gold["resolved"] is True, forgery.describe(gold, gold["test_output"])
    report = _verify(task, _plant_patch(task, PLANTS[plant]))
    forgery.assert_refused(report, task, forgery.NoEffect(), report["test_output"])


@pytest.mark.parametrize("version", OLD)
def test_no_bytecode_prefix_is_compiled_for_an_interpreter_without_pycache_prefix(version, tmp_path):
    """Under 3.6 the compiler failed (no checked-hash pycs: a warning on every environment build);
    under 3.7 ``cache_from_source`` ignored the prefix and the environment build wrote checked-hash
    pycs beside the sources, into the interpreter's own stdlib (pyenv's, on the host) and the
    checkout. Now it writes nothing and succeeds: the prefix is empty, nothing looks in it."""
    from patchgym.sandboxes.bytecode import COMPILER

    prefix = pyenv_cpython(version)
    if prefix is None:
        pytest.skip(f"no pyenv CPython {version} on this host")
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text("X = 1\n")
    proc = subprocess.run([str(prefix / "bin" / f"python{version}"), "-I", str(COMPILER), str(tmp_path / "prefix"),
                           "--stdlib", f"{tree}=/testbed"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no pycs written" in proc.stdout
    assert not list(tree.rglob("*.pyc")) and not (tmp_path / "prefix").exists()


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


def test_the_python_archive_command(old_archives, tmp_path):
    """``patchgym images python-archive PREFIX --output DIR`` (no Docker needed): the archive, or
    exit status 2 and the reason."""
    from typer.testing import CliRunner

    from patchgym.cli.app import app

    if "3.7" not in old_archives:
        pytest.skip("no pyenv CPython 3.7 on this host to pack")
    runner = CliRunner()
    made = runner.invoke(app, ["images", "python-archive", str(pyenv_cpython("3.7")), "--output", str(tmp_path)])
    assert made.exit_code == 0, made.output
    assert [a.sha256 for a in python_archives.find_archives(tmp_path)] == [old_archives["3.7"].sha256]
    refused = runner.invoke(app, ["images", "python-archive", str(tmp_path), "--output", str(tmp_path / "x")])
    assert refused.exit_code == 2 and "holds no bin/python3.X" in refused.output


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
