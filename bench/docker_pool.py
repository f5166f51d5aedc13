"""Does the Docker warm pool pay? The same work with the pool off and on (one started container per
image, a task kept warm from its second use: the default), alternating, in one run.

* ``episodes`` — RepoEnv episodes on the docker backend, in this process: reset, one ``bash`` step,
  ``--think`` seconds (a model's turn), the gold patch applied with ``git apply``, submit (the
  workspace diff, then grading in a fresh sandbox of the same image). Over the bundled tasks each
  once (``distinct``), and over ``--tasks-limit`` tasks each ``--repeat`` times in a row
  (``repeated``, as the rollouts of one task in an RL group). Figures: the median episode and
  submit (grading) time, and the containers started per episode.
* ``eval`` — ``patchgym eval --predictions gold --backend docker --workers W`` (a subprocess):
  grading alone, one sandbox per instance, each instance once. Figures: wall time, containers
  started per instance.

Containers started are counted from the engine's events (``create`` of patchgym sandboxes), so
a container the pool starts and nobody uses is counted. Medians over ``--runs``; the machine is
shared, so compare the pool's columns within a run. Needs a Docker engine and the bundled tasks'
instance images (built by a first, uncounted pass).

    python bench/docker_pool.py [--runs 3] [--think 1.0] [--repeat 3] [--tasks-limit 6] [--workers 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import gymnasium as gym  # noqa: E402

import patchgym.gym_envs  # noqa: E402,F401  (registers the environments)
from patchgym import load_task_set  # noqa: E402
from patchgym.sandboxes.docker import docker_client  # noqa: E402
from patchgym.sandboxes.docker import pool as pools  # noqa: E402
from patchgym.sandboxes.docker.client import owner_id  # noqa: E402


class CreatedContainers:
    """Counts the sandbox containers the engine creates while it runs, per owner (from the live
    event stream: the engine keeps too few past events to count them afterwards)."""

    def __init__(self) -> None:
        self.owners: dict[str, int] = {}
        self._stream = docker_client().events(decode=True, filters={"event": "create",
                                                                    "label": "org.patchgym.kind=sandbox"})
        self._thread = threading.Thread(target=self._count, daemon=True)
        self._thread.start()

    def _count(self) -> None:
        try:
            for event in self._stream:
                owner = event.get("Actor", {}).get("Attributes", {}).get("org.patchgym.owner", "")
                self.owners[owner] = self.owners.get(owner, 0) + 1
        except Exception:  # the stream closed
            pass

    def of(self, pid: int) -> int:
        time.sleep(1.0)  # events arrive a moment after the create
        return self.owners.get(f"{owner_id().split(':')[0]}:{pid}", 0)


def fresh_pools() -> None:
    """Close the process's shared pools, so that a run starts with none warm."""
    for size in list(pools._pools):
        pools._pools.pop(size).close()


def episodes(ids: list[str], pool: int, think: float, created: CreatedContainers) -> dict[str, float]:
    fresh_pools()
    env = gym.make("patchgym/RepoEnv-v0", backend="docker", sandbox_options={"pool_size": pool})
    tasks = load_task_set()
    totals, submits = [], []
    before = created.of(os.getpid())
    try:
        for instance_id in ids:
            begin = time.perf_counter()
            env.reset(options={"task_id": instance_id})
            env.step({"name": "bash", "arguments": {"command": "git status --short; ls"}})
            time.sleep(think)
            patch = tasks.get(instance_id).patch
            env.step({"name": "bash", "arguments": {"command": f"printf %s {shlex.quote(patch)} | git apply"}})
            graded = time.perf_counter()
            _, reward, terminated, _, _ = env.step({"name": "submit", "arguments": {}})
            done = time.perf_counter()
            if not terminated or reward != 1.0:
                raise RuntimeError(f"{instance_id}: the gold patch did not resolve (reward {reward})")
            totals.append(done - begin - think)
            submits.append(done - graded)
    finally:
        env.close()
        fresh_pools()
    return {"episode_s": statistics.median(totals), "submit_s": statistics.median(submits),
            "containers_per_episode": (created.of(os.getpid()) - before) / len(ids)}


def evaluation(ids: list[str], pool: int, workers: int, out: Path, created: CreatedContainers) -> dict[str, float]:
    argv = [sys.executable, "-m", "patchgym.cli", "eval", "--predictions", "gold", "--backend", "docker",
            "--workers", str(workers), "--force", "--output", str(out), "--instance-ids", ",".join(ids)]
    begin = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "PATCHGYM_DOCKER_POOL": str(pool)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output, _ = proc.communicate()
    wall = time.perf_counter() - begin
    if proc.returncode != 0:
        raise RuntimeError(f"eval failed ({proc.returncode}):\n{output[-3000:]}")
    return {"wall_s": wall, "containers_per_instance": created.of(proc.pid) / len(ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--think", type=float, default=1.0, help="seconds between steps, a model's turn")
    parser.add_argument("--repeat", type=int, default=3, help="episodes of each task in a row (repeated)")
    parser.add_argument("--tasks-limit", type=int, default=6, help="tasks in the repeated scenario")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    ids = [t.instance_id for t in load_task_set()]
    repeated = [i for i in ids[: args.tasks_limit] for _ in range(args.repeat)]
    out = Path(tempfile.mkdtemp(prefix="pg-bench-pool-"))
    created = CreatedContainers()
    scenarios = {
        "distinct": lambda pool: episodes(ids, pool, args.think, created),
        "repeated": lambda pool: episodes(repeated, pool, args.think, created),
        "eval": lambda pool: evaluation(ids, pool, args.workers, out / "eval", created),
    }
    episodes(ids, 0, 0.0, created)  # builds what is missing; not counted
    samples: dict[str, list[dict[str, float]]] = {f"{name}_pool_{p}": [] for name in scenarios for p in (0, 1)}
    for i in range(args.runs):
        for name, scenario in scenarios.items():
            for pool in ((0, 1) if i % 2 == 0 else (1, 0)):
                result = scenario(pool)
                samples[f"{name}_pool_{pool}"].append(result)
                print(f"run {i + 1} {name} pool={pool}: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()),
                      flush=True)
    results: dict[str, object] = {"tasks": len(ids), "repeated_episodes": len(repeated), "think_s": args.think,
                                  "workers": args.workers}
    for key, values in samples.items():
        results[key] = {metric: round(statistics.median(v[metric] for v in values), 3) for metric in values[0]}
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
