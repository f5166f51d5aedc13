"""What processes and containers hold of the host's memory, for the benches (root reads every process)."""

from __future__ import annotations

import glob
import os
import statistics
import time
from pathlib import Path


def _rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup in bytes."""
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh.readlines()[1:]:
            key, _, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    return values


def uss(pid: int) -> int:
    """The pages only this process holds (private clean + dirty)."""
    rollup = _rollup(pid)
    return rollup["Private_Clean"] + rollup["Private_Dirty"]


def pss(pid: int) -> int:
    return _rollup(pid)["Pss"]


def pids_named(name: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as fh:
                    if fh.read().strip() == name:
                        found.append(int(entry))
            except OSError:
                pass
    return found


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's)."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found += [int(c) for c in fh.read().split()]
    except OSError:
        pass
    return found


def engine_uss() -> int:
    """dockerd's and containerd's private memory: the median of a few looks (their Go heaps move)."""
    looks = []
    for _ in range(5):
        looks.append(sum(uss(pid) for name in ("dockerd", "containerd") for pid in pids_named(name)))
        time.sleep(0.3)
    return int(statistics.median(looks))


def shims() -> dict[str, int]:
    """Container id -> its containerd-shim's pid, in one pass over /proc (the shim's ``-id`` argument)."""
    found = {}
    for pid in pids_named("containerd-shim"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "-id" in argv[:-1]:
            found[argv[argv.index("-id") + 1]] = pid
    return found


def shim_of(container_id: str) -> int:
    if (pid := shims().get(container_id)) is None:
        raise RuntimeError(f"no containerd-shim for {container_id[:12]}")
    return pid


def cgroup_memory(container_id: str) -> int:
    for pattern in (f"/sys/fs/cgroup/memory/docker/{container_id}/memory.usage_in_bytes",
                    f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.current",
                    f"/sys/fs/cgroup/docker/{container_id}/memory.current"):
        for path in glob.glob(pattern):
            return int(Path(path).read_text())
    raise RuntimeError(f"no memory cgroup found for {container_id[:12]}")


def load_average() -> float:
    return round(os.getloadavg()[0], 1)


def mount_count() -> int:
    with open("/proc/self/mountinfo", "rb") as fh:
        return sum(1 for _ in fh)
