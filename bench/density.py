"""How many idle sandboxes one host holds: start rate, idle memory and close time at N held at once,
beside a floor started the same way in the same run.

* ``local``: N ``LocalSandbox`` held at once, each ready (made, and answered one ``exec("true")``);
  floor: N bare ``bwrap`` processes with the same namespaces and system mounts, each running
  ``sleep infinity`` (ready once its child runs).
* ``docker``: N ``DockerSandbox`` (pool off); floor: N ``docker run -d`` of the same image running
  ``sleep infinity`` with no network.

Levels are cumulative (``--levels 64,256,1024``: start 64, measure, start 192 more, measure, ...),
started by ``--workers`` threads. Per level: ready/s over the segment that reached it, idle MiB per
sandbox (median of up to 32 sampled: local, its memory cgroup's usage (its processes, its tmpfs,
the kernel memory charged to it), or its processes' private memory (USS) plus its tmpfs if that is
more; the bwrap floor, its processes' USS; docker, its container's memory cgroup plus its
containerd-shim's USS, as ``docker_sandbox.py`` counts it) and the host's mount table. Then all
are closed at once by the workers: seconds per sandbox. Each run measures patchgym and the floor, alternating which goes
first; figures are per run and medians of runs, with the load average at each run's start.
Lines of progress go to stderr; the results, also per run as it ends, to ``--json``. Needs root.

    python bench/density.py --backend local --levels 64,256,1024 --runs 3 --json density-local.json
    python bench/density.py --backend docker --levels 64 --runs 3 --json density-docker.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procmem import cgroup_memory, children, load_average, mount_count, shim_of, uss  # noqa: E402

from patchgym import load_task_set  # noqa: E402
from patchgym.tasks.backends import make_sandbox  # noqa: E402

MIB = 1 << 20
SAMPLE = 32


def log(message: str) -> None:
    print(f"[density {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class LocalKind:
    name = "patchgym-local"

    def __init__(self, task) -> None:
        self.task = task

    def start(self):
        sandbox = make_sandbox(self.task, "local")
        sandbox.exec("true")
        return sandbox

    def memory(self, sandbox) -> int:
        """The larger of its memory cgroup's usage (its processes, its tmpfs, the kernel memory
        charged to it: docker's measure) and its processes' USS plus its tmpfs."""
        bwrap = sandbox._init.proc.pid
        used = os.statvfs(Path(f"/proc/{bwrap}/root") / str(sandbox.root).lstrip("/"))  # its tmpfs, in its namespace
        own = sum(uss(p) for p in [bwrap, *children(bwrap)]) + (used.f_blocks - used.f_bfree) * used.f_frsize
        group = sandbox._group.dirs.get("memory") if sandbox._group is not None else None
        for name in ("memory.usage_in_bytes", "memory.current"):
            if group is not None and (group / name).exists():
                return max(own, int((group / name).read_text()))
        return own

    def close(self, sandbox) -> None:
        sandbox.close()


class BwrapFloor:
    name = "bwrap-floor"

    def __init__(self, task) -> None:
        from patchgym.sandboxes.isolation import _system_binds, bwrap_path

        self.argv = [bwrap_path(), "--die-with-parent", "--unshare-all", *_system_binds(), "--proc", "/proc",
                     "--dev", "/dev", "--", "sleep", "infinity"]

    def start(self):
        proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL)
        while not children(proc.pid):
            time.sleep(0.001)
        return proc

    def memory(self, proc) -> int:
        return sum(uss(p) for p in [proc.pid, *children(proc.pid)])

    def close(self, proc) -> None:
        proc.kill()
        proc.wait()


class DockerKind:
    name = "patchgym-docker"

    def __init__(self, task) -> None:
        self.task = task

    def start(self):
        sandbox = make_sandbox(self.task, "docker", pool_size=0)
        sandbox.exec("true")
        return sandbox

    def memory(self, sandbox) -> int:
        return cgroup_memory(sandbox.container.id) + uss(shim_of(sandbox.container.id))

    def close(self, sandbox) -> None:
        sandbox.close()


class DockerFloor(DockerKind):
    name = "docker-run-floor"

    def __init__(self, task) -> None:
        from patchgym.sandboxes.docker.client import KIND_LABEL, MANAGED_LABEL, OWNER_LABEL, docker_client, owner_id

        sandbox = make_sandbox(task, "docker", pool_size=0)
        self.image = sandbox.image
        sandbox.close()
        self.client = docker_client()
        # labelled as a sandbox of this process: `patchgym sandboxes gc` removes any a killed bench leaves
        self.labels = {MANAGED_LABEL: "1", KIND_LABEL: "sandbox", OWNER_LABEL: owner_id()}

    def start(self):
        return self.client.containers.run(self.image, ["sleep", "infinity"], detach=True, network_mode="none",
                                          auto_remove=True, labels=self.labels)

    def memory(self, container) -> int:
        return cgroup_memory(container.id) + uss(shim_of(container.id))

    def close(self, container) -> None:
        container.remove(force=True)


def measure(kind, levels: list[int], workers: int) -> dict:
    """Start ``kind`` up to each level, measure, then close all."""
    held: list = []
    lock = threading.Lock()
    out: dict = {"levels": {}}

    def one(_: int) -> None:
        item = kind.start()
        with lock:
            held.append(item)

    try:
        with ThreadPoolExecutor(workers) as pool:
            for level in levels:
                count = level - len(held)
                begin = time.perf_counter()
                list(pool.map(one, range(count)))
                seconds = time.perf_counter() - begin
                time.sleep(2.0)  # let starts settle before memory is read
                sample = held[:: max(1, len(held) // SAMPLE)][:SAMPLE]
                mib = statistics.median(kind.memory(item) for item in sample) / MIB
                out["levels"][level] = {"ready_per_s": round(count / seconds, 2), "idle_mib": round(mib, 2),
                                        "mounts": mount_count(), "load": load_average()}
                log(f"{kind.name} {level}: {out['levels'][level]}")
            begin = time.perf_counter()
            list(pool.map(kind.close, held))
            out["close_s_per_sandbox"] = round((time.perf_counter() - begin) / len(held), 4)
            out["close_s_total"] = round(time.perf_counter() - begin, 2)
            held.clear()
            log(f"{kind.name} closed: {out['close_s_per_sandbox']} s each")
    finally:
        for item in held:  # interrupted: nothing left behind
            try:
                kind.close(item)
            except Exception as exc:  # noqa: BLE001 - keep closing the rest
                log(f"could not close {item}: {exc}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("local", "docker"), default="local")
    parser.add_argument("--task", default="patchgym__semverkit-1")
    parser.add_argument("--levels", default="64,256,1024")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    levels = sorted(int(n) for n in args.levels.split(","))
    task = load_task_set().get(args.task)
    kinds = [LocalKind(task), BwrapFloor(task)] if args.backend == "local" else [DockerKind(task), DockerFloor(task)]
    runs = []
    try:
        for run in range(args.runs):
            order = kinds if run % 2 == 0 else kinds[::-1]
            result = {"load_at_start": load_average()}
            for kind in order:
                result[kind.name] = measure(kind, levels, args.workers)
            runs.append(result)
            if args.json:
                args.json.write_text(json.dumps({"levels": levels, "runs": runs}, indent=2) + "\n")
    except KeyboardInterrupt:
        log(f"interrupted after {len(runs)} whole run(s) (kept in --json); run again to measure more")
        raise SystemExit(130) from None
    summary = {}
    for kind in kinds:
        for level in levels:
            for key in ("ready_per_s", "idle_mib", "mounts"):
                values = [r[kind.name]["levels"][level][key] for r in runs]
                summary[f"{kind.name} {level} {key}"] = (statistics.median(values), values)
        values = [r[kind.name]["close_s_per_sandbox"] for r in runs]
        summary[f"{kind.name} close_s_per_sandbox"] = (statistics.median(values), values)
    for key, (median, values) in summary.items():
        print(f"{key:<48} median {median:<10} runs {values}")
    print(f"load average at each run's start: {[r['load_at_start'] for r in runs]}")


if __name__ == "__main__":
    main()
