"""A neighbour's step under another local sandbox's CPU burn: does one session slow another's?

Two local sandboxes on a bundled task: the neighbour, a ``RepoEnv`` (what the server drives),
takes bash steps (``--steps`` of each kind: ``echo``, and ``cpu``, a python3 loop of ~0.1 s, the
kind of work a test run is; under the burn, fewer when they pass ``--budget`` seconds in all)
idle, then while the other sandbox burns CPU (``--burn``: busy loops,
a fork bomb, held at its pids limit and killed within seconds, or an output flood); the
neighbour's p50/p99 both ways, the ratio of its p99 under the burn to idle, and the CPUs the
burner used meanwhile (``--burner-cpus``: its ``ResourceLimits.cpus``, the cpu cgroup's quota).

``--in-service-cgroup``: each run's process (and so the neighbour's sandbox, and a sandbox with no
cpu cgroup of its own) is first moved into a cpu cgroup of its own, as ``patchgym serve`` runs
under systemd, in a container or in a Kubernetes pod. Without it the run stays in the root cgroup,
where a kernel with ``sched_autogroup_enabled`` already shares the CPU per session (setsid) rather
than per process, which hides what the cgroups do; with it, autogroup does not apply.

Each run is a child process of its tree's Python: this tree's (``this``), and with
``--peer-python`` another tree's too (``peer``: e.g. main's venv, whose sandboxes have no cpu
cgroup), the two alternating ``--repeats`` times, so both are measured minutes apart at most on
the same machine. Medians over the runs.

    python bench/cpu_share.py [--burn loops] [--burners 200] [--steps 30] [--repeats 3] [--in-service-cgroup]
                              [--peer-python PEER/bin/python]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

BURNS = {  # what the burning sandbox runs (bounded by its own limits: pids, output, time)
    # the loops start together (each spawned while the others still sleep) and stay under the pids limit
    "loops": "for i in $(seq {n}); do (sleep 2; exec sh -c 'while :; do :; done') & done; wait",
    "forkbomb": "f() {{ while :; do (f &) 2>/dev/null; done; }}; f",
    "flood": "yes 'an output flood' | head -c 5000000000",
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


STEPS = {  # the neighbour's step: a shell builtin, or some CPU work (a test run's kind of step)
    "echo": "echo {i}",
    "cpu": "python3 -c 'print(sum(range(2_000_000)) * 0 + {i})'",
}


def steps_of(env, kind: str, steps: int, budget: float = math.inf) -> list[float]:
    """The wall time of ``steps`` steps of ``kind``, fewer when they take more than ``budget`` seconds
    in all (a starved neighbour's would take many minutes)."""
    times: list[float] = []
    deadline = time.monotonic() + budget
    for i in range(steps):
        if time.monotonic() > deadline:
            break
        start = time.perf_counter()
        observation, _, done, _, info = env.step({"name": "bash", "arguments": {"command": STEPS[kind].format(i=i)}})
        times.append(time.perf_counter() - start)
        assert info["exit_code"] == 0 and observation.startswith(str(i)) and not done, observation
    return times


@contextlib.contextmanager
def service_cgroup():
    """This process in a cpu cgroup of its own for the block (v1: the cpu hierarchy's; v2: the
    unified one), as a service manager or a container runtime would put the server; removed after."""
    root = Path("/sys/fs/cgroup")
    base = root if (root / "cgroup.controllers").exists() else root / "cpu"
    path = base / f"bench-service-{os.getpid()}"
    path.mkdir()
    try:
        (path / "cgroup.procs").write_text(str(os.getpid()))
        yield
    finally:
        (base / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(100):  # the sandboxes' processes may take a moment to go
            with contextlib.suppress(OSError):
                path.rmdir()
                break
            time.sleep(0.05)


def one_run(burn: str, burners: int, steps: int, burner_cpus: float | None, budget: float) -> dict:
    """In the child: the neighbour's steps of each kind idle, then under the burn."""
    from patchgym.gym_envs.repo_env import RepoEnv
    from patchgym.sandboxes import ResourceLimits
    from patchgym.sandboxes.base import usage_of
    from patchgym.tasks.backends import make_sandbox

    neighbour = RepoEnv(max_steps=2 * len(STEPS) * steps + 10)
    neighbour.reset(seed=0)
    burner = make_sandbox(neighbour.task, limits=ResourceLimits(cpus=burner_cpus) if burner_cpus else None)
    try:
        steps_of(neighbour, "echo", 3)  # warm
        idle = {kind: steps_of(neighbour, kind, steps) for kind in STEPS}
        def burning() -> None:  # until the sandbox closes (the timeout only bounds a run that hangs)
            with contextlib.suppress(Exception):
                burner.exec(BURNS[burn].format(n=burners), timeout=1800)

        thread = threading.Thread(target=burning, daemon=True)
        thread.start()
        time.sleep(4)  # the burn ramps up
        cpu_before, wall_before = usage_of(burner).cpu_seconds, time.monotonic()
        burned = {kind: steps_of(neighbour, kind, steps, budget) for kind in STEPS}
        cpu_after, wall_after = usage_of(burner).cpu_seconds, time.monotonic()
    finally:
        neighbour.close()
        burner.close()
    figures = {"burner_cpus_used": round((cpu_after - cpu_before) / (wall_after - wall_before), 2)
                                   if cpu_before is not None and cpu_after is not None else None}
    for kind in STEPS:
        for when, values in (("idle", idle[kind]), ("burn", burned[kind])):
            figures[f"{kind}_{when}_p50_ms"] = round(percentile(values, 50) * 1000, 1)
            figures[f"{kind}_{when}_p99_ms"] = round(percentile(values, 99) * 1000, 1)
        figures[f"{kind}_burn_steps"] = len(burned[kind])
        figures[f"{kind}_p99_ratio"] = round(percentile(burned[kind], 99) / percentile(idle[kind], 99), 2)
    return figures


def run_child(python: str, args: argparse.Namespace) -> dict:
    extra = ["--burner-cpus", str(args.burner_cpus)] if args.burner_cpus else []
    extra += ["--in-service-cgroup"] if args.in_service_cgroup else []
    extra += ["--budget", str(args.budget)]
    out = subprocess.run([python, str(Path(__file__).resolve()), "--child", "--burn", args.burn, "--burners",
                          str(args.burners), "--steps", str(args.steps), *extra], capture_output=True, text=True,
                         timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{python}: the run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burn", choices=sorted(BURNS), default="loops",
                        help="what the burning sandbox runs: busy loops, a fork bomb (its pids limit bounds it), "
                             "or a 5 GB output flood")
    parser.add_argument("--burners", type=int, default=200, help="busy processes of --burn loops")
    parser.add_argument("--burner-cpus", type=float, help="the burning sandbox's ResourceLimits.cpus (default 2)")
    parser.add_argument("--steps", type=int, default=30, help="steps of each kind, idle and under the burn")
    parser.add_argument("--budget", type=float, default=90,
                        help="seconds each kind's steps under the burn may take in all (fewer steps past it)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peer-python", help="another tree's Python, measured alternately (e.g. main's venv)")
    parser.add_argument("--in-service-cgroup", action="store_true",
                        help="run each run's process in a cpu cgroup of its own, as under systemd or in a container")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with service_cgroup() if args.in_service_cgroup else contextlib.nullcontext():
            figures = one_run(args.burn, args.burners, args.steps, args.burner_cpus, args.budget)
        print(json.dumps(figures))
        return
    trees = {"this": sys.executable, **({"peer": args.peer_python} if args.peer_python else {})}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(args.repeats):
        for name, python in (trees.items() if r % 2 == 0 else reversed(list(trees.items()))):
            result = run_child(python, args)
            runs[name].append(result)
            print(f"run {r + 1} {name}: {result}", file=sys.stderr, flush=True)
    summary = {name: {key: statistics.median(run[key] for run in results) if results[0][key] is not None else None
                      for key in results[0]} for name, results in runs.items()}
    where = "in a service cgroup" if args.in_service_cgroup else "in the root cgroup"
    print(f"cpu_share: --burn {args.burn}, {args.steps} steps of each kind, {where}, medians of {args.repeats} runs; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for name, f in summary.items():
        print(f"  {name:5} the burner used {f['burner_cpus_used']} CPUs")
        for kind in STEPS:
            print(f"  {name:5} {kind:5} idle p50/p99 {f[f'{kind}_idle_p50_ms']}/{f[f'{kind}_idle_p99_ms']} ms   "
                  f"burn p50/p99 {f[f'{kind}_burn_p50_ms']}/{f[f'{kind}_burn_p99_ms']} ms   "
                  f"p99 burn/idle {f[f'{kind}_p99_ratio']} ({f[f'{kind}_burn_steps']} steps under the burn)")
    if args.json:
        given = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"args": given, "runs": runs, "median": summary}, indent=2) + "\n")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted (each run closes its sandboxes)", file=sys.stderr)
        sys.exit(130)
