"""The ray backend against the local one, in the same run: graded episodes per minute, the CPU each
episode costs outside its sandbox (Ray's own processes included), and one ``exec("true")``.

    python bench/ray_backend.py [--runs 3] [--episodes 18] [--workers 4] [--execs 60] [--json]
    python bench/ray_backend.py --scaling [--nodes 1,2,3] [--node-cpus 0.5] [--slots-per-node 2] [--runs 3]

An episode is one ``Verifier.verify`` of a bundled task's gold patch (a sandbox, apply, the task's
tests, close). Tasks are taken round-robin over the bundled catalog, ``--workers`` at once. Before
each timed batch, each backend grades ``--workers`` uncounted episodes, so that both start warm:
the local backend's process is running, and so are the ray backend's sandbox hosts (an actor
process per slot, kept warm between sandboxes). A cold host's start is reported apart
(``ray_cold_start_s``: the first sandbox's whole start on a fresh cluster).

Default: the local backend, then ``ray.cluster_utils.Cluster`` on 127.0.0.1 with ``--workers``
sandbox slots on 1 node and split over 2 nodes. All of them share this machine's cores, so two nodes
measure the cost of spreading, not more compute. ``exec("true")``: one ray and one local sandbox,
calls alternating, medians.

``--scaling``: the sandbox nodes get real CPU limits. Each node (its raylet, the actors it starts
and their sandboxes) runs in a ``cpu`` cgroup with a quota of ``--node-cpus`` cores; the head (GCS)
and this driver declare no sandbox slot and run outside the quotas, as a trainer's node would. Each
node count N grades ``--episodes`` × N episodes with ``--slots-per-node`` × N at once; the local
backend runs ``--episodes`` with ``--slots-per-node`` at once under one node's quota, as the
reference for one node's worth of cores. ``quota_throttled`` is the share of scheduling periods in
which a quota held its node back: near 0, the machine's other load was the limit, not the quotas,
and the node counts cannot show scaling (measure on an otherwise idle machine).

CPU per episode: this whole process tree sits in a ``cpuacct`` cgroup, so what it spends (the
driver, Ray's daemons, the sandbox hosts, ended processes included) is measured; the sandboxes'
own processes move to their cgroups and are left out: they do the same work on either backend
(``test_cpu_s`` shows their tests' part). ``ray_overhead_cpu_s`` = a ray configuration's CPU per
episode minus the local backend's: what Ray adds per episode, all of it. The breakdown by process
(``cpu_by_process``) says where it went.

Needs root: the cgroups, and Ray's daemons listen on every interface, so the script re-runs itself
with ``unshare --net`` in a namespace with only loopback, after building the bundled environments
(which needs the network) in this process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from patchgym.grading.verifier import Verifier  # noqa: E402
from patchgym.tasks.backends import make_sandbox, sandbox_factory  # noqa: E402
from patchgym.tasks.catalog import load_task_set  # noqa: E402
from patchgym.tests.ray_cluster.helpers import build_environments, interfaces  # noqa: E402

CGROUPS = Path("/sys/fs/cgroup")
TICK = os.sysconf("SC_CLK_TCK")
NODE = {"node_ip_address": "127.0.0.1", "object_store_memory": 150 * 1024 * 1024}


class BenchCgroups:
    """This process tree's ``cpuacct`` cgroup (what it spends), and ``cpu`` cgroups with quotas that
    a block of code can start processes in (:meth:`limited`)."""

    def __init__(self) -> None:
        self.name = f"patchgym-bench-{os.getpid()}"
        self.account = CGROUPS / "cpuacct" / self.name
        self.account.mkdir()
        (self.account / "cgroup.procs").write_text(str(os.getpid()))
        self._home_cpu = CGROUPS / "cpu" / _cgroup_of(os.getpid(), "cpu").lstrip("/")
        self._made: list[Path] = []

    def cpu_seconds(self) -> float:
        return int((self.account / "cpuacct.usage").read_text()) / 1e9

    def throttling(self) -> tuple[int, int]:
        """(periods, throttled periods) so far over the quota cgroups: how often a quota, rather than
        the machine's other load, was what held the processes back."""
        periods = throttled = 0
        for path in self._made:
            stat = dict(line.split() for line in (path / "cpu.stat").read_text().splitlines())
            periods, throttled = periods + int(stat["nr_periods"]), throttled + int(stat["nr_throttled"])
        return periods, throttled

    @contextlib.contextmanager
    def limited(self, name: str, cpus: float) -> Iterator[None]:
        """Run the block in a ``cpu`` cgroup of ``cpus`` cores: processes it starts stay there."""
        path = CGROUPS / "cpu" / self.name / name
        if not path.is_dir():
            path.mkdir(parents=True)
            (path / "cpu.cfs_period_us").write_text("100000")
            (path / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
            self._made.append(path)
        (path / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield
        finally:
            (self._home_cpu / "cgroup.procs").write_text(str(os.getpid()))

    def close(self) -> None:
        """Leave the cgroups and remove them, once the last of Ray's processes has ended."""
        (CGROUPS / "cpuacct" / _cgroup_of(1, "cpuacct").lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))
        for path in [*reversed(self._made), CGROUPS / "cpu" / self.name, self.account]:
            for _ in range(100):
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                print(f"could not remove {path}: processes are still in it", file=sys.stderr)


def _cgroup_of(pid: int, controller: str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    raise SystemExit(f"no {controller} cgroup (cgroup v1 is needed)")


def process_cpu(group: str) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of each live process in the cpuacct cgroup ``group``, with its kind."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f":cpuacct:/{group}\n" not in (entry / "cgroup").read_text() + "\n":
                continue
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out[int(entry.name)] = (_kind(int(entry.name), cmdline), (int(stat[11]) + int(stat[12])) / TICK)
    return out


def _kind(pid: int, cmdline: str) -> str:
    if pid == os.getpid():
        return "driver"
    for marker, kind in (("gcs_server", "gcs_server"), ("raylet", "raylet"), ("ray::SandboxHost", "sandbox hosts"),
                         ("ray_cluster.guard", "guards")):
        if marker in cmdline:
            return kind
    return "other Ray processes"


def episodes(factory, count: int, workers: int, groups: BenchCgroups) -> dict:
    """Grade ``count`` gold episodes ``workers`` at once after ``workers`` uncounted ones."""
    tasks = list(load_task_set())
    verifier = Verifier(factory)

    def batch(n: int) -> list:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda i: verifier.verify(tasks[i % len(tasks)], tasks[i % len(tasks)].patch),
                                 range(n)))

    warm = batch(workers)
    before, cpu0, quota0, start = process_cpu(groups.name), groups.cpu_seconds(), groups.throttling(), time.monotonic()
    reports = batch(count)
    seconds, cpu, quota1 = time.monotonic() - start, groups.cpu_seconds() - cpu0, groups.throttling()
    after = process_cpu(groups.name)
    bad = [(r.instance_id, r.infrastructure_failure_reason or r.error) for r in warm + reports if not r.resolved]
    if bad:
        raise SystemExit(f"gold did not resolve: {bad}")
    by_kind: Counter[str] = Counter()
    for pid, (kind, used) in after.items():
        by_kind[kind] += used - before.get(pid, (kind, 0.0))[1]
    by_kind["ended processes"] = cpu - sum(by_kind.values())
    placements = [r.placement or {} for r in reports]
    cold = [r.placement["start_seconds"] for r in warm if r.placement and not r.placement.get("host_reused")]
    return {
        "episodes_per_min": count * 60 / seconds,
        "cpu_s": cpu / count,
        "test_cpu_s": statistics.mean(r.cost.test_cpu_seconds or 0.0 for r in reports),
        "cpu_by_process": {k: round(v / count, 4) for k, v in sorted(by_kind.items())},
        "nodes_used": len({p["node_id"] for p in placements if "node_id" in p}),
        "hosts_reused": sum(bool(p.get("host_reused")) for p in placements) / count if placements[0] else None,
        "cold_start_s": statistics.median(cold) if cold else None,
        # --scaling: the share of scheduling periods in which a node's quota held it back (near 0:
        # the machine's other load, not the quota, was the limit, and node counts cannot scale)
        "quota_throttled": (quota1[1] - quota0[1]) / (quota1[0] - quota0[0]) if quota1[0] > quota0[0] else None,
    }


@contextlib.contextmanager
def cluster(nodes: int, slots: int, groups: BenchCgroups | None = None, node_cpus: float = 0.0) -> Iterator[str]:
    """A Ray cluster on 127.0.0.1 with ``slots`` sandbox slots on each of ``nodes`` nodes: the head is
    the first node, or, with ``groups``, a node of its own without slots, and each sandbox node runs
    in a cgroup of ``node_cpus`` cores. Yields its address (this process is connected to it)."""
    import ray
    from ray.cluster_utils import Cluster

    node = {**NODE, "num_cpus": 1, "resources": {"patchgym_sandbox": slots}}
    head = {**NODE, "num_cpus": 0, "resources": {}} if groups else node
    c = Cluster(initialize_head=True, head_node_args={**head, "include_dashboard": False})
    try:
        for i in range(nodes - (0 if groups else 1)):
            with groups.limited(f"node-{i}", node_cpus) if groups else contextlib.nullcontext():
                c.add_node(**node)
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False)
        try:
            yield c.address
        finally:
            ray.shutdown()
    finally:
        c.shutdown()


def ratio_run(args, groups: BenchCgroups, turn: int) -> dict:
    """One run: the local backend, ray on 1 node, ray on 2 nodes, starting with the ``turn``-th (so
    that over runs, drift in the machine's load hits each alike)."""
    def local() -> dict:
        return {"local": episodes(sandbox_factory("local"), args.episodes, args.workers, groups)}

    def ray_on(nodes: int) -> Callable[[], dict]:
        def run() -> dict:
            with cluster(nodes, args.workers // nodes):
                out = {f"ray_{nodes}node": episodes(sandbox_factory("ray"), args.episodes, args.workers, groups)}
                if nodes == 1:  # per-step overhead: one host's exec beside a local sandbox's, interleaved
                    out["exec_true_ms"] = exec_pair(args.execs)
                return out
        return run

    configs = [local, ray_on(1), ray_on(2)]
    out: dict = {}
    for config in configs[turn % 3:] + configs[:turn % 3]:
        out.update(config())
    return {key: out[key] for key in ("local", "ray_1node", "ray_2node", "exec_true_ms")}


def exec_pair(execs: int) -> dict:
    """Median ``exec("true")`` of a ray and a local sandbox, calls alternating one by one, so that
    both see the same moments of the machine's other load."""
    task = load_task_set().get("patchgym__semverkit-1")
    sandboxes = {"ray": make_sandbox(task, "ray"), "local": make_sandbox(task, "local")}
    try:
        times: dict[str, list[float]] = {name: [] for name in sandboxes}
        for i in range(execs + 10):
            for name, sandbox in sandboxes.items():
                start = time.perf_counter()
                sandbox.exec("true")
                if i >= 10:  # the first ten: warm-up
                    times[name].append(time.perf_counter() - start)
        return {name: statistics.median(t) * 1000 for name, t in times.items()}
    finally:
        for sandbox in sandboxes.values():
            sandbox.close()


def scaling_run(args, groups: BenchCgroups) -> dict:
    with groups.limited("local", args.node_cpus):
        out = {"local": episodes(sandbox_factory("local"), args.episodes, args.slots_per_node, groups)}
    for nodes in args.nodes:
        with cluster(nodes, args.slots_per_node, groups, args.node_cpus):
            out[f"ray_{nodes}node"] = episodes(sandbox_factory("ray"), args.episodes * nodes,
                                               args.slots_per_node * nodes, groups)
    return out


def summarize(runs: list[dict]) -> dict:
    """Medians over runs of each figure, and of each run's ratios to the local backend."""
    def median(get: Callable[[dict], float | None]) -> float | None:
        values = [v for v in map(get, runs) if v is not None]
        return round(statistics.median(values), 4) if values else None

    out: dict = {}
    for config in [k for k in runs[0] if k != "exec_true_ms"]:
        row = {key: median(lambda r, c=config, k=key: r[c][k]) for key in runs[0][config] if key != "cpu_by_process"}
        row["cpu_by_process"] = {kind: median(lambda r, c=config, k=kind: r[c]["cpu_by_process"].get(k))
                                 for kind in runs[0][config]["cpu_by_process"]}
        if config != "local":
            row["over_local"] = median(lambda r, c=config: r[c]["episodes_per_min"] / r["local"]["episodes_per_min"])
            row["ray_overhead_cpu_s"] = median(lambda r, c=config: r[c]["cpu_s"] - r["local"]["cpu_s"])
        out[config] = row
    if "exec_true_ms" in runs[0]:
        exec_ms = [r["exec_true_ms"] for r in runs]
        out["exec_true_ms"] = {"ray": round(statistics.median(e["ray"] for e in exec_ms), 3),
                               "local": round(statistics.median(e["local"] for e in exec_ms), 3),
                               "ray_over_local": round(statistics.median(e["ray"] / e["local"] for e in exec_ms), 3)}
    return out


def rerun_without_network() -> int | None:
    """Outside a loopback-only network namespace: build the bundled environments (they need the
    network), re-run this command line under ``unshare --net`` and return its exit code. Inside: None.
    (Ray's daemons listen on every interface; there, nothing they open is reachable from outside.)"""
    if interfaces() == ["lo"]:
        return None
    build_environments()
    inner = f"ip link set lo up && exec {shlex.join([sys.executable, *sys.argv])}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    child = subprocess.Popen(["unshare", "--net", "sh", "-c", inner], env=env)
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:  # the child had the same Ctrl-C and is stopping its cluster: let it
            continue


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=18, help="timed episodes (per node with --scaling)")
    parser.add_argument("--workers", type=int, default=4, help="episodes at once = sandbox slots in all (even)")
    parser.add_argument("--execs", type=int, default=200, help="exec(\"true\") calls on each sandbox")
    parser.add_argument("--scaling", action="store_true", help="nodes with CPU limits, episodes/min per node count")
    parser.add_argument("--nodes", type=lambda s: [int(n) for n in s.split(",")], default=[1, 2, 3])
    parser.add_argument("--node-cpus", type=float, default=0.5, help="--scaling: cores per node (a cgroup quota)")
    parser.add_argument("--slots-per-node", type=int, default=2, help="--scaling: sandbox slots per node")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if (code := rerun_without_network()) is not None:
        return code
    groups = BenchCgroups()
    try:
        runs = []
        for i in range(args.runs):
            runs.append(scaling_run(args, groups) if args.scaling else ratio_run(args, groups, i))
            print(f"run {i + 1}: " + json.dumps(runs[-1]), file=sys.stderr, flush=True)
    finally:
        groups.close()
    result = summarize(runs)
    if args.json:
        print(json.dumps({"medians": result, "runs": runs}, indent=2))
    else:
        for config, row in result.items():
            print(f"{config}: " + ", ".join(f"{k}={v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
