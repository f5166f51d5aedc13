"""The node side of the ray backend: one actor hosts one local or docker sandbox on its node.

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
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..base import EnvironmentBuildError, SandboxError, usage_of
from ..limits import ResourceLimits
from ..local import SandboxSpec
from ..locks import file_lock
from ..paths import cache_dir

#: What a host answers instead of opening when its node cannot reach the driver's repository.
NEED_REPO = "need-repo"
INNER_BACKENDS = ("local", "docker")


def shipped_dir() -> Path:
    """Where repositories shipped through the object store are kept on a node: inside the mirrors'
    cache, which every local sandbox already hides from commands (they hold the whole history)."""
    path = cache_dir("mirrors") / "shipped"
    path.mkdir(parents=True, exist_ok=True)
    return path


def is_local_path(source: str) -> bool:
    return "://" not in source and not source.startswith("git@")


class SandboxHost:
    """Hosts one sandbox; every method answers ``(ok, value)`` so errors cross Ray as they are."""

    def __init__(self) -> None:
        self.sandbox: Any = None
        self.repository = ""  # how this node got the repository: path, url or shipped
        self.guard = start_guard()

    def open(self, inner: str, spec: SandboxSpec, limits: ResourceLimits | None, options: dict[str, Any],
             *, ship: str = "auto", digest: str | None = None, bundle: bytes | None = None,
             extra_hidden: Any = None) -> tuple[bool, Any]:
        """Build the sandbox; answer its placement, or :data:`NEED_REPO` when this node needs the
        driver's repository shipped (``digest`` names a bundle the node may already keep)."""
        try:
            start = time.monotonic()
            source = self._repository(spec.repo, ship, digest, bundle)
            if source is None:
                return True, NEED_REPO
            hidden = tuple(spec.hidden_paths) + tuple(extra_hidden() if extra_hidden else ())
            spec = replace(spec, repo=source, hidden_paths=hidden)
            self.sandbox = _make(inner, spec, limits, options)
            warmup = time.monotonic() - start
            return True, self._placement(inner, spec, warmup)
        except Exception as exc:
            return False, _portable(exc)

    def call(self, method: str, *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        """Run one protocol method (``exec``, ``read_file``, ``write_file``, ``diff``, ``reset``,
        and the optional ``usage``)."""
        if method not in ("exec", "read_file", "write_file", "diff", "reset", "usage"):
            return False, SandboxError(f"not a sandbox method: {method!r}")
        if self.sandbox is None:
            return False, SandboxError("the sandbox was never opened")
        try:
            if method == "usage":
                return True, usage_of(self.sandbox)
            return True, getattr(self.sandbox, method)(*args, **kwargs)
        except Exception as exc:
            return False, _portable(exc)

    def close(self) -> tuple[bool, Any]:
        try:
            if self.sandbox is not None:
                self.sandbox.close()
            return True, None
        except Exception as exc:
            return False, _portable(exc)

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
        }


def _make(inner: str, spec: SandboxSpec, limits: ResourceLimits | None, options: dict[str, Any]) -> Any:
    if inner == "local":
        from ..local import LocalSandbox

        return LocalSandbox(spec, limits=limits, **options)
    if inner == "docker":
        from ..docker import DockerSandbox, default_pool_size, shared_pool

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
            [sys.executable, "-m", "sandboxes.ray_cluster.guard"], stdin=read_end,
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
