"""Engine-wide mutual exclusion for builds: the build container's *name* is the mutex.

Images and the runtime volume belong to the engine, not to one ``PATCHGYM_HOME`` or one host, so
a file lock cannot coordinate their builders (other homes, other users, other hosts of a remote
engine). The engine refuses a second container with a name in use, atomically: whoever creates
``patchgym-build-<key>`` builds ``<key>``, and holds it until that container is removed. A builder
that was killed leaves its container behind; the next claimant removes it once its owner (labelled
``<host>:<pid>`` with the pid's start time) is provably gone: a process of this host that no longer
runs. An owner on another host is waited for (it cannot be seen from here).

``PATCHGYM_DOCKER_NAMESPACE`` prefixes every engine-wide name patchgym makes for builds (build
containers, runtime volumes), so that tests and concurrent installations can share one engine
without touching each other's.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

from patchgym.sandboxes.base import EnvironmentBuildError
from patchgym.sandboxes.docker.client import OWNER_LABEL, docker_client, owner_id, remove_container
from patchgym.sandboxes.reaper import is_alive

STARTED_LABEL = "org.patchgym.owner_started"  # the owner's start time (clock ticks since boot)
BUILD_PREFIX = "patchgym-build-"
CLAIM_TIMEOUT = 3 * 3600.0  # the longest a build may hold a name this process waits for


def namespace(raw: str | None = None) -> str:
    """``$PATCHGYM_DOCKER_NAMESPACE`` (or ``raw``) as a name part (``""`` by default)."""
    raw = (os.environ.get("PATCHGYM_DOCKER_NAMESPACE", "") if raw is None else raw).strip().lower()
    cleaned = re.sub(r"[^a-z0-9_.-]+", "-", raw).strip("-.")
    return f"{cleaned}-" if cleaned else ""


def build_name(key: str) -> str:
    """The name of the container that builds ``key``: the engine-wide mutex for that build."""
    return f"{BUILD_PREFIX}{namespace()}{key}"


def _started(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def owner_labels() -> dict[str, str]:
    """Labels naming this process as the owner of a container."""
    return {OWNER_LABEL: owner_id(), STARTED_LABEL: _started(os.getpid()) or ""}


def owner_gone(labels: dict[str, str]) -> bool:
    """Whether the process that owns a container is provably gone: it was of this host and its pid
    runs no more, or runs a process started at another time (the pid was reused)."""
    host, _, pid = (labels.get(OWNER_LABEL) or "").partition(":")
    if host != os.uname().nodename or not pid.isdigit():
        return False
    if not is_alive(int(pid)):
        return True
    started = labels.get(STARTED_LABEL)
    return bool(started) and _started(int(pid)) not in (None, started)


def claim(name: str, create: Callable[[str], object], *, poll: float = 0.5,
          timeout: float = CLAIM_TIMEOUT):
    """Create the build container ``name`` with ``create(name)`` and return it: this process then
    holds the build until it removes the container. While another holds it, its container is
    removed if its owner is gone, else waited for; the caller checks again, once it holds the
    name, whether the build is still needed (the holder may have finished it)."""
    import docker.errors

    deadline = time.monotonic() + timeout
    while True:
        try:
            return create(name)
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise
        try:
            holder = docker_client().containers.get(name)
        except docker.errors.NotFound:
            continue  # released meanwhile
        if owner_gone(holder.labels or {}) and remove_container(holder):
            continue
        if time.monotonic() > deadline:
            raise EnvironmentBuildError(f"{name} is still held by {holder.labels.get(OWNER_LABEL)!r} "
                                        f"after {timeout:.0f}s; remove that container if its owner is gone")
        time.sleep(poll)
