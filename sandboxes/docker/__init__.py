"""The Docker backend: layered cached images (base from debootstrap, environment, instance) and one
container per sandbox, whose command server (a small static program, ``server.c``) is its main
process. Needs a reachable Docker engine; nothing here is imported by the local backend."""

from __future__ import annotations

from patchgym.sandboxes.docker.client import docker_available, docker_client
from patchgym.sandboxes.docker.containers import gc_containers
from patchgym.sandboxes.docker.pool import WarmPool, default_pool_size, shared_pool
from patchgym.sandboxes.docker.sandbox import DockerSandbox

__all__ = ["DockerSandbox", "WarmPool", "default_pool_size", "docker_available", "docker_client", "gc_containers",
           "shared_pool"]
