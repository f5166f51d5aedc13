"""Joining a Ray cluster, or starting a private one on this host, for the ray backend.

Ray's connection is per process: code that already called ``ray.init(address=...)`` (a trainer)
is used as it is; otherwise :func:`ensure_connected` joins ``address`` (or ``$RAY_ADDRESS``), and
with neither starts a single-node cluster on loopback whose node declares the sandbox resource.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from patchgym.sandboxes.base import SandboxError

#: The custom resource a node declares for each sandbox it may host (``ray start --resources``).
RESOURCE = "patchgym_sandbox"

_lock = threading.Lock()


class RayUnavailableError(SandboxError):
    """Ray is not installed, or the cluster cannot be reached or hosts no sandbox."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailableError("the ray backend needs Ray: pip install 'patchgym[ray]'") from None
    return ray


def ensure_connected(address: str | None = None, *, resource: str = RESOURCE) -> Any:
    """Connect this process to Ray once and return the ``ray`` module.

    ``address`` (``host:port`` or ``ray://...``) is joined; without it ``$RAY_ADDRESS``; without
    either, a local cluster is started with one ``resource`` per core. An address that differs from
    the cluster this process is already connected to is refused rather than silently ignored.
    """
    ray = import_ray()
    with _lock:
        if ray.is_initialized():
            if address and address not in ("auto",) and not _same_cluster(ray, address):
                raise RayUnavailableError(
                    f"this process is already connected to another Ray cluster than {address}")
            return ray
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address:
            _probe(address)
        try:
            if address:
                ray.init(address=address, namespace="patchgym", log_to_driver=False,
                         configure_logging=False)
            else:
                ray.init(resources={resource: float(os.cpu_count() or 1)}, include_dashboard=False,
                         _node_ip_address="127.0.0.1", namespace="patchgym", log_to_driver=False,
                         configure_logging=False)
        except Exception as exc:
            raise RayUnavailableError(f"cannot connect to Ray{f' at {address}' if address else ''}: {exc}") from None
    return ray


def _probe(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a ``host:port`` nobody listens on: ``ray.init`` itself retries for minutes."""
    if "://" in address or address == "auto" or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise RayUnavailableError(f"not a Ray address (host:port or ray://host:port): {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise RayUnavailableError(f"cannot connect to Ray at {address}: {exc}") from None


def _same_cluster(ray: Any, address: str) -> bool:
    try:
        current = ray.get_runtime_context().gcs_address
    except Exception:
        return True  # cannot tell: trust the caller's own connection
    if address.startswith("ray://"):
        return True  # a Ray Client address names the client server, not the GCS: cannot compare
    return address in (current, "")


def sandbox_capacity(resource: str = RESOURCE) -> tuple[float, int]:
    """How many sandboxes the cluster's live nodes declare in all, and on how many nodes."""
    ray = import_ray()
    total, nodes = 0.0, 0
    for node in ray.nodes():
        if node.get("Alive") and node.get("Resources", {}).get(resource, 0) > 0:
            total += node["Resources"][resource]
            nodes += 1
    return total, nodes


def require_capacity(resource: str = RESOURCE) -> tuple[float, int]:
    """:func:`sandbox_capacity`, refused with the fix when no live node declares ``resource``: Ray
    would otherwise keep a sandbox's actor pending for ever."""
    slots, nodes = sandbox_capacity(resource)
    if slots < 1:
        raise RayUnavailableError(
            f"no live node of the Ray cluster declares the resource {resource!r}, so no sandbox can be "
            f"placed; start nodes with: ray start ... --resources '{{\"{resource}\": N}}' (docs/ray.md)")
    return slots, nodes
