"""The Docker engine connection, and the labels that mark what patchgym owns.

Every request patchgym makes to the engine goes through :func:`engine_client`'s clients, which
share one bound: at most :data:`ENGINE_CONCURRENCY` requests in flight from this process (a
request waits at most its deadline for a slot), each with a socket deadline (``timeout``), over
one connection pool per client. docker-py's own unix-socket adapter keys its pools by the whole
URL, container id included, and closes the least recently used of 25 while other threads still
use it: under 64 threads that surfaced as ``AttributeError: 'NoneType' object has no attribute
'qsize'`` from urllib3, a start failed half-way.
"""

from __future__ import annotations

import logging
import os
import threading
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
# The engine serves a container operation in well under a second; under a storm of starts on a
# loaded host, in seconds. A minute without a byte from it means it is stuck: the call fails.
ENGINE_TIMEOUT = 60.0
# Requests in flight from this process at once. More only queue inside the engine (its container
# operations take per-container and store-wide locks) and cost a connection each.
ENGINE_CONCURRENCY = 8
_slots = threading.BoundedSemaphore(ENGINE_CONCURRENCY)


class EngineBusyError(SandboxError):
    """No slot for a request to the engine came free within the request's deadline."""


class _Slotted:
    """A requests transport adapter that sends through ``inner`` in one of this process's slots.

    The slot is held until the answer's headers: a streamed body (an attached stream, build
    logs) does not keep it."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def send(self, request, stream=False, timeout=None, **kwargs):
        wait = timeout if isinstance(timeout, (int, float)) else ENGINE_TIMEOUT
        if not _slots.acquire(timeout=wait):
            raise EngineBusyError(f"the Docker engine did not take a request within {wait:.0f}s "
                                  f"({ENGINE_CONCURRENCY} of this process's requests were still in flight)")
        try:
            return self.inner.send(request, stream=stream, timeout=timeout, **kwargs)
        finally:
            _slots.release()

    def close(self) -> None:
        self.inner.close()


def _one_pool_unix_adapter():
    from docker.transport import UnixHTTPAdapter

    class OnePoolUnixAdapter(UnixHTTPAdapter):
        """docker-py's unix-socket adapter with one pool for every URL (requests go by path)."""

        def get_connection(self, url, proxies=None):
            return super().get_connection("http+docker://localhost", proxies)

    return OnePoolUnixAdapter


def engine_client(timeout: float = ENGINE_TIMEOUT):
    """A new docker-py client for the engine of ``DOCKER_HOST`` whose every request has the socket
    deadline ``timeout`` and takes one of this process's :data:`ENGINE_CONCURRENCY` slots."""
    import docker
    from docker.transport import UnixHTTPAdapter

    client = docker.from_env(timeout=int(timeout), max_pool_size=ENGINE_CONCURRENCY)
    api = client.api
    for prefix, adapter in list(api.adapters.items()):
        if isinstance(adapter, UnixHTTPAdapter):
            adapter.close()
            adapter = _one_pool_unix_adapter()(adapter.socket_path, timeout, pool_connections=1,
                                               max_pool_size=ENGINE_CONCURRENCY)
        api.mount(prefix, _Slotted(adapter))
    return client


@lru_cache(maxsize=1)
def docker_client():
    """A client for the local engine (``DOCKER_HOST`` honoured); a clear error when unreachable."""
    try:
        import docker  # noqa: F401
    except ImportError as exc:  # pragma: no cover - docker is a dependency
        raise SandboxError("the docker Python package is not installed (pip install docker)") from exc
    try:
        client = engine_client()
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


def kill_container(container) -> None:
    """SIGKILL a container's processes (its main one first); the engine then removes it
    (``auto_remove``). A container already gone is fine; a failure is logged, and the retirement
    watch removes the container after its grace."""
    try:
        container.kill()
    except Exception as exc:  # gone already, or the engine failed: said, not raised (a close)
        log.debug("killing container %s: %s", getattr(container, "id", "?")[:12], exc)


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
