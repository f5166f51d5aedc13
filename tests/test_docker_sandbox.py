"""What only the Docker backend has: labels, a lifetime the container enforces, the warm pool, gc."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest

import gym_envs  # noqa: F401
from sandboxes.limits import ResourceLimits
from tasks.backends import sandbox_spec


@pytest.fixture(scope="module")
def docker(docker_base):
    from sandboxes.docker import docker_client

    return docker_client()


def test_container_has_limits_labels_and_no_network(docker, calc_task):
    from sandboxes.docker import DockerSandbox

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
    from sandboxes.docker import DockerSandbox

    sb = DockerSandbox(sandbox_spec(calc_task), lifetime=3)
    cid = sb.container.id
    sb._conn.close()  # the client "dies": nobody will call close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and docker.containers.list(all=True, filters={"id": cid}):
        time.sleep(0.5)
    assert not docker.containers.list(all=True, filters={"id": cid})


def test_warm_pool_hands_out_started_containers(docker, calc_task):
    from sandboxes.docker import DockerSandbox, WarmPool

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
        while not pool._ready.get((first.image, ResourceLimits(), False)) and time.monotonic() < deadline:
            time.sleep(0.2)
        again = DockerSandbox(spec, pool=pool)
        assert again.exec("ls dirty.txt").exit_code != 0, "a pooled container must be fresh"
        again.close()
    finally:
        pool.close()


def test_gc_removes_only_patchgym_containers_of_dead_owners(docker, docker_base):
    from sandboxes.docker import gc_containers
    from sandboxes.docker.client import owner_id

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
    from sandboxes.docker import DockerSandbox

    sb = DockerSandbox(sandbox_spec(calc_task))
    try:
        assert sb.exec("id -u").output.strip() == "1000"
        attacks = sb.exec("ls /opt/patchgym 2>&1; echo x > /opt/patchgym/agent.py 2>&1; "
                          "for p in $(pgrep python3); do kill -9 $p; done 2>&1; "
                          "touch /usr/lib/x 2>&1; echo done").output
        assert "Permission denied" in attacks and attacks.rstrip().endswith("done")
        sb.write_file("calc/new.py", "X = 1\n")
        assert sb.exec("echo more >> calc/new.py && rm calc/new.py && echo ok").output.strip() == "ok"
        sb.exec("rm -rf calc; git commit -qam gone")
        sb.reset()
        assert sb.diff() == "" and sb.exec("touch calc/z && echo writable").output.strip() == "writable"
    finally:
        sb.close()
