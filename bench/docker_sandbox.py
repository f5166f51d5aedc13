"""Docker backend beside mini-swe-agent's DockerEnvironment on the same instance image, in one run.

* ``idle_memory`` — what an idle sandbox costs the host, all told, per sandbox, with ``--idle`` of
  them started at once and left idle: the container's memory cgroup (``memory.usage_in_bytes``:
  its processes, its tmpfs files, the kernel memory charged to it), its containerd-shim's private
  memory (USS: the pages no other process shares; the shim's code is shared by all shims), and the
  growth of the engine (dockerd + containerd) and of the client process (USS), divided by the
  number of sandboxes. The same for mini-swe-agent's containers (its client: the process holding
  the ``DockerEnvironment`` objects). File pages shared with other containers (the image's, the
  command server's binary) are charged to whichever cgroup read them first, so they count once,
  not per sandbox; the kernel's network objects of mini-swe-agent's bridged containers (veth pair,
  netfilter state) are charged to no container and are not counted.
* ``start_cold`` / ``minisweagent_start`` — a new ``DockerSandbox`` until it can run a command
  (container create + attach + start, the server filling /testbed), beside mini-swe-agent's
  ``DockerEnvironment(...)`` (``docker run -d``), alternating; ``close()`` is not counted;
  ``start_pool`` — a new ``DockerSandbox`` from a warm pool (containers pre-started).
* ``exec_true`` / ``minisweagent_exec_true`` — ``exec("true")`` (one request to the command server)
  beside mini-swe-agent's ``execute`` of ``true`` (one ``docker exec`` CLI process), round-robin.

mini-swe-agent runs in its own interpreter (``--mswea-python``, e.g. a venv with
``pip install mini-swe-agent``; it is not a dependency of patchgym), driven over a pipe; its timings
are taken inside that process, around its own calls. Needs a Docker engine, root (to read the
engine's processes) and the task's instance image (built on first use).

    python bench/docker_sandbox.py --mswea-python $MSWEA_VENV/bin/python \\
        [--task ID [--tasks FILE]] [--repeat 200] [--starts 10] [--idle 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_sandbox import print_results, summary  # noqa: E402  (also puts the repository on sys.path)
from procmem import _rollup, cgroup_memory, engine_uss, shim_of, uss  # noqa: E402

from patchgym import load_task_set  # noqa: E402
from patchgym.sandboxes.base import ResourceLimits  # noqa: E402
from patchgym.sandboxes.docker import DockerSandbox, WarmPool  # noqa: E402
from patchgym.tasks.backends import sandbox_spec  # noqa: E402

# mini-swe-agent's side, run by --mswea-python: one JSON request per line, one JSON answer per line.
PEER = r"""
import json, os, subprocess, sys, tempfile, time
answers = os.fdopen(os.dup(1), "w")  # whatever mini-swe-agent prints goes to stderr
os.dup2(2, 1)
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="pg-bench-mswea-"))
import logging
from minisweagent.environments.docker import DockerEnvironment
logging.disable(logging.INFO)
image, envs = sys.argv[1], {}
print(json.dumps({"ready": True}), file=answers, flush=True)
for line in sys.stdin:
    request = json.loads(line)
    op, start = request["op"], time.perf_counter()
    if op == "start":
        env = DockerEnvironment(image=image, cwd="/testbed")
        envs[env.container_id] = env
        answer = {"id": env.container_id}
    elif op == "exec":
        envs[request["id"]].execute({"command": "true"})
        answer = {}
    elif op == "remove":
        env = envs.pop(request["id"])
        subprocess.run(["docker", "rm", "-f", env.container_id], capture_output=True)
        env.container_id = None
        answer = {}
    answer["seconds"] = time.perf_counter() - start
    print(json.dumps(answer), file=answers, flush=True)
for env in envs.values():  # the bench ended early: nothing left running
    subprocess.run(["docker", "rm", "-f", env.container_id], capture_output=True)
    env.container_id = None
"""


class Peer:
    """mini-swe-agent's DockerEnvironment, in its own interpreter."""

    def __init__(self, python: str, image: str) -> None:
        self.proc = subprocess.Popen([python, "-c", PEER, image], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        if not json.loads(self.proc.stdout.readline() or "{}").get("ready"):
            raise RuntimeError(f"mini-swe-agent did not start under {python}")

    def call(self, op: str, **args) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ---------------------------------------------------------------------------------------------
# memory


def idle_memory(container_ids: list[str], engine_before: int, client_pid: int, client_before: int) -> dict:
    """Per-sandbox memory of ``container_ids`` (all idle now), in MiB."""
    n = len(container_ids)
    cgroups = [cgroup_memory(c) for c in container_ids]
    shims = [shim_of(c) for c in container_ids]
    shim_uss = [uss(p) for p in shims]
    shim_pss = [_rollup(p)["Pss"] for p in shims]
    engine = (engine_uss() - engine_before) / n
    client = (uss(client_pid) - client_before) / n
    mib = 1 << 20
    per = statistics.median(cgroups) + statistics.median(shim_uss) + engine + client
    return {"total_mib": round(per / mib, 2), "container_cgroup_mib": round(statistics.median(cgroups) / mib, 2),
            "shim_uss_mib": round(statistics.median(shim_uss) / mib, 2),
            "shim_pss_mib": round(statistics.median(shim_pss) / mib, 2),
            "engine_mib": round(engine / mib, 2), "client_mib": round(client / mib, 2), "n": n}


def settle() -> None:
    time.sleep(3.0)


def measure_idle(spec, image: str, peer: Peer | None, count: int) -> dict:
    results = {}
    settle()
    engine_before, client_before = engine_uss(), uss(os.getpid())
    sandboxes = [DockerSandbox(spec) for _ in range(count)]
    settle()
    results["idle_memory"] = idle_memory([sb.container.id for sb in sandboxes], engine_before, os.getpid(),
                                         client_before)
    server = sandboxes[0].exec("grep -E 'VmRSS|RssAnon' /proc/1/status").output.split()
    results["idle_server_rss_kib"] = {"rss": int(server[1]), "anon": int(server[4])}
    testbed = sandboxes[0].exec("df -B1 --output=used /testbed | tail -1").output
    results["idle_testbed_tmpfs_mib"] = round(int(testbed) / (1 << 20), 2)
    for sb in sandboxes:
        sb.close()
    if peer is not None:
        settle()
        engine_before, client_before = engine_uss(), uss(peer.proc.pid)
        ids = [peer.call("start")["id"] for _ in range(count)]
        settle()
        results["minisweagent_idle_memory"] = idle_memory(ids, engine_before, peer.proc.pid, client_before)
        for container_id in ids:
            peer.call("remove", id=container_id)
    return results


# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="patchgym__semverkit-1")
    parser.add_argument("--tasks", type=Path, help="the task file --task is in (default: the bundled catalog)")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--idle", type=int, default=10, help="sandboxes held idle at once for the memory figure")
    parser.add_argument("--mswea-python", default=os.environ.get("MSWEA_PYTHON", sys.executable),
                        help="an interpreter with mini-swe-agent installed (default: $MSWEA_PYTHON, else this one)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    spec = sandbox_spec(load_task_set(args.tasks).get(args.task))
    sandbox = DockerSandbox(spec)  # builds the images and the runtime if needed
    results: dict[str, object] = {"task": args.task, "image": sandbox.image}
    try:
        peer = Peer(args.mswea_python, sandbox.image)
    except Exception as exc:
        print(f"skipping mini-swe-agent columns: {exc}", file=sys.stderr)
        peer = None

    # exec, round-robin
    peer_id = peer.call("start")["id"] if peer else None
    samples: dict[str, list[float]] = {"exec_true": [], "minisweagent_exec_true": []}
    for round_ in range(args.repeat + 10):
        order = ["ours", "peer"] if round_ % 2 == 0 else ["peer", "ours"]
        for who in order:
            if who == "ours":
                begin = time.perf_counter()
                sandbox.exec("true")
                elapsed = time.perf_counter() - begin
                name = "exec_true"
            elif peer is not None:
                elapsed, name = peer.call("exec", id=peer_id)["seconds"], "minisweagent_exec_true"
            else:
                continue
            if round_ >= 10:
                samples[name].append(elapsed)
    sandbox.close()
    if peer is not None:
        peer.call("remove", id=peer_id)

    # starts, alternating
    starts: dict[str, list[float]] = {"start_cold": [], "minisweagent_start": []}
    for i in range(args.starts):
        for who in (["ours", "peer"] if i % 2 == 0 else ["peer", "ours"]):
            time.sleep(0.5)  # let the last removal finish, so it does not overlap this start
            if who == "ours":
                begin = time.perf_counter()
                sb = DockerSandbox(spec)
                starts["start_cold"].append(time.perf_counter() - begin)
                sb.close()
            elif peer is not None:
                answer = peer.call("start")
                starts["minisweagent_start"].append(answer["seconds"])
                peer.call("remove", id=answer["id"])
    pool = WarmPool(size=2)
    pool.prefill(sandbox.image, ResourceLimits())
    warm = []
    for _ in range(args.starts):
        begin = time.perf_counter()
        sb = DockerSandbox(spec, pool=pool)
        warm.append(time.perf_counter() - begin)
        sb.close()
        time.sleep(1.0)  # let the pool refill, as a trainer's think time would
    pool.close()

    for name, values in {**samples, **starts, "start_pool": warm}.items():
        if values:
            results[name] = summary(values)
    if peer is not None:
        results["exec_speedup_vs_minisweagent"] = round(
            statistics.median(samples["minisweagent_exec_true"]) / statistics.median(samples["exec_true"]), 1)
        results["start_ratio_vs_minisweagent"] = round(
            statistics.median(starts["start_cold"]) / statistics.median(starts["minisweagent_start"]), 2)
    results.update(measure_idle(spec, sandbox.image, peer, args.idle))
    if peer is not None:
        peer.close()
    timings = {k: v for k, v in results.items() if not isinstance(v, dict) or "median_ms" in v}
    print_results(timings, args.json)
    for key, value in results.items():
        if key not in timings:
            print(f"{key}  {json.dumps(value)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
