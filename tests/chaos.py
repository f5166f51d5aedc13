"""Chaos driver: SIGKILL ``patchgym eval`` or ``patchgym run`` at random moments, then run it to
completion, and check that the finished report is a clean run's and that nothing is left behind.

    python -m tests.chaos --command eval|run --backend local|docker --rounds N --max-delay D \\
        --seed S --work DIR [--tasks FILE] [--instance-ids A,B] [--workers W]

Each round starts the command in a session of its own, waits a random time (seeded: the same
seed gives the same kill times, not the same kill *points*, which depend on load) and SIGKILLs the
command's own process only: what it started must die with it. Then the command runs to completion
with the same home and output, and must give a clean report: every gold task resolved, none
masked. Last, nothing of the killed runs may remain: no process (by its environment or command
line naming the run's home), mount under the home, cgroup, build directory or sandbox of a killed
pid, and on Docker no container owned by a killed pid and no build container of the run's
namespace. ``run`` talks to a scripted endpoint (:mod:`tests.fake_openai`) that applies each
task's gold patch and submits.

``DIR`` holds the home (``DIR/home``, a fresh ``PATCHGYM_HOME`` unless ``--home`` names one), the
output (``DIR/out``) and each round's log. Exit status 0 when every check holds; the findings are
printed as one JSON object either way. :func:`chaos` is what ``tests/test_chaos.py`` calls.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTLE = 20.0  # the longest the kernel and the engine may take to end what a killed run started


@dataclass
class Outcome:
    rounds: list[dict] = field(default_factory=list)  # each: delay, killed pid or finished first
    report: dict = field(default_factory=dict)  # what the completed run's report says
    problems: list[str] = field(default_factory=list)
    leftovers: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems and not any(self.leftovers.values())


def _gold_scripts(task_set) -> dict[str, list]:
    from tests.fake_openai import call

    return {task.problem_statement[:200]: [
        call("bash", {"command": f"printf %s {shlex.quote(task.patch)} | git apply"}), call("submit", {})]
        for task in task_set}


@contextmanager
def _endpoint(command: str, tasks: Path | None, ids: list[str]) -> Iterator[str | None]:
    """A scripted OpenAI-compatible endpoint for ``run`` (None for ``eval``)."""
    if command != "run":
        yield None
        return
    from patchgym.tasks.catalog import load_task_set
    from tests.fake_openai import FakeModel
    from tests.serving import serve

    task_set = load_task_set(tasks).select(ids or None)
    model = FakeModel()
    model.scripts = _gold_scripts(task_set)
    with serve(model.app) as url:
        yield f"{url}/v1"


def _argv(command: str, backend: str, out: Path, tasks: Path | None, ids: list[str], workers: int,
          base_url: str | None) -> list[str]:
    argv = [sys.executable, "-m", "patchgym.cli"]
    if command == "eval":
        argv += ["eval", "--predictions", "gold", "--output", str(out), "--backend", backend]
    else:
        argv += ["run", "--model", "gold", "--base-url", str(base_url), "--output", str(out), "--backend", backend]
    argv += ["--workers", str(workers)]
    if tasks is not None:
        argv += ["--tasks", str(tasks)]
    if ids:
        argv += ["--instance-ids", ",".join(ids)]
    return argv


def _check_report(command: str, out: Path, expected: int, outcome: Outcome) -> None:
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError) as exc:
        outcome.problems.append(f"no whole report: {exc}")
        return
    if command == "eval":
        outcome.report = {k: report.get(f"{k}_instances") for k in ("total", "resolved", "error")}
        if (report.get("resolved_instances"), report.get("error_instances")) != (expected, 0):
            outcome.problems.append(f"not a clean report: {outcome.report}, errors: {report.get('error_ids')}")
    else:
        outcome.report = {k: report.get(k) for k in ("total", "scored", "resolved", "masked")}
        if (report.get("resolved"), report.get("masked")) != (expected, 0):
            outcome.problems.append(f"not a clean report: {outcome.report}")


def _processes(home: Path, spared: set[int]) -> list[str]:
    """Live processes whose environment or command line names ``home``."""
    needle = str(home).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in (b"Z", b"X") and (needle in cmdline or needle in environ):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]
            found.append(f"{entry.name}: {command}")
    return found


def _owned(root: Path, pids: set[int]) -> list[str]:
    if not root.is_dir():
        return []
    return [str(p) for p in root.iterdir() if p.name.removeprefix("sb-").split("-", 1)[0] in {str(i) for i in pids}]


def _leftovers(home: Path, killed: set[int], backend: str, namespace: str) -> dict[str, list[str]]:
    from patchgym.sandboxes.limits import CGROUP_PARENT, CGROUP_ROOT

    spared = {os.getpid(), os.getppid()}
    found: dict[str, list[str]] = {"processes": _processes(home, spared)}
    found["mounts"] = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                       if str(home) in line.split()[4]]
    cgroups: list[str] = []
    for base in [CGROUP_ROOT / CGROUP_PARENT, *(CGROUP_ROOT / c / CGROUP_PARENT for c in ("pids", "memory"))]:
        cgroups += _owned(base, killed)
    found["cgroups"] = cgroups
    found["directories"] = [p for kind in ("sandboxes", "builds", "etc") for p in _owned(home / kind, killed)]
    if backend == "docker":
        from patchgym.sandboxes.docker.build_mutex import BUILD_PREFIX
        from patchgym.sandboxes.docker.build_mutex import namespace as name_part
        from patchgym.sandboxes.docker.client import MANAGED_LABEL, OWNER_LABEL, docker_client

        client = docker_client()
        host = os.uname().nodename
        owners = {f"{host}:{pid}" for pid in killed}
        containers = client.containers.list(all=True, filters={"label": f"{MANAGED_LABEL}=1"}, ignore_removed=True)
        found["containers"] = [f"{c.name} ({c.labels.get(OWNER_LABEL)})" for c in containers
                               if c.labels.get(OWNER_LABEL) in owners or c.name.startswith(BUILD_PREFIX + name_part(namespace))]
        found["volumes"] = [v.name for v in client.volumes.list(filters={"dangling": True})
                            if (v.attrs.get("Labels") or {}).get(MANAGED_LABEL) == "1"
                            and not v.name.startswith("patchgym-runtime-")]
    return found


def chaos(*, command: str, backend: str, rounds: int, max_delay: float, seed: int, work: Path,
          tasks: Path | None = None, ids: list[str] | None = None, workers: int = 2,
          home: Path | None = None, min_delay: float = 0.5, timeout: float = 3600) -> Outcome:
    """Kill ``command`` ``rounds`` times at random, complete it, and say what was found."""
    ids = ids or []
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    home = (home or work / "home").resolve()
    out = work / "out"
    env = {**os.environ, "PATCHGYM_HOME": str(home), "PYTHONPATH": str(ROOT)}
    own_namespace = "PATCHGYM_DOCKER_NAMESPACE" not in env
    env.setdefault("PATCHGYM_DOCKER_NAMESPACE", f"chaos-{seed}")
    rng = random.Random(seed)
    outcome = Outcome()
    killed: set[int] = set()
    endpoint = _endpoint(command, tasks, ids) if command == "run" else nullcontext(None)
    with endpoint as base_url:
        argv = _argv(command, backend, out, tasks, ids, workers, base_url)
        for index in range(rounds):
            delay = rng.uniform(min_delay, max(min_delay, max_delay))
            with (work / f"round-{index}.log").open("wb") as log:
                proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    code = proc.wait(timeout=delay)
                    outcome.rounds.append({"delay": round(delay, 2), "finished_first": code})
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)  # the command alone: its children must follow it
                    proc.wait()
                    killed.add(proc.pid)
                    outcome.rounds.append({"delay": round(delay, 2), "killed": proc.pid})
        with (work / "final.log").open("wb") as log:
            final = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, timeout=timeout)
        if final.returncode != 0:
            outcome.problems.append(f"the completing run exited {final.returncode} (see {work / 'final.log'})")
    from patchgym.tasks.catalog import load_task_set

    _check_report(command, out, len(load_task_set(tasks).select(ids or None)), outcome)
    # Bounded wait for the kernel and the engine (a loaded host delays them): the check is what
    # remains at the end, not how fast it went.
    deadline = time.monotonic() + SETTLE
    while True:
        outcome.leftovers = _leftovers(home, killed, backend, env["PATCHGYM_DOCKER_NAMESPACE"])
        if not any(outcome.leftovers.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if backend == "docker" and own_namespace:  # the runtime volume of the namespace made for the run
        from patchgym.sandboxes.docker.build_mutex import namespace as name_part
        from patchgym.sandboxes.docker.client import docker_client

        prefix = "patchgym-runtime-" + name_part(env["PATCHGYM_DOCKER_NAMESPACE"])
        for volume in docker_client().volumes.list(filters={"name": prefix}):
            if volume.name.startswith(prefix):
                volume.remove(force=True)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--command", choices=("eval", "run"), required=True)
    parser.add_argument("--backend", choices=("local", "docker"), default="local")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--max-delay", type=float, default=20.0, help="Longest wait before a kill (s).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, required=True, help="Directory for the home, output and logs.")
    parser.add_argument("--tasks", type=Path, default=None, help="Task file (default: the bundled catalog).")
    parser.add_argument("--instance-ids", default="", help="Comma-separated instance ids (default: all).")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--home", type=Path, default=None, help="PATCHGYM_HOME to use (default: DIR/home).")
    args = parser.parse_args(argv)
    outcome = chaos(command=args.command, backend=args.backend, rounds=args.rounds, max_delay=args.max_delay,
                    seed=args.seed, work=args.work, tasks=args.tasks,
                    ids=[i for i in args.instance_ids.split(",") if i], workers=args.workers, home=args.home)
    print(json.dumps({"ok": outcome.ok, **asdict(outcome)}, indent=2))
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
