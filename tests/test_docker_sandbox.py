"""What only the Docker backend has: labels, a lifetime the container enforces, a container that
ends with its client, the command server as pid 1, the warm pool, gc."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

import patchgym.gym_envs  # noqa: F401
from patchgym.sandboxes.base import ResourceLimits, SandboxError
from patchgym.sandboxes.docker.client import owner_id
from patchgym.tasks.backends import sandbox_spec


@pytest.fixture(scope="module")
def docker(docker_base):
    from patchgym.sandboxes.docker import docker_client

    return docker_client()


def test_container_has_limits_labels_and_no_network(docker, calc_task):
    from patchgym.sandboxes.docker import DockerSandbox

    sb = DockerSandbox(sandbox_spec(calc_task), limits=ResourceLimits(memory_bytes=512 << 20, max_processes=64))
    try:
        attrs = docker.api.inspect_container(sb.container.id)
        host = attrs["HostConfig"]
        assert host["Memory"] == 512 << 20 and host["PidsLimit"] == 64 and host["NetworkMode"] == "none"
        assert attrs["Config"]["Labels"]["org.patchgym.kind"] == "sandbox"
        assert attrs["Config"]["Labels"]["org.patchgym.owner"].endswith(f":{__import__('os').getpid()}")
        bomb = sb.exec("for i in $(seq 100); do sleep 5 & done 2>&1 | tail -1; true", timeout=30)
        # the pids limit holds, and a command kept at it is ended by the watchdog within seconds
        assert "[patchgym: command killed: process limit (64) reached]" in bomb.output, bomb.output
        assert bomb.exit_code != 0 and not bomb.timed_out and bomb.duration < 10
        assert sb.exec("echo alive").output.strip() == "alive"
    finally:
        sb.close()


def test_lifetime_is_enforced_by_the_container_itself(docker, calc_task):
    from patchgym.sandboxes.docker import DockerSandbox

    sb = DockerSandbox(sandbox_spec(calc_task), lifetime=3)
    cid = sb.container.id
    try:  # the client stays connected: only the lifetime ends the container
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and docker.containers.list(all=True, ignore_removed=True, filters={"id": cid}):
            time.sleep(0.5)
        assert not docker.containers.list(all=True, ignore_removed=True, filters={"id": cid})
        with pytest.raises(SandboxError):
            sb.exec("true")
    finally:
        sb.close()


def test_a_killed_client_takes_its_containers_with_it(docker, calc_tasks_file):
    """The owner dies without close() (SIGKILL): its sandbox and its pool's waiting container end
    with its streams, and the engine removes them; nothing waits for gc or the lifetime."""
    script = ("import os, sys, time\n"
              f"sys.path[:0] = [{str(Path(__file__).parents[1])!r}]\n"
              "from patchgym.tasks.backends import make_sandbox\n"
              "from patchgym.tasks.model import load_tasks\n"
              f"task = load_tasks({str(calc_tasks_file)!r})[0]\n"
              "make_sandbox(task, 'docker', pool_size=1).close()\n"
              "sb = make_sandbox(task, 'docker', pool_size=1)\n"  # a task seen twice is kept warm
              "from patchgym.sandboxes.docker import shared_pool\n"
              "pool = shared_pool(1)\n"
              "while not pool.waiting(): time.sleep(0.05)\n"  # the next sandbox, started ahead
              "print(os.getpid(), sb.container.id, *(i[0].id for q in pool._ready.values() for i in q), flush=True)\n"
              "os.kill(os.getpid(), 9)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-3000:]
    pid, *ids = proc.stdout.split()
    assert len(ids) == 2
    owner = f"{owner_id().split(':')[0]}:{pid}"
    deadline = time.monotonic() + 20
    left = None
    while time.monotonic() < deadline:
        left = docker.containers.list(all=True, ignore_removed=True, filters={"label": f"org.patchgym.owner={owner}"})
        if not left:
            break
        time.sleep(0.2)
    assert not left, [c.status for c in left]
    assert not any(docker.containers.list(all=True, ignore_removed=True, filters={"id": cid}) for cid in ids)


def test_warm_pool_hands_out_started_containers(docker, calc_task):
    from patchgym.sandboxes.docker import DockerSandbox, WarmPool

    spec = sandbox_spec(calc_task)
    first = DockerSandbox(spec)  # resolves (and builds) the image
    first.close()
    pool = WarmPool(size=1)
    try:
        pool.prefill(first.image, ResourceLimits())
        start = time.monotonic()
        sb = DockerSandbox(spec, pool=pool)
        acquired = time.monotonic() - start
        assert sb.exec("git status --short").output == ""
        assert acquired < 0.1, acquired
        sb.write_file("dirty.txt", "x")
        sb.close()
        deadline = time.monotonic() + 30
        while not pool.waiting() and time.monotonic() < deadline:
            time.sleep(0.2)
        again = DockerSandbox(spec, pool=pool)
        assert again.exec("ls dirty.txt").exit_code != 0, "a pooled container must be fresh"
        again.close()
    finally:
        pool.close()


def test_warm_pool_lets_go_of_what_nobody_takes_and_skips_dead_containers(docker, calc_task):
    from patchgym.sandboxes.docker import DockerSandbox, WarmPool

    spec = sandbox_spec(calc_task)
    first = DockerSandbox(spec)
    first.close()
    other = ResourceLimits(max_processes=100)
    pool = WarmPool(size=1, idle=2.0, max_waiting=1)
    try:
        pool.prefill(first.image, ResourceLimits())
        pool.prefill(first.image, other)  # max_waiting: the longest waiting is let go for it
        assert [key[1] for key in pool._ready if pool._ready[key]] == [other]
        dead = _pool_containers(pool)[0]
        docker.containers.get(dead).kill()  # a waiting container whose server died
        sb = DockerSandbox(spec, limits=other, pool=pool)  # is skipped: a live one is started instead
        assert sb.container.id != dead and sb.exec("echo ok").output.strip() == "ok"
        sb.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not pool.waiting():
            time.sleep(0.1)
        refilled = _pool_containers(pool)
        assert len(refilled) == 1
        deadline = time.monotonic() + 30  # nobody takes it within idle: let go, removed by the engine
        while time.monotonic() < deadline and docker.containers.list(all=True, ignore_removed=True, filters={"id": refilled[0]}):
            time.sleep(0.2)
        assert pool.waiting() == 0 and not docker.containers.list(all=True, ignore_removed=True, filters={"id": refilled[0]})
    finally:
        pool.close()


def test_make_sandbox_uses_the_shared_pool_unless_turned_off(docker, calc_task, monkeypatch):
    import patchgym.sandboxes.docker.pool as pools
    from patchgym.tasks.backends import make_sandbox

    monkeypatch.setattr(pools, "_pools", {})
    monkeypatch.setenv("PATCHGYM_DOCKER_POOL", "0")
    sb = make_sandbox(calc_task, "docker")
    sb.close()
    assert pools._pools == {}
    monkeypatch.delenv("PATCHGYM_DOCKER_POOL")
    make_sandbox(calc_task, "docker").close()
    pool = pools._pools[1]
    assert pool.waiting() == 0  # a task seen once: no container started ahead for it
    sb = make_sandbox(calc_task, "docker")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not pool.waiting():
            time.sleep(0.2)
        assert pool.waiting() == 1  # seen twice: the next sandbox of this task is already started
        assert make_sandbox(calc_task, "docker", pool_size=0).close() is None and pools._pools.keys() == {1}
    finally:
        sb.close()
        pools._pools[1].close()


def _pool_containers(pool) -> list[str]:
    return [item[0].id for queue in pool._ready.values() for item in queue]


def test_gc_removes_only_patchgym_containers_of_dead_owners(docker, docker_base):
    from patchgym.sandboxes.docker import gc_containers
    from patchgym.sandboxes.docker.client import owner_id

    host = owner_id().split(":")[0]
    common = {"detach": True, "command": ["sleep", "300"]}
    dead = docker.containers.run(docker_base, labels={"org.patchgym.managed": "1", "org.patchgym.kind": "sandbox",
                                                      "org.patchgym.owner": f"{host}:999999"}, **common)
    alive = docker.containers.run(docker_base, labels={"org.patchgym.managed": "1", "org.patchgym.kind": "sandbox",
                                                       "org.patchgym.owner": owner_id()}, **common)
    foreign = docker.containers.run(docker_base, **common)  # inherits the image's labels, but is not ours
    try:
        removed = gc_containers()
        assert dead.id[:12] in removed
        assert alive.id[:12] not in removed and foreign.id[:12] not in removed
        assert docker.containers.get(alive.id) and docker.containers.get(foreign.id)
    finally:
        for c in (dead, alive, foreign):
            try:
                c.remove(force=True)
            except Exception:
                pass


def test_repo_env_on_docker_resolves_the_gold_fix(docker, calc_tasks_file, calc_task):
    import shlex

    env = gym.make("patchgym/RepoEnv-v0", tasks=str(calc_tasks_file), backend="docker")
    try:
        obs, info = env.reset()
        assert info["workdir"] == "/testbed"
        env.step({"name": "bash", "arguments": {"command": f"printf %s {shlex.quote(calc_task.patch)} | git apply"}})
        out, *_ = env.step({"name": "str_replace_editor", "arguments": {"command": "view", "path": "/testbed/calc"}})
        assert "__init__.py" in out
        _, reward, term, _, info = env.step({"name": "submit", "arguments": {}})
        assert term and reward == 1.0 and info["resolved"]
    finally:
        env.close()


def test_commands_cannot_reach_the_command_server_or_its_pristine_copy(docker, calc_task):
    from patchgym.sandboxes.docker import DockerSandbox

    sb = DockerSandbox(sandbox_spec(calc_task))
    try:
        assert sb.exec("id -u").output.strip() == "1000"
        # the server is pid 1 (a static binary on a read-only, root-only mount): commands cannot
        # list, read or change its files, signal it, or write the pristine tree they borrow from
        attacks = sb.exec("ls /opt/patchgym 2>&1; cat /opt/patchgym/pgserver 2>&1 | head -c 0; "
                          "echo x > /opt/patchgym/pgserver 2>&1; kill -9 1 2>&1; kill -STOP 1 2>&1; "
                          "touch /var/lib/patchgym/testbed/x 2>&1; ls /var/lib/patchgym 2>&1; "
                          "touch /usr/lib/x 2>&1; echo done").output
        assert "Permission denied" in attacks and "Operation not permitted" in attacks, attacks
        assert attacks.rstrip().endswith("done")
        assert sb.exec("echo alive").output.strip() == "alive"
        sb.write_file("calc/new.py", "X = 1\n")
        assert sb.exec("echo more >> calc/new.py && rm calc/new.py && echo ok").output.strip() == "ok"
        # the repository's history is borrowed from the image (git alternates), read-only
        objects = sb.exec("cat .git/objects/info/alternates; touch $(cat .git/objects/info/alternates)/x 2>&1").output
        assert "/var/lib/patchgym/testbed/.git/objects" in objects and "Permission denied" in objects
        base = sb.exec("git rev-parse HEAD").output
        sb.exec("rm -rf calc; git commit -qam gone")
        assert "gone" in sb.exec("git log --oneline -1").output
        sb.reset()
        assert sb.diff() == "" and sb.exec("touch calc/z && echo writable").output.strip() == "writable"
        assert sb.exec("git fsck && git rev-parse HEAD").output == base
    finally:
        sb.close()


def test_nothing_a_command_starts_survives_it(docker, calc_task):
    """Not a process that closed its output first (no pipe left to wait on), nor a zombie: when a
    command ends, its server (pid 1) is the only process left in the container."""
    from patchgym.sandboxes.docker import DockerSandbox

    sb = DockerSandbox(sandbox_spec(calc_task))
    try:
        quiet = sb.exec("exec >/dev/null 2>&1; sleep 300 & sleep 300 & true", timeout=20)
        assert quiet.exit_code == 0 and not quiet.timed_out and quiet.duration < 5
        sb.exec("(sleep 0.1 &) ; exit 7")
        ps = sb.exec("ps -eo pid=,stat=,args=").output.splitlines()
        assert [line.split()[0] for line in ps] == ["1", ps[1].split()[0]], ps  # the server and ps itself
        assert "pgserver" in ps[0] and not any("Z" in line.split()[1] for line in ps), ps
    finally:
        sb.close()


def test_exec_reports_cpu_and_the_sandbox_its_usage(docker, calc_task):
    from patchgym.sandboxes.docker import DockerSandbox

    sb = DockerSandbox(sandbox_spec(calc_task))
    try:
        busy = sb.exec("python -c 'import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass' "
                       "& wait")
        assert busy.exit_code == 0 and 0.25 <= busy.cpu_seconds <= busy.duration + 0.1, busy
        assert sb.exec("true").cpu_seconds < 0.25
        usage = sb.usage()
        assert usage.cpu_seconds >= 0.25 and usage.peak_memory_bytes > 1 << 20, usage
    finally:
        sb.close()


def test_grading_commands_use_no_warm_pool_unless_asked(monkeypatch):
    """eval, tasks validate and the like grade each image about once: a container started ahead
    is wasted and competes with the tests (bench/docker_pool.py); PATCHGYM_DOCKER_POOL asks for one."""
    import patchgym.tasks.backends as task_backends
    from patchgym.cli import common

    seen = []
    monkeypatch.setattr(task_backends, "sandbox_factory", lambda backend, **options: seen.append(options) or print)
    monkeypatch.setattr(common, "reap", lambda **_: {})
    monkeypatch.delenv("PATCHGYM_DOCKER_POOL", raising=False)
    common.make_verifier("docker", "auto")
    common.make_verifier("local", "auto")
    monkeypatch.setenv("PATCHGYM_DOCKER_POOL", "2")
    common.make_verifier("docker", "auto")
    assert seen == [{"pool_size": 0}, {"isolation": "auto"}, {}]
