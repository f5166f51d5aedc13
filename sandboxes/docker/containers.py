"""Sandbox containers: how one is started (its command server as pid 1, bounded tmpfs mounts, no
network, limits, labels, a lifetime), removed, and found again when its owner is gone.

The container's main process is the command server (``server.c``, from the runtime volume, see
``runtime.py``): it ends when its lifetime is over or when the client's stream closes, and the
engine then removes the container (``auto_remove``), so a killed client cannot leave it running.
A start that fails removes what it made: the container is named before it is created, so even one
the engine made after the request's deadline passed is found (and one that started is let go of
through ``retire.py``, which never races the engine's own removal).
Every place the command user can write (/testbed, /tmp, /var/tmp, /dev/shm, /run/lock) is a tmpfs
with a size and an inode limit that the engine sets up: past them writes fail with ENOSPC, and the
container's writable layer on the host's disk is root's alone. (A Docker volume of the local
driver with tmpfs options would be the other engine-enforced bound, but the engine does not fill
such a volume from the image: it starts empty, like a tmpfs mount, which needs no cleanup.)
"""

from __future__ import annotations

import logging
import uuid
from functools import lru_cache

from patchgym.sandboxes.base import ResourceLimits, SandboxError
from patchgym.sandboxes.docker.build_mutex import namespace
from patchgym.sandboxes.docker.client import (
    KIND_LABEL,
    MANAGED_LABEL,
    OWNER_LABEL,
    TESTBED_BYTES_LABEL,
    TESTBED_FILES_LABEL,
    docker_client,
    owner_id,
    remove_container,
)
from patchgym.sandboxes.docker.connection import attach
from patchgym.sandboxes.docker.retire import retirements
from patchgym.sandboxes.docker.runtime import RUNTIME_MOUNT, SERVER, discard_runtime, runtime_volume

log = logging.getLogger(__name__)

WORKDIR = "/testbed"
NAME_PREFIX = "patchgym-sb-"
DEFAULT_LIFETIME = 6 * 3600
START_TIMEOUT = 300.0  # the server fills /testbed before it answers: a large repository takes seconds
SMALL_SCRATCH = (64 << 20, 10_000)  # bytes, inodes at most for /dev/shm and /run/lock (Docker's shm is 64 MiB)


@lru_cache(maxsize=256)
def _testbed_usage(image: str) -> tuple[int, int]:
    """The bytes and inodes of the image's /testbed, measured when it was built: without
    ``.git/objects``, which sandboxes borrow from the image (images built before that count it,
    so their sandboxes may write that much more)."""
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


def start_container(image: str, limits: ResourceLimits, lifetime: int, network: bool,
                    binds: dict[str, str] | None = None):
    """Start a container for ``image`` whose main process is the command server, and wait until
    the server has filled /testbed. Return the container and a connection to its server.
    ``binds``: host paths mounted read-only at the container paths given.

    Fails with a :class:`SandboxError` (``docker.errors.ImageNotFound`` for a missing image), having
    removed what it made."""
    import docker.errors

    try:
        return _start(image, limits, lifetime, network, binds)
    except (SandboxError, docker.errors.ImageNotFound):
        raise
    except Exception as exc:  # the engine refused, failed or missed a deadline
        raise SandboxError(f"cannot start a sandbox container from {image}: {type(exc).__name__}: {exc}") from exc


def _start(image: str, limits: ResourceLimits, lifetime: int, network: bool, binds: dict[str, str] | None):
    import docker
    import docker.errors

    client = docker_client()
    api = client.api
    ulimits = [
        docker.types.Ulimit(name="cpu", soft=limits.cpu_seconds, hard=limits.cpu_seconds + 5),
        docker.types.Ulimit(name="fsize", soft=limits.file_size_bytes, hard=limits.file_size_bytes),
        docker.types.Ulimit(name="nofile", soft=limits.open_files, hard=limits.open_files),
        docker.types.Ulimit(name="core", soft=0, hard=0),
    ]
    for attempt in range(2):
        volume = runtime_volume()
        mounts = {volume: {"bind": RUNTIME_MOUNT, "mode": "ro"},
                  **{host: {"bind": target, "mode": "ro"} for host, target in (binds or {}).items()}}
        host_config = api.create_host_config(
            auto_remove=True, network_mode=None if network else "none", mem_limit=limits.memory_bytes,
            memswap_limit=limits.memory_bytes, pids_limit=limits.max_processes, nano_cpus=int(limits.cpus * 1e9),
            ulimits=ulimits, tmpfs=tmpfs_mounts(image, limits), binds=mounts,
            # The server's stdout carries every answer: none of it goes to a log file on the host.
            log_config=docker.types.LogConfig(type="none"))
        name = f"{NAME_PREFIX}{namespace()}{uuid.uuid4().hex[:16]}"
        # create + start rather than run(): run() answers a missing image by pulling from a registry.
        # stdin_open without detach sets StdinOnce: the server's stdin closes when the client goes.
        try:
            container_id = api.create_container(
                image, [SERVER, str(int(lifetime))], stdin_open=True, detach=False, working_dir=WORKDIR, name=name,
                host_config=host_config, labels={MANAGED_LABEL: "1", KIND_LABEL: "sandbox", OWNER_LABEL: owner_id()},
            )["Id"]
        except BaseException:
            # The engine may have made it after this request's deadline passed: by its name.
            remove_container(client.containers.prepare_model({"Id": name}), attempts=1)
            raise
        container = client.containers.prepare_model({"Id": container_id, "Name": f"/{name}"})
        connection = None
        started = False
        try:
            # attached before the start, so that nothing the server says is lost
            connection = attach(api, container_id)
            try:
                api.start(container_id)
                started = True
            except docker.errors.APIError as exc:
                if attempt == 0 and SERVER in str(exc) and "no such file" in str(exc).lower():
                    discard_runtime(volume)  # an interrupted build left the volume incomplete: build it again
                    connection.close()
                    remove_container(container)
                    continue
                raise
            connection.wait_ready(START_TIMEOUT)
            return container, connection
        except BaseException:
            if started:  # its server ends with the stream, and the engine removes it: watched, not raced
                retirements.retire(container, connection)
            else:  # never started: nothing removes it but this
                if connection is not None:
                    connection.close()
                remove_container(container)
            raise
    raise AssertionError("unreachable: the second attempt returns or raises")


def gc_containers(*, include_live_owners: bool = False, other_hosts: bool = False,
                  kept: list[str] | None = None) -> list[str]:
    """Remove patchgym containers whose owning process is gone (found by label); return their ids.

    Only containers patchgym made itself are touched: labelled as a sandbox or a build container
    with an owner. (Images carry patchgym's labels too, so a container someone else started from
    one of them inherits ``managed=1``, but not those.) A container owned by a live process of
    this host is kept unless ``include_live_owners``; one owned by another host sharing the engine
    is kept unless ``other_hosts`` (this host cannot tell whether its owner still lives). A
    container that vanishes while gc runs (another gc, auto-removal) is skipped, never an error.
    ``kept``, when given, receives a line for each container left and why.
    """
    from patchgym.sandboxes.reaper import is_alive

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
            if kept is not None:
                kept.append(f"{container.name}: owned by {owner}, another host (--all removes it)")
            continue
        alive = owner_host == host and pid.isdigit() and is_alive(int(pid))
        if alive and not include_live_owners:
            if kept is not None:
                kept.append(f"{container.name}: owned by {owner}, which is running")
            continue
        if remove_container(container):
            removed.append(container.id[:12])
    return removed
