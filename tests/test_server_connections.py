"""Connections no client can hold: half-sent requests (the attack that once took ``patchgym serve``
down with no token at all), requests read too slowly, and the log lines a flood would write.
Loopback only; every flood is bounded in count and time."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from patchgym.server.app import create_app
from patchgym.server.serving import LogThrottle, connection_limit
from tests.serving import free_port, serve

TASK = "fixture__calc-1"
HALF_SENT = b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"  # never finished
SERVER_NOFILE = 512  # the server's descriptor limit in the flood test: the flood is above it
FLOOD = 800  # half-sent connections held at once by the attacker
STEP_P99_BOUND = 3.0  # s: another client's echo step during the flood (idle: ~0.05 s)
HEALTHZ_BOUND = 3.0  # s: a /healthz on a new connection during the flood


def bash(command: str) -> dict:
    return {"name": "bash", "arguments": {"command": command}}


@contextlib.contextmanager
def serve_process(tasks: Path, log: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``patchgym serve`` in a process of its own with RLIMIT_NOFILE at :data:`SERVER_NOFILE`
    (soft and hard: it cannot raise it); killed with its group at the end."""
    port = free_port()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (SERVER_NOFILE, SERVER_NOFILE))

    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "patchgym.cli", "serve", "--port", str(port), "--tasks",
                                 str(tasks), *args], stdout=out, stderr=out, start_new_session=True,
                                preexec_fn=limit, env={**os.environ, "PATCHGYM_LOG": "info"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Flood:
    """Holds up to ``count`` connections each with a half-sent request, opening a new one for each
    the server closes, until stopped (bounded: ``count`` sockets, ``seconds`` of time)."""

    def __init__(self, port: int, count: int, seconds: float) -> None:
        self.port, self.count, self.deadline = port, count, time.monotonic() + seconds
        self.sockets: list[socket.socket] = []
        self.opened = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket | None:
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", self.port))
            s.sendall(HALF_SENT)
        except OSError as exc:
            s.close()
            self.failed.append(f"{type(exc).__name__}: {exc}")
            return None
        s.setblocking(False)
        self.opened += 1
        return s

    def _run(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            closed = [s for s in self.sockets if not _still_open(s)]
            for s in closed:
                s.close()
            self.sockets = [s for s in self.sockets if s.fileno() != -1]
            while len(self.sockets) < self.count and not self._stop.is_set():
                s = self._open()
                if s is None:
                    break
                self.sockets.append(s)
            self._stop.wait(0.2)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for s in self.sockets:
            s.close()


def _still_open(s: socket.socket) -> bool:
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


@pytest.fixture
def nofile_room() -> None:
    """This process needs a descriptor per flood connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FLOOD + 512:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, FLOOD + 1024), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= FLOOD + 512


def test_half_sent_requests_above_the_descriptor_limit_starve_no_one(calc_tasks_file, tmp_path, nofile_room):
    log = tmp_path / "serve.log"
    with serve_process(calc_tasks_file, log, "--max-sessions", "2") as (url, proc), \
            httpx.Client(base_url=url, timeout=60) as client:
        sid = client.post("/v1/sessions", json={"task_id": TASK}).json()["session_id"]
        step = f"/v1/sessions/{sid}/step"
        assert client.post(step, json={"action": bash("echo warm")}).status_code == 200
        steps, probes = [], []
        with Flood(int(url.rsplit(":", 1)[1]), FLOOD, seconds=60) as flood:
            while flood.opened < FLOOD and time.monotonic() < flood.deadline:  # every half-sent request is in
                time.sleep(0.05)
            for i in range(12):
                start = time.monotonic()
                r = client.post(step, json={"action": bash(f"echo {i}")})
                steps.append(time.monotonic() - start)
                assert r.status_code == 200 and f"{i}" in r.json()["observation"], (i, r.text, log.read_text()[-3000:])
                start = time.monotonic()
                assert httpx.get(f"{url}/healthz", timeout=HEALTHZ_BOUND).status_code == 200  # a new connection
                probes.append(time.monotonic() - start)
            opened = flood.opened
        assert opened > FLOOD > SERVER_NOFILE  # the server closed some to let the others in, and they came back
        p99 = statistics.quantiles(steps, n=100)[98]
        assert p99 < STEP_P99_BOUND and max(probes) < HEALTHZ_BOUND, (steps, probes)
        metrics = client.get("/metrics").text
        assert proc.poll() is None
    text = log.read_text()
    assert "Too many open files" not in text and "Traceback" not in text, text[-3000:]
    evicted = next(line for line in metrics.splitlines() if 'reason="evicted"' in line)
    assert float(evicted.split()[-1]) > 0, metrics


def _closed_within(s: socket.socket, seconds: float) -> bool:
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_a_request_not_read_in_time_is_closed_and_keep_alive_is_not(calc_tasks_file):
    with serve(create_app(tasks=calc_tasks_file), read_timeout=1) as url:
        port = int(url.rsplit(":", 1)[1])
        silent, half, slow_body = (socket.create_connection(("127.0.0.1", port)) for _ in range(3))
        with silent, half, slow_body:
            half.sendall(HALF_SENT)
            slow_body.sendall(b"POST /v1/verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              b"Content-Length: 100\r\n\r\n{\"instance_id\":")
            start = time.monotonic()
            assert all(_closed_within(s, 10) for s in (silent, half, slow_body))
            assert 0.5 < time.monotonic() - start < 8
        with httpx.Client(base_url=url, timeout=10) as client:  # an idle keep-alive connection outlives it
            assert client.get("/healthz").status_code == 200
            time.sleep(1.5)
            assert client.get("/healthz").status_code == 200
            assert 'patchgym_connections_closed_total{reason="timed_out"} 3.0' in client.get("/metrics").text


def test_connection_cap_leaves_descriptors_for_the_sessions():
    assert connection_limit(1024, 32) == 1024 - 64 - 16 * 32 - 3 * 64
    assert connection_limit(1 << 20, 32) == 4096
    with pytest.raises(ValueError, match="raise the limit"):
        connection_limit(512, 32)


def test_log_throttle_shows_one_line_per_message_per_interval():
    throttle = LogThrottle(interval=0.2)

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    shown = [r for r in (record("socket.accept() out of system resource") for _ in range(1000)) if throttle.filter(r)]
    assert len(shown) == 1
    assert throttle.filter(record("Invalid HTTP request received."))  # another message has its own interval
    time.sleep(0.25)
    again = record("socket.accept() out of system resource")
    assert throttle.filter(again) and "999 more like this" in again.getMessage()
