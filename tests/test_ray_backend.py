"""The ray backend: plain unit tests of its node side, and the cluster tests of tests/ray_cluster/
run in a network namespace that has only loopback (Ray's daemons listen on every interface).

The cluster tests are a pytest run of their own (``netns_*.py`` files, not collected here): a
two-node ``ray.cluster_utils.Cluster`` on 127.0.0.1 inside ``ip netns exec``. They need root and
iproute2; ``PATCHGYM_REQUIRE_RAY=1`` (set by CI) turns a skip for a missing requirement into a failure.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from patchgym.sandboxes import SandboxClosedError, SandboxError
from patchgym.sandboxes.ray_cluster import channel, host, pool
from tests.netns import Netns
from tests.ray_cluster.helpers import build_environments

ROOT = Path(__file__).resolve().parent.parent


def _missing() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'patchgym[ray]')"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux")):
        if not shutil.which(tool):
            return f"{package} ({tool}) is not installed"
    return None


def test_cluster_tests_in_a_loopback_only_namespace(tmp_path):
    missing = _missing()
    if missing:
        if os.environ.get("PATCHGYM_REQUIRE_RAY") == "1":
            pytest.fail(f"PATCHGYM_REQUIRE_RAY=1 but {missing}")
        pytest.skip(missing)
    # The namespace has no network: the bundled tasks' environments are built here first, into the
    # home the cluster's nodes then share with this session.
    home = os.environ["PATCHGYM_HOME"]
    build_environments()
    log = tmp_path / "cluster-tests.log"
    with Netns("pg-ray") as ns, log.open("w") as sink:
        env = {**os.environ, "PATCHGYM_IN_NETNS": ns.name, "PATCHGYM_TEST_HOME": home, "RAY_USAGE_STATS_ENABLED": "0"}
        try:
            code = subprocess.run(
                ns.enter([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "python_files=netns_*.py",
                         "--timeout", "240", "-rfE", str(ROOT / "tests" / "ray_cluster")]),
                cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=540).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        leftovers = ns.pids()
    output = log.read_text()
    print(output[-20000:])
    assert code == 0, f"the cluster tests failed ({code}):\n{output[-20000:]}"
    assert "passed" in output and " skipped" not in output, output[-3000:]
    assert not leftovers, f"processes were left in the namespace: {leftovers}"


# -- the node side, without a cluster -------------------------------------------------------


def test_an_exception_that_cannot_cross_to_the_driver_becomes_a_sandbox_error():
    class Unpicklable(Exception):
        def __init__(self, a, b):
            super().__init__(a)

    portable = host._portable(Unpicklable("x", "y"))
    assert isinstance(portable, SandboxError) and "Unpicklable" in str(portable)
    keep = FileNotFoundError(2, "gone")
    assert host._portable(keep) is keep


def test_a_node_asks_for_the_repository_when_it_lacks_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHGYM_HOME", str(tmp_path / "home"))
    h = host.SandboxHost.__new__(host.SandboxHost)  # no guard: only the shipping logic is exercised
    missing = str(tmp_path / "not-here.bundle")
    assert h._repository(missing, "auto", None, None) is None  # ask the driver
    assert h._repository("https://example.invalid/r.git", "auto", None, None) == "https://example.invalid/r.git"
    present = tmp_path / "r.bundle"
    present.write_bytes(b"bundle bytes")
    assert h._repository(str(present), "auto", None, None) == str(present)
    assert h._repository(str(present), "always", None, None) is None  # ship even though it exists
    data = b"the driver's bundle"
    digest = hashlib.sha256(data).hexdigest()
    assert h._repository(missing, "auto", digest, None) is None  # not kept yet: send the bytes
    kept = h._repository(missing, "auto", digest, data)
    assert Path(kept).read_bytes() == data and Path(kept).parent == host.shipped_dir()
    assert h._repository(missing, "auto", digest, None) == kept  # kept by digest: not sent again
    with pytest.raises(SandboxError, match="corrupt"):
        h._repository(missing, "auto", hashlib.sha256(b"other").hexdigest(), data)


# -- the direct channel from the driver to a host --------------------------------------------


class Explodes:
    """A pickle that, once loaded, writes a file: what an intruder would send to the host's port."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (self.path, "ran"))


@pytest.fixture()
def server():
    calls = []

    def handle(name, args, kwargs):
        calls.append(name)
        if name == "sleep":
            time.sleep(args[0])
        if name == "unpicklable":
            return True, threading.Lock()
        return True, (name, args, kwargs)

    token = secrets.token_bytes(channel.TOKEN_BYTES)
    s = channel.ChannelServer("127.0.0.1", token, handle)
    yield s, token, calls
    s.close()


def frame(obj) -> bytes:
    data = pickle.dumps(obj)
    return len(data).to_bytes(8, "big") + data


def test_a_connection_without_the_token_runs_nothing(server, tmp_path):
    s, token, calls = server
    target = tmp_path / "pwned"
    for hello in (b"", channel.HELLO + b"\0" * channel.TOKEN_BYTES, channel.HELLO + token[:-1] + b"x",
                  b"x" * (len(channel.HELLO) + channel.TOKEN_BYTES)):
        with socket.create_connection(s.address, timeout=5) as intruder:
            intruder.sendall(hello + frame(("call", (Explodes(target),), {})))
            intruder.settimeout(5)
            try:
                answer = intruder.recv(64)
            except ConnectionResetError:  # dropped with what it sent still unread
                answer = b""
            assert answer == b"", f"answered to {hello!r}"
    assert not target.exists() and calls == []
    with pytest.raises(ConnectionError):  # the driver's own end says so too
        channel.Channel(s.address, secrets.token_bytes(channel.TOKEN_BYTES))


def test_the_driver_calls_the_host_and_a_slow_call_blocks_no_other(server):
    s, token, calls = server
    c = channel.Channel(s.address, token)
    assert c.request("open", ("a", b"\0" * 100_000), {"k": 1}, 5) == (True, ("open", ("a", b"\0" * 100_000), {"k": 1}))
    slow = threading.Thread(target=c.request, args=("sleep", (1.5,), {}, 10))
    slow.start()
    time.sleep(0.2)
    started = time.monotonic()
    assert c.request("call", (), {}, 5)[0] and time.monotonic() - started < 1, "it waited for the slow call"
    slow.join()
    ok, error = c.request("unpicklable", (), {}, 5)  # an answer that cannot cross says so
    assert not ok and isinstance(error, SandboxError)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        c.request("sleep", (3,), {}, 0.3)
    assert time.monotonic() - started < 1.5
    assert c.request("call", (), {}, 5)[0], "a timed-out connection is dropped, not reused mid-frame"
    c.close()
    with pytest.raises(ConnectionError):
        c.request("call", (), {}, 5)


# -- a host: one sandbox at a time, calls only for the sandbox it holds ----------------------


class FakeSandbox:
    def __init__(self) -> None:
        self.closed = False

    def exec(self, command, **kwargs):
        return f"ran {command}"

    def close(self) -> None:
        self.closed = True


def bare_host(sandbox=None, owner=None) -> host.SandboxHost:
    h = host.SandboxHost.__new__(host.SandboxHost)  # no guard process, no channel
    h.sandbox, h.owner, h.repository, h._lock, h.channel = sandbox, owner, "", threading.Lock(), None
    return h


def test_a_host_serves_only_the_sandbox_it_holds_now():
    sandbox = FakeSandbox()
    h = bare_host(sandbox, "mine")
    assert h.call("mine", "exec", "true") == (True, "ran true")
    ok, error = h.call("a closed one", "exec", "rm -rf /testbed")
    assert not ok and isinstance(error, SandboxClosedError)
    assert h.run("mine", lambda sb, x: (sb is sandbox, x), (1,), {}) == (True, (True, 1))
    assert not h.run("a closed one", lambda sb: sb, (), {})[0]
    assert h.dispatch("__init__", (), {})[0] is False  # a channel asks for nothing but the calls
    ok, error = h.open("next", "local", None, None, {})
    assert not ok and "still holds another sandbox" in str(error)
    assert h.close("a closed one") == (True, None) and not sandbox.closed
    assert h.close("mine") == (True, None) and sandbox.closed and h.sandbox is None
    assert not h.call("mine", "exec", "true")[0]


def test_the_ray_options_name_the_cluster_joined_for_processes_started_later(monkeypatch):
    """serve's grading workers are processes of their own: given no address, each looked for a
    cluster itself and failed ("resources must not be provided") or could join another one."""
    import patchgym.sandboxes.ray_cluster as ray_cluster
    from patchgym.cli.common import backend_options

    fake = types.SimpleNamespace(get_runtime_context=lambda: types.SimpleNamespace(gcs_address="127.0.0.1:6379"))
    monkeypatch.setattr(ray_cluster, "ensure_connected", lambda address=None: fake)
    monkeypatch.setattr(ray_cluster, "require_capacity", lambda: (4.0, 2))
    assert backend_options("ray")["address"] == "127.0.0.1:6379"  # a private cluster this process started
    assert backend_options("ray", ray_address="127.0.0.1:6379")["address"] == "127.0.0.1:6379"
    assert backend_options("ray", ray_address="ray://head:10001")["address"] == "ray://head:10001"


# -- the driver's warm hosts ---------------------------------------------------------------------


class FakeRay:
    def __init__(self) -> None:
        self.job, self.killed, self.initialized = "job-1", [], True

    def is_initialized(self) -> bool:
        return self.initialized

    def get_runtime_context(self):
        return types.SimpleNamespace(get_job_id=lambda: self.job)

    def kill(self, actor, no_restart=True) -> None:
        self.killed.append(actor)


def in_use(p: pool.HostPool, ray: FakeRay, name: str, node: str, key=("r", 0.0, "SPREAD")) -> pool.Host:
    h = pool.Host(actor=name, key=key, session=ray.job, node_id=node)
    p.started(h)
    return h


def test_warm_hosts_spread_expire_and_give_way():
    ray, p = FakeRay(), pool.HostPool()
    spread = ("r", 0.0, "SPREAD")
    a1, a2, b1 = (in_use(p, ray, name, node) for name, node in (("a1", "a"), ("a2", "a"), ("b1", "b")))
    p.give_back(ray, a1, keep_warm=30)
    p.give_back(ray, b1, keep_warm=30)
    assert p.take(ray, spread) is b1, "node b has fewer sandboxes of this driver in use"
    assert p.take(ray, ("r", 0.0, "DEFAULT")) is None, "other options never share a host"
    p.give_back(ray, b1, keep_warm=0.3)
    time.sleep(0.8)
    assert ray.killed == ["b1"] and p.idle_count() == 1, "an idle host is killed after keep_warm"
    p.make_room(ray, ("r", 1.0, "SPREAD"))  # a host of other options starts: a1 may hold its slot
    assert ray.killed == ["b1", "a1"] and p.idle_count() == 0
    p.give_back(ray, a2, keep_warm=30)
    ray.job = "job-2"  # ray.shutdown() and ray.init(): the old hosts died with the old connection
    assert p.take(ray, spread) is None and p.idle_count() == 0
    lost = in_use(p, ray, "lost", "a")
    p.discard(ray, lost)
    assert ray.killed[-1] == "lost"
    p.give_back(ray, in_use(p, ray, "late", "a"), keep_warm=0.2)
    ray.initialized = False  # ray.shutdown(): a call to Ray now would start a new cluster (ray.init())
    time.sleep(0.6)
    assert ray.killed[-1] == "lost" and p.idle_count() == 0
    assert pool.pool_key("r", 0, "SPREAD") == spread and pool.pool_key("r", 0, object()) is None
