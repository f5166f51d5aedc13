"""The command server's runtime: built once per engine, mounted read-only into every sandbox.

The runtime is a Docker volume, ``patchgym-runtime-<hash of its sources>``, holding the command
server (``server.c`` compiled as a static binary, so one build runs on every Debian release) and
the Python diff helper with the host modules it reuses (as the package ``pgrt``). It is compiled
in a container of the default base image (which carries gcc), with no network; the volume lives on
the engine's host, so remote engines work too. Every sandbox mounts it read-only: one copy on disk
and in the page cache for all of them, instead of a copy in each container's writable layer.

The volume's root is root's only (mode 0700): commands (uid 1000) cannot read or change what is in
it. Every process on the engine shares it, so its build is coordinated through the engine: it is
filled in a container named for the build (:mod:`.build_mutex`; tied to its builder, it ends with
it: ``images.BuildContainer``), and labelled complete by a marker
volume, ``<name>-complete``, created only once the fill succeeded. A volume without its marker (a
killed builder's) is filled again in place under the same name; it is never removed while
sandboxes may use it.
"""

from __future__ import annotations

import hashlib
import io
import logging
import tarfile
import threading
from pathlib import Path

from patchgym.sandboxes.base import EnvironmentBuildError, SandboxError
from patchgym.sandboxes.docker.build_mutex import namespace
from patchgym.sandboxes.docker.client import KIND_LABEL, MANAGED_LABEL, docker_client
from patchgym.sandboxes.paths import cache_dir

log = logging.getLogger(__name__)

RUNTIME_MOUNT = "/opt/patchgym"
SERVER = f"{RUNTIME_MOUNT}/pgserver"
VOLUME_PREFIX = "patchgym-runtime-"
COMPLETE_SUFFIX = "-complete"
PGRT_MODULES = ("base.py", "files.py", "gitops.py")  # what diff_helper.py imports, and what they import
CFLAGS = ("-static", "-Os", "-s", "-Wall", "-Wextra", "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections")
BUILD_TIMEOUT = 300
_HERE = Path(__file__).resolve().parent
_volumes: dict[str, str] = {}
_volumes_lock = threading.Lock()


def _sources() -> dict[str, bytes]:
    """The runtime's files by their path in the build context."""
    files = {"server.c": (_HERE / "server.c").read_bytes(),
             "command_server.h": (_HERE.parent / "command_server.h").read_bytes(),
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


def _complete(name: str) -> bool:
    """Whether the runtime volume ``name`` exists and was filled whole (its marker exists)."""
    return _volume_exists(name) and _volume_exists(name + COMPLETE_SUFFIX)


def runtime_volume() -> str:
    """The name of the runtime volume for this code, built first when the engine lacks it whole."""
    sources = _sources()
    key = runtime_key(sources)
    name = VOLUME_PREFIX + namespace() + key
    with _volumes_lock:
        if name in _volumes.values():
            return name
    if not _complete(name):
        _build(name, key, sources)
        _prune_others(name)
    with _volumes_lock:
        _volumes[key] = name
    return name


def discard_runtime(name: str) -> None:
    """Forget a runtime volume found incomplete, and drop its marker so that the next
    :func:`runtime_volume` fills it again (under the build's mutex). The volume itself is never
    removed here: other processes' sandboxes may be using it."""
    with _volumes_lock:
        for key, value in list(_volumes.items()):
            if value == name:
                del _volumes[key]
    try:
        docker_client().volumes.get(name + COMPLETE_SUFFIX).remove(force=True)
    except Exception as exc:
        log.debug("no marker of %s to remove: %s", name, exc)


def _build(name: str, key: str, sources: dict[str, bytes]) -> None:
    """Fill the volume ``name`` in the build container named for it (the engine-wide mutex, tied to
    this process as every build container is: ``images.BuildContainer``), unless its holder,
    waited for, finished it; then create its marker."""
    from patchgym.sandboxes.docker.images import DEFAULT_RELEASE, BuildContainer, ensure_base

    client = docker_client()
    base = ensure_base(DEFAULT_RELEASE)
    # Idempotent, and file by file atomic: a killed builder's half-filled volume is filled again,
    # and so is a whole one made before markers existed, which sandboxes may be using meanwhile.
    script = ("set -e; umask 077; cd /pgbuild; rm -rf /v/.stage; mkdir /v/.stage; "
              f"gcc {' '.join(CFLAGS)} -o /v/pgserver.new server.c; "
              # bytecode for the default release's python (a read-only mount keeps none of its own)
              "cp -R rt/. /v/.stage/; python3 -m compileall -q /v/.stage >/dev/null; "
              "chown -R 0:0 /v; chmod -R go-rwx /v; chmod 0700 /v; cd /v/.stage; "
              "find . -mindepth 1 -type d -exec mkdir -p /v/{} \\; ; find . ! -type d -exec mv -f {} /v/{} \\; ; "
              "cd /; rm -rf /v/.stage; mv /v/pgserver.new /v/pgserver")
    labels = {MANAGED_LABEL: "1", KIND_LABEL: "runtime"}
    client.volumes.create(name=name, labels=labels)  # returns the existing one if there is one
    log_file = cache_dir("envs") / f"docker-runtime-{key}.log"
    with BuildContainer(base.id, log_file, purpose=f"the sandbox runtime {name}", key=f"runtime-{key}",
                         network=False, volumes={name: {"bind": "/v", "mode": "rw"}}) as box:
        if _complete(name):
            return  # the holder we waited for finished it
        log.info("building the sandbox runtime %s", name)
        log_file.write_text(f"# {name}\n")
        try:
            box.put_archive("/", _context(sources))
            box.run(["sh", "-c", script], what="building the sandbox command server", timeout=BUILD_TIMEOUT)
            client.volumes.create(name=name + COMPLETE_SUFFIX, labels={**labels, KIND_LABEL: "runtime-complete"})
        except (SandboxError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            raise EnvironmentBuildError(f"building the sandbox command server failed: {exc}") from None


def _prune_others(keep: str) -> None:
    """Remove the runtime volumes of other versions of this code that no container uses."""
    try:
        volumes = docker_client().volumes.list(filters={"label": f"{KIND_LABEL}=runtime"})
    except Exception as exc:
        log.debug("cannot list runtime volumes: %s", exc)
        return
    prefix = VOLUME_PREFIX + namespace()
    for volume in volumes:
        other = volume.name[len(prefix):]
        if volume.name != keep and volume.name.startswith(prefix) and len(other) == len(keep) - len(prefix):
            try:
                volume.remove()  # the volume first: its marker goes only once it is gone
            except Exception as exc:  # in use by a sandbox of another version: kept
                log.debug("keeping %s: %s", volume.name, exc)
                continue
            try:
                docker_client().volumes.get(volume.name + COMPLETE_SUFFIX).remove()
            except Exception as exc:
                log.debug("no marker of %s: %s", volume.name, exc)
