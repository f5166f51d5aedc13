"""``--specs`` reads SWE-bench's harness constants whole, without running them, and applies their
requirement paths and package rewrites as SWE-bench's harness does."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from patchgym.tasks.model import TaskFileError
from patchgym.tasks.swebench_constants import (
    HARNESS_REPLACE_REQ_PACKAGES,
    clean_requirements,
    read_constants,
    read_python_constants,
    requirements_at,
)
from patchgym.tasks.swebench_io import import_rows, load_spec_tables
from tests.conftest import FIXTURES, git

CONSTANTS = FIXTURES / "swebench_constants" / "constants"
SQLFLUFF = FIXTURES / "swebench_constants" / "sqlfluff"


def test_the_constants_package_is_read_whole():
    tables = read_constants(CONSTANTS)
    assert set(tables.specs) == {"iamkun/dayjs", "pytest-dev/pytest", "sqlfluff/sqlfluff"}
    assert tables.specs["sqlfluff/sqlfluff"]["2.0"] == {"python": "3.9", "packages": "requirements.txt",
                                                      "install": "python -m pip install -e .",
                                                      "test_cmd": "pytest -rA"}
    pytest_specs = tables.specs["pytest-dev/pytest"]
    assert pytest_specs["5.1"]["pip_packages"] == ["attrs==23.1.0", "py==1.11.0", "wcwidth==0.2.6"]
    assert pytest_specs["5.0"]["pip_packages"] == ["attrs==23.1.0", "py==1.11.0"]
    assert pytest_specs["5.0"]["pre_install"] == ["sed -i 's/>=>=/>=/' setup.cfg"]
    assert pytest_specs["7.4"]["python"] == "3.11" and pytest_specs["7.4"]["nano_cpus"] == 2_000_000_000
    assert tables.reqs_paths["sqlfluff/sqlfluff"] == ["requirements_dev.txt"]
    # SWE-bench keeps REPLACE_REQ_PACKAGES in its harness, not its constants: the harness's list applies.
    assert tables.replace_req_packages == HARNESS_REPLACE_REQ_PACKAGES == (("types-pkg_resources", "types-setuptools"),)
    # One file of the package gives its own maps (MAP_REPO_VERSION_TO_SPECS_PY).
    assert set(read_constants(CONSTANTS / "python.py").specs) == {"pytest-dev/pytest", "sqlfluff/sqlfluff"}


def test_json_of_the_same_tables(tmp_path):
    tables = read_constants(CONSTANTS)
    path = tmp_path / "constants.json"
    path.write_text(json.dumps({"MAP_REPO_VERSION_TO_SPECS": tables.specs, "MAP_REPO_TO_REQS_PATHS": tables.reqs_paths,
                                "REPLACE_REQ_PACKAGES": [["types-pkg_resources", "types-setuptools"], ["nose", None]]}))
    loaded = load_spec_tables(path)
    assert loaded.specs == tables.specs and {r: loaded.reqs_paths[r] for r in tables.reqs_paths} == tables.reqs_paths
    assert loaded.replace_req_packages == (("types-pkg_resources", "types-setuptools"), ("nose", None))
    plain = tmp_path / "specs.json"
    plain.write_text(json.dumps({"sqlfluff/sqlfluff": tables.specs["sqlfluff/sqlfluff"]}))
    assert load_spec_tables(plain).specs == {"sqlfluff/sqlfluff": tables.specs["sqlfluff/sqlfluff"]}


def test_the_source_is_never_run(tmp_path):
    """The attack: a constants file that runs code when imported. Nothing of it runs; the
    statements that are not constants are skipped, the constants around them still read."""
    marker = tmp_path / "ran"
    (tmp_path / "__init__.py").write_text(
        "import os\n"
        f"os.system('touch {marker}')\n"
        f"open({str(marker)!r}, 'w').write('x')\n"
        f"__import__('os').system('touch {marker}')\n"
        "X = [1] * 10**12\n"
        "L = ['x']\n"
        f"for i in {[0] * 64}:\n    L.extend(L)\n"
        "S = 'a'\n"
        f"for i in {[0] * 64}:\n    S = S + S\n"
        "F = '{0.__class__.__mro__}'.format(1)\n"
        "def f():\n    pass\n"
        f"SPECS = {{'1.0': {{'python': '3.9', 'install': (lambda: __import__('os').system('touch {marker}'))()}}}}\n"
        "MAP_REPO_VERSION_TO_SPECS = {'a/b': {'2.0': {'python': '3.11'}}, **{'c/d': {'1': {}}}}\n"
        "MAP_REPO_VERSION_TO_SPECS['e/f'] = {'1': {'python': str(3.10)}}\n")
    tables = read_constants(tmp_path)
    assert not marker.exists()
    names = read_python_constants(tmp_path)
    assert "X" not in names and "F" not in names and "os" not in names and "f" not in names
    assert len(names["L"]) <= 200_000 and len(names["S"]) <= 1_000_000  # doubling stopped at the caps
    assert tables.specs == {"a/b": {"2.0": {"python": "3.11"}}, "c/d": {"1": {}}, "e/f": {"1": {"python": "3.1"}}}


def test_not_constants_is_an_error(tmp_path):
    path = tmp_path / "x.py"
    path.write_text("A = 1\n")
    with pytest.raises(TaskFileError, match="no MAP_REPO_VERSION_TO_SPECS"):
        load_spec_tables(path)
    path.write_text("def (:\n")
    with pytest.raises(TaskFileError, match="cannot read it as Python source"):
        load_spec_tables(path)


def test_package_rewrites_as_swebenchs_harness_applies_them():
    text = "flake8\ntypes-pkg_resources==0.1.3\ntypes-pkg_resources\nmy-types-pkg_resources\ntypes-toml\n"
    assert clean_requirements(text, HARNESS_REPLACE_REQ_PACKAGES) == (
        "flake8\ntypes-setuptools\ntypes-setuptools\nmy-types-pkg_resources\ntypes-toml\n")
    assert clean_requirements("a\nnose>=1.0\nb\n", (("nose", None),)) == "a\nb\n"


def test_requirements_with_r_files_as_swebench_reads_them():
    files = {name: (SQLFLUFF / name).read_text() for name in ("requirements.txt", "requirements_dev.txt")}
    found = requirements_at(files.get, ["requirements-missing.txt", "requirements_dev.txt"])
    assert found is not None
    path, text = found
    assert path == "requirements_dev.txt"
    lines = [line for line in text.split("\n") if line.strip()]
    # the -r file's lines first (its comments left out), then the file's own, without "-e ." or comments
    assert lines == ["click>=7.1", "colorama>=0.3", "flake8", "types-pkg_resources==0.1.3", "types-toml"]
    assert requirements_at(files.get, ["nothing.txt"]) is None


@pytest.fixture
def sqlfluff_repo(tmp_path):
    """A repository in sqlfluff's shape: its requirement files at the environment's commit, and a
    later base commit whose requirements_dev.txt differs (the environment's commit is what counts)."""
    repo = tmp_path / "repos" / "sqlfluff__sqlfluff"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    shutil.copytree(SQLFLUFF, repo, dirs_exist_ok=True)
    (repo / "setup.py").write_text("from setuptools import setup\nsetup(name='sqlfluff')\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "environment")
    env_commit = git(repo, "rev-parse", "HEAD").strip()
    (repo / "requirements_dev.txt").write_text("later-only-package\n")
    git(repo, "commit", "-q", "-am", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    return repo, env_commit, base


def test_sqlfluffs_published_constants_need_no_hand_edits(sqlfluff_repo, tmp_path):
    """The bar: SWE-bench's constants for sqlfluff, given as they are, give an environment that
    installs requirements_dev.txt as SWE-bench's harness does: read at the environment's commit,
    its -r file included, types-pkg_resources (gone from PyPI) rewritten to types-setuptools."""
    repo, env_commit, base = sqlfluff_repo
    row = {"instance_id": "sqlfluff__sqlfluff-1", "repo": "sqlfluff/sqlfluff", "base_commit": base,
           "environment_setup_commit": env_commit, "version": "2.0", "problem_statement": "x", "patch": "",
           "test_patch": "", "FAIL_TO_PASS": ["test/a_test.py::test_a"], "PASS_TO_PASS": []}
    tables = load_spec_tables(CONSTANTS)
    result = import_rows([("line 1", row)], repos=repo.parent, output=tmp_path / "t.jsonl", specs=tables.specs,
                         constants=tables)
    (task,) = result.tasks
    assert result.environment_source == {"sqlfluff__sqlfluff-1": "specs"}
    assert task.environment.python == "3.9" and task.test_spec.command.startswith("pytest -rA")
    first, *rest = task.environment.install
    assert rest == ["python -m pip install -e ."]
    assert "python -m pip install -r /dev/stdin" in first
    assert "types-setuptools" in first and "types-pkg_resources" not in first
    assert "click>=7.1" in first and "later-only-package" not in first and "-e ." not in first.split("\n")
    # The step is a shell here-document pip reads: it installs what SWE-bench's harness would.
    listed = subprocess.run(["bash", "-c", first.replace("python -m pip install -r /dev/stdin", "cat")],
                            capture_output=True, text=True, check=True).stdout
    assert [line for line in listed.split("\n") if line.strip()] == [
        "click>=7.1", "colorama>=0.3", "flake8", "types-setuptools", "types-toml"]


def test_a_repository_that_cannot_be_read_falls_back_with_a_warning(sqlfluff_repo, tmp_path):
    repo, env_commit, base = sqlfluff_repo
    row = {"instance_id": "sqlfluff__sqlfluff-2", "repo": "sqlfluff/sqlfluff", "base_commit": base,
           "environment_setup_commit": "0" * 40, "version": "2.0", "problem_statement": "x", "patch": "",
           "test_patch": "", "FAIL_TO_PASS": ["test/a_test.py::test_a"], "PASS_TO_PASS": []}
    tables = load_spec_tables(CONSTANTS)
    result = import_rows([("line 1", row)], repos=repo.parent, output=tmp_path / "t.jsonl", specs=tables.specs,
                         constants=tables)
    (task,) = result.tasks
    assert any("requirements_dev.txt could be read" in w or "none of requirements_dev.txt" in w for w in result.warnings)
    assert "requirements" in task.environment.install[0]


def test_builtin_specs_rewrite_requirements_as_specs_does(sqlfluff_repo, tmp_path):
    """With no --specs, sqlfluff's built-in spec installs requirements_dev.txt as SWE-bench's
    harness does: read at the environment's commit, types-pkg_resources rewritten."""
    repo, env_commit, base = sqlfluff_repo
    row = {"instance_id": "sqlfluff__sqlfluff-3", "repo": "sqlfluff/sqlfluff", "base_commit": base,
           "environment_setup_commit": env_commit, "version": "0.6", "problem_statement": "x", "patch": "",
           "test_patch": "", "FAIL_TO_PASS": ["test/a_test.py::test_a"], "PASS_TO_PASS": []}
    result = import_rows([("line 1", row)], repos=repo.parent, output=tmp_path / "t.jsonl")
    (task,) = result.tasks
    assert result.environment_source == {"sqlfluff__sqlfluff-3": "builtin"}
    first, *rest = task.environment.install
    assert rest == ["python -m pip install -e ."]
    listed = subprocess.run(["bash", "-c", first.replace("python -m pip install -r /dev/stdin", "cat")],
                            capture_output=True, text=True, check=True).stdout
    assert [line for line in listed.split("\n") if line.strip()] == [
        "click>=7.1", "colorama>=0.3", "flake8", "types-setuptools", "types-toml"]


def test_unread_requirements_are_installed_from_swebenchs_paths_at_build_time(sqlfluff_repo, tmp_path):
    """Where the file cannot be read at import, the build installs the first of the repository's
    MAP_REPO_TO_REQS_PATHS in the checkout (sqlfluff's requirements_dev.txt is in no generic list)."""
    repo, _, base = sqlfluff_repo
    row = {"instance_id": "sqlfluff__sqlfluff-4", "repo": "sqlfluff/sqlfluff", "base_commit": base,
           "environment_setup_commit": "0" * 40, "version": "0.6", "problem_statement": "x", "patch": "",
           "test_patch": "", "FAIL_TO_PASS": ["test/a_test.py::test_a"], "PASS_TO_PASS": []}
    result = import_rows([("line 1", row)], repos=repo.parent, output=tmp_path / "t.jsonl")
    (task,) = result.tasks
    assert any("none of requirements_dev.txt could be read" in w for w in result.warnings)
    step = task.environment.install[0]
    assert step.startswith("for f in requirements_dev.txt; do") and "requirements-dev.txt" not in step
    work = tmp_path / "checkout"
    work.mkdir()
    (work / "requirements_dev.txt").write_text("flake8\n")
    ran = subprocess.run(["bash", "-c", step.replace("python -m pip install -r", "cat")], cwd=work,
                         capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout == "flake8\n"


def _installed(task) -> list[str]:
    """The requirement lines the first install step hands pip (its here-document)."""
    first = task.environment.install[0]
    listed = subprocess.run(["bash", "-c", first.replace("python -m pip install -r /dev/stdin", "cat")],
                            capture_output=True, text=True, check=True).stdout
    return [line for line in listed.split("\n") if line.strip()]


def test_a_spec_map_alone_gets_swebenchs_requirement_paths_and_rewrites(sqlfluff_repo, tmp_path):
    """The spec map alone (as many forks publish it) holds no MAP_REPO_TO_REQS_PATHS nor
    REPLACE_REQ_PACKAGES: SWE-bench's harness applies its own to every spec, and so does patchgym
    (else sqlfluff's build asks PyPI for types-pkg_resources, which it no longer has). A file of
    the constants' tables overrides them."""
    repo, env_commit, base = sqlfluff_repo
    row = {"instance_id": "sqlfluff__sqlfluff-5", "repo": "sqlfluff/sqlfluff", "base_commit": base,
           "environment_setup_commit": env_commit, "version": "2.0", "problem_statement": "x", "patch": "",
           "test_patch": "", "FAIL_TO_PASS": ["test/a_test.py::test_a"], "PASS_TO_PASS": []}
    specs = read_constants(CONSTANTS).specs["sqlfluff/sqlfluff"]
    plain = tmp_path / "specs.json"
    plain.write_text(json.dumps({"sqlfluff/sqlfluff": specs}))
    tables = load_spec_tables(plain)
    result = import_rows([("line 1", row)], repos=repo.parent, output=tmp_path / "t.jsonl", specs=tables.specs,
                         constants=tables)
    (task,) = result.tasks
    assert result.environment_source == {"sqlfluff__sqlfluff-5": "specs"} and not result.warnings
    assert _installed(task) == ["click>=7.1", "colorama>=0.3", "flake8", "types-setuptools", "types-toml"]

    own = tmp_path / "constants.json"
    own.write_text(json.dumps({"MAP_REPO_VERSION_TO_SPECS": {"sqlfluff/sqlfluff": specs},
                               "REPLACE_REQ_PACKAGES": [["types-pkg_resources", None], ["flake8", "ruff"]]}))
    tables = load_spec_tables(own)
    result = import_rows([("line 1", row)], repos=repo.parent, output=tmp_path / "t2.jsonl", specs=tables.specs,
                         constants=tables)
    assert _installed(result.tasks[0]) == ["click>=7.1", "colorama>=0.3", "ruff", "types-toml"]
