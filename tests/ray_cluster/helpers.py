"""What the ray cluster tests (and bench/ray_backend.py) share: the bundled environments built before
entering a namespace without network, and finding the processes a test command left running."""

from __future__ import annotations

import os
from pathlib import Path

SLOTS_PER_NODE = 3


def interfaces() -> list[str]:
    """The network interfaces of this process's network namespace (["lo"]: loopback only)."""
    import socket

    return sorted(name for _, name in socket.if_nameindex())


def processes_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (a command's unique argument)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def commands_of(pids: list[int]) -> list[str]:
    """Each pid's command line, for a failure message."""
    out = []
    for pid in pids:
        try:
            out.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            out.append(f"{pid}: gone")
    return out


def build_environments() -> None:
    """Build each bundled environment once (on a throw-away local sandbox), while there is a network:
    the cluster's nodes then find them in the cache they share with this process."""
    from patchgym.tasks.backends import make_sandbox
    from patchgym.tasks.catalog import load_task_set

    built = set()
    for task in load_task_set():
        if task.environment.to_spec() not in built:
            make_sandbox(task, "local").close()
            built.add(task.environment.to_spec())
