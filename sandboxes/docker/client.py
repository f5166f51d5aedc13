"""The Docker engine connection, and the labels that mark what patchgym owns."""

from __future__ import annotations

import logging
import os
import time
from functools import lru_cache

from patchgym.sandboxes.base import SandboxError

log = logging.getLogger(__name__)

# Every container and image patchgym creates carries MANAGED_LABEL=1 plus its kind; gc and the
# reaper only ever touch objects with this label.
MANAGED_LABEL = "org.patchgym.managed"
KIND_LABEL = "org.patchgym.kind"  # base | env | instance | sandbox | build
OWNER_LABEL = "org.patchgym.owner"  # "<hostname>:<pid>" of the process that made a container
# An instance image's /testbed, measured at build: what its sandboxes' /testbed tmpfs must hold.
TESTBED_BYTES_LABEL = "org.patchgym.testbed_bytes"
TESTBED_FILES_LABEL = "org.patchgym.testbed_files"
DEFAULT_RELEASE = os.environ.get("PATCHGYM_DEBIAN_RELEASE", "bookworm")


@lru_cache(maxsize=1)
def docker_client():
    """A client for the local engine (``DOCKER_HOST`` honoured); a clear error when unreachable."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - docker is a dependency
        raise SandboxError("the docker Python package is not installed (pip install docker)") from exc
    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except Exception as exc:
        raise SandboxError(f"no Docker engine is reachable ({exc}); start dockerd or set DOCKER_HOST") from None
    return client


def docker_available() -> bool:
    try:
        docker_client()
        return True
    except SandboxError:
        return False


def owner_id() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


def remove_container(container, *, attempts: int = 3) -> bool:
    """Remove a container and its anonymous volumes; False when it was not there to remove (gone
    already, or being removed by someone else: auto_remove, another gc) or the engine kept failing.

    Other engine errors (a busy overlay mount, an engine restarting) are tried again, and a
    warning says when they persist: a container left behind stays until ``patchgym sandboxes gc``
    finds it by its labels."""
    import docker.errors

    for attempt in range(1, attempts + 1):
        try:
            container.remove(force=True, v=True)
            return True
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "in progress" in str(exc):  # someone else is removing it
                return False
            error: Exception = exc
        except Exception as exc:  # the engine went away, a socket error
            error = exc
        log.debug("removing container %s (attempt %d): %s", getattr(container, "id", "?")[:12], attempt, error)
        if attempt < attempts:
            time.sleep(0.2 * attempt)
    log.warning("could not remove container %s: %s (patchgym sandboxes gc removes it later)",
                getattr(container, "name", None) or getattr(container, "id", "?")[:12], error)
    return False
