"""Task environments: interpreter choice, install steps that see the repository at /testbed,
caching, and build failures reported as infrastructure failures."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import PYTEST_PIN, calc_task_row

from patchgym import Verifier, load_tasks
from patchgym.sandboxes import EnvironmentBuildError, EnvironmentSpec
from patchgym.sandboxes.environments import ensure_environment, find_interpreter
from patchgym.sandboxes.isolation import bwrap_path
from patchgym.tasks.backends import make_sandbox


def _task(tmp_path, calc_repo, **overrides):
    repo, info = calc_repo
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(calc_task_row(repo, info, **overrides)) + "\n")
    return load_tasks(path)[0]


def test_interpreter_choice():
    here = find_interpreter(EnvironmentSpec(python=f"{sys.version_info.major}.{sys.version_info.minor}"))
    assert here.version.startswith(f"{sys.version_info.major}.{sys.version_info.minor}")
    with pytest.raises(EnvironmentBuildError, match="no Python interpreter on this host satisfies '==2.5'"):
        find_interpreter(EnvironmentSpec(python="==2.5"))
    with pytest.raises(EnvironmentBuildError, match="invalid python constraint"):
        find_interpreter(EnvironmentSpec(python="three"))


def test_the_running_interpreter_is_chosen_without_starting_the_others(monkeypatch):
    """Probing every Python on a host starts each one twice (1.7 s for 17 candidates here), and the
    running interpreter is preferred whenever it fits: it is taken without asking the others."""
    from patchgym.sandboxes import environments

    def probe_all(wanted):
        raise AssertionError("probed the other interpreters")

    monkeypatch.setattr(environments, "_fitting", probe_all)
    here = find_interpreter(EnvironmentSpec(python=f">={sys.version_info.major}.{sys.version_info.minor}"))
    assert here.executable == os.path.realpath(sys.executable)


def test_uv_managed_interpreters_are_candidates_and_a_failed_download_is_explained(tmp_path, monkeypatch):
    from patchgym.sandboxes import environments

    managed = tmp_path / "uv-python" / "cpython-3.99.0-linux-x86_64-gnu" / "bin"
    managed.mkdir(parents=True)
    (managed / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(tmp_path / "uv-python"))
    assert str(managed / "python3") in environments._candidate_executables()

    fake_uv = tmp_path / "uv"
    fake_uv.write_text("#!/bin/sh\necho \"$@\" >> " + str(tmp_path / "asked") + "\n"
                       "echo 'error: Failed to download: dns error' >&2\nexit 2\n")
    fake_uv.chmod(0o755)
    monkeypatch.setattr(environments, "uv_executable", lambda: str(fake_uv))
    monkeypatch.delenv("UV_PYTHON_DOWNLOADS", raising=False)
    environments._uv_python_install.cache_clear()
    with pytest.raises(EnvironmentBuildError, match=r"uv python install '2.6' failed: error: Failed to download"):
        find_interpreter(EnvironmentSpec(python="2.6"))
    assert (tmp_path / "asked").read_text() == "python install 2.6\n"
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
    environments._uv_python_install.cache_clear()
    with pytest.raises(EnvironmentBuildError, match="UV_PYTHON_DOWNLOADS=never"):
        find_interpreter(EnvironmentSpec(python="2.6"))
    assert (tmp_path / "asked").read_text() == "python install 2.6\n", "not asked again"


def test_environment_is_built_once_and_shared(calc_task):
    spec = calc_task.environment.to_spec()
    first = ensure_environment(spec)
    second = ensure_environment(spec)
    assert first.venv == second.venv and (first.venv / "bin" / "python").exists()
    assert json.loads((first.venv.parent.parent / "ready.json").read_text())["spec"]["packages"] == [PYTEST_PIN]


def test_an_environment_is_built_with_a_bytecode_prefix_and_an_old_one_gets_it_when_next_used(calc_task):
    """The read-only bytecode prefix (sandboxes/bytecode.py) is built with the environment, and an
    environment built before prefixes gets one the first time it is used; a failed try is not
    repeated by every sandbox (the environment is then used without one: the /dev/null fallback)."""
    import shutil

    spec = calc_task.environment.to_spec()
    built = ensure_environment(spec)
    prefix = built.bytecode
    assert prefix is not None and prefix in built.mounts and prefix.parent == built.venv.parent
    stdlib_pyc = f"json/__init__.{sys.implementation.cache_tag}.pyc"
    assert list(prefix.rglob(stdlib_pyc)), "the stdlib is compiled into the prefix"
    shutil.rmtree(prefix)
    (prefix.parent / "bytecode.log").write_text("a try that failed\n")
    assert ensure_environment(spec).bytecode is None  # not tried again
    (prefix.parent / "bytecode.log").unlink()  # as an environment from before prefixes
    again = ensure_environment(spec)
    assert again.bytecode == prefix and list(prefix.rglob(stdlib_pyc)) and prefix in again.mounts
    assert not list(prefix.parent.glob(".bytecode.tmp-*"))


def test_install_steps_run_against_the_workspace_path(tmp_path, calc_repo):
    """An editable install made at build time must import each sandbox's own workspace."""
    task = _task(tmp_path, calc_repo, instance_id="fixture__calc-editable", environment={
        "python": ">=3.9",
        "packages": [PYTEST_PIN, "setuptools>=70.1"],
        "pre_install": ["echo pre-install-ran > \"$VIRTUAL_ENV/pre-install.txt\""],
        "install": ["python -m pip install --no-deps --no-build-isolation -e ."],
    })
    sb = make_sandbox(task)
    try:
        assert (sb.env.venv / "pre-install.txt").read_text().strip() == "pre-install-ran"
        sb.write_file("calc/__init__.py", sb.read_file("calc/__init__.py") + b"\nEDITED_HERE = True\n")
        out = sb.exec("cd /tmp && python -c 'import calc; print(calc.__file__, calc.EDITED_HERE)'").output
        assert out.split() == [f"{sb.workdir}/calc/__init__.py", "True"], out
    finally:
        sb.close()
    report = Verifier().verify(task, task.patch)
    assert report.resolved, report.test_output[-1500:]


def test_environment_build_failure_is_an_infrastructure_failure(tmp_path, calc_repo):
    task = _task(tmp_path, calc_repo, instance_id="fixture__calc-badenv", environment={
        "python": ">=3.9", "packages": ["patchgym-no-such-package-anywhere==0.0.0"]})
    report = Verifier().verify(task, task.patch)
    assert report.infrastructure_failure and not report.resolved
    assert "patchgym-no-such-package-anywhere" in report.infrastructure_failure_reason
    # A failed build is not cached as ready: the next attempt tries again.
    with pytest.raises(EnvironmentBuildError):
        make_sandbox(task)


def test_unknown_repository_is_a_clear_error(tmp_path, calc_repo):
    from patchgym import TaskFileError

    task = _task(tmp_path, calc_repo, repo_path="nowhere/repo.bundle")
    with pytest.raises(TaskFileError, match="repo_path 'nowhere/repo.bundle' does not exist"):
        make_sandbox(task)


@pytest.mark.skipif(bwrap_path() is None, reason="editable installs are shared only when made at /testbed")
def test_commits_with_the_same_install_inputs_share_one_editable_environment(tmp_path, calc_repo):
    """Every synthesized bug is its own commit: with an editable install, those whose install
    inputs are the base's share its venv (no build per candidate), and each sandbox still imports
    its own tree. A copy install (``pip install .``) stays one environment per commit."""
    repo, info = calc_repo
    editable = {"python": ">=3.9", "packages": [PYTEST_PIN, "setuptools>=70.1"],
                "install": ["python -m pip install --no-deps --no-build-isolation -e ."]}
    base = _task(tmp_path, calc_repo, instance_id="fixture__calc-share-base", environment=editable)
    fixed = base.model_copy(update={"instance_id": "fixture__calc-share-fix", "base_commit": info["fix_commit"]})
    probe = "cd /tmp && python -c 'import calc\ntry: calc.mean([])\nexcept Exception as e: print(type(e).__name__)'"
    seen = {}
    for task in (base, fixed):
        sb = make_sandbox(task)
        try:
            seen[task.instance_id] = (sb.env.venv, sb.exec(probe).output.strip())
        finally:
            sb.close()
    (base_venv, base_error), (fix_venv, fix_error) = seen.values()
    assert base_venv == fix_venv, "the fix commit changes only Python source: one environment"
    assert (base_error, fix_error) == ("ZeroDivisionError", "ValueError"), "each sandbox imports its own tree"

    copy = {**editable, "install": ["python -m pip install --no-deps --no-build-isolation ."]}
    venvs = set()
    for commit in (info["base"], info["fix_commit"]):
        task = _task(tmp_path, calc_repo, instance_id="fixture__calc-share-copy", base_commit=commit,
                     environment=copy)
        sb = make_sandbox(task)
        try:
            venvs.add(sb.env.venv)
        finally:
            sb.close()
    assert len(venvs) == 2, "a copy of the source is in the venv: one environment per commit"
