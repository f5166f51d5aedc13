"""The server's life beyond the happy path: a client that hangs up mid-step, and a server killed
with live sessions whose successor cleans up what it left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from patchgym.server.app import create_app
from tests.serving import free_port, serve

TASK = "fixture__calc-1"


def bash(command: str) -> dict:
    return {"name": "bash", "arguments": {"command": command}}


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_client_disconnect_mid_step_leaves_a_usable_session(calc_tasks_file):
    app = create_app(tasks=calc_tasks_file, max_sessions=2)
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        sid = http.post("/v1/sessions", json={"task_id": TASK}).json()["session_id"]
        # The client gives up after 0.3 s: its connection closes while the command still runs.
        with pytest.raises(httpx.ReadTimeout):
            http.post(f"/v1/sessions/{sid}/step", json={"action": bash("sleep 1.5; echo late > late.txt")},
                      timeout=0.3)
        # The step finishes server-side; the session is neither lost nor stuck busy.
        wait_for(lambda: http.get(f"/v1/sessions/{sid}").json()["steps"] == 1, 30, "the abandoned step to finish")
        r = http.post(f"/v1/sessions/{sid}/step", json={"action": bash("cat late.txt")})
        assert r.status_code == 200 and "late" in r.json()["observation"]
        assert http.get("/healthz").json()["sessions"] == 1
        assert http.delete(f"/v1/sessions/{sid}").status_code == 204
        assert len(app.state.manager) == 0


def _owned_by(pid: int, home: Path) -> list[Path]:
    """Host-side leftovers (sandbox directories, /etc copies) named after process ``pid``."""
    found = []
    for kind in ("sandboxes", "etc"):
        root = home / kind
        if root.is_dir():
            found += [p for p in root.iterdir() if p.name.removeprefix("sb-").split("-", 1)[0] == str(pid)]
    return found


def _marker_processes(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if int(p) != os.getpid()]


def _start_server(tasks: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "patchgym.cli", "serve", "--port", str(port), "--tasks", str(tasks),
         "--max-sessions", "4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, 60, "the server to start")
    return proc


def test_killed_server_leftovers_are_reaped_by_the_next_one(calc_tasks_file, patchgym_home):
    marker = f"sleep {4000 + os.getpid() % 1000}.5"
    port = free_port()
    first = _start_server(calc_tasks_file, port)
    try:
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=60) as http:
            ids = [http.post("/v1/sessions", json={"task_id": TASK}).json()["session_id"] for _ in range(2)]
            # A live command in one session when the server dies.
            http.post(f"/v1/sessions/{ids[0]}/step", json={"action": bash(f"({marker} &) ; echo started")})
        assert _owned_by(first.pid, patchgym_home), "the sessions' sandboxes should exist on the host"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert _owned_by(first.pid, patchgym_home), "SIGKILL leaves the sandboxes behind"

    second = _start_server(calc_tasks_file, port)
    try:
        assert _owned_by(first.pid, patchgym_home) == [], "the new server reaps the dead one's sandboxes"
        wait_for(lambda: _marker_processes(marker) == [], 15, "the dead server's sandbox processes to die")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()["sessions"] == 0
        httpx.post(f"http://127.0.0.1:{port}/v1/sessions", json={"task_id": TASK}, timeout=60).raise_for_status()
        assert _owned_by(second.pid, patchgym_home)
    finally:
        second.send_signal(signal.SIGINT)  # graceful: its lifespan closes every sandbox
        try:
            second.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)
            raise
    assert _owned_by(second.pid, patchgym_home) == [], "a graceful shutdown closes every session's sandbox"
