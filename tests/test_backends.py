"""One behavioural suite for every sandbox backend: what the gym relies on must hold on each."""

from __future__ import annotations

import os
import time

import pytest

from patchgym import Verifier
from patchgym.sandboxes import PathOutsideWorkspaceError, SandboxClosedError
from patchgym.tasks.backends import make_sandbox, sandbox_factory


@pytest.fixture(params=["local", "local-python-init", "docker"])
def backend(request, monkeypatch) -> str:
    """Every backend, and the local one with the Python init it falls back to without a C compiler."""
    if request.param == "docker":
        request.getfixturevalue("docker_base")
        return "docker"
    if request.param == "local-python-init":
        monkeypatch.setenv("PATCHGYM_PYTHON_INIT", "1")
    return "local"


@pytest.fixture
def sandbox(backend, calc_task):
    sb = make_sandbox(calc_task, backend)
    yield sb
    sb.close()


def test_exec_output_exit_code_and_workdir(sandbox):
    result = sandbox.exec("echo out; echo err >&2; exit 3")
    assert result.exit_code == 3 and "out" in result.output and "err" in result.output
    assert sandbox.exec("pwd").output.strip() == sandbox.workdir
    assert sandbox.exec("python -m pytest -q -p no:cacheprovider 2>&1 | tail -1").output.strip().startswith("7 passed")


def test_stdin_closed_timeout_and_no_survivors(sandbox):
    start = time.monotonic()
    assert sandbox.exec("cat; echo done", timeout=20).output.strip() == "done"
    result = sandbox.exec("echo started; sleep 300", timeout=1.5)
    assert result.timed_out and "started" in result.output and "timed out" in result.output
    background = sandbox.exec("(sleep 300 &); nohup sleep 300 >/dev/null 2>&1 & echo bg", timeout=30)
    assert background.output.strip() == "bg" and not background.timed_out
    assert "sleep 300" not in sandbox.exec("ps -eo args").output
    assert time.monotonic() - start < 20


def test_output_cap(sandbox):
    result = sandbox.exec("echo FIRST; head -c 20000000 /dev/zero | tr '\\0' x; echo; echo LAST", output_limit=4000)
    assert result.truncated and result.output.startswith("FIRST") and result.output.rstrip().endswith("LAST")
    assert "output truncated" in result.output and len(result.output) < 5000


def test_no_history_after_base(sandbox, calc_repo):
    _, info = calc_repo
    assert sandbox.exec("git log --all --format=%H").output.split()[0] == info["base"]
    seen = sandbox.exec("git log --all --oneline; git tag; git reflog --all; git cat-file -p "
                        f"{info['fix_commit']} 2>&1").output
    assert "Release 0.2" not in seen and "Fix mean" not in seen and "v0.2" not in seen


def test_files_diff_and_reset(sandbox, calc_repo):
    sandbox.write_file("calc/extra.py", "X = 1\n")
    sandbox.write_file(f"{sandbox.workdir}/calc/__init__.py", "# emptied\n")
    assert sandbox.read_file("calc/extra.py") == b"X = 1\n"
    diff = sandbox.diff()
    assert "new file mode" in diff and "+# emptied" in diff
    with pytest.raises(PathOutsideWorkspaceError):
        sandbox.read_file("../../etc/passwd")
    sandbox.exec("ln -s /etc/hostname link; mkfifo pipe")
    with pytest.raises(PathOutsideWorkspaceError):
        sandbox.read_file("link")
    with pytest.raises(OSError, match="not a regular file"):
        sandbox.read_file("pipe")
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("missing.txt")
    sandbox.exec("rm -rf ./* .git; echo junk > /tmp/leftover")
    sandbox.reset()
    assert sandbox.diff() == ""
    assert sandbox.exec("git rev-parse HEAD").output.strip() == calc_repo[1]["base"]
    assert sandbox.exec("cat /tmp/leftover").exit_code != 0


def test_a_reset_leaves_no_shared_memory_or_ipc_objects(sandbox):
    """An episode must not find what the last one stashed outside the workspace without a process:
    a POSIX shm file, a System V segment, queue or semaphore set (an answer kept for the next try)."""
    made = sandbox.exec("echo answer > /dev/shm/stash && ipcmk -M 4096 && ipcmk -Q && ipcmk -S 1 && ipcs")
    assert made.exit_code == 0 and made.output.count("0x") >= 3, made.output
    sandbox.reset()
    left = sandbox.exec("ls -A /dev/shm; ipcs -m | grep -c 0x; ipcs -q | grep -c 0x; ipcs -s | grep -c 0x")
    assert left.output.split() == ["0", "0", "0"], left.output


def test_no_network(sandbox):
    probe = ("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=3); print('CONNECTED')\n"
             "except OSError as e:\n    print('refused', e)\n")
    sandbox.write_file("probe.py", probe)
    assert "refused" in sandbox.exec("python probe.py").output


def test_close_is_idempotent(backend, calc_task):
    sb = make_sandbox(calc_task, backend)
    sb.close()
    sb.close()
    with pytest.raises(SandboxClosedError):
        sb.exec("true")


def test_verifier_grades_alike(backend, calc_task):
    if os.environ.get("PATCHGYM_PYTHON_INIT"):
        pytest.skip("grading runs on exec and the file calls, which the tests above cover with the Python init")
    verifier = Verifier(sandbox_factory(backend))
    assert verifier.verify(calc_task, calc_task.patch).resolved
    empty = verifier.verify(calc_task, "", run_empty=True)
    assert not empty.resolved and empty.tests_status["FAIL_TO_PASS"]["failure"] == calc_task.FAIL_TO_PASS
