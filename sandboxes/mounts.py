"""Disk-bounded local workspaces: a size- and inode-limited tmpfs under an overlay of the checkout.

A sandbox's root is a tmpfs of ``disk_bytes`` and ``disk_files`` holding everything its commands can
write: the overlay's upper and work directories (what the agent adds or changes in the workspace)
and its ``/tmp``. The workspace is an overlayfs whose lower layer is the shared pristine checkout,
which no sandbox can modify: the quota counts only what the agent adds, no per-sandbox copy of the
repository is made, and the host's page cache serves every sandbox's reads of the same checkout.
Writes past the quota fail inside the sandbox with ENOSPC.

Mounting needs root (CAP_SYS_ADMIN) and overlayfs; elsewhere the caller falls back to a plain copy,
whose disk use is not bounded. Mounts outlive a killed process, so :func:`remove_tree` (used by
``close()`` and by the reaper) unmounts before deleting, and never deletes across a mount.

Where sandboxes run in namespaces, the two mounts are made in a mount namespace of the sandbox's
own (:func:`private_mounts_prefix`), not the host's: every mount on the host is copied into every
new namespace and read through ``/proc/self/mountinfo`` by bubblewrap, which made a sandbox's start
cost grow with the number of sandboxes (about 0.2 ms per host mount: +400 ms at 1,024 sandboxes).
There they vanish with the namespace, when its last process ends: nothing to unmount at close.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import threading
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

MS_NOSUID, MS_NODEV = 0x2, 0x4
MNT_DETACH = 0x2
UNSAFE_IN_OPTIONS = (",", ":", "\\", "\n")  # overlayfs option syntax; such paths cannot be mounted
_libc = ctypes.CDLL(None, use_errno=True)
_probe_lock = threading.Lock()


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount_tmpfs(target: Path, size: int, inodes: int) -> None:
    """Mount a tmpfs of at most ``size`` bytes and ``inodes`` files at ``target``."""
    options = f"size={size},nr_inodes={inodes},mode=0755".encode()
    _check(_libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", MS_NOSUID | MS_NODEV, options),
           f"mount tmpfs on {target}")


def mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    """Mount ``lower`` (never written) with ``upper`` on top at ``target``."""
    options = _overlay_options(lower, upper, work).encode()
    _check(_libc.mount(b"overlay", os.fsencode(target), b"overlay", MS_NOSUID | MS_NODEV, options),
           f"mount overlay on {target}")


def _overlay_options(lower: Path, upper: Path, work: Path) -> str:
    paths = [str(p) for p in (lower, upper, work)]
    if any(c in p for p in paths for c in UNSAFE_IN_OPTIONS):
        raise OSError(f"cannot name {paths} in overlayfs options")
    return f"lowerdir={paths[0]},upperdir={paths[1]},workdir={paths[2]}"


# $1 size, $2 inodes, $3 root, $4 the overlay's options, then the command: run by unshare(1) in a
# new mount namespace whose mounts propagate nowhere.
_PRIVATE_MOUNTS = (
    'set -e; size=$1 inodes=$2 root=$3 options=$4; shift 4; '
    'mount -t tmpfs -o "size=$size,nr_inodes=$inodes,mode=0755,nosuid,nodev" tmpfs "$root"; '
    'mkdir "$root/upper" "$root/work" "$root/testbed" "$root/tmp"; chmod 1777 "$root/tmp"; '
    'mount -t overlay -o "$options,nosuid,nodev" overlay "$root/testbed"; exec "$@"'
)


@lru_cache(maxsize=1)
def _private_mount_tools() -> tuple[str, str] | None:
    """util-linux's unshare (to make the namespace) and mount; nsenter (git runs there for diffs)."""
    unshare, mount, nsenter = shutil.which("unshare"), shutil.which("mount"), shutil.which("nsenter")
    return (unshare, mount) if unshare and mount and nsenter else None


def private_mounts_prefix(root: Path, lower: Path, size: int, inodes: int) -> list[str] | None:
    """A command prefix that makes a new mount namespace (private propagation), mounts there a
    tmpfs of ``size`` bytes and ``inodes`` files at ``root`` with ``root/tmp`` and the overlay of
    ``lower`` at ``root/testbed``, then execs the command; None without util-linux's ``unshare``,
    ``mount`` and ``nsenter``."""
    tools = _private_mount_tools()
    if tools is None:
        return None
    options = _overlay_options(lower, root / "upper", root / "work")
    return [tools[0], "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _PRIVATE_MOUNTS,
            "patchgym-mounts", str(size), str(inodes), str(root), options]


def mounts_under(root: Path) -> list[Path]:
    """Mount points at or below ``root``, deepest first."""
    top = os.path.realpath(root)
    found = []
    with open("/proc/self/mountinfo", "rb") as fh:
        for line in fh:
            point = _unescape(line.split()[4])
            if point == top or point.startswith(top.rstrip("/") + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _unescape(field: bytes) -> str:
    """Mount points in mountinfo escape space, tab, newline and backslash as octal."""
    out, i = bytearray(), 0
    while i < len(field):
        if field[i:i + 1] == b"\\" and field[i + 1:i + 4].isdigit():
            out.append(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return os.fsdecode(bytes(out))


def unmount_all(root: Path) -> bool:
    """Detach every mount at or below ``root`` (deepest first); True when none is left.

    A lazy (detaching) unmount takes the mount out of the tree at once even if something still
    holds it open, so what lies below is the plain directory again.
    """
    for point in mounts_under(root):
        if _libc.umount2(os.fsencode(point), MNT_DETACH) != 0:
            log.warning("cannot unmount %s: %s", point, os.strerror(ctypes.get_errno()))
    return not mounts_under(root)


def remove_tree(root: Path) -> bool:
    """Unmount everything under ``root``, then delete it (or the file or link ``root`` is); True
    when it is gone.

    ``shutil.rmtree`` descends into mount points, so a tree that still has a mount in it is left
    alone (and logged): a leftover mount must never turn a cleanup into a deletion of what is
    mounted there.
    """
    if root.is_symlink() or root.is_file():
        try:
            root.unlink()
        except FileNotFoundError:
            pass
        return True
    if not root.exists():
        return True
    if not unmount_all(root):
        log.error("not removing %s: still mounted: %s", root, ", ".join(map(str, mounts_under(root))))
        return False
    shutil.rmtree(root, ignore_errors=True)
    return not root.exists()


def quota_unavailable_reason() -> str | None:
    """Why disk-bounded workspaces cannot be made here, or None when they can (probed once)."""
    with _probe_lock:
        return _probe()


@lru_cache(maxsize=1)
def _probe() -> str | None:
    if os.environ.get("PATCHGYM_NO_QUOTA") == "1":
        return "PATCHGYM_NO_QUOTA=1"
    if os.geteuid() != 0:
        return "mounting a tmpfs and an overlay needs root"
    from patchgym.sandboxes.paths import cache_dir
    from patchgym.sandboxes.reaper import owned_name

    probe = cache_dir("sandboxes") / owned_name(f"quota-probe-{os.urandom(4).hex()}")
    probe.mkdir()
    try:
        mount_tmpfs(probe, 1 << 20, 64)
        for name in ("lower", "upper", "work", "merged"):
            (probe / name).mkdir()
        mount_overlay(probe / "lower", probe / "upper", probe / "work", probe / "merged")
        return None
    except OSError as exc:
        return str(exc)
    finally:
        remove_tree(probe)
