"""How many sessions one host serves: a near-free scripted agent at rising concurrency, until the
bash-step p99, an error or memory breaks; for the local and docker backends and a local Ray cluster.

The agent is no model: per episode it applies the task's gold patch (one ``bash`` step), runs
``--steps`` cheap commands (server_load.py's rotation: ``ls``, ``cat``, ``git status``...) and
submits; the submit must earn reward 1.0 (``--no-gold``: the rotation's README edit is graded,
reward 0). N workers run ``--episodes`` episodes each, back to back, with no think time (a closed
loop against ``patchgym serve``, one connection per worker: server_load.py's driver). Levels
double from ``--start`` up to ``--max`` (4, 8, 16, ... and ``--max``); ``--repeats`` runs per
level, medians. The climb stops at the first level where any run had an error, MemAvailable fell
under ``--min-available-mib``, or the median bash-step p99 reached ``--p99-limit``: that is what
failed first, and the level below it the largest that held.

Per level, one line: sessions/s (sessions created), episodes/min (submits answered), bash-step and
submit p50/p99, memory per live sandbox (the sandboxes' memory cgroups, local and ray; docker: each
container's memory cgroup plus its containerd-shim's private memory; sampled every
``--sample-interval`` s, the median of held / live), load average before and after, errors by kind.

* ``local``, ``docker``: ``patchgym serve --backend B`` on this host.
* ``ray``: a ``ray.cluster_utils.Cluster`` on 127.0.0.1 (bench/ray_backend.py's) with ``--ray-nodes``
  nodes, each with sandbox slots for twice its share of ``--max`` (a session's sandbox and its
  grading's), and ``patchgym serve --backend ray --ray-address`` on it. Ray's daemons listen on
  every interface, so with ``ray`` among the backends the whole bench re-runs itself in a
  loopback-only network namespace (``unshare --net``), after building the bundled environments.

Every finished level is written to ``--json`` at once (atomically); ``--resume`` reads it and goes
on from the first level not measured. Ctrl-C stops the runs, the server, the cluster and their
sandboxes, and says how to resume. Needs root (cgroups; ray: the namespace).

    python bench/capacity.py --backend local,docker,ray [--start 4] [--max 256] [--steps 3] [--episodes 2]
        [--repeats 3] [--p99-limit 1.0] [--ray-nodes 3] --json capacity.json [--resume]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procmem import cgroup_memory, load_average, shims, uss  # noqa: E402
from server_load import (  # noqa: E402
    descendants,
    fmt,
    median_of,
    proc_table,
    run_remote,
    server_process,
    settled_leftovers,
)

from patchgym.tasks.catalog import load_task_set  # noqa: E402

BACKENDS = ("local", "docker", "ray")
MIB = 1 << 20


def log(message: str) -> None:
    print(f"[capacity {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the climb (pure) ---------------------------------------------------------------------


def levels(start: int, top: int) -> list[int]:
    """start, 2·start, 4·start, ... below ``top``, then ``top``."""
    out, n = [], max(1, start)
    while n < top:
        out.append(n)
        n *= 2
    return [*out, top]


def failure(level: dict[str, Any], p99_limit_s: float, min_available_mib: float) -> str | None:
    """What broke at this level, or None if it held: errors first (by kind), then memory, then p99."""
    if level["errors"]:
        kinds = ", ".join(f"{kind} x{count}" for kind, count in sorted(level["errors_by_kind"].items()))
        return f"errors: {kinds}"
    low = level.get("min_mem_available_mib")
    if low is not None and low < min_available_mib:
        return f"memory: MemAvailable fell to {low:.0f} MiB (< {min_available_mib:g})"
    p99 = level.get("bash_p99_ms")
    if p99 is None:
        return "no bash step was measured"
    if p99 >= p99_limit_s * 1000:
        return f"p99: bash step {p99:.0f} ms (>= {p99_limit_s * 1000:.0f})"
    return None


def bar_chart(rows: list[tuple[str, float, str]], width: int = 40) -> list[str]:
    """Plain-text horizontal bars: (label, value, note) scaled to the largest value."""
    top = max((value for _, value, _ in rows), default=0) or 1
    label_width = max((len(label) for label, _, _ in rows), default=0)
    return [f"  {label:>{label_width}} | {'#' * max(1 if value else 0, round(value / top * width)):<{width}} "
            f"{value:.1f} {note}".rstrip() for label, value, note in rows]


# -- memory of the live sandboxes ---------------------------------------------------------


def cgroup_probe(table: dict[int, tuple[int, int, float]]) -> tuple[int, int]:
    """(live sandboxes, bytes) over the memory cgroups of local sandboxes (``sb-<owner pid>-...``)
    whose owner is this process or one it started (the server, its grading workers, Ray's hosts)."""
    ours = descendants(os.getpid(), table)
    live = held = 0
    for path in glob.glob("/sys/fs/cgroup/memory/patchgym/sb-*/memory.usage_in_bytes") + glob.glob(
            "/sys/fs/cgroup/patchgym/sb-*/memory.current"):
        owner = Path(path).parent.name.removeprefix("sb-").split("-", 1)[0]
        if owner.isdigit() and int(owner) in ours:
            with contextlib.suppress(OSError, ValueError):
                held += int(Path(path).read_text())
                live += 1
    return live, held


def docker_containers(owners: set[int]) -> list[Any]:
    """patchgym's sandbox containers started by one of ``owners`` (their owner label's pid)."""
    from patchgym.sandboxes.docker.client import KIND_LABEL, MANAGED_LABEL, OWNER_LABEL, docker_client

    ours = {f"{os.uname().nodename}:{pid}" for pid in owners}
    listed = docker_client().containers.list(
        all=True, filters={"label": [f"{MANAGED_LABEL}=1", f"{KIND_LABEL}=sandbox"]}, ignore_removed=True)
    return [c for c in listed if c.labels.get(OWNER_LABEL) in ours]


def docker_probe(table: dict[int, tuple[int, int, float]]) -> tuple[int, int]:
    """(live sandboxes, bytes): each container's memory cgroup plus its shim's private memory."""
    try:
        containers = docker_containers(descendants(os.getpid(), table))
    except Exception:  # the engine did not answer this time: no sample, rather than a dead sampler thread
        return 0, 0
    shim = shims()
    live = held = 0
    for container in containers:
        with contextlib.suppress(OSError, RuntimeError, KeyError):
            held += cgroup_memory(container.id) + (uss(shim[container.id]) if container.id in shim else 0)
            live += 1
    return live, held


# -- serving ------------------------------------------------------------------------------


@contextlib.contextmanager
def serving(backend: str, args: argparse.Namespace, log_path: Path) -> Iterator[tuple[str, int]]:
    """``patchgym serve`` for ``backend`` (ray: on a fresh local cluster); yields (url, pid)."""
    if backend != "ray":
        with server_process(args.max, args.tasks, log_path, args.grading_workers, backend) as served:
            yield served
        return
    from ray_backend import cluster

    slots = math.ceil(2 * args.max / args.ray_nodes) + 1
    log(f"ray: a cluster of {args.ray_nodes} nodes, {slots} sandbox slots each")
    with cluster(args.ray_nodes, slots) as address, server_process(
            args.max, args.tasks, log_path, args.grading_workers, "ray", ("--ray-address", address)) as served:
        yield served


def level_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One level's line: medians over runs, errors summed."""
    med = median_of(runs)
    return {"sessions_per_s": med.get("sessions_per_s"), "episodes_per_min": med.get("episodes_per_min"),
            "bash_p50_ms": med.get("bash.p50_ms"), "bash_p99_ms": med.get("bash.p99_ms"),
            "submit_p50_ms": med.get("submit.p50_ms"), "submit_p99_ms": med.get("submit.p99_ms"),
            "sandbox_mib": med.get("sandbox_mib"), "peak_live_sandboxes": med.get("peak_live_sandboxes"),
            "peak_tree_rss_mib": med.get("peak_tree_rss_mib"),
            "min_mem_available_mib": med.get("min_mem_available_mib"),
            "errors": med["errors"], "errors_by_kind": med["errors_by_kind"]}


def measure_level(url: str, pid: int, backend: str, n: int, task_ids: list[str], golds: dict[str, str] | None,
                  args: argparse.Namespace) -> dict[str, Any]:
    probe = docker_probe if backend == "docker" else cgroup_probe
    runs, load_before = [], load_average()
    for r in range(args.repeats):
        run = run_remote(url, pid, task_ids, n, args, probe=probe, episodes_per_worker=args.episodes, golds=golds)
        summary = run.summary()
        summary["sessions_per_s"] = round(sum(len(e.create) for e in run.episodes) / run.wall, 3)
        summary["episodes_per_min"] = round(sum(len(e.submit) for e in run.episodes) * 60 / run.wall, 2)
        if backend != "docker":  # docker's warm pool keeps containers between sessions on purpose
            live = settled_live(probe)
            if live:
                summary["errors"] += live
                summary["errors_by_kind"] = {**summary["errors_by_kind"], "leftover:sandboxes": live}
        runs.append(summary)
        if args.repeats > 1:
            log(f"{backend} {n}: run {r + 1}/{args.repeats}: bash p99 {fmt(summary['bash'].get('p99_ms'))} ms, "
                f"errors {summary['errors']}")
    return {"sessions": n, **level_figures(runs), "load_before": load_before, "load_after": load_average(),
            "runs": runs}


def settled_live(probe: Callable[[dict], tuple[int, int]], wait: float = 5.0) -> int:
    """Sandboxes still live once every session was deleted, allowing closes in flight ``wait`` s."""
    deadline = time.monotonic() + wait
    while (live := probe(proc_table())[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return live


def print_level(backend: str, lv: dict[str, Any]) -> None:
    kinds = ", ".join(f"{k} x{c}" for k, c in lv["errors_by_kind"].items()) or "-"
    print(f"{backend:>6} {lv['sessions']:>5}  {fmt(lv['sessions_per_s']):>10}  {fmt(lv['episodes_per_min']):>10}  "
          f"{fmt(lv['bash_p50_ms']):>8} / {fmt(lv['bash_p99_ms']):<8}  {fmt(lv['submit_p50_ms']):>8} / "
          f"{fmt(lv['submit_p99_ms']):<8}  {fmt(lv['sandbox_mib']):>8}  "
          f"{lv['load_before']:>5} -> {lv['load_after']:<5}  {kinds}", flush=True)


HEADER = (f"{'backend':>6} {'N':>5}  {'sessions/s':>10}  {'episodes/m':>10}  {'step p50 / p99 ms':>19}  "
          f"{'submit p50 / p99 ms':>19}  {'MiB/sbx':>8}  {'load before->after':>18}  errors")


def climb(backend: str, args: argparse.Namespace, result: dict[str, Any], save: Callable[[], None]) -> None:
    """Measure ``backend`` level by level into ``result`` (what --resume brought is kept), saving each."""
    verdict = result.get("verdict", {})
    if verdict.get("complete"):
        log(f"{backend}: finished in {args.json}; skipped")
        return
    result.setdefault("levels", [])
    log_path = Path(tempfile.mkdtemp(prefix="pg-capacity-")) / f"serve-{backend}.log"
    owners: set[int] = set()
    try:
        with serving(backend, args, log_path) as (url, pid):
            try:
                log(f"{backend}: serve pid {pid} at {url} (log {log_path})")
                run_levels(url, pid, backend, args, result, save)
            finally:  # whoever may own sandboxes: the server, its grading workers, Ray's processes
                owners = descendants(os.getpid(), proc_table())
    finally:
        leftover = left_behind(backend, owners)
        result["left_after_shutdown"] = leftover
        alive = sorted(pid for pid in owners if Path(f"/proc/{pid}").exists())
        log(f"{backend}: left after shutdown: {leftover or 'nothing'}" + (
            "" if not leftover else f"; owners still running: {alive}" if alive else
            "; their owners are gone: the next sandbox start's reaper removes them"))
    held = [lv["sessions"] for lv in result["levels"] if not lv.get("failure")]
    failed = next((lv for lv in result["levels"] if lv.get("failure")), None)
    result["verdict"] = {"largest_holding": max(held, default=0), "complete": True,
                         "first_failure": failed and {"sessions": failed["sessions"], "what": failed["failure"]}}
    save()


def run_levels(url: str, pid: int, backend: str, args: argparse.Namespace, result: dict[str, Any],
               save: Callable[[], None]) -> None:
    """A warm-up session per task (not counted), then the levels up to the first that fails."""
    task_set = load_task_set(args.tasks)
    task_ids = args.task or [t.instance_id for t in task_set]
    golds = None if args.no_gold else {t.instance_id: t.patch for t in task_set if t.instance_id in task_ids}
    log(f"{backend}: warm-up, one session per task ({len(task_ids)})")
    workers = min(len(task_ids), args.max)  # serve's --max-sessions is --max: more at once is a 429
    warm = run_remote(url, pid, task_ids, workers, argparse.Namespace(**{**vars(args), "steps": 1}),
                      golds=golds, episodes_per_worker=-(-len(task_ids) // workers)).summary()
    if warm["errors"]:
        raise SystemExit(f"{backend}: the warm-up failed: {warm['errors_by_kind']}")
    done = {lv["sessions"]: lv for lv in result["levels"]}
    for n in levels(args.start, args.max):
        if n in done:
            lv = done[n]
        else:
            log(f"{backend}: {n} sessions x {args.episodes} episode(s), {args.repeats} run(s)")
            lv = measure_level(url, pid, backend, n, task_ids, golds, args)
            result["levels"].append(lv)
        lv["failure"] = failure(lv, args.p99_limit, args.min_available_mib)
        print_level(backend, lv)
        save()
        if lv["failure"]:
            return


def left_behind(backend: str, owners: set[int], wait: float = 5.0) -> dict[str, Any]:
    """What the bench's processes left once the server (and cluster) stopped: sandbox directories,
    cgroups and processes of any of them; docker: their containers."""
    deadline = time.monotonic() + wait
    while True:
        found: dict[str, Any] = {}
        for pid in owners:
            for kind, items in settled_leftovers(pid, wait=0).items():
                if items:
                    found.setdefault(kind, []).extend(items)
        if backend == "docker":
            with contextlib.suppress(Exception):  # the engine's answer is a report, not the bench's result
                if containers := [c.id[:12] for c in docker_containers(owners)]:
                    found["containers"] = containers
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def print_summary(out: dict[str, Any]) -> None:
    print(f"\ncapacity: bash-step p99 < {out['config']['p99_limit']:g} s, 0 errors, MemAvailable >= "
          f"{out['config']['min_available_mib']:g} MiB")
    rows = []
    for backend, result in out["backends"].items():
        verdict = result.get("verdict", {})
        first = verdict.get("first_failure")
        print(f"  {backend}: largest level that held {verdict.get('largest_holding', 0)}; first failure: "
              + (f"{first['sessions']} sessions, {first['what']}" if first else "none up to --max"))
        rows += [(f"{backend} {lv['sessions']:>4}", lv["episodes_per_min"] or 0.0,
                  f"(p99 {fmt(lv['bash_p99_ms'])} ms{', ' + lv['failure'].split(':')[0] if lv.get('failure') else ''})")
                 for lv in result.get("levels", [])]
    if rows:
        print("\nepisodes/min per level:")
        print("\n".join(bar_chart(rows)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="local", help="comma-separated: local, docker, ray (in this order)")
    parser.add_argument("--start", type=int, default=4, help="the first level's workers (sessions at once)")
    parser.add_argument("--max", type=int, default=256, help="the last level (and serve's --max-sessions)")
    parser.add_argument("--steps", type=int, default=3, help="cheap bash steps per episode, besides the gold patch")
    parser.add_argument("--episodes", type=int, default=2, help="episodes each worker runs back to back")
    parser.add_argument("--repeats", type=int, default=1, help="runs per level; medians")
    parser.add_argument("--p99-limit", type=float, default=1.0, help="seconds the bash-step p99 must stay under")
    parser.add_argument("--min-available-mib", type=float, default=1024, help="MemAvailable that must remain")
    parser.add_argument("--no-gold", action="store_true", help="submit the rotation's README edit, not the gold patch")
    parser.add_argument("--ray-nodes", type=int, default=3, help="ray: nodes of the local cluster")
    parser.add_argument("--grading-workers", type=int, help="serve's --grading-workers (default: serve's)")
    parser.add_argument("--tasks", help="task file or directory (default: the bundled catalog)")
    parser.add_argument("--task", action="append", help="only this task id (repeatable; default: all, round-robin)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one HTTP request may take")
    parser.add_argument("--sample-interval", type=float, default=1.0, help="seconds between memory samples")
    parser.add_argument("--json", type=Path, required=True, help="results, written as each level ends")
    parser.add_argument("--resume", action="store_true", help="keep the levels --json holds; measure the rest")
    args = parser.parse_args()
    backends = args.backend.split(",")
    if unknown := set(backends) - set(BACKENDS):
        parser.error(f"unknown backend(s): {', '.join(sorted(unknown))}")
    if min(args.start, args.max, args.steps, args.episodes, args.repeats, args.ray_nodes) < 1:
        parser.error("--start, --max, --steps, --episodes, --repeats and --ray-nodes must be at least 1")
    args.think = 0.0  # server_load's driver: a closed loop
    if "ray" in backends:
        from ray_backend import rerun_without_network

        if (code := rerun_without_network()) is not None:
            return code
    config = {k: v for k, v in vars(args).items() if k not in ("json", "resume")}
    out: dict[str, Any] = {"config": config, "cpus": os.cpu_count(), "backends": {}}
    if args.resume and args.json.exists():
        out = json.loads(args.json.read_text())
        out["config"] = config

    def save() -> None:
        partial = args.json.with_name(f".{args.json.name}.partial")
        partial.write_text(json.dumps(out, indent=2) + "\n")
        partial.replace(args.json)

    print(HEADER, flush=True)
    try:
        for backend in backends:
            climb(backend, args, out["backends"].setdefault(backend, {}), save)
    except KeyboardInterrupt:
        save()
        print(f"\ninterrupted: the server, cluster and sandboxes were stopped; finished levels are in {args.json}. "
              f"Resume with the same command and --resume.", file=sys.stderr)
        return 130
    print_summary(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
