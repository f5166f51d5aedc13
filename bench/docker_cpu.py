"""Where an episode's CPU goes on the docker backend, beside the local backend in the same run.

An episode: ``RepoEnv.reset`` on a bundled task, one ``bash`` step applying the gold patch, and
``submit`` (the diff, then grading in a fresh sandbox): two sandboxes, the exec path, the diff
and a test run. ``--episodes`` (all 18 bundled tasks by default) run ``--workers`` at once, per
backend, alternating which goes first; ``--runs`` times.

CPU per episode, by where it was spent:

* ``client``: this process and every process it waited for (local sandboxes' processes are its
  descendants, reaped through bubblewrap: their CPU is here), less the sampler's own thread;
* ``sandboxes``: the sandboxes' own cgroups (``cpuacct.usage``), sampled every 0.1 s while they
  live: a docker container's (the command server, the commands, the tests), a local sandbox's (its
  init, the commands, the tests: killed with their init, they are never waited for by this
  process, so its own figure misses them);
* ``shims``: each of those containers' containerd-shim, sampled likewise;
* ``engine``: dockerd and containerd (every client's: other users of the engine show up here).

Needs root (to read the engine's processes and the containers' cgroups) and a Docker engine with
the bundled tasks' images (built on first use).

    python bench/docker_cpu.py [--episodes 18] [--workers 4] [--runs 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procmem import load_average, pids_named  # noqa: E402

from patchgym import load_task_set  # noqa: E402
from patchgym.gym_envs.repo_env import RepoEnv  # noqa: E402
from patchgym.sandboxes.docker.client import OWNER_LABEL, docker_client, owner_id  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def self_cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class DockerSampler:
    """The last CPU seen of each of this process's sandboxes (containers, local sandboxes' cgroups)
    and of each container's shim."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, float] = {}
        self.shims: dict[str, float] = {}
        self.own_cpu = 0.0  # this sampler's thread: in this process's CPU, not the episodes'
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self._sample()
        finally:
            self.own_cpu = time.thread_time()

    def _sample(self) -> None:
        client = docker_client()
        while not self._stop.wait(0.1):
            try:
                found = client.containers.list(sparse=True, filters={"label": f"{OWNER_LABEL}={owner_id()}"})
                ids = [c.id for c in found]
            except Exception:  # noqa: BLE001 - a busy engine: next round
                continue
            shims = {}
            for pid in pids_named("containerd-shim"):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                for cid in ids:
                    if cid.encode() in cmdline:
                        shims[cid] = pid
            groups = [Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}") for cid in ids]
            groups += Path("/sys/fs/cgroup/cpuacct/patchgym").glob(f"sb-{os.getpid()}-*")
            for group in groups:
                try:
                    usage = int((group / "cpuacct.usage").read_text()) / 1e9
                    self.sandboxes[group.name] = max(self.sandboxes.get(group.name, 0.0), usage)
                except (OSError, ValueError):
                    pass
            for cid in ids:
                if cid in shims and (cpu := proc_cpu(shims[cid])) is not None:
                    self.shims[cid] = max(self.shims.get(cid, 0.0), cpu)

    def __enter__(self) -> DockerSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def engine_cpu() -> float:
    return sum(proc_cpu(p) or 0.0 for name in ("dockerd", "containerd") for p in pids_named(name))


def episode(task_set, backend: str, task) -> bool:
    env = RepoEnv(task_set, backend=backend, sandbox_options={"pool_size": 0} if backend == "docker" else None)
    try:
        env.reset(options={"task_id": task.instance_id})
        env.step({"name": "bash", "arguments": {"command": f"printf %s {shlex.quote(task.patch)} | git apply"}})
        _, reward, terminated, _, info = env.step({"name": "submit", "arguments": {}})
        return bool(terminated and reward == 1.0)
    finally:
        env.close()


def measure(task_set, tasks: list, backend: str, workers: int) -> dict:
    before_client, before_engine, started = self_cpu(), engine_cpu(), time.monotonic()
    with DockerSampler() as sampler, ThreadPoolExecutor(workers) as pool:
        resolved = sum(pool.map(lambda t: episode(task_set, backend, t), tasks))
    n = len(tasks)
    out = {"resolved": f"{resolved}/{n}", "wall_s": round(time.monotonic() - started, 1),
           "client_cpu_s": round((self_cpu() - before_client - sampler.own_cpu) / n, 3),
           "sandboxes_cpu_s": round(sum(sampler.sandboxes.values()) / n, 3),
           "shims_cpu_s": round(sum(sampler.shims.values()) / n, 3),
           "engine_cpu_s": round((engine_cpu() - before_engine) / n, 3)}
    out["total_cpu_s"] = round(sum(out[k] for k in ("client_cpu_s", "sandboxes_cpu_s", "shims_cpu_s",
                                                    "engine_cpu_s")), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=18)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    task_set = load_task_set()
    tasks = list(task_set)[:args.episodes]
    for backend in ("local", "docker"):  # warm: environments, images, runtime (not counted)
        measure(task_set, tasks[:args.workers], backend, args.workers)
    runs = []
    for run in range(args.runs):
        result = {"load_at_start": load_average()}
        for backend in (("local", "docker") if run % 2 == 0 else ("docker", "local")):
            result[backend] = measure(task_set, tasks, backend, args.workers)
            print(f"[run {run + 1}] {backend}: {result[backend]} (load {load_average()})", file=sys.stderr, flush=True)
        result["docker_over_local"] = round(result["docker"]["total_cpu_s"] / result["local"]["total_cpu_s"], 2)
        runs.append(result)
        if args.json:
            args.json.write_text(json.dumps(runs, indent=2) + "\n")
    for backend in ("local", "docker"):
        keys = runs[0][backend].keys() - {"resolved"}
        print(backend, {k: statistics.median(r[backend][k] for r in runs) for k in sorted(keys)})
    print("docker / local CPU per episode:", [r["docker_over_local"] for r in runs],
          "median", statistics.median(r["docker_over_local"] for r in runs),
          "| load at each run's start:", [r["load_at_start"] for r in runs])


if __name__ == "__main__":
    main()
