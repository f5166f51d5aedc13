"""Many sandboxes started and closed at once on the Docker backend: every call to the engine has a
deadline and a bounded share of it, a storm of starts and closes ends with every sandbox made or
a clean error, nothing left on the engine, a process that exits at once and an engine that still
works, builds committing meanwhile included (issue 38)."""

from __future__ import annotations

import json
import os
import socketserver
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from patchgym.sandboxes.docker import client as client_module
from patchgym.sandboxes.docker.client import ENGINE_CONCURRENCY, EngineBusyError, engine_client


class _FakeEngine(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Just enough of the engine's HTTP API on a unix socket: ``/version``, container inspection
    (404 after a short pause, or never for the container ``hang``). Counts requests in flight."""

    daemon_threads = True

    def __init__(self, path: str) -> None:
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        super().__init__(path, _Handler)

    def handle_error(self, request, client_address) -> None:
        pass  # a caller gone at its deadline


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def address_string(self) -> str:
        return "unix"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        server: _FakeEngine = self.server  # type: ignore[assignment]
        with server.lock:
            server.in_flight += 1
            server.most_in_flight = max(server.most_in_flight, server.in_flight)
        if "/containers/hang/" in self.path:
            server.release.wait(30)
        elif not self.path.endswith("/version"):
            time.sleep(0.02)
        with server.lock:  # before the answer: its caller may send the next request once it has it
            server.in_flight -= 1
        if self.path.endswith("/version"):
            self._answer(200, {"ApiVersion": "1.41", "Version": "20.10.24"})
        else:
            self._answer(404, {"message": "No such container"})

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    engine = _FakeEngine(str(tmp_path / "docker.sock"))
    thread = threading.Thread(target=engine.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'docker.sock'}")
    yield engine
    engine.release.set()
    engine.shutdown()
    engine.server_close()


def test_many_threads_share_a_bounded_engine_connection(fake_engine):
    """64 threads inspecting 320 different containers: every call answered (404 here), never more
    than the bound in flight, one connection pool whatever the number of URLs (docker-py's own
    kept 25 pools keyed by URL and closed one still in use)."""
    import docker.errors

    client = engine_client(timeout=10)
    failures: list[BaseException] = []

    def inspect(worker: int) -> None:
        for n in range(5):
            try:
                client.api.inspect_container(f"c{worker}x{n}")
            except docker.errors.NotFound:
                pass
            except BaseException as exc:  # noqa: BLE001 - any other outcome is the failure
                failures.append(exc)

    threads = [threading.Thread(target=inspect, args=(w,)) for w in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures[:3]
    assert 1 <= fake_engine.most_in_flight <= ENGINE_CONCURRENCY


def test_an_engine_that_never_answers_fails_the_call_at_its_deadline(fake_engine):
    """A stuck engine: the call fails at its deadline; with every slot of this process held, the
    next call fails at its deadline too, saying so, instead of queueing forever."""
    client = engine_client(timeout=1)
    started = time.monotonic()
    with pytest.raises(requests.exceptions.Timeout):  # as docker-py lets it through
        client.api.inspect_container("hang")
    assert time.monotonic() - started < 5

    # every slot held (as by stuck calls of other threads): the next call waits its deadline, no more
    held = [client_module._slots.acquire(timeout=10) for _ in range(ENGINE_CONCURRENCY)]
    try:
        assert all(held)
        started = time.monotonic()
        with pytest.raises(EngineBusyError, match="did not take a request"):
            client.api.inspect_container("other")
        assert time.monotonic() - started < 5
    finally:
        for _ in filter(None, held):
            client_module._slots.release()


STORM = """
import json, sys, threading, time, uuid
from pathlib import Path
from patchgym.sandboxes.base import SandboxError
from patchgym.tasks.backends import make_sandbox
from patchgym.tasks.model import load_tasks

N, BUILDS = int(sys.argv[2]), int(sys.argv[3])
task = load_tasks(sys.argv[1])[0]
make_sandbox(task, "docker", pool_size=0).close()  # the image, resolved (built) once
stop = threading.Event()
built = []

def builder(j):
    from patchgym.sandboxes.docker.images import BuildContainer, _client, base_tag
    while not stop.is_set():
        with BuildContainer(base_tag(), Path(sys.argv[4]) / f"build-{j}.log", purpose="a storm test") as box:
            # a step that leaves a process behind, as a careless install step might
            box.run(["sh", "-c", "head -c 8000000 /dev/urandom >/root/blob; (sleep 60 &); true"], what="a step")
            tag = uuid.uuid4().hex[:12]
            box.commit("patchgym-test-storm", tag, kind="test-storm", changes=[])
        _client().images.remove(f"patchgym-test-storm:{tag}")
        built.append(tag)

builders = [threading.Thread(target=builder, args=(j,), daemon=True) for j in range(BUILDS)]
for b in builders:
    b.start()
boxes, outcomes = [None] * N, [None] * N
gate = threading.Barrier(N)

def start(i):
    gate.wait()
    try:
        boxes[i] = make_sandbox(task, "docker", pool_size=0)
        outcomes[i] = "ok" if boxes[i].exec("echo hi").output.strip() == "hi" else "wrong output"
    except SandboxError as exc:
        outcomes[i] = f"clean: {type(exc).__name__}: {exc}"[:300]
    except BaseException as exc:
        outcomes[i] = f"unclean: {type(exc).__name__}: {exc}"[:300]

def close(i):
    gate.wait()
    if boxes[i] is not None:
        boxes[i].close()

for step in (start, close):
    threads = [threading.Thread(target=step, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
stop.set()
for b in builders:
    b.join(300)
others = [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
print(json.dumps({"outcomes": outcomes, "builds": len(built), "non_daemon": others}), flush=True)
"""


def test_a_storm_of_starts_and_closes_leaves_nothing_and_the_engine_working(docker_base, calc_task, calc_tasks_file,
                                                                            tmp_path):
    """64 starts from 64 threads at once, a step each, then 64 closes at once, while a build commits
    images beside them (the storm alone is the same run without it: one run, to keep the suite short)."""
    builds = 1
    from patchgym.sandboxes.docker import DockerSandbox, docker_client
    from patchgym.sandboxes.docker.client import KIND_LABEL, OWNER_LABEL
    from patchgym.tasks.backends import sandbox_spec

    client = docker_client()
    proc = subprocess.Popen([sys.executable, "-c", STORM, str(calc_tasks_file), "64", str(builds), str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        line = proc.stdout.readline()
        reported = time.monotonic()
        proc.wait(timeout=60)
        exited_after = time.monotonic() - reported
    finally:
        proc.kill()
    stderr = proc.stderr.read()
    assert line, stderr[-3000:]
    result = json.loads(line)
    outcomes = result["outcomes"]
    assert all(o == "ok" or o.startswith("clean:") for o in outcomes), [o for o in outcomes if o != "ok"][:5]
    assert outcomes.count("ok") >= len(outcomes) // 2, [o for o in outcomes if o != "ok"][:5]
    assert result["non_daemon"] == [] and proc.returncode == 0, stderr[-3000:]
    assert exited_after < 10, f"the process took {exited_after:.1f}s to exit"
    assert result["builds"] >= 1, stderr[-3000:]

    owner = f"{OWNER_LABEL}={os.uname().nodename}:{proc.pid}"
    deadline = time.monotonic() + 60
    while (left := client.containers.list(all=True, sparse=True, filters={"label": owner})) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [(c.id[:12], c.attrs.get("State")) for c in left]
    assert not client.images.list(filters={"label": f"{KIND_LABEL}=test-storm"})

    sandbox = DockerSandbox(sandbox_spec(calc_task))  # the engine still starts a container
    try:
        assert sandbox.exec("echo alive").output.strip() == "alive"
    finally:
        sandbox.close()


def test_build_commits_do_not_pause_and_leave_no_build_process(docker_base, tmp_path):
    """A build's commit does not freeze the container (a pausing commit wedged Docker 20.10 on
    cgroup v1), and no process a step left behind runs into the image's snapshot."""
    from patchgym.sandboxes.docker.images import BuildContainer, _client, base_tag

    with BuildContainer(base_tag(), tmp_path / "build.log", purpose="a commit test") as box:
        box.run(["sh", "-c", "(sleep 300 &); true"], what="a step leaving a process")
        since = time.time()
        tag = box.commit("patchgym-test-storm", tmp_path.name[-12:].lower(), kind="test-storm", changes=[])
        # processes still running (killed ones stay as zombies: the tie's cat reaps nothing)
        left = box.run_capture(["sh", "-c", "ps -eo stat=,comm= | grep -v '^Z' | sort"])[1].split()
        events = list(_client().events(decode=True, since=since - 1, until=time.time() + 1,
                                       filters={"container": box.container.id}))
    try:
        assert events and not [e for e in events if e.get("Action") in ("pause", "unpause")], events
        assert "sleep" not in left and "cat" in left, left
    finally:
        _client().images.remove(tag)
