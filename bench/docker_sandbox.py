"""Docker backend timings beside mini-swe-agent's DockerEnvironment on the same image, in one run.

* ``exec_true`` — ``DockerSandbox.exec("true")`` (one request to the in-container command server);
* ``minisweagent_docker_true`` — mini-swe-agent's ``DockerEnvironment.execute`` of ``true`` (one
  ``docker exec`` CLI process per command), when mini-swe-agent is installed;
* ``fresh_sandbox_cold`` — a new ``DockerSandbox`` until it can run a command (container start +
  command server); ``close()`` is not counted (it hands the removal to a background thread);
* ``fresh_sandbox_pool`` — the same from a warm pool (containers pre-started);
* ``minisweagent_docker_start`` — mini-swe-agent starting its container (``docker run``).

Exec columns are measured round-robin. Needs a Docker engine and the task's instance image (built
on first use: ``patchgym images bootstrap`` first).

    python bench/docker_sandbox.py [--task ID] [--repeat 200] [--starts 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_sandbox import print_results, summary, timed  # noqa: E402  (also puts the repository on sys.path)

from gym_envs import load_task_set  # noqa: E402
from sandboxes.docker import DockerSandbox, WarmPool  # noqa: E402
from sandboxes.limits import ResourceLimits  # noqa: E402
from tasks.backends import sandbox_spec  # noqa: E402


def minisweagent_docker(image: str):
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="pg-bench-mswea-"))
    try:
        from minisweagent.environments.docker import DockerEnvironment
    except ImportError as exc:
        print(f"skipping mini-swe-agent columns: {exc} (pip install mini-swe-agent)", file=sys.stderr)
        return None
    return lambda: DockerEnvironment(image=image, cwd="/testbed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="patchgym__semverkit-1")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    spec = sandbox_spec(load_task_set().get(args.task))
    sandbox = DockerSandbox(spec)  # builds the images if needed
    results: dict[str, object] = {"task": args.task, "image": sandbox.image}
    make_peer = minisweagent_docker(sandbox.image)
    peer = make_peer() if make_peer else None
    columns = {"exec_true": lambda: sandbox.exec("true")}
    if peer is not None:
        columns["minisweagent_docker_true"] = lambda: peer.execute({"command": "true"})
    samples: dict[str, list[float]] = {name: [] for name in columns}
    for round_ in range(args.repeat + 10):
        names = list(columns)[round_ % len(columns):] + list(columns)[:round_ % len(columns)]
        for name in names:
            start = time.perf_counter()
            columns[name]()
            if round_ >= 10:
                samples[name].append(time.perf_counter() - start)
    sandbox.close()
    if peer is not None:
        peer.cleanup()
    for name, values in samples.items():
        results[name] = summary(values)

    def start(pool: WarmPool | None) -> float:
        begin = time.perf_counter()
        sb = DockerSandbox(spec, pool=pool)
        elapsed = time.perf_counter() - begin
        sb.close()
        return elapsed

    cold = []
    for _ in range(args.starts):
        cold.append(start(None))
        time.sleep(0.5)  # let the background removal finish, so it does not overlap the next start
    results["fresh_sandbox_cold"] = summary(cold)
    pool = WarmPool(size=2)
    pool.prefill(sandbox.image, ResourceLimits())
    warm = []
    for _ in range(args.starts):
        warm.append(start(pool))
        time.sleep(1.0)  # let the pool refill, as a trainer's think time would
    pool.close()
    results["fresh_sandbox_pool"] = summary(warm)
    if make_peer is not None:
        def peer_start() -> None:
            make_peer().cleanup()
        results["minisweagent_docker_start"] = summary(timed(peer_start, args.starts))
        results["exec_speedup_vs_minisweagent"] = round(
            statistics.median(samples["minisweagent_docker_true"]) / statistics.median(samples["exec_true"]), 1)

    print_results(results, args.json)


if __name__ == "__main__":
    main()
