"""The ray backend against the local one, in the same run: graded episodes per minute on 1 vs 2
simulated nodes (``ray.cluster_utils.Cluster`` on 127.0.0.1, the same total of sandbox slots split
over the nodes), and the cost of one ``exec("true")`` through an actor beside a local sandbox's.

    python bench/ray_backend.py [--runs 3] [--episodes 18] [--workers 4] [--execs 60] [--json]

An episode is one ``Verifier.verify`` of a bundled task's gold patch (fresh sandbox, apply, the
task's tests, close): on the ray backend that includes creating and killing the sandbox's actor.
Tasks are taken round-robin over the bundled catalog, ``--workers`` at once. The local backend runs
the same episodes in the same run as the peer. One simulated node and two share this machine's
cores, so two nodes measure the cost of spreading, not more compute: on a real cluster each node
brings its own cores.

Ray's daemons listen on every interface, so the script re-runs itself in a network namespace with
only loopback (``unshare --net``; needs root), after building the bundled environments (which
needs the network) in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gym_envs.grading.verifier import Verifier  # noqa: E402
from tasks.backends import make_sandbox, sandbox_factory  # noqa: E402
from tasks.catalog import load_task_set  # noqa: E402
from tests.ray_cluster.helpers import build_environments, interfaces  # noqa: E402


def episodes_per_minute(factory, episodes: int, workers: int) -> tuple[float, list[dict]]:
    tasks = list(load_task_set())
    verifier = Verifier(factory)
    start = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        reports = list(pool.map(lambda i: verifier.verify(tasks[i % len(tasks)], tasks[i % len(tasks)].patch),
                                range(episodes)))
    seconds = time.monotonic() - start
    bad = [r.instance_id for r in reports if not r.resolved]
    if bad:
        raise SystemExit(f"gold did not resolve: {bad} ({reports[0].infrastructure_failure_reason})")
    return episodes * 60 / seconds, [r.placement or {} for r in reports]


def exec_latency(sandbox, n: int) -> float:
    for _ in range(5):
        sandbox.exec("true")
    times = []
    for _ in range(n):
        t = time.perf_counter()
        sandbox.exec("true")
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def one_run(args) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    out: dict = {}
    task = load_task_set().get("patchgym__semverkit-1")
    rate, _ = episodes_per_minute(sandbox_factory("local"), args.episodes, args.workers)
    out["local_episodes_per_min"] = rate
    for nodes in (1, 2):
        slots = args.workers // nodes
        node = {"num_cpus": 1, "resources": {"patchgym_sandbox": slots}, "node_ip_address": "127.0.0.1",
                "object_store_memory": 150 * 1024 * 1024}
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
        for _ in range(nodes - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            rate, placements = episodes_per_minute(sandbox_factory("ray"), args.episodes, args.workers)
            out[f"ray_{nodes}node_episodes_per_min"] = rate
            out[f"ray_{nodes}node_nodes_used"] = len({p["node_id"] for p in placements})
            warm = [p["warmup_seconds"] for p in placements]
            out[f"ray_{nodes}node_warmup_median_s"] = statistics.median(warm)
            if nodes == 1:  # per-step overhead: one actor's exec beside a local sandbox's, interleaved
                remote, local = make_sandbox(task, "ray"), make_sandbox(task, "local")
                try:
                    r, loc = [], []
                    for _ in range(3):
                        r.append(exec_latency(remote, args.execs // 3))
                        loc.append(exec_latency(local, args.execs // 3))
                    out["ray_exec_true_ms"] = statistics.median(r) * 1000
                    out["local_exec_true_ms"] = statistics.median(loc) * 1000
                finally:
                    remote.close()
                    local.close()
        finally:
            ray.shutdown()
            cluster.shutdown()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=18)
    parser.add_argument("--workers", type=int, default=4, help="episodes at once = sandbox slots in all (even)")
    parser.add_argument("--execs", type=int, default=60)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if interfaces() != ["lo"]:
        build_environments()
        inner = f"ip link set lo up && exec {sys.executable} {' '.join(map(str, sys.argv))}"
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        return subprocess.run(["unshare", "--net", "sh", "-c", inner], env=env).returncode
    runs = []
    for i in range(args.runs):
        runs.append(one_run(args))
        print(f"run {i + 1}: " + ", ".join(f"{k}={v:.2f}" for k, v in runs[-1].items()), file=sys.stderr, flush=True)
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    medians["ray_2node_over_1node"] = statistics.median(
        r["ray_2node_episodes_per_min"] / r["ray_1node_episodes_per_min"] for r in runs)
    medians["ray_1node_over_local"] = statistics.median(
        r["ray_1node_episodes_per_min"] / r["local_episodes_per_min"] for r in runs)
    medians["ray_exec_over_local"] = statistics.median(r["ray_exec_true_ms"] / r["local_exec_true_ms"] for r in runs)
    if args.json:
        print(json.dumps({"medians": medians, "runs": runs}, indent=2))
    else:
        for k, v in medians.items():
            print(f"{k:32s} {v:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
