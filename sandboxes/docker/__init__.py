"""The Docker backend: layered cached images (base from debootstrap, environment, instance) and one
container per sandbox. Needs a reachable Docker engine; nothing here is imported by the local
backend."""

from __future__ import annotations

import atexit
import threading

from .client import docker_available, docker_client
from .sandbox import DockerSandbox, WarmPool, gc_containers

_pools: dict[int, WarmPool] = {}
_pools_lock = threading.Lock()


def shared_pool(size: int) -> WarmPool:
    """The process-wide warm pool of ``size`` containers per image (closed at exit)."""
    with _pools_lock:
        if size not in _pools:
            _pools[size] = WarmPool(size)
            atexit.register(_pools[size].close)
        return _pools[size]


__all__ = ["DockerSandbox", "WarmPool", "docker_available", "docker_client", "gc_containers", "shared_pool"]
