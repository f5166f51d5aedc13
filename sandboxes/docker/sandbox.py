"""The Docker backend: one container per sandbox, from cached layered images.

Each container runs with no network, memory/CPU/pids limits, patchgym's ownership labels, and a
hard lifetime the container enforces itself (its main process is ``sleep LIFETIME`` under Docker's
init, and it is removed when that ends), so a killed client cannot leave it running forever.
Every place the command user can write (/testbed, /tmp, /var/tmp, /dev/shm, /run/lock) is a tmpfs
with a size and an inode limit that the engine sets up: past them writes fail with ENOSPC, and the
container's writable layer on the host's disk is root's alone. (A Docker volume of the local
driver with tmpfs options would be the other engine-enforced bound, but the engine does not fill
such a volume from the image: it starts empty, like a tmpfs mount, which needs no cleanup.)
Commands go through one long-lived in-container command server (see ``agent.py``), not one
``docker exec`` per command. ``reset()`` restores the pristine tree in place.
"""

from __future__ import annotations

import atexit
import base64
import logging
import posixpath
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

from ..base import ClosesItself, ExecResult, PathOutsideWorkspaceError, SandboxClosedError, SandboxError, WorkspaceError
from ..gitops import DIFF_LIMIT
from ..limits import ResourceLimits
from ..local import SandboxSpec
from ..output import DEFAULT_OUTPUT_LIMIT
from .client import (
    KIND_LABEL,
    MANAGED_LABEL,
    OWNER_LABEL,
    TESTBED_BYTES_LABEL,
    TESTBED_FILES_LABEL,
    docker_client,
    owner_id,
)
from .connection import AGENT_DIR, AgentConnection, agent_archive

log = logging.getLogger(__name__)

WORKDIR = "/testbed"
DEFAULT_LIFETIME = 6 * 3600
GRACE = 30.0  # beyond a command's own timeout before the server counts as hung
# (repo, commit, environment, release) -> instance image tag: resolving it asks the engine about
# three images and hashes the spec, which costs far more than a container from the warm pool.
_images: dict[tuple, str] = {}
SMALL_SCRATCH = (64 << 20, 10_000)  # bytes, inodes at most for /dev/shm and /run/lock (Docker's shm is 64 MiB)


@lru_cache(maxsize=256)
def _testbed_usage(image: str) -> tuple[int, int]:
    """The bytes and inodes of the image's /testbed, measured when it was built."""
    labels = docker_client().images.get(image).labels or {}
    try:
        return int(labels[TESTBED_BYTES_LABEL]), int(labels[TESTBED_FILES_LABEL])
    except (KeyError, ValueError):
        raise SandboxError(f"image {image} does not record the size of its /testbed; rebuild it") from None


def tmpfs_mounts(image: str, limits: ResourceLimits) -> dict[str, str]:
    """The bounded tmpfs mounts of a sandbox container: every path the command user may write."""
    testbed_bytes, testbed_files = _testbed_usage(image)
    small_bytes, small_files = (min(limits.disk_bytes, SMALL_SCRATCH[0]), min(limits.disk_files, SMALL_SCRATCH[1]))

    def tmpfs(size: int, inodes: int, mode: str) -> str:
        return f"size={size},nr_inodes={inodes},mode={mode},exec"

    return {
        WORKDIR: tmpfs(testbed_bytes + limits.disk_bytes, testbed_files + limits.disk_files, "0755"),
        "/tmp": tmpfs(limits.disk_bytes, limits.disk_files, "1777"),
        "/var/tmp": tmpfs(limits.disk_bytes, limits.disk_files, "1777"),
        "/dev/shm": tmpfs(small_bytes, small_files, "1777"),
        "/run/lock": tmpfs(small_bytes, small_files, "1777"),
    }


def _run_container(image: str, limits: ResourceLimits, lifetime: int, network: bool):
    """Start a container for ``image`` and connect to its command server."""
    import docker

    client = docker_client()
    ulimits = [
        docker.types.Ulimit(name="cpu", soft=limits.cpu_seconds, hard=limits.cpu_seconds + 5),
        docker.types.Ulimit(name="fsize", soft=limits.file_size_bytes, hard=limits.file_size_bytes),
        docker.types.Ulimit(name="nofile", soft=limits.open_files, hard=limits.open_files),
        docker.types.Ulimit(name="core", soft=0, hard=0),
    ]
    # create + start rather than run(): run() answers a missing image by pulling from a registry.
    container = client.containers.create(
        image, ["sleep", str(int(lifetime))], detach=True, init=True, auto_remove=True,
        network_mode=None if network else "none", mem_limit=limits.memory_bytes,
        memswap_limit=limits.memory_bytes, pids_limit=limits.max_processes,
        nano_cpus=int(limits.cpus * 1e9), ulimits=ulimits, working_dir=WORKDIR, tmpfs=tmpfs_mounts(image, limits),
        labels={MANAGED_LABEL: "1", KIND_LABEL: "sandbox", OWNER_LABEL: owner_id()},
    )
    try:
        container.start()
        if not container.put_archive(posixpath.dirname(AGENT_DIR), agent_archive()):
            raise SandboxError("could not copy the command server into the container")
        return container, AgentConnection(client, container.id)
    except BaseException:
        _remove(container)
        raise


def _remove(container) -> bool:
    """Remove a container; False when it was not there to remove (gone already, or being removed
    by someone else: auto_remove, another gc) or the engine failed."""
    try:
        container.remove(force=True, v=True)
        return True
    except Exception as exc:
        log.debug("removing container %s: %s", getattr(container, "id", "?")[:12], exc)
        return False


# Removing a running container takes 100-200 ms of the engine's time; close() hands it to these
# threads so that a trainer is not kept waiting, and exit waits for them so none is left behind.
_removals = ThreadPoolExecutor(max_workers=4, thread_name_prefix="patchgym-docker-rm")
atexit.register(_removals.shutdown, wait=True)


class WarmPool:
    """Pre-started containers per (image, limits), handed out at once and refilled in the background.

    A fresh sandbox from the pool costs one request to an already running command server instead
    of a container start. ``size`` 0 disables it.
    """

    def __init__(self, size: int = 0, *, lifetime: int = DEFAULT_LIFETIME) -> None:
        self.size = size
        self.lifetime = lifetime
        self._ready: dict[tuple, deque] = {}
        self._lock = threading.Lock()
        self._closed = False

    def acquire(self, image: str, limits: ResourceLimits, network: bool):
        key = (image, limits, network)
        with self._lock:
            queue = self._ready.setdefault(key, deque())
            item = queue.popleft() if queue else None
        if self.size > 0:
            threading.Thread(target=self._refill, args=(key,), daemon=True).start()
        return item if item is not None else _run_container(image, limits, self.lifetime, network)

    def prefill(self, image: str, limits: ResourceLimits, network: bool = False) -> None:
        """Start the pool's containers for ``image`` now (blocking)."""
        self._refill((image, limits, network))

    def _refill(self, key: tuple) -> None:
        while True:
            with self._lock:
                if self._closed or len(self._ready.get(key, ())) >= self.size:
                    return
            try:
                container, connection = _run_container(key[0], key[1], self.lifetime, key[2])
            except Exception as exc:
                log.warning("warm pool could not start a container: %s", exc)
                return
            with self._lock:
                if not self._closed:
                    self._ready.setdefault(key, deque()).append((container, connection))
                    continue
            connection.close()  # the pool closed while this one was starting
            _remove(container)
            return

    def close(self) -> None:
        with self._lock:
            self._closed = True
            items = [item for queue in self._ready.values() for item in queue]
            self._ready.clear()
        for container, connection in items:
            connection.close()
            _remove(container)


class DockerSandbox(ClosesItself):
    """A :class:`~sandboxes.base.Sandbox` in a Docker container (workspace at ``/testbed``)."""

    workdir = WORKDIR

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        limits: ResourceLimits | None = None,
        release: str | None = None,
        network: bool = False,
        pool: WarmPool | None = None,
        lifetime: int = DEFAULT_LIFETIME,
    ) -> None:
        from .images import instance_image

        self.spec = spec
        self.base_commit = spec.base_commit
        self.limits = limits or ResourceLimits()
        self._lock = threading.RLock()
        self._closed = False
        import docker.errors

        key = (spec.repo, spec.base_commit, spec.environment, release)
        for attempt in range(2):
            if key not in _images:
                _images[key] = instance_image(spec.repo, spec.base_commit, spec.environment, release=release)
            self.image = _images[key]
            try:
                if pool is not None:
                    self.container, self._conn = pool.acquire(self.image, self.limits, network)
                else:
                    self.container, self._conn = _run_container(self.image, self.limits, lifetime, network)
                break
            except docker.errors.ImageNotFound:
                _images.pop(key, None)  # pruned since it was resolved: build it again, once
                if attempt:
                    raise
        self.id = self.container.id[:12]

    def exec(self, command: str, timeout: float = 60.0, cwd: str | None = None,
             env: dict[str, str] | None = None, output_limit: int | None = None) -> ExecResult:
        run_cwd = None
        if cwd is not None:
            self._check_path(cwd)
            run_cwd = cwd if cwd.startswith("/") else f"{WORKDIR}/{cwd}"
        response = self._request({"op": "exec", "command": command, "timeout": timeout, "cwd": run_cwd,
                                  "env": env or {}, "limit": output_limit or DEFAULT_OUTPUT_LIMIT},
                                 timeout + GRACE)
        return ExecResult(exit_code=response["exit_code"], output=response["output"],
                          timed_out=response["timed_out"], duration=response["duration"],
                          truncated=response["truncated"])

    def read_file(self, path: str) -> bytes:
        return base64.b64decode(self._request({"op": "read", "path": path}, 120)["data"])

    def write_file(self, path: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self._request({"op": "write", "path": path, "data": base64.b64encode(raw).decode()}, 120)

    def diff(self) -> str:
        return self._request({"op": "diff", "limit": DIFF_LIMIT}, 600)["diff"]

    def reset(self) -> None:
        self._request({"op": "reset"}, 300)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()
            _removals.submit(_remove, self.container)

    def _check_path(self, path: str) -> None:
        if path.startswith("/") and path != WORKDIR and not path.startswith(WORKDIR + "/"):
            raise PathOutsideWorkspaceError(f"{path} is outside the workspace {WORKDIR}")

    def _request(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        with self._lock:
            if self._closed:
                raise SandboxClosedError(f"sandbox {getattr(self, 'id', '?')} is closed")
            response = self._conn.request(payload, timeout)
        error = response.get("error")
        if error == "outside":
            raise PathOutsideWorkspaceError(response["message"])
        if error == "notfound":
            raise FileNotFoundError(response["message"])
        if error == "notregular":
            raise IsADirectoryError(response["message"])
        if error == "workspace":
            raise WorkspaceError(response["message"])
        if error:
            raise SandboxError(f"sandbox {self.id}: {response['message']}")
        return response


def gc_containers(*, include_live_owners: bool = False, other_hosts: bool = False) -> list[str]:
    """Remove patchgym containers whose owning process is gone (found by label); return their ids.

    Only containers patchgym made itself are touched: labelled as a sandbox or a build container
    with an owner. (Images carry patchgym's labels too, so a container someone else started from
    one of them inherits ``managed=1``, but not those.) A container owned by a live process of
    this host is kept unless ``include_live_owners``; one owned by another host sharing the engine
    is kept unless ``other_hosts`` (this host cannot tell whether its owner still lives). A
    container that vanishes while gc runs (another gc, auto-removal) is skipped, never an error.
    """
    from ..reaper import is_alive

    client = docker_client()
    removed = []
    host = owner_id().split(":")[0]
    try:
        # ignore_removed: one removed between the listing and its inspection is left out.
        containers = client.containers.list(all=True, filters={"label": f"{MANAGED_LABEL}=1"}, ignore_removed=True)
    except Exception as exc:
        raise SandboxError(f"cannot list containers: {exc}") from None
    for container in containers:
        owner = container.labels.get(OWNER_LABEL, "")
        if container.labels.get(KIND_LABEL) not in ("sandbox", "build") or not owner:
            continue
        owner_host, _, pid = owner.partition(":")
        if owner_host != host and not other_hosts:
            continue
        alive = owner_host == host and pid.isdigit() and is_alive(int(pid))
        if alive and not include_live_owners:
            continue
        if _remove(container):
            removed.append(container.id[:12])
    return removed
