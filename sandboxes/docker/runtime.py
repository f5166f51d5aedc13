"""The command server's runtime: built once per engine, mounted read-only into every sandbox.

The runtime is a Docker volume, ``patchgym-runtime-<hash of its sources>``, holding the command
server (``server.c`` compiled as a static binary, so one build runs on every Debian release) and
the Python diff helper with the host modules it reuses (as the package ``pgrt``). It is compiled
in a container of the default base image (which carries gcc), with no network; the volume lives on
the engine's host, so remote engines work too. Every sandbox mounts it read-only: one copy on disk
and in the page cache for all of them, instead of a copy in each container's writable layer.

The volume's root is root's only (mode 0700): commands (uid 1000) cannot read or change what is in
it. The binary is moved into place last, so a volume with ``pgserver`` in it is complete; one left
without it by an interrupted build is rebuilt (:func:`discard_runtime`).
"""

from __future__ import annotations

import hashlib
import io
import logging
import tarfile
import threading
from pathlib import Path

from ..base import EnvironmentBuildError, SandboxError
from ..locks import file_lock
from .client import KIND_LABEL, MANAGED_LABEL, OWNER_LABEL, docker_client, owner_id, remove_container

log = logging.getLogger(__name__)

RUNTIME_MOUNT = "/opt/patchgym"
SERVER = f"{RUNTIME_MOUNT}/pgserver"
VOLUME_PREFIX = "patchgym-runtime-"
PGRT_MODULES = ("base.py", "files.py", "gitops.py")  # what diff_helper.py imports, and what they import
CFLAGS = ("-static", "-Os", "-s", "-Wall", "-Wextra", "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections")
BUILD_TIMEOUT = 300
_HERE = Path(__file__).resolve().parent
_volumes: dict[str, str] = {}
_volumes_lock = threading.Lock()


def _sources() -> dict[str, bytes]:
    """The runtime's files by their path in the build context."""
    files = {"server.c": (_HERE / "server.c").read_bytes(),
             "rt/diff_helper.py": (_HERE / "diff_helper.py").read_bytes(), "rt/pgrt/__init__.py": b""}
    for name in PGRT_MODULES:
        files[f"rt/pgrt/{name}"] = (_HERE.parent / name).read_bytes()
    return files


def runtime_key(sources: dict[str, bytes] | None = None) -> str:
    digest = hashlib.sha256(" ".join(CFLAGS).encode())
    for name, data in sorted((sources or _sources()).items()):
        digest.update(b"\0%s\0%d\0" % (name.encode(), len(data)) + data)
    return digest.hexdigest()[:16]


def _context(sources: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in sorted(sources.items()):
            info = tarfile.TarInfo(f"pgbuild/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _volume_exists(name: str) -> bool:
    import docker.errors

    try:
        docker_client().volumes.get(name)
        return True
    except docker.errors.NotFound:
        return False


def runtime_volume() -> str:
    """The name of the runtime volume for this code, built first when the engine lacks it."""
    sources = _sources()
    key = runtime_key(sources)
    with _volumes_lock:
        if key in _volumes:
            return _volumes[key]
    name = VOLUME_PREFIX + key
    if not _volume_exists(name):
        from .images import _lock_path

        with file_lock(_lock_path(f"runtime-{key}")):
            if not _volume_exists(name):
                _build(name, sources)
                _prune_others(name)
    with _volumes_lock:
        _volumes[key] = name
    return name


def discard_runtime(name: str) -> None:
    """Forget and remove a runtime volume found incomplete (an interrupted build), to build it again."""
    with _volumes_lock:
        for key, value in list(_volumes.items()):
            if value == name:
                del _volumes[key]
    try:
        docker_client().volumes.get(name).remove(force=True)
    except Exception as exc:
        log.warning("could not remove the runtime volume %s: %s", name, exc)


def _build(name: str, sources: dict[str, bytes]) -> None:
    from .images import DEFAULT_RELEASE, ensure_base

    client = docker_client()
    base = ensure_base(DEFAULT_RELEASE)
    log.info("building the sandbox runtime %s", name)
    script = ("set -e; umask 077; cd /pgbuild; "
              f"gcc {' '.join(CFLAGS)} -o /v/pgserver.new server.c; "
              # bytecode for the default release's python (a read-only mount keeps none of its own)
              "cp -R rt/. /v/; python3 -m compileall -q /v >/dev/null; "
              "chown -R 0:0 /v; chmod -R go-rwx /v; chmod 0700 /v; mv /v/pgserver.new /v/pgserver")
    volume = client.volumes.create(name=name, labels={MANAGED_LABEL: "1", KIND_LABEL: "runtime"})
    container = None
    try:
        container = client.containers.create(
            base.id, ["sh", "-c", script], network_mode="none", working_dir="/",
            volumes={name: {"bind": "/v", "mode": "rw"}},
            labels={MANAGED_LABEL: "1", KIND_LABEL: "build", OWNER_LABEL: owner_id()})
        if not container.put_archive("/", _context(sources)):
            raise EnvironmentBuildError("could not copy the command server's sources into the build container")
        container.start()
        status = container.wait(timeout=BUILD_TIMEOUT)
        if status.get("StatusCode") != 0:
            output = container.logs().decode(errors="replace")[-3000:]
            raise EnvironmentBuildError(f"building the sandbox command server failed: {output}")
    except BaseException as exc:
        if container is not None:
            remove_container(container)
            container = None
        try:
            volume.remove(force=True)
        except Exception:
            pass
        if isinstance(exc, (SandboxError, KeyboardInterrupt, SystemExit)):
            raise
        raise EnvironmentBuildError(f"building the sandbox command server failed: {exc}") from None
    finally:
        if container is not None:
            remove_container(container)


def _prune_others(keep: str) -> None:
    """Remove the runtime volumes of other versions of this code that no container uses."""
    try:
        volumes = docker_client().volumes.list(filters={"label": f"{KIND_LABEL}=runtime"})
    except Exception as exc:
        log.debug("cannot list runtime volumes: %s", exc)
        return
    for volume in volumes:
        if volume.name != keep and volume.name.startswith(VOLUME_PREFIX):
            try:
                volume.remove()
            except Exception as exc:  # in use by a sandbox of another version: kept
                log.debug("keeping %s: %s", volume.name, exc)
