"""The ray backend on a two-node cluster (fixture ``cluster``): where
sandboxes land, grading, shipping repositories, and what happens when an actor, a driver or a node
dies. Runs only inside tests/test_ray_backend.py's loopback-only network namespace."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import ray

from patchgym.grading.verifier import Verifier
from patchgym.gym_envs.repo_env import RepoEnv
from patchgym.sandboxes import SandboxClosedError, SandboxError
from patchgym.sandboxes.ray_cluster import RaySandbox, RayUnavailableError
from patchgym.sandboxes.ray_cluster import sandbox as ray_sandbox
from patchgym.sandboxes.ray_cluster.channel import Channel
from patchgym.sandboxes.ray_cluster.host import shipped_dir
from patchgym.sandboxes.ray_cluster.pool import POOL
from patchgym.server.app import create_app
from patchgym.tasks.backends import make_sandbox, sandbox_factory, sandbox_spec
from patchgym.tasks.catalog import load_task_set
from tests.ray_cluster.helpers import SLOTS_PER_NODE, commands_of, interfaces, processes_with
from tests.serving import serve

ROOT = Path(__file__).resolve().parents[2]

NODE = {"num_cpus": 1, "resources": {"patchgym_sandbox": SLOTS_PER_NODE}, "node_ip_address": "127.0.0.1",
        "object_store_memory": 150 * 1024 * 1024}
_INTERFACES = interfaces()
# (No conftest.py here: tests/ has one, and other test modules import it by the name "conftest".)
pytestmark = pytest.mark.skipif(
    not os.environ.get("PATCHGYM_IN_NETNS") or _INTERFACES != ["lo"],
    reason=f"run through tests/test_ray_backend.py, in a namespace with only loopback (here: {_INTERFACES})")


@pytest.fixture(scope="module")
def cluster():
    """Two nodes on 127.0.0.1, each with SLOTS_PER_NODE sandbox slots."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    c.add_node(**NODE)
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="patchgym-tests", log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def task_set():
    return load_task_set()


@pytest.fixture()
def task(task_set):
    return task_set.get("patchgym__semverkit-1")



def wait_until(check, timeout: float, what) -> None:
    """Poll ``check``; fail after ``timeout`` with ``what`` (a text, or a callable made at failure)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what() if callable(what) else what}")
        time.sleep(0.2)


def gone(placement: dict) -> bool:
    """The sandbox's actor process and its directory on the node are both gone."""
    return not Path(f"/proc/{placement['pid']}").exists() and not Path(placement["sandbox_root"]).exists()


def node_ids(cluster) -> set[str]:
    return {n.node_id for n in cluster.list_all_nodes()}


def test_sandboxes_spread_over_both_nodes_and_go_with_close(cluster, task):
    sandboxes = [make_sandbox(task, "ray") for _ in range(4)]
    try:
        placements = [s.placement for s in sandboxes]
        assert {p["node_id"] for p in placements} == node_ids(cluster), placements
        assert all(p["backend"] == "ray/local" and p["warmup_seconds"] > 0 for p in placements)
        for node in node_ids(cluster):  # the first sandbox of this environment on each node says so
            flags = [p["first_on_node"] for p in placements if p["node_id"] == node]
            assert flags[0] and not any(flags[1:]), placements
        first, second = sandboxes[0], sandboxes[1]
        assert first.workdir == "/testbed"
        first.write_file("notes.txt", "only in the first")
        assert first.exec("cat notes.txt").output == "only in the first"
        assert second.exec("cat notes.txt").exit_code != 0  # workspaces are separate
        assert "notes.txt" in first.diff()
        first.reset()
        assert first.diff() == "" and first.exec("test -e notes.txt").exit_code == 1
        result = first.exec("sleep 5", timeout=1)
        assert result.timed_out and result.duration < 4
        with pytest.raises(FileNotFoundError):
            first.read_file("no/such/file")
    finally:
        for s in sandboxes:
            s.close()
    for p in placements:  # the sandbox goes with close; its host stays warm for the next one
        wait_until(lambda p=p: not Path(p["sandbox_root"]).exists(), 30, f"{p['sandbox_root']} removed by close")
    with pytest.raises(SandboxClosedError):
        sandboxes[0].exec("true")
    sandboxes[0].close()  # idempotent
    assert POOL.release_all() == 4
    for p in placements:
        wait_until(lambda p=p: gone(p), 30, f"actor {p['pid']} gone once released")


def test_a_warm_host_serves_the_next_sandbox_and_nothing_of_the_last(cluster, task):
    """A host whose sandbox closed cleanly hosts the next one: no new process, a pristine
    workspace, and the closed sandbox's late calls never reach its successor."""
    POOL.release_all()
    first = make_sandbox(task, "ray")
    first.write_file("left.txt", "from the first sandbox")
    first.exec("sleep 300.5 >/dev/null 2>&1 &")
    late = first._host, first._owner  # what a late call of the first sandbox would still carry
    first.close()
    second = make_sandbox(task, "ray")
    try:
        assert second.placement["host_reused"] and not first.placement["host_reused"]
        assert second.placement["pid"] == first.placement["pid"], "the same actor process"
        assert second.placement["start_seconds"] < first.placement["start_seconds"]
        assert second.exec("test -e left.txt").exit_code == 1 and second.diff() == ""
        assert not processes_with("300.5"), "what the first sandbox left running died with its close"
        host, owner = late
        ok, error = host.channel.request("call", (owner, "exec", "touch late.txt"), {}, 30)
        assert not ok and isinstance(error, SandboxClosedError)
        assert second.exec("test -e late.txt").exit_code == 1
    finally:
        second.close()
    cold = make_sandbox(task, "ray", keep_warm=0)  # no reuse asked: the host goes with the sandbox
    cold.close()
    wait_until(lambda: gone(cold.placement), 30, "a host not kept warm is killed with its sandbox")


def test_the_direct_channel_serves_only_the_driver(cluster, task):
    """Calls go to the host over a TCP connection of their own; nothing in a sandbox can reach its
    port, and a connection without the token runs nothing (tests/test_ray_backend.py has the rest)."""
    with make_sandbox(task, "ray") as s:
        host, port = s._host.channel.address
        assert host == s.placement["node_ip"]
        probe = f"python3 -c 'import socket; socket.create_connection((\"{host}\", {port}), timeout=3)'"
        assert s.exec(probe).exit_code != 0, "a sandbox has no network, not even to its host"
        with socket.create_connection((host, port), timeout=5) as intruder:
            intruder.sendall(b"patchgym-host/1\n" + b"\0" * 32)
            assert intruder.recv(16) == b"", "a wrong token is dropped at once"
        assert s.exec("true").ok


def test_gold_resolves_through_the_verifier_in_one_call_on_the_node(cluster, task_set, monkeypatch):
    calls = []
    request = Channel.request
    monkeypatch.setattr(Channel, "request", lambda self, name, args, *rest: calls.append(
        args[1] if name == "call" else name) or request(self, name, args, *rest))
    verifier = Verifier(sandbox_factory("ray"))
    task = task_set.get("patchgym__dotenvkit-1")
    report = verifier.verify(task, task.patch)
    assert report.resolved and report.reward == 1.0, report
    assert report.placement["node_id"] in node_ids(cluster)
    # the whole grading ran beside the sandbox: one call, not one per command and file
    assert calls == ["open", "run", "usage", "close"] or calls == ["run", "usage", "close"], calls
    cost = report.cost  # measured on the node: its harness, its tests, the sandbox's cgroups
    assert cost.test_cpu_seconds > 0 and cost.harness_cpu_seconds > 0 and cost.peak_memory_bytes > 0, cost
    assert "passed" in report.test_output
    assert not verifier.verify(task, "", run_empty=True).resolved


def test_without_a_direct_connection_every_call_goes_through_ray(cluster, task_set, monkeypatch):
    """Where the driver cannot reach a host's port (a Ray Client driver outside the cluster's
    network), the same calls, the whole grading included, go as Ray tasks."""
    monkeypatch.setattr(ray_sandbox, "_connect", lambda address, token: None)
    task = task_set.get("patchgym__semverkit-2")
    with make_sandbox(task, "ray", keep_warm=0) as s:
        assert s._host.channel is None and s.exec("echo hi").output == "hi\n"
    report = Verifier(sandbox_factory("ray", keep_warm=0)).verify(task, task.patch)
    assert report.resolved and not report.placement["host_reused"], report


def test_repository_shipped_to_the_node_and_hidden_from_commands(cluster, task):
    s = make_sandbox(task, "ray", ship="always")
    try:
        assert s.placement["repository"] == "shipped", s.placement
        history = s.exec("git log --format=%H").output.split()
        with make_sandbox(task, "ray") as by_path:  # the same history as from the driver's path: no later commit
            assert history[0] == task.base_commit and history == by_path.exec("git log --format=%H").output.split()
        kept = list(shipped_dir().glob("*.bundle"))
        assert kept, "the node keeps what it was sent"
        # kept among the node's mirrors, which commands cannot read (they hold the whole history)
        assert ".bundle" not in s.exec(f"ls -A {shipped_dir()} 2>&1").output
        assert s.exec(f"cat {kept[0]} >/dev/null").exit_code != 0
    finally:
        s.close()


def test_a_cluster_without_sandbox_capacity_is_a_clear_error_not_a_hang(cluster, task):
    start = time.monotonic()
    with pytest.raises(RayUnavailableError, match="patchgym_nowhere"):
        RaySandbox(sandbox_spec(task), resource="patchgym_nowhere")
    assert time.monotonic() - start < 10


def test_a_full_cluster_waits_then_fails_cleanly(cluster, task):
    with ThreadPoolExecutor(SLOTS_PER_NODE * 2) as pool:
        held = list(pool.map(lambda _: make_sandbox(task, "ray"), range(SLOTS_PER_NODE * 2)))
    try:
        start = time.monotonic()
        with pytest.raises(SandboxError, match="did not answer starting the sandbox"):
            make_sandbox(task, "ray", start_timeout=3)
        assert time.monotonic() - start < 15
    finally:
        for s in held:
            s.close()
    s = make_sandbox(task, "ray", start_timeout=60)  # the slots are free again
    s.close()


def test_a_killed_actor_is_an_infrastructure_failure_and_its_guard_cleans_up(cluster, task):
    s = make_sandbox(task, "ray")
    marker = "301.25"
    outcome = {}

    def run():
        start = time.monotonic()
        try:
            s.exec(f"sleep {marker}", timeout=600)
        except SandboxError as exc:
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: processes_with(marker), 20, "the command started")
    ray.kill(s._host.actor, no_restart=True)  # no close: the actor gets no chance to clean up
    thread.join(60)
    assert isinstance(outcome.get("error"), SandboxError) and outcome["seconds"] < 30, outcome
    with pytest.raises(SandboxError, match="lost"):  # every later call fails the same way
        s.exec("true")
    wait_until(lambda: gone(s.placement) and not processes_with(marker), 60,
               "the guard removed the sandbox and killed its command")
    s.close()


DRIVER = textwrap.dedent("""
    import json, sys, threading, time
    import ray
    ray.init(address=sys.argv[1], log_to_driver=False)
    from patchgym.tasks.backends import make_sandbox
    from patchgym.tasks.catalog import load_task_set
    task = load_task_set().get("patchgym__semverkit-1")
    boxes = [make_sandbox(task, "ray") for _ in range(2)]
    for box in boxes:
        threading.Thread(target=box.exec, args=("sleep 302.75",), kwargs={"timeout": 600}, daemon=True).start()
    print(json.dumps([b.placement for b in boxes]), flush=True)
    time.sleep(600)
""")


def test_a_killed_driver_takes_its_actors_and_sandboxes_with_it(cluster):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, cluster.address], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        placements = json.loads(driver.stdout.readline())
        wait_until(lambda: len(processes_with("302.75")) >= 2, 20, "both commands started")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    assert len(placements) == 2
    for p in placements:
        wait_until(lambda p=p: gone(p), 60, f"actor {p['pid']} and its sandbox gone after the driver's death")
    wait_until(lambda: not processes_with("302.75"), 30,
               lambda: f"the commands of the dead driver's sandboxes killed: {commands_of(processes_with('302.75'))}")


def test_repo_env_and_server_run_episodes_on_ray(cluster, task_set):
    task = task_set.get("patchgym__semverkit-2")
    env = RepoEnv(task_set, backend="ray")
    try:
        _, info = env.reset(options={"task_id": task.instance_id})
        assert info["placement"]["node_id"] in node_ids(cluster) and not info["infrastructure_failure"]
        env.sandbox.write_file("gold.diff", task.patch)
        env.step({"name": "bash", "arguments": {"command": "git apply gold.diff && rm gold.diff"}})
        _, reward, terminated, _, info = env.step({"name": "submit", "arguments": {}})
        assert terminated and reward == 1.0, info
    finally:
        env.close()
    app = create_app(tasks=None, backend="ray", max_sessions=2)
    with serve(app) as url, httpx.Client(base_url=url, timeout=120) as http:
        r = http.post("/v1/sessions", json={"task_id": task.instance_id})
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        r = http.post(f"/v1/sessions/{sid}/step", json={"action": {"name": "submit", "arguments": {}}}).json()
        assert r["terminated"] and r["reward"] == 0.0 and not r["info"].get("infrastructure_failure"), r
        assert http.delete(f"/v1/sessions/{sid}").status_code == 204


EVAL_IDS = [f"patchgym__{repo}-{n}" for repo in ("dotenvkit", "semverkit", "textable") for n in (1, 2)]


def test_eval_cli_resolves_bundled_tasks_with_sandboxes_on_both_nodes(cluster, task_set, tmp_path):
    """Two tasks of each bundled repository (all 18: bench/ray_backend.py and the closing note of
    issue 14, to keep the suite's time)."""
    out = tmp_path / "gold"
    proc = subprocess.run(
        [sys.executable, "-m", "patchgym.cli", "eval", "--backend", "ray", "--ray-address", cluster.address,
         "--predictions", "gold", "--workers", "4", "--output", str(out), "--instance-ids", ",".join(EVAL_IDS)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sandbox slot(s) on 2 node(s)" in proc.stderr
    summary = json.loads((out / "report.json").read_text())
    assert summary["resolved_instances"] == len(EVAL_IDS) == summary["total_instances"], summary
    nodes = {json.loads((out / i / "report.json").read_text())[i]["placement"]["node_id"] for i in EVAL_IDS}
    assert nodes == node_ids(cluster)


def test_eval_cli_refuses_an_unreachable_cluster_quickly():
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "patchgym.cli", "eval", "--backend", "ray", "--ray-address", "127.0.0.1:9",
         "--predictions", "gold", "--instance-ids", "patchgym__semverkit-1"],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and "cannot connect to Ray at 127.0.0.1:9" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 120


def test_a_node_killed_mid_episode_masks_the_episode_without_a_hang(cluster, task_set):
    """Last: it changes the cluster (a third node is added, then killed)."""
    victim = cluster.add_node(num_cpus=1, resources={"patchgym_sandbox": 1}, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    pin = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(victim.node_id, soft=False)
    env = RepoEnv(task_set, backend="ray", sandbox_options={"scheduling_strategy": pin})
    marker = "303.5"
    try:
        _, info = env.reset(options={"task_id": "patchgym__textable-1"})
        placement = info["placement"]
        assert placement["node_id"] == victim.node_id
        result = {}

        def step():
            start = time.monotonic()
            result["step"] = env.step({"name": "bash", "arguments": {"command": f"sleep {marker}"}})
            result["seconds"] = time.monotonic() - start

        thread = threading.Thread(target=step)
        thread.start()
        wait_until(lambda: processes_with(marker), 20, "the command started")
        cluster.remove_node(victim)
        thread.join(90)
        assert not thread.is_alive(), "the step hung after its node died"
        _, reward, terminated, truncated, info = result["step"]
        assert terminated and reward == 0.0 and info["infrastructure_failure"], info
        assert "lost" in info["infrastructure_failure_reason"] and result["seconds"] < 60, info
    finally:
        env.close()
    wait_until(lambda: gone(placement) and not processes_with(marker), 60,
               "what the dead node's sandbox left on this machine was removed")
