"""The driver side of the ray backend: a :class:`~sandboxes.base.Sandbox` whose workspace lives in an
actor on a node of a Ray cluster.

Each ``RaySandbox`` creates one actor (a :class:`.host.SandboxHost`) on a node that declares the
sandbox resource, spread over the nodes by default, and forwards every protocol call to it. The
actor is owned by this process and never restarted: when this process dies Ray kills it, and the
actor's guard removes its sandbox. Every call has a deadline (the command's own timeout plus a
margin), and a lost actor, a dead node or a missed deadline is an infrastructure failure
(:class:`~sandboxes.base.SandboxError`, masked by graders), never a hang.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..base import ClosesItself, ExecResult, SandboxClosedError, SandboxError, SandboxUsage
from ..limits import ResourceLimits
from ..local import SandboxSpec
from ..repos import git
from .connect import RESOURCE, ensure_connected, require_capacity
from .host import INNER_BACKENDS, NEED_REPO, SandboxHost, is_local_path

log = logging.getLogger(__name__)

SHIP_MODES = ("auto", "always", "never")
_bundles: dict[tuple[str, float], tuple[str, Any]] = {}
_bundles_lock = threading.Lock()


class RaySandbox(ClosesItself):
    """A sandbox hosted by a Ray actor (``inner``: ``local`` or ``docker`` on the node).

    ``address`` joins a cluster when this process is not connected yet (see
    :func:`.connect.ensure_connected`). ``ship`` says when the repository goes to the node through
    Ray's object store as a git bundle: ``auto`` when the node lacks the driver's path, ``always``
    (nodes whose filesystems differ), ``never``. ``start_timeout`` bounds waiting for a free slot
    plus building the environment; ``margin`` is added to each command's own timeout before the
    call counts as lost. ``placement`` says where the sandbox runs and what its warm-up cost.
    """

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        limits: ResourceLimits | None = None,
        inner: str = "local",
        inner_options: dict[str, Any] | None = None,
        address: str | None = None,
        resource: str = RESOURCE,
        num_cpus: float = 0.0,
        scheduling_strategy: Any = "SPREAD",
        ship: str = "auto",
        extra_hidden: Any = None,
        start_timeout: float = 1800.0,
        call_timeout: float = 600.0,
        margin: float = 60.0,
    ) -> None:
        if inner not in INNER_BACKENDS:
            raise ValueError(f"inner must be one of {', '.join(INNER_BACKENDS)}, not {inner!r}")
        if ship not in SHIP_MODES:
            raise ValueError(f"ship must be one of {', '.join(SHIP_MODES)}, not {ship!r}")
        self.spec = spec
        self.base_commit = spec.base_commit
        self.call_timeout, self.margin = call_timeout, margin
        self._lock = threading.Lock()
        self._closed = False
        self._lost: str | None = None
        self._actor: Any = None
        self.placement: dict[str, Any] = {}
        self._ray = ensure_connected(address, resource=resource)
        require_capacity(resource)
        actor_class = _actor_class(self._ray)
        started = time.monotonic()
        try:
            self._actor = actor_class.options(
                resources={resource: 1}, num_cpus=num_cpus, scheduling_strategy=scheduling_strategy,
                max_restarts=0, max_task_retries=0, max_concurrency=2,
            ).remote()
            self.placement = self._open(inner, spec, limits, dict(inner_options or {}), ship, extra_hidden,
                                        start_timeout)
        except BaseException:
            self.close()
            raise
        self.workdir: str = self.placement.pop("workdir")
        # the whole start as the driver saw it: waiting for a slot, the actor's process, then warm-up
        self.placement["start_seconds"] = round(time.monotonic() - started, 3)
        self.id = f"ray-{self.placement.get('sandbox_id')}"

    # -- protocol -------------------------------------------------------------------------

    def exec(self, command: str, timeout: float = 60.0, cwd: str | None = None,
             env: dict[str, str] | None = None, output_limit: int | None = None) -> ExecResult:
        return self._call("exec", command, timeout=timeout, cwd=cwd, env=env, output_limit=output_limit,
                          deadline=timeout + self.margin)

    def read_file(self, path: str) -> bytes:
        return self._call("read_file", path)

    def write_file(self, path: str, data: bytes | str) -> None:
        self._call("write_file", path, data)

    def diff(self) -> str:
        return self._call("diff")

    def reset(self) -> None:
        self._call("reset")

    def usage(self) -> SandboxUsage:
        """What the sandbox has cost its node so far (nothing measured once it is lost or closed)."""
        try:
            return self._call("usage")
        except SandboxError:
            return SandboxUsage()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            actor, self._actor = self._actor, None
        if actor is None:
            return
        try:
            if self._lost is None:  # let it close its sandbox; the guard cleans up otherwise
                self._ray.get(actor.close.remote(), timeout=30)
        except Exception as exc:
            log.warning("ray sandbox %s: close on the node failed (its guard cleans up): %s",
                        self.placement.get("sandbox_id"), exc)
        finally:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:
                pass

    # -- internals ------------------------------------------------------------------------

    def _open(self, inner: str, spec: SandboxSpec, limits: ResourceLimits | None, options: dict[str, Any],
              ship: str, extra_hidden: Any, timeout: float) -> dict[str, Any]:
        digest, bundle = None, None
        for _ in range(2):
            ref = self._actor.open.remote(inner, spec, limits, options, ship=ship, digest=digest, bundle=bundle,
                                          extra_hidden=extra_hidden)
            answer = self._wait(ref, timeout, "starting the sandbox")
            if answer != NEED_REPO:
                return answer
            if ship == "never" or not is_local_path(spec.repo):
                raise SandboxError(f"the node has no repository at {spec.repo} and shipping it is off (ship='never')")
            digest, bundle = _bundle_of(self._ray, spec.repo)
        raise SandboxError(f"the node did not take the shipped repository {spec.repo}")

    def _call(self, method: str, *args: Any, deadline: float | None = None, **kwargs: Any) -> Any:
        with self._lock:
            if self._closed:
                raise SandboxClosedError(f"ray sandbox {self.placement.get('sandbox_id')} is closed")
            if self._lost is not None:
                raise SandboxError(self._lost)
            actor = self._actor
        return self._wait(actor.call.remote(method, *args, **kwargs), deadline or self.call_timeout, method)

    def _wait(self, ref: Any, timeout: float, what: str) -> Any:
        """The host's answer to ``ref``: its value, its exception re-raised, or a SandboxError."""
        exceptions = self._ray.exceptions
        try:
            ok, value = self._ray.get(ref, timeout=timeout)
        except exceptions.GetTimeoutError:
            self._lose(f"the ray sandbox did not answer {what} within {timeout:.0f}s "
                       f"(node {self.placement.get('node_ip', '?')})")
        except exceptions.RayError as exc:
            self._lose(f"the ray sandbox was lost during {what}: {_first_line(exc)}")
        if not ok:
            raise value
        return value

    def _lose(self, reason: str) -> None:
        """Mark the sandbox lost (every later call fails the same way), kill its actor, raise."""
        with self._lock:
            self._lost = reason
            actor = self._actor
        if actor is not None:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:
                pass
        raise SandboxError(reason)


@lru_cache(maxsize=1)
def _actor_class(ray: Any) -> Any:
    """SandboxHost as a Ray actor class (made once)."""
    return ray.remote(SandboxHost)


def _bundle_of(ray: Any, source: str) -> tuple[str, Any]:
    """The repository at ``source`` as a git bundle in the object store: (digest, object ref).

    Made once per source (and modification time) in this process; a node keeps what it received
    by digest, so each node receives each repository once.
    """
    path = Path(source).expanduser().resolve()
    key = (str(path), path.stat().st_mtime)
    with _bundles_lock:
        if key not in _bundles:
            if path.is_file():
                data = path.read_bytes()  # already a bundle
            else:
                fd, tmp = tempfile.mkstemp(suffix=".bundle")
                os.close(fd)
                try:
                    git("bundle", "create", "--quiet", tmp, "--all", cwd=path)
                    data = Path(tmp).read_bytes()
                finally:
                    os.unlink(tmp)
            _bundles[key] = (hashlib.sha256(data).hexdigest(), ray.put(data))
        return _bundles[key]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    died = [line for line in lines if "died" in line.lower() or "node" in line.lower()]
    return f"{type(exc).__name__}: {(died or lines or [''])[0][:300]}"
