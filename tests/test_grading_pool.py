"""Grading off the serving path: a server with grading workers grades submits and /verify in
worker processes with a CPU share of their own, the same grades as in-process (issue 38); a worker
ended mid-grading (a signal, the pool's close, its server killed) leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from patchgym.sandboxes.base import SandboxError
from patchgym.server.app import create_app
from patchgym.server.grading_pool import GradingPool, GradingWorkerError
from patchgym.tasks.model import Task
from tests.serving import serve
from tests.test_server import SUBMIT, TASK, apply_via_bash, create


def test_submits_and_verify_are_graded_by_workers_with_a_cpu_share_of_their_own(calc_tasks_file, calc_task):
    app = create_app(tasks=calc_tasks_file, env_options={"grading_workers": 1, "grading_cpu_share": 1000})
    pool = app.state.service.grader
    assert isinstance(pool, GradingPool)
    try:
        with serve(app) as url, httpx.Client(base_url=url, timeout=300) as http:
            sid = create(http)["session_id"]
            assert http.post(f"/v1/sessions/{sid}/step", json={"action": apply_via_bash(calc_task.patch)}).json()[
                "observation"] is not None
            done = http.post(f"/v1/sessions/{sid}/step", json={"action": SUBMIT}).json()
            assert done["terminated"] and done["reward"] == 1.0 and done["info"]["resolved"], done["info"]
            empty = http.post("/v1/verify", json={"instance_id": TASK, "patch": ""}).json()
            assert empty["resolved"] is False and not empty["infrastructure_failure"], empty
            (worker,) = [w.proc.pid for w in pool._all]
            assert worker != os.getpid()
            if pool.group is not None:  # root with a cpu controller, as in CI
                assert str(worker) in (pool.group / "cgroup.procs").read_text().split()
                shares = (pool.group / "cpu.shares")
                assert not shares.exists() or int(shares.read_text()) == 1000 * (os.cpu_count() or 1)
                assert f"patchgym-serving-{os.getpid()}" in Path("/proc/self/cgroup").read_text()
        # The server's end closed the pool: its exit handlers may never run (uvicorn re-raises SIGTERM).
        assert pool._all == [] and _alive({worker}) == set()
        assert pool.group is None or not pool.group.exists()
        assert f"patchgym-serving-{os.getpid()}" not in Path("/proc/self/cgroup").read_text()
    finally:
        pool.close()


def _slow_patch(marker: str) -> str:
    """A patch whose tests hang in ``sleep <marker>`` (a process the host sees by its arguments)."""
    return (
        "diff --git a/calc/__init__.py b/calc/__init__.py\n"
        "--- a/calc/__init__.py\n"
        "+++ b/calc/__init__.py\n"
        "@@ -1,4 +1,6 @@\n"
        ' """Small numeric helpers."""\n'
        "+import subprocess\n"
        f'+subprocess.run(["sleep", "{marker}"])\n'
        " \n"
        " \n"
        " def clamp(x, lo, hi):\n"
    )


def _marker_alive(marker: str) -> bool:
    return subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True).returncode == 0


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (a sandbox's bubblewrap, its init, the test run)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for children in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                new = {int(c) for c in children.read_text().split()} - found
            except OSError:
                continue
            found |= new
            todo += new
    return found


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()
            and Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"}


def _owned_by(pid: int, home: Path, backend: str = "local") -> list[str]:
    """What a process named for itself: sandbox workspaces and /etc copies, cgroups, containers."""
    cgroups = Path("/sys/fs/cgroup")
    found = [*(home / "sandboxes").glob(f"{pid}-*"), *(home / "etc").glob(f"{pid}-*"),
             *cgroups.glob(f"*/patchgym/sb-{pid}-*"), *cgroups.glob(f"*/patchgym-sb-{pid}-*"),
             *cgroups.glob(f"patchgym/sb-{pid}-*")]
    if backend == "docker":
        from patchgym.sandboxes.docker.client import OWNER_LABEL, docker_client

        owner = f"{OWNER_LABEL}={os.uname().nodename}:{pid}"
        found += [f"container {c.name}" for c in docker_client().containers.list(all=True, filters={"label": owner})]
    return [str(item) for item in found]


def _grading_underway(pool: GradingPool, task: Task, marker: str) -> tuple[threading.Thread, list[BaseException]]:
    """A slow grading in a thread of its own, returned once its tests are running; what the pool
    raised lands in the list."""
    raised: list[BaseException] = []

    def grade() -> None:
        try:
            pool.verify(task, _slow_patch(marker))
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=grade, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not _marker_alive(marker):
        assert thread.is_alive() and time.monotonic() < deadline, f"the slow grading never ran: {raised}"
        time.sleep(0.05)
    return thread, raised


def test_a_worker_terminated_mid_grading_closes_its_sandbox_and_is_replaced(calc_task, patchgym_home, backend):
    """SIGTERM (then a second signal during its cleanup) to a worker mid-grading: it closes the
    sandbox it grades in and exits within seconds, the abandoned grading is the server's failure,
    and the next grading gets a fresh worker."""
    marker = f"{5000 + os.getpid() % 1000}.25"
    pool = GradingPool(1, backend=backend)
    try:
        (worker,) = pool._all
        thread, raised = _grading_underway(pool, calc_task, marker)
        pid, below = worker.proc.pid, _descendants(worker.proc.pid)
        assert _owned_by(pid, patchgym_home, backend), "the grading's sandbox should be on the host"
        start = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGHUP)  # during its cleanup: changes nothing
        assert worker.proc.wait(timeout=10) == 128 + signal.SIGTERM  # its own orderly end
        assert time.monotonic() - start < 5
        thread.join(timeout=10)
        assert [type(e) for e in raised] == [GradingWorkerError], raised
        assert isinstance(raised[0], SandboxError), "an infrastructure failure (a server's 503), not the agent's"
        assert _owned_by(pid, patchgym_home, backend) == [], "closed by the worker itself, not left for gc"
        assert _alive(below) == set() and not _marker_alive(marker)
        (replacement,) = pool._all
        assert replacement is not worker
        assert pool.verify(calc_task, calc_task.patch).resolved
    finally:
        pool.close()


def test_closing_the_pool_mid_grading_ends_its_worker_within_seconds(calc_task, patchgym_home):
    marker = f"{6000 + os.getpid() % 1000}.25"
    pool = GradingPool(1, backend="local")
    (worker,) = pool._all
    closer = threading.Thread(target=pool.close, daemon=True)
    try:
        thread, raised = _grading_underway(pool, calc_task, marker)
        pid, below = worker.proc.pid, _descendants(worker.proc.pid)
        start = time.monotonic()
        closer.start()
        closer.join(timeout=20)
        assert not closer.is_alive(), "close() hung on the grading under way"
        assert time.monotonic() - start < 8
        assert worker.proc.poll() == 128 + signal.SIGTERM  # ended by SIGTERM, not the SIGKILL after it
        thread.join(timeout=10)
        assert [type(e) for e in raised] == [GradingWorkerError], raised
        assert _owned_by(pid, patchgym_home) == [] and _alive(below) == set() and not _marker_alive(marker)
        assert pool._all == [], "a closed pool starts no worker"
    finally:
        worker.proc.kill()
        if not closer.is_alive():
            pool.close()
    assert pool.group is None or not pool.group.exists()


# A server's stand-in: a pool grading the patch in argv[2] for the task in argv[1]; prints its worker's pid.
POOL_OWNER = """
import sys, threading, time
from patchgym.server.grading_pool import GradingPool
from patchgym.tasks.model import load_tasks
pool = GradingPool(1, backend="local")
threading.Thread(target=pool.verify, args=(load_tasks(sys.argv[1])[0], sys.argv[2]), daemon=True).start()
print(pool._all[0].proc.pid, flush=True)
time.sleep(300)
"""


def _pool_cgroups(pid: int) -> list[Path]:
    cgroups = Path("/sys/fs/cgroup")
    return [*cgroups.glob(f"cpu/patchgym-*-{pid}"), *cgroups.glob(f"patchgym-*-{pid}")]


def test_a_killed_servers_worker_closes_its_sandbox_and_the_next_pool_removes_its_cgroups(calc_task, patchgym_home):
    """SIGKILL to the pool's process mid-grading: its worker gets SIGTERM as its death signal and
    closes the grading's sandbox; the cgroups named for the dead server go with the next pool."""
    marker = f"{7000 + os.getpid() % 1000}.25"
    owner = subprocess.Popen([sys.executable, "-c", POOL_OWNER, str(calc_task.source_file), _slow_patch(marker)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        worker = int(owner.stdout.readline())
        deadline = time.monotonic() + 60
        while not _marker_alive(marker):
            assert owner.poll() is None and time.monotonic() < deadline, "the slow grading never ran"
            time.sleep(0.05)
        below = _descendants(worker)
    finally:
        owner.kill()
        owner.wait()
    start = time.monotonic()
    while _alive({worker}):
        assert time.monotonic() - start < 5, "the worker outlived its server"
        time.sleep(0.05)
    assert _owned_by(worker, patchgym_home) == [] and _alive(below) == set() and not _marker_alive(marker)
    left = _pool_cgroups(owner.pid)
    pool = GradingPool(1, backend="local")
    pool.close()
    assert pool.group is None or len(left) == 2, "where pools make cgroups, a killed one's stay until the next"
    assert [group for group in left if group.exists()] == []
