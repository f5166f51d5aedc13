"""Registering a repository: detection of its environment and test command from the files of a
commit, the whole-suite check, and ``patchgym repos add`` / ``repos list`` on real git repositories."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import PYTEST_PIN, git
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.cli import common as cli_common
from patchgym.grading.outcome import TestStatus
from patchgym.grading.testrun import TestRun
from patchgym.making.git_source import RepoFiles, RepoSetupError, open_source, repo_from_url, resolve_rev
from patchgym.making.repo_setup import (
    UnsupportedRepoError,
    check_suite,
    detect_setup,
    pick_python,
    setup_py_keywords,
)

runner = CliRunner()
cli_common.out.width = cli_common.console.width = 300  # no wrapping inside table cells
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"


def commit(repo: Path, files: dict[str, str], message: str = "commit") -> str:
    """Write ``files`` into ``repo`` (created and git-initialised when new) and commit them."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q", "-b", "main")
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def detect(repo: Path, rev: str = "HEAD", **options):
    sha = resolve_rev(repo, rev)
    return detect_setup(RepoFiles(repo, sha), **options)


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def text(result) -> str:
    return " ".join(result.output.split())


LIB = {"tinylib/__init__.py": "def add(a, b):\n    return a + b\n"}
PASSING_TESTS = {"tests/test_add.py": "from tinylib import add\n\n\ndef test_small():\n    assert add(1, 2) == 3\n\n\n"
                                      "def test_negative():\n    assert add(-1, 1) == 0\n"}


# --- detection ---------------------------------------------------------------------------------


def test_pyproject_with_a_test_extra_installs_it_and_adds_missing_plugins(tmp_path):
    repo = tmp_path / "pp"
    commit(repo, {**LIB, **PASSING_TESTS, "pyproject.toml": """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "tinylib"
version = "0.1"
requires-python = ">=3.9"
dependencies = ["packaging>=23"]

[project.optional-dependencies]
docs = ["sphinx"]
dev = ["black"]
Testing = ["pytest>=8", "hypothesis"]

[tool.pytest.ini_options]
addopts = "--cov=tinylib -n 2"
"""})
    found = detect(repo)
    env = found.environment
    assert env.install == ["python -m pip install -e '.[Testing]'"]
    # pytest comes with the extra (no pin added); the plugins addopts needs do not.
    assert env.packages == ["pytest-cov", "pytest-xdist"]
    assert env.python == HERE  # this interpreter satisfies >=3.9, and sandboxes prefer it
    assert found.test_spec.command == "python -m pytest -p no:cacheprovider"
    notes = "\n".join(found.notes)
    assert "requires-python '>=3.9' in pyproject.toml" in notes
    assert "pyproject.toml [tool.pytest.ini_options]" in notes and "'--cov=tinylib'" in notes


def test_requirements_test_txt_becomes_packages_with_includes_followed(tmp_path):
    repo = tmp_path / "reqs"
    commit(repo, {**LIB, **PASSING_TESTS,
                  "requirements.txt": "attrs>=22  # runtime\n",
                  "requirements-dev.txt": "black\n",  # a test file exists: dev ones are not used
                  "requirements-test.txt": "# test deps\n-r requirements/common.txt\n-e .\n"
                                           "hypothesis==6.100.0 \\\n    --hash=sha256:abc\n--index-url https://x\n",
                  "requirements/common.txt": "coverage[toml]>=7 ; python_version >= '3.8'\n"})
    found = detect(repo)
    env = found.environment
    assert env.install == []  # no pyproject.toml/setup.py: nothing to install
    assert env.packages == [PYTEST_PIN, "attrs>=22", "coverage[toml]>=7 ; python_version >= '3.8'",
                            "hypothesis==6.100.0"]
    notes = "\n".join(found.notes)
    assert "from requirements-test.txt" in notes and "editable line '-e .'" in notes
    assert "pytest, on the tests/ directory" in notes


def test_setup_cfg_extras_python_requires_and_pytest_section(tmp_path):
    repo = tmp_path / "cfg"
    commit(repo, {**LIB, **PASSING_TESTS, "setup.cfg": """
[metadata]
name = tinylib

[options]
python_requires = >=3.8
packages = find:

[options.extras_require]
testing =
    pytest>=7
    pytest-asyncio

[tool:pytest]
asyncio_mode = auto
addopts = -ra --timeout=30
"""})
    found = detect(repo)
    env = found.environment
    assert env.install == ["python -m pip install -e '.[testing]'"]
    assert env.packages == ["pytest-timeout"]  # pytest-asyncio comes with the extra
    assert "setup.cfg [tool:pytest]" in "\n".join(found.notes)
    assert "requires-python '>=3.8' in setup.cfg" in "\n".join(found.notes)


def test_setup_py_is_parsed_not_run(tmp_path):
    source = """
import os
from setuptools import setup
os.system("touch /tmp/patchgym-should-never-run")
EXTRAS = {"tests": ["pytest", "mock"] + ["freezegun"]}
setup(name="tinylib", python_requires=">=3.7", extras_require=EXTRAS, tests_require=["nose"],
      install_requires=[r for r in open("reqs.txt")])
"""
    kw = setup_py_keywords(source)
    assert kw == {"python_requires": ">=3.7", "extras_require": {"tests": ["pytest", "mock", "freezegun"]},
                  "tests_require": ["nose"]}
    repo = tmp_path / "setuppy"
    commit(repo, {**LIB, **PASSING_TESTS, "setup.py": source})
    found = detect(repo)
    assert found.environment.install == ["python -m pip install -e '.[tests]'"]
    assert found.environment.packages == []  # tests_require is not needed: the extra brings pytest
    assert not Path("/tmp/patchgym-should-never-run").exists()


def test_detection_reads_the_commit_not_the_working_tree(tmp_path):
    repo = tmp_path / "history"
    first = commit(repo, {**LIB, **PASSING_TESTS, "requirements-test.txt": "pytest==8.3.5\nhypothesis\n"})
    commit(repo, {"requirements-test.txt": "pytest==8.3.5\n"})
    (repo / "requirements-test.txt").write_text("pytest==8.3.5\nsomething-uncommitted\n")
    assert detect(repo).environment.packages == [PYTEST_PIN]
    assert detect(repo, first[:8]).environment.packages == [PYTEST_PIN, "hypothesis"]
    assert resolve_rev(repo, "HEAD~1") == first


@pytest.mark.parametrize(("files", "like"), [
    ({"django/__init__.py": "", "tests/runtests.py": ""}, "Django"),
    ({"sympy/__init__.py": "", "bin/test": ""}, "SymPy"),
])
def test_django_and_sympy_point_to_import_swebench(tmp_path, files, like):
    repo = tmp_path / like
    commit(repo, files)
    with pytest.raises(UnsupportedRepoError, match=f"looks like {like}.*import-swebench"):
        detect(repo)
    assert detect(repo, test_cmd="python -m pytest tests").test_spec.command == "python -m pytest tests"


def test_user_options_win_over_detection(tmp_path):
    repo = tmp_path / "opts"
    commit(repo, {**LIB, **PASSING_TESTS, "pyproject.toml": "[project]\nname='tinylib'\nversion='0.1'\n"})
    found = detect(repo, python=">=3.9", install=["pip install -e . --no-deps"], packages=["numpy"],
                   test_cmd="python -m pytest -x")
    env = found.environment
    assert (env.python, env.install, found.test_spec.command) == (">=3.9", ["pip install -e . --no-deps"],
                                                                  "python -m pytest -x")
    assert env.packages == [PYTEST_PIN, "numpy"]
    with pytest.raises(RepoSetupError, match="--python '2.7': no interpreter on this machine"):
        detect(repo, python="2.7")


def test_python_is_picked_among_this_machines_interpreters():
    assert pick_python(None)[0] == HERE
    with pytest.raises(RepoSetupError, match="no Python on this machine satisfies '>=9.0' .*pyproject.toml"):
        pick_python(">=9.0", "pyproject.toml")
    try:
        other, note = pick_python(f"<{HERE}", "setup.py")
    except RepoSetupError:
        pytest.skip("no older interpreter on this machine")
    assert other != HERE and "setup.py" in note


def test_sources_and_revisions_are_checked(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(RepoSetupError, match="is not a git repository"):
        open_source(str(plain))
    with pytest.raises(RepoSetupError, match="no such path"):
        open_source(str(tmp_path / "missing"))
    repo = tmp_path / "src"
    commit(repo, LIB)
    inner = open_source(str(repo / "tinylib"))
    assert inner.source == str(repo.resolve()) and "registering" in inner.notes[0]
    assert inner.default_repo("tl") == "local/tl"
    with pytest.raises(RepoSetupError, match="unknown revision 'v9' in"):
        resolve_rev(repo, "v9")
    assert repo_from_url("https://github.com/psf/requests.git") == "psf/requests"
    assert repo_from_url("git@github.com:pallets/click.git") == "pallets/click"
    assert repo_from_url("ssh://git@example.com:2222/team/lib/") == "team/lib"


def _run(statuses: dict[str, TestStatus], output: str = "", exit_code: int = 0) -> TestRun:
    return TestRun(statuses=statuses, command="pytest", output=output, exit_code=exit_code, timed_out=False)


def test_suite_check_verdicts():
    ok = check_suite(_run({"a": TestStatus.PASSED, "b": TestStatus.PASSED, "c": TestStatus.SKIPPED,
                           "d": TestStatus.XFAIL, "e": TestStatus.FAILED}), 0.75)
    assert ok.ok and (ok.passed, ok.failed, ok.skipped, ok.pass_rate) == (3, 1, 1, 0.75)
    low = check_suite(_run({"t::a": TestStatus.PASSED, "t::b": TestStatus.ERROR}, "ERROR t::b - ImportError: x",
                           1), 0.8)
    assert not low.ok and low.failing == ["t::b"] and low.reasons == {"t::b": "ImportError: x"}
    assert "only 50% of the tests pass (need 80%)" in low.problem
    empty = check_suite(_run({}, "collected 0 items", 5), 0.8)
    assert not empty.ok and not empty.collected and "nothing was collected: pytest reported no tests collected" \
        in empty.problem and "collected 0 items" in empty.tail
    skipped = check_suite(_run({"a": TestStatus.SKIPPED}), 0.8)
    assert not skipped.ok and "all 1 collected tests were skipped" in skipped.problem


# --- the command line ----------------------------------------------------------------------------


def test_repos_add_registers_a_passing_repository_and_lists_it(tmp_path):
    from patchgym.making.registry import get_repo, registry_dir

    repo = tmp_path / "tinylib"
    sha = commit(repo, {**LIB, **PASSING_TESTS, "requirements-test.txt": f"{PYTEST_PIN}\n"})
    result = run("repos", "add", str(repo), "--name", "setup-tinylib")
    assert result.exit_code == 0, result.output
    out = text(result)
    assert "2 passed, 0 failed, 0 errors, 0 skipped, 100% pass" in out and "registered setup-tinylib" in out
    saved = json.loads((registry_dir() / "setup-tinylib.json").read_text())
    assert saved["head"] == sha and saved["repo"] == "local/setup-tinylib" and saved["source"] == str(repo)
    assert saved["environment"] == {"python": HERE, "packages": [PYTEST_PIN], "pre_install": [], "install": []}
    assert get_repo("setup-tinylib").test_spec.command == "python -m pytest -p no:cacheprovider"

    listed = run("repos", "list")
    assert listed.exit_code == 0
    rows = {line.split("│")[1].strip(): line for line in listed.output.splitlines() if line.count("│") > 5}
    assert "local/setup-tinylib" in rows["setup-tinylib"] and sha[:12] in rows["setup-tinylib"]
    for bundled in ("dotenvkit", "semverkit", "textable"):
        assert f"patchgym/{bundled}" in rows[bundled] and "yes" in rows[bundled]

    again = run("repos", "add", str(repo), "--name", "setup-tinylib")
    assert again.exit_code == 2 and "'setup-tinylib' is already registered" in text(again)
    bundled = run("repos", "add", str(repo), "--name", "semverkit")
    assert bundled.exit_code == 2 and "is a bundled repository; pass --force" in text(bundled)


def test_repos_add_refuses_a_mostly_failing_suite_naming_the_failures(tmp_path):
    from patchgym.making.registry import registry_dir

    repo = tmp_path / "broken"
    commit(repo, {**LIB, "requirements-test.txt": f"{PYTEST_PIN}\n", "tests/test_broken.py": (
        "from tinylib import add\n\n\ndef test_ok():\n    assert add(1, 1) == 2\n\n\n"
        "def test_wrong_sum():\n    assert add(2, 2) == 5\n\n\n"
        "def test_wrong_type():\n    assert add('a', 'b') == 'ba'\n\n\n"
        "def test_also_wrong():\n    assert add(0, 0) == 1\n")})
    result = run("repos", "add", str(repo), "--name", "setup-broken")
    assert result.exit_code == 1, result.output
    out = text(result)
    assert "1 passed, 3 failed" in out and "tests/test_broken.py::test_wrong_sum" in out
    assert "tests/test_broken.py::test_also_wrong" in out and "assert 4 == 5" in out
    assert "not registered: only 25% of the tests pass (need 80%)" in out
    assert not (registry_dir() / "setup-broken.json").exists()

    forced = run("repos", "add", str(repo), "--name", "setup-broken", "--force")
    assert forced.exit_code == 0 and "registering anyway (--force)" in text(forced)
    assert (registry_dir() / "setup-broken.json").exists()


def test_repos_add_says_when_nothing_was_collected(tmp_path):
    repo = tmp_path / "notests"
    commit(repo, {**LIB, "requirements-test.txt": f"{PYTEST_PIN}\n"})
    result = run("repos", "add", str(repo), "--name", "setup-notests")
    assert result.exit_code == 1, result.output
    out = text(result)
    assert "nothing was collected: pytest reported no tests collected" in out
    assert "collected 0 items" in out  # the tail of pytest's output says why
    assert "no pytest configuration, tests/ directory or test_*.py files found" in out


def test_repos_add_rejects_bad_input(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    result = run("repos", "add", str(plain), "--name", "setup-plain")
    assert result.exit_code == 2 and "is not a git repository" in text(result)
    repo = tmp_path / "r"
    commit(repo, LIB)
    result = run("repos", "add", str(repo), "--name", "setup-r", "--rev", "nope")
    assert result.exit_code == 2 and "unknown revision 'nope'" in text(result)
    result = run("repos", "add", str(repo), "--name", "../evil")
    assert result.exit_code == 2 and "invalid name '../evil'" in text(result)
