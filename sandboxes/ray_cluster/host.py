"""The node side of the ray backend: one actor hosts one local or docker sandbox at a time on its node.

Nothing here imports Ray: the class is made a Ray actor by :mod:`.sandbox`, so this module runs
(and is tested) as plain Python too. Each host starts a *guard* first: a detached process that
waits for the actor's process to end, however it ends (``close``, ``ray.kill``, the driver's death
taking its actors with it, a node shutdown), and then removes what dead owners left on the node
(cgroups with their processes, sandbox directories and mounts, containers). A sandbox therefore
never outlives its actor, even when the actor gets no chance to clean up itself.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from patchgym.sandboxes.base import (
    EnvironmentBuildError,
    ResourceLimits,
    SandboxClosedError,
    SandboxError,
    SandboxSpec,
    usage_of,
)
from patchgym.sandboxes.locks import file_lock
from patchgym.sandboxes.paths import cache_dir
from patchgym.sandboxes.ray_cluster.channel import ChannelServer

#: What a host answers instead of opening when its node cannot reach the driver's repository.
NEED_REPO = "need-repo"
INNER_BACKENDS = ("local", "docker")


def shipped_dir() -> Path:
    """Where repositories shipped from the driver are kept on a node: inside the mirrors'
    cache, which every local sandbox already hides from commands (they hold the whole history)."""
    path = cache_dir("mirrors") / "shipped"
    path.mkdir(parents=True, exist_ok=True)
    return path


def is_local_path(source: str) -> bool:
    return "://" not in source and not source.startswith("git@")


class SandboxHost:
    """Hosts one sandbox at a time; every method answers ``(ok, value)`` so errors cross as they are.

    The driver may reuse a host for its next sandbox once the last one closed cleanly (the actor's
    process, Ray's worker and patchgym's imports then cost nothing again). Each sandbox is named by
    the driver's ``owner`` key, which every call carries: a call for a sandbox this host no longer
    holds (a late call of a closed one) never reaches the next sandbox.

    With ``token``, the host also answers on a :class:`~.channel.ChannelServer` at ``address``
    (default: its Ray node's address), which ``open``'s placement names as ``channel``.
    """

    CALLS = ("open", "call", "run", "close")  # what a channel may ask for

    def __init__(self, token: bytes | None = None, address: str | None = None) -> None:
        self.sandbox: Any = None
        self.owner: str | None = None
        self.repository = ""  # how this node got the repository: path, url or shipped
        self._lock = threading.Lock()
        self.guard = start_guard()
        self.channel: ChannelServer | None = None
        if token is not None:
            self.channel = ChannelServer(address or _node_address(), token, self.dispatch)

    def dispatch(self, name: str, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        """One call from the channel: ``getattr(self, name)(*args, **kwargs)`` for :attr:`CALLS`."""
        if name not in self.CALLS:
            return False, SandboxError(f"not a sandbox host call: {name!r}")
        try:
            return getattr(self, name)(*args, **kwargs)
        except Exception as exc:  # wrong arguments: the driver's bug, reported rather than hung on
            return False, _portable(exc)

    def open(self, owner: str, inner: str, spec: SandboxSpec, limits: ResourceLimits | None,
             options: dict[str, Any], *, ship: str = "auto", digest: str | None = None,
             bundle: bytes | None = None, extra_hidden: Any = None) -> tuple[bool, Any]:
        """Build the sandbox for ``owner``; answer its placement, or :data:`NEED_REPO` when this node
        needs the driver's repository shipped (``digest`` names a bundle the node may already keep)."""
        try:
            with self._lock:
                if self.sandbox is not None:
                    raise SandboxError("this host still holds another sandbox")
                self.owner = None
            start = time.monotonic()
            source = self._repository(spec.repo, ship, digest, bundle)
            if source is None:
                return True, NEED_REPO
            hidden = tuple(spec.hidden_paths) + tuple(extra_hidden() if extra_hidden else ())
            spec = replace(spec, repo=source, hidden_paths=hidden)
            sandbox = _make(inner, spec, limits, options)
            with self._lock:
                self.sandbox, self.owner = sandbox, owner
            warmup = time.monotonic() - start
            return True, self._placement(inner, spec, warmup)
        except Exception as exc:
            return False, _portable(exc)

    def call(self, owner: str, method: str, *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        """Run one protocol method (``exec``, ``read_file``, ``write_file``, ``diff``, ``reset``,
        and the optional ``usage``)."""
        if method not in ("exec", "read_file", "write_file", "diff", "reset", "usage"):
            return False, SandboxError(f"not a sandbox method: {method!r}")
        try:
            sandbox = self._sandbox_of(owner)
            if method == "usage":
                return True, usage_of(sandbox)
            return True, getattr(sandbox, method)(*args, **kwargs)
        except Exception as exc:
            return False, _portable(exc)

    def run(self, owner: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[bool, Any]:
        """``fn(sandbox, *args, **kwargs)`` here, beside the sandbox: a whole piece of work (a
        grading) in one call instead of one call per command and file. ``fn`` is the driver's own
        code (a function importable on this node), never the agent's."""
        try:
            return True, fn(self._sandbox_of(owner), *args, **kwargs)
        except Exception as exc:
            return False, _portable(exc)

    def close(self, owner: str) -> tuple[bool, Any]:
        """Close ``owner``'s sandbox (nothing when this host holds another one, or none)."""
        with self._lock:
            if self.owner != owner or self.sandbox is None:
                return True, None
            sandbox = self.sandbox
        try:
            sandbox.close()
        except Exception as exc:
            return False, _portable(exc)
        with self._lock:  # only a clean close frees the host for another sandbox
            self.sandbox = self.owner = None
        return True, None

    def _sandbox_of(self, owner: str) -> Any:
        with self._lock:
            if self.sandbox is None or self.owner != owner:
                raise SandboxClosedError("the sandbox is closed (this host no longer holds it)")
            return self.sandbox

    # -- internals ------------------------------------------------------------------------

    def _repository(self, source: str, ship: str, digest: str | None, bundle: bytes | None) -> str | None:
        """The repository as this node can reach it, or None when it must be shipped."""
        if not is_local_path(source):
            self.repository = "url"
            return source  # the node clones it itself
        if ship != "always" and Path(source).exists():
            self.repository = "path"
            return source
        if digest is None:
            return None
        path = shipped_dir() / f"{digest}.bundle"
        if not path.exists():
            if bundle is None:
                return None
            if hashlib.sha256(bundle).hexdigest() != digest:
                raise SandboxError("the shipped repository bundle is corrupt (its digest does not match)")
            with file_lock(path.with_suffix(".lock")):
                if not path.exists():
                    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
                    tmp.write_bytes(bundle)
                    tmp.rename(path)
        self.repository = "shipped"
        return str(path)

    def _placement(self, inner: str, spec: SandboxSpec, warmup: float) -> dict[str, Any]:
        import ray  # only ever called inside an actor

        context = ray.get_runtime_context()
        node_id = context.get_node_id()
        key = hashlib.sha256(repr((inner, spec.repo, spec.base_commit, spec.environment)).encode()).hexdigest()[:16]
        marker = cache_dir("ray") / "warm" / f"{node_id[:16]}-{key}"
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:  # the first sandbox of this environment on this node built (or found) it: its warm-up
            marker.touch(exist_ok=False)
            first = True
        except FileExistsError:
            first = False
        return {
            "backend": f"ray/{inner}", "node_id": node_id, "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(), "pid": os.getpid(), "sandbox_id": getattr(self.sandbox, "id", None),
            "sandbox_root": str(getattr(self.sandbox, "root", "")) or None, "workdir": self.sandbox.workdir,
            "repository": self.repository,
            "warmup_seconds": round(warmup, 3), "first_on_node": first,
            "channel": self.channel.address if self.channel is not None else None,
        }


def _node_address() -> str:
    """This node's address as Ray knows it (only ever called inside an actor)."""
    import ray

    return ray.util.get_node_ip_address()


def _make(inner: str, spec: SandboxSpec, limits: ResourceLimits | None, options: dict[str, Any]) -> Any:
    if inner == "local":
        from patchgym.sandboxes.local import LocalSandbox

        return LocalSandbox(spec, limits=limits, **options)
    if inner == "docker":
        from patchgym.sandboxes.docker import DockerSandbox, default_pool_size, shared_pool

        options = dict(options)
        pool_size = options.pop("pool_size", None)  # None: $PATCHGYM_DOCKER_POOL, else 1; 0: no warm pool
        options["pool"] = shared_pool(default_pool_size() if pool_size is None else int(pool_size))
        return DockerSandbox(spec, limits=limits, **options)
    raise ValueError(f"unknown sandbox backend for ray nodes {inner!r}; one of: {', '.join(INNER_BACKENDS)}")


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling (it crosses to the driver), else a SandboxError saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        kind = EnvironmentBuildError if isinstance(exc, EnvironmentBuildError) else SandboxError
        return kind(f"{type(exc).__name__}: {exc}")


def start_guard() -> subprocess.Popen | None:
    """Start the process that cleans up after this one, whenever and however it ends.

    The guard holds the read end of a pipe whose write end only this process has (not inherited by
    anything it runs): end of file means this process is gone. It runs in its own session so that
    signals to the actor's process group do not reach it, and reaps only what dead owners left.
    """
    read_end, write_end = os.pipe()
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "patchgym.sandboxes.ray_cluster.guard"], stdin=read_end,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "PATCHGYM_GUARD_WRITER": str(os.getpid())},
        )
    except OSError:
        os.close(write_end)
        return None
    finally:
        os.close(read_end)
        _keep_open.append(write_end)  # held until this process ends; then the guard sees EOF


_keep_open: list[int] = []
