"""Resource limits for sandboxed process trees: cgroups where we may create them, rlimits always.

``RLIMIT_NPROC`` does not bind root (the uid these machines and CI run as), so processes are
bounded with the pids cgroup controller, and memory with the memory controller; both bound the
whole tree, not one process. Where cgroups cannot be created (no permission, no controller),
per-process rlimits remain and a warning is logged.

CPU: each sandbox has a cpu cgroup of its own, as each Docker container does, so the kernel
shares the CPU between sandboxes, not between processes: a sandbox running 500 busy processes
weighs as one process, not 500, and its neighbours' test runs keep their share.
``ResourceLimits.cpus`` caps it besides (a CFS quota, Docker's ``--cpus``). With cgroup v1 the cpu
cgroups sit at the top of the cpu hierarchy (``patchgym-sb-...``), not under a common parent: a
parent would weigh all sandboxes together as one process against everything else on the host,
the server's own threads included, so a busy host would starve every sandbox at once. With v2
(one tree) they share ``patchgym/``'s weight.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import signal
import time
import uuid
from functools import lru_cache
from pathlib import Path

from patchgym.sandboxes.base import ResourceLimits
from patchgym.sandboxes.process import is_dead_or_exiting
from patchgym.sandboxes.reaper import is_alive, owned_name, owner_of, stale_children

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "patchgym"
CPU_PREFIX = "patchgym-"  # v1 cpu cgroups: top-level, named patchgym-sb-<owner pid>-<random>


CPU_PERIOD_US = 100_000  # the CFS period the quota is counted in (Docker's)


class ProcessGroup:
    """A set of cgroups (pids, memory, cpu) that one sandbox's processes are placed in.

    ``join_fds`` are opened in the parent so that the forked child only has to ``write`` its pid:
    no Python-level file handling happens between fork and exec.
    """

    def __init__(self, limits: ResourceLimits, name: str | None = None) -> None:
        # The owner's pid in the name lets a reaper tell leftovers of dead processes from live ones.
        self.name = name or f"sb-{owned_name(uuid.uuid4().hex[:12])}"
        self.dirs: dict[str, Path] = {}
        self._create(limits)

    @property
    def active(self) -> bool:
        return "pids" in self.dirs

    def _create(self, limits: ResourceLimits) -> None:
        if os.environ.get("PATCHGYM_NO_CGROUPS") == "1":
            return
        unified = (CGROUP_ROOT / "cgroup.controllers").exists()
        if unified:
            self._create_v2(limits)
        else:
            self._create_v1(limits)

    def _create_v1(self, limits: ResourceLimits) -> None:
        for controller, files in {
            "pids": {"pids.max": str(limits.max_processes)},
            "memory": {"memory.limit_in_bytes": str(limits.memory_bytes)},
            "freezer": {},  # lets kill_all stop forks in flight before it kills
            "cpuacct": {},  # CPU time of the whole tree (cost per episode)
            "cpu": {"cpu.shares": "1024", "cpu.cfs_period_us": str(CPU_PERIOD_US),
                    "cpu.cfs_quota_us": str(_quota_us(limits))},  # one sandbox's share, whatever its processes
        }.items():
            path = _v1_path(controller, self.name)
            try:
                path.mkdir(parents=True, exist_ok=True)
                for fname, value in files.items():
                    (path / fname).write_text(value)
            except OSError as exc:
                log.debug("cgroup %s unavailable: %s", path, exc)
                _rmdir_quiet(path)
                continue
            self.dirs[controller] = path

    def _create_v2(self, limits: ResourceLimits) -> None:
        parent = CGROUP_ROOT / CGROUP_PARENT
        path = parent / self.name
        try:
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text("+pids +memory")
            path.mkdir(exist_ok=True)
            (path / "pids.max").write_text(str(limits.max_processes))
            (path / "memory.max").write_text(str(limits.memory_bytes))
        except OSError as exc:
            log.debug("cgroup v2 %s unavailable: %s", path, exc)
            _rmdir_quiet(path)
            return
        self.dirs["pids"] = path
        self.dirs["memory"] = path
        self.dirs["cpuacct"] = path  # cpu.stat is in every v2 cgroup
        try:  # the cpu controller apart: a parent that cannot delegate it still bounds pids and memory
            (parent / "cgroup.subtree_control").write_text("+cpu")
            (path / "cpu.weight").write_text("100")
            (path / "cpu.max").write_text(f"{_quota_us(limits)} {CPU_PERIOD_US}")
            self.dirs["cpu"] = path
        except OSError as exc:
            log.debug("cgroup v2 cpu controller unavailable for %s: %s", path, exc)

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) every process of the group used so far, reaped ones included;
        None without a CPU accounting cgroup."""
        path = self.dirs.get("cpuacct")
        try:
            if path is None:
                return None
            if (path / "cpuacct.usage").exists():
                return int((path / "cpuacct.usage").read_text()) / 1e9
            for line in (path / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def peak_memory_bytes(self) -> int | None:
        """The most memory the group has held at once (None without a memory cgroup, or on a
        kernel that does not record it)."""
        path = self.dirs.get("memory")
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            try:
                return int((path / name).read_text()) if path is not None else None
            except (OSError, ValueError):
                continue
        return None

    def oom_kills(self) -> int | None:
        """How many processes the kernel has killed for the group's memory limit (None where it
        does not say)."""
        path = self.dirs.get("memory")
        for name in ("memory.oom_control", "memory.events"):
            try:
                for line in (path / name).read_text().splitlines() if path is not None else ():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
            except (OSError, ValueError):
                continue
        return None

    def procs_files(self) -> list[str]:
        return sorted({str(p / "cgroup.procs") for p in self.dirs.values()})

    def pids(self) -> set[int]:
        found: set[int] = set()
        for f in self.procs_files():
            try:
                found.update(int(x) for x in Path(f).read_text().split())
            except OSError:
                pass
        return found

    def live_pids(self) -> set[int]:
        """Members that are neither zombies nor already exiting (neither can be killed further)."""
        return {pid for pid in self.pids() if not is_dead_or_exiting(pid)}

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL every process in the group until none is left; True when it emptied.

        Killing while processes fork (a fork bomb) can miss a child created between reading the
        member list and the kill, so the group is frozen first where the kernel allows: frozen
        processes cannot fork, and the killed ones die when it thaws.
        """
        if not self.live_pids():
            return True
        frozen = self._freeze()
        try:
            for pid in self.live_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        finally:
            if frozen:
                self._write("freezer", "freezer.state", "THAWED")
        deadline = time.monotonic() + timeout
        while True:
            pids = self.live_pids()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                log.warning("cgroup %s still has processes %s after kill", self.name, sorted(pids))
                return False
            time.sleep(0.005)

    def _write(self, controller: str, name: str, value: str) -> bool:
        path = self.dirs.get(controller)
        if path is None:
            return False
        try:
            (path / name).write_text(value)
            return True
        except OSError:
            return False

    def _freeze(self, timeout: float = 1.0) -> bool:
        if not self._write("freezer", "freezer.state", "FROZEN"):
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if (self.dirs["freezer"] / "freezer.state").read_text().strip() == "FROZEN":
                    return True
            except OSError:
                return True
            time.sleep(0.001)
        return True  # partly frozen still slows forks down; the kill loop below finishes the job

    def destroy(self) -> None:
        self.kill_all()
        for path in set(self.dirs.values()):
            for _ in range(50):
                if _rmdir_quiet(path):
                    break
                time.sleep(0.01)
        self.dirs.clear()


def _v1_path(controller: str, name: str) -> Path:
    """Where the v1 cgroup ``name`` of ``controller`` goes: under ``patchgym/``, but the cpu one at
    the top (and cpuacct with it where the two share a hierarchy, as systemd mounts them: a process
    is in one cgroup per hierarchy)."""
    if controller == "cpu" or (controller == "cpuacct" and
                               os.path.realpath(CGROUP_ROOT / "cpu") == os.path.realpath(CGROUP_ROOT / "cpuacct")):
        return CGROUP_ROOT / controller / f"{CPU_PREFIX}{name}"
    return CGROUP_ROOT / controller / CGROUP_PARENT / name


def _quota_us(limits: ResourceLimits) -> int:
    """``limits.cpus`` as CPU microseconds per :data:`CPU_PERIOD_US` (at least 1 ms)."""
    return max(1000, int(limits.cpus * CPU_PERIOD_US))


def _rmdir_quiet(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


LAUNCH_FAILED = "patchgym: cannot enter cgroup"
_JOIN_SCRIPT = (
    f'for f do [ "$f" = -- ] && break; echo $$ > "$f" || {{ echo "{LAUNCH_FAILED} $f" >&2; exit 125; }}; shift; done; '
    'shift; exec "$@"'
)


def launcher(limits: ResourceLimits, group: ProcessGroup | None) -> list[str]:
    """A command prefix that enters the group's cgroups, sets rlimits, then execs the command.

    Doing this with two tiny programs (``sh``, ``prlimit``) instead of a Python ``preexec_fn`` lets
    the parent spawn with vfork: a fork of a large Python process costs several milliseconds per
    command, more than the sandbox itself. Children inherit both cgroups and rlimits, and the shell
    joins the cgroups before anything else runs, so no process escapes the bounds.
    """
    procs = group.procs_files() if group is not None and group.active else []
    rlimits = [f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 5}", f"--fsize={limits.file_size_bytes}",
               f"--nofile={_open_files(limits)}", "--core=0"]
    if not procs:  # weaker per-process stand-ins for the cgroup bounds
        rlimits += [f"--as={limits.memory_bytes}", f"--nproc={limits.max_processes}"]
    return ["/bin/sh", "-c", _JOIN_SCRIPT, "patchgym-launch", *procs, "--", _prlimit(), *rlimits, "--"]


def _open_files(limits: ResourceLimits) -> int:
    """``limits.open_files``, or less when this process may not have as many: a sandbox cannot
    raise its hard limit past its starter's (bubblewrap's user namespace lacks the privilege)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return limits.open_files if hard == resource.RLIM_INFINITY else min(limits.open_files, hard)


@lru_cache(maxsize=1)
def _prlimit() -> str:
    found = shutil.which("prlimit")
    if found is None:
        raise RuntimeError("prlimit (util-linux) is required to bound sandboxed processes")
    return found


def reap_stale_cgroups() -> int:
    """Kill and remove patchgym cgroups whose owning process is dead; return how many."""
    removed = 0
    bases = [CGROUP_ROOT / c / CGROUP_PARENT for c in ("pids", "memory", "freezer", "cpuacct")]
    bases.append(CGROUP_ROOT / CGROUP_PARENT)
    stale = [child for base in bases for child in stale_children(base)] + _stale_cpu_groups()
    for child in stale:
        if not child.is_dir():
            continue
        group = ProcessGroup.__new__(ProcessGroup)
        group.name, group.dirs = child.name, {"stale": child}
        group.destroy()
        removed += 1
    return removed


def _stale_cpu_groups() -> list[Path]:
    """Top-level v1 cpu cgroups of patchgym's dead processes (only those named with
    :data:`CPU_PREFIX`: the top of the hierarchy holds everyone's cgroups)."""
    top = CGROUP_ROOT / "cpu"
    if not top.is_dir() or (CGROUP_ROOT / "cgroup.controllers").exists():
        return []
    stale = []
    for child in top.iterdir():
        owner = owner_of(child.name.removeprefix(CPU_PREFIX)) if child.name.startswith(CPU_PREFIX) else None
        if owner is not None and not is_alive(owner):
            stale.append(child)
    return stale
