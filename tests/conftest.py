"""Shared fixtures: an isolated PATCHGYM_HOME and a small task repository with real git history."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
collect_ignore = ["fixtures"]  # source files for test repositories, not tests of patchgym
PYTEST_PIN = "pytest==8.3.5"  # the same pin as the bundled catalog, so the venv is shared
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Fixture", "GIT_AUTHOR_EMAIL": "fixture@patchgym.invalid",
    "GIT_COMMITTER_NAME": "Fixture", "GIT_COMMITTER_EMAIL": "fixture@patchgym.invalid",
}
# Seconds spent per test file (setup, call and teardown), listed at the end of every run: the suite must stay
# under 25 minutes on 2 cores, and --durations names single tests, not the files that add up.
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _FILE_SECONDS:
        return
    terminalreporter.write_sep("=", "slowest test files (setup + call + teardown)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")


def git(repo: Path, *args: str, date: str = "2026-01-01T00:00:00Z") -> str:
    env = {**os.environ, **GIT_ENV, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def commit_tree(repo: Path, source: Path, message: str, date: str) -> str:
    shutil.copytree(source, repo, dirs_exist_ok=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message, date=date)
    return git(repo, "rev-parse", "HEAD").strip()


def build_calc_repo(dest: Path) -> dict:
    """The ``calc`` fixture: two commits, a base with a bug, a later 'future' commit and tag."""
    src = FIXTURES / "calc"
    dest.mkdir(parents=True)
    git(dest, "init", "-q", "-b", "main")
    commit_tree(dest, src / "v1", "Initial commit: clamp()", "2026-01-01T10:00:00Z")
    base = commit_tree(dest, src / "v2", "Add mean()", "2026-01-02T10:00:00Z")
    shutil.copy(src / "fix" / "calc" / "__init__.py", dest / "calc" / "__init__.py")
    patch = git(dest, "diff")
    git(dest, "checkout", "-q", "--", ".")
    shutil.copy(src / "fix" / "tests" / "test_calc.py", dest / "tests" / "test_calc.py")
    test_patch = git(dest, "diff")
    git(dest, "checkout", "-q", "--", ".")
    fix = commit_tree(dest, src / "fix", "Fix mean() of an empty sequence", "2026-01-03T10:00:00Z")
    commit_tree(dest, src / "future", "Release 0.2", "2026-01-04T10:00:00Z")
    git(dest, "tag", "v0.2")
    return {"base": base, "patch": patch, "test_patch": test_patch, "fix_commit": fix}


def calc_task_row(repo: Path, info: dict, **overrides) -> dict:
    row = {
        "instance_id": "fixture__calc-1",
        "repo": "fixture/calc",
        "base_commit": info["base"],
        "problem_statement": "mean([]) raises ZeroDivisionError instead of ValueError",
        "patch": info["patch"],
        "test_patch": info["test_patch"],
        "FAIL_TO_PASS": ["tests/test_calc.py::test_mean_empty"],
        "PASS_TO_PASS": [
            "tests/test_calc.py::test_clamp_inside", "tests/test_calc.py::test_clamp_edges",
            "tests/test_calc.py::test_clamp_bad_interval", "tests/test_calc.py::test_mean",
            "tests/test_calc.py::test_mean_iterables[values0]",
            "tests/test_calc.py::test_mean_iterables[values1]",
            "tests/test_calc.py::test_mean_iterables[values2]",
        ],
        "version": "0.1",
        "created_at": "2026-01-02T12:00:00Z",
        "environment": {"python": ">=3.9", "packages": [PYTEST_PIN]},
        "test_spec": {"command": "python -m pytest -p no:cacheprovider", "format": "pytest", "timeout": 60},
        "repo_path": str(repo),
    }
    row.update(overrides)
    return row


@pytest.fixture(scope="session", autouse=True)
def patchgym_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every cache (venvs, checkouts, sandboxes) in one place per test session."""
    home = Path(os.environ.get("PATCHGYM_TEST_HOME") or tmp_path_factory.mktemp("patchgym-home"))
    os.environ["PATCHGYM_HOME"] = str(home)
    # Tests asking for an interpreter no host has must not wait on uv failing to download one
    # (about 10 s each with no route to the downloads); test_environments tests the asking itself.
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    # No Docker warm pool unless a test asks for one (test_docker_sandbox does): a container waiting
    # in a pool holds its image, which tests that remove images would find in use.
    os.environ.setdefault("PATCHGYM_DOCKER_POOL", "0")
    # Harnesses installed with npm (Codex CLI: about 100 MB to download, 400 MB installed) are kept
    # across sessions, as pip's and npm's caches are; a run elsewhere installs its own.
    os.environ.setdefault("PATCHGYM_HARNESSES", str(Path.home() / ".cache" / "patchgym-test-harnesses"))
    return home


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of the checkout: setuptools builds in the source
    tree's build/, whose leftovers (a module since moved or deleted) would end up in the wheel and
    hide a missing file."""
    work = tmp_path_factory.mktemp("wheel")
    wheels, source = work / "wheels", work / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                                ".pytest_cache", ".venv", "runs", "logs"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("patchgym-*.whl")
    return wheel


def pip_into(env_dir: Path, *args: str) -> list[str]:
    """The command running this suite's pip on the venv ``env_dir`` (which needs no pip of its own)."""
    return [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "--disable-pip-version-check",
            *args]


@pytest.fixture(scope="session")
def plain_venv(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed without extras into a venv of its own (dependencies from the package
    index, as a user's ``pip install .`` gets them). The venv has no pip of its own (ensurepip costs
    more than the rest of making it): the suite's pip installs into it (``pip --python``), without
    compiling every module of every dependency to bytecode first (the few the tests import are
    compiled when they are)."""
    env_dir = tmp_path_factory.mktemp("plain") / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    install = subprocess.run(pip_into(env_dir, "install", "-q", "--no-compile", str(built_wheel)),
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    return env_dir


@pytest.fixture(scope="session")
def calc_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    repo = tmp_path_factory.mktemp("repos") / "calc"
    return repo, build_calc_repo(repo)


@pytest.fixture(scope="session")
def calc_tasks_file(calc_repo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo, info = calc_repo
    path = tmp_path_factory.mktemp("tasks") / "calc.jsonl"
    path.write_text(json.dumps(calc_task_row(repo, info)) + "\n")
    return path


@pytest.fixture(scope="session")
def calc_task(calc_tasks_file):
    from patchgym import load_tasks

    return load_tasks(calc_tasks_file)[0]


@pytest.fixture
def calc_sandbox(calc_task):
    from patchgym.tasks.backends import make_sandbox

    sandbox = make_sandbox(calc_task)
    yield sandbox
    sandbox.close()


def sandbox_of_a_killed_process(task, then: str) -> list[str]:
    """Make a local sandbox for ``task`` in a child process, run ``then`` (Python, with the sandbox
    as ``sb``; what it prints comes back as words), and kill the child with SIGKILL: what a crashed
    owner leaves behind, for the reapers to find."""
    script = (
        "import os, sys\n"
        f"sys.path[:0] = [{str(Path(__file__).parents[1])!r}]\n"
        "from patchgym.tasks.backends import make_sandbox\n"
        "from patchgym.tasks.model import load_tasks\n"
        f"sb = make_sandbox(load_tasks({str(task.source_file)!r})[0])\n"
        f"{then}\n"
        "sys.stdout.flush()\n"
        "os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ.copy())
    assert proc.returncode == -9, proc.stderr[-3000:]
    return proc.stdout.split()


def docker_required() -> bool:
    return os.environ.get("PATCHGYM_REQUIRE_DOCKER") == "1"


def require_docker() -> None:
    """Skip when no Docker engine is reachable, unless CI demands Docker (then fail)."""
    from patchgym.sandboxes.docker.client import docker_available

    if docker_available():
        return
    if docker_required():
        pytest.fail("PATCHGYM_REQUIRE_DOCKER=1 but no Docker engine is reachable")
    pytest.skip("no Docker engine is reachable (start dockerd; CI sets PATCHGYM_REQUIRE_DOCKER=1)")


@pytest.fixture(scope="session")
def docker_base() -> str:
    """The Debian base image, bootstrapped once (debootstrap + docker import) when missing."""
    require_docker()
    from patchgym.sandboxes.docker.images import base_tag, ensure_base

    ensure_base()
    return base_tag()


@pytest.fixture(params=["local", "docker"])
def backend(request) -> str:
    if request.param == "docker":
        request.getfixturevalue("docker_base")
    return request.param


@pytest.fixture(scope="module")
def url(calc_tasks_file) -> Iterator[str]:
    """The calc task set served by a real uvicorn, one server per test module."""
    from patchgym.server.app import create_app
    from tests.serving import serve

    with serve(create_app(tasks=calc_tasks_file)) as u:
        yield u


@pytest.fixture
def http(url) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def scripted_server():
    """The scripted OpenAI-compatible endpoint (tests/fake_openai.py), one server for the session."""
    from tests.fake_openai import scripted_endpoint

    with scripted_endpoint() as model:
        yield model


@pytest.fixture
def scripted(scripted_server):
    """The session's scripted endpoint, its scripts and records cleared for this test."""
    scripted_server.reset()
    return scripted_server


@pytest.fixture(scope="session")
def harnesses():
    """``harnesses(name)``: the harness of tests/harness_cases.py, made once per session
    (mini-swe-agent imports litellm; Codex CLI is installed with npm once per machine)."""
    from tests.harness_cases import make_harness

    made: dict[str, object] = {}

    def get(name: str):
        if name not in made:
            made[name] = make_harness(name)
        return made[name]

    return get
