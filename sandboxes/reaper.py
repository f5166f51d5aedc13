"""Finding and removing what crashed processes left behind.

Everything a process creates on the host (sandbox directories, its /etc copy, build directories,
cgroups) is named ``<owner pid>-<random>``, so a reaper can tell leftovers of dead processes from
the live ones of any process, this one included. A sandbox directory may still have its tmpfs and
overlay mounted: they are unmounted first, and a tree that stays mounted is never deleted.
"""

from __future__ import annotations

import os
from pathlib import Path

OWNED_DIRS = ("sandboxes", "etc", "builds")


def owned_name(suffix: str) -> str:
    return f"{os.getpid()}-{suffix}"


def owner_of(name: str) -> int | None:
    head = name.removeprefix("sb-").split("-", 1)[0]
    return int(head) if head.isdigit() else None


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def stale_children(root: Path) -> list[Path]:
    """Entries of ``root`` whose owner process is dead."""
    if not root.is_dir():
        return []
    out = []
    for child in root.iterdir():
        owner = owner_of(child.name)
        if owner is not None and not is_alive(owner):
            out.append(child)
    return out
