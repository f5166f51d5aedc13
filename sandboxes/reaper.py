"""Finding and removing what crashed processes left behind.

Everything a process creates on the host (sandbox directories, its /etc copy, build directories,
cgroups) is named ``<owner pid>-<random>``, and so is a cache entry's staging copy (a checkout, a
mirror, the shared /etc copy, made under a hidden name and renamed into place), so a reaper can
tell leftovers of dead processes from the live ones of any process, this one included. A sandbox
directory may still have its tmpfs and overlay mounted: they are unmounted first, and a tree that
stays mounted is never deleted.
"""

from __future__ import annotations

import os
from pathlib import Path

OWNED_DIRS = ("sandboxes", "etc", "builds", "bridges")  # bridges: harness episodes (rollouts.harnesses)
# Caches whose entries are made under a staging name (:func:`staging_path`) and renamed into place.
STAGING_DIRS = ("runtime", "etc-shared", "mirrors", "checkouts", "python")


def owned_name(suffix: str) -> str:
    return f"{os.getpid()}-{suffix}"


def staging_path(target: Path) -> Path:
    """Where ``target`` is made before it is renamed into place: beside it, hidden, named for this
    process (``.<name>.<pid>-<random>``), so that a dead maker's half-made copy can be told from a
    live one's (:func:`stale_children`)."""
    return target.with_name(f".{target.name}.{owned_name(os.urandom(4).hex())}")


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


def stale_children(root: Path, *, staging: bool = False) -> list[Path]:
    """Entries of ``root`` whose owner process is dead: those named for it (:func:`owned_name`),
    or with ``staging``, only the staging copies (:func:`staging_path`) among a cache's entries."""
    if not root.is_dir():
        return []
    out = []
    for child in root.iterdir():
        if staging and not child.name.startswith("."):
            continue
        owner = owner_of(child.name.rsplit(".", 1)[-1] if staging else child.name)
        if owner is not None and not is_alive(owner):
            out.append(child)
    return out
