"""The driver side of the ray backend: a :class:`~sandboxes.base.Sandbox` whose workspace lives in an
actor on a node of a Ray cluster.

Each ``RaySandbox`` opens its sandbox in an actor (a :class:`.host.SandboxHost`) on a node that
declares the sandbox resource, spread over the nodes by default: a warm host of this process whose
last sandbox closed (:mod:`.pool`), else a new one. It forwards every protocol call to the host over
a direct connection (:mod:`.channel`), or through Ray where there is none, and ``run_near`` runs a
whole piece of work (a grading) beside the sandbox in one call. The actor is owned by this process
and never restarted: when this process dies Ray kills it, and the actor's guard removes its
sandbox. Every call has a deadline (the command's own timeout plus a margin), and a lost actor, a
dead node or a missed deadline is an infrastructure failure (:class:`~sandboxes.base.SandboxError`,
masked by graders), never a hang.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from patchgym.sandboxes.base import (
    ClosesItself,
    ExecResult,
    ResourceLimits,
    SandboxClosedError,
    SandboxError,
    SandboxSpec,
    SandboxUsage,
)
from patchgym.sandboxes.ray_cluster.channel import TOKEN_BYTES, Channel
from patchgym.sandboxes.ray_cluster.connect import RESOURCE, ensure_connected, require_capacity
from patchgym.sandboxes.ray_cluster.host import INNER_BACKENDS, NEED_REPO, SandboxHost, is_local_path
from patchgym.sandboxes.ray_cluster.pool import POOL, Host, connected, kill, pool_key, session_of
from patchgym.sandboxes.repos import git

log = logging.getLogger(__name__)

SHIP_MODES = ("auto", "always", "never")
T = TypeVar("T")
_bundles: dict[tuple[str, float], tuple[str, bytes]] = {}
_bundles_lock = threading.Lock()


class RaySandbox(ClosesItself):
    """A sandbox hosted by a Ray actor (``inner``: ``local`` or ``docker`` on the node).

    ``address`` joins a cluster when this process is not connected yet (see
    :func:`.connect.ensure_connected`). ``ship`` says when the repository goes to the node through
    its host's connection as a git bundle: ``auto`` when the node lacks the driver's path, ``always``
    (nodes whose filesystems differ), ``never``. ``start_timeout`` bounds waiting for a free slot
    plus building the environment; ``margin`` is added to each command's own timeout before the
    call counts as lost. ``keep_warm``: seconds a host whose sandbox closed cleanly waits for this
    process's next sandbox (:mod:`.pool`; 0: one actor per sandbox). ``placement`` says where the
    sandbox runs and what its start cost.
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
        keep_warm: float = 10.0,
    ) -> None:
        if inner not in INNER_BACKENDS:
            raise ValueError(f"inner must be one of {', '.join(INNER_BACKENDS)}, not {inner!r}")
        if ship not in SHIP_MODES:
            raise ValueError(f"ship must be one of {', '.join(SHIP_MODES)}, not {ship!r}")
        self.spec = spec
        self.base_commit = spec.base_commit
        self.call_timeout, self.margin, self.keep_warm = call_timeout, margin, keep_warm
        self._lock = threading.Lock()
        self._closed = False
        self._lost: str | None = None
        self._host: Host | None = None
        self._owner = uuid.uuid4().hex  # the host serves calls that carry it, and no others
        self.placement: dict[str, Any] = {}
        self._ray = ensure_connected(address, resource=resource)
        started = time.monotonic()
        try:
            self.placement = self._start(inner, spec, limits, dict(inner_options or {}), ship, extra_hidden,
                                         start_timeout, (resource, num_cpus, scheduling_strategy))
        except BaseException:
            self.close()
            raise
        self.workdir: str = self.placement.pop("workdir")
        self.placement.pop("channel", None)
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

    def run_near(self, fn: Callable[..., T], *args: Any, timeout: float, **kwargs: Any) -> T:
        """``fn(sandbox, *args, **kwargs)`` run on the sandbox's node, in its host, with the node's
        own sandbox: a whole grading in one round trip instead of one per command and file, and
        its CPU spent on the node, not here. ``fn`` must be a module-level function (it crosses by
        name, and the node imports it); its exceptions are raised here. ``timeout``: the whole
        call's, before ``margin``; past it the sandbox is lost."""
        return self._call(None, fn, args, kwargs, deadline=timeout + self.margin)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            host, self._host = self._host, None
        if host is None:
            return
        clean = False
        if self._lost is None:  # let it close its sandbox; the guard cleans up otherwise
            try:
                self._invoke(host, "close", (self._owner,), {}, 30.0, "closing the sandbox")
                clean = True
            except Exception as exc:
                log.warning("ray sandbox %s: close on the node failed (its guard cleans up): %s",
                            self.placement.get("sandbox_id"), exc)
        if clean:
            POOL.give_back(self._ray, host, self.keep_warm)
        else:
            POOL.discard(self._ray, host)

    # -- internals ------------------------------------------------------------------------

    def _start(self, inner: str, spec: SandboxSpec, limits: ResourceLimits | None, options: dict[str, Any],
               ship: str, extra_hidden: Any, timeout: float, actor_options: tuple[str, float, Any]) -> dict[str, Any]:
        """Open the sandbox in a warm host of this process, or else in a new one."""
        args = (inner, spec, limits, options)
        key = pool_key(*actor_options)
        while key is not None and self.keep_warm > 0 and (host := POOL.take(self._ray, key)) is not None:
            self._host = host
            try:
                return self._open(host, args, ship, extra_hidden, timeout, reused=True)
            except HostLostError as exc:
                if exc.timed_out:
                    raise
                with self._lock:  # it died while idle (its node went away, say): try the next one
                    self._host, self._lost = None, None
                POOL.discard(self._ray, host)
        resource, num_cpus, strategy = actor_options
        require_capacity(resource)
        if key is not None:
            POOL.make_room(self._ray, key)
        token = secrets.token_bytes(TOKEN_BYTES)
        actor = _actor_class(self._ray).options(
            resources={resource: 1}, num_cpus=num_cpus, scheduling_strategy=strategy,
            max_restarts=0, max_task_retries=0, max_concurrency=2,
        ).remote(token)
        host = self._host = Host(actor=actor, key=key or (), session=session_of(self._ray))
        placement = self._open(host, args, ship, extra_hidden, timeout, reused=False)
        host.node_id = placement["node_id"]
        host.channel = _connect(placement.get("channel"), token)
        POOL.started(host)
        return placement

    def _open(self, host: Host, args: tuple, ship: str, extra_hidden: Any, timeout: float, *,
              reused: bool) -> dict[str, Any]:
        spec = args[1]
        digest, bundle = None, None
        for _ in range(2):
            kwargs = {"ship": ship, "digest": digest, "bundle": bundle, "extra_hidden": extra_hidden}
            answer = self._invoke(host, "open", (self._owner, *args), kwargs, timeout, "starting the sandbox")
            if answer != NEED_REPO:
                answer["host_reused"] = reused
                return answer
            if ship == "never" or not is_local_path(spec.repo):
                raise SandboxError(f"the node has no repository at {spec.repo} and shipping it is off (ship='never')")
            digest, bundle = _bundle_of(spec.repo)
        raise SandboxError(f"the node did not take the shipped repository {spec.repo}")

    def _call(self, method: str | None, *args: Any, deadline: float | None = None, **kwargs: Any) -> Any:
        """A protocol ``method`` on the host's sandbox; with no method, ``run`` (``args``: fn, args, kwargs)."""
        with self._lock:
            if self._closed:
                raise SandboxClosedError(f"ray sandbox {self.placement.get('sandbox_id')} is closed")
            if self._lost is not None:
                raise SandboxError(self._lost)
            host = self._host
        assert host is not None
        timeout = deadline or self.call_timeout
        if method is None:
            return self._invoke(host, "run", (self._owner, *args), {}, timeout, "a run on the node")
        return self._invoke(host, "call", (self._owner, method, *args), kwargs, timeout, method)

    def _invoke(self, host: Host, name: str, args: tuple, kwargs: dict, timeout: float, what: str) -> Any:
        """The host's answer to one call, over its channel or else through Ray: its value, its
        exception re-raised, or a SandboxError when the host was lost or did not answer in time."""
        if host.channel is not None:
            try:
                ok, value = host.channel.request(name, args, kwargs, timeout)
            except TimeoutError:
                self._lose(host, f"the ray sandbox did not answer {what} within {timeout:.0f}s "
                                 f"(node {self.placement.get('node_ip', '?')})", timed_out=True)
            except (OSError, EOFError) as exc:
                self._lose(host, f"the ray sandbox was lost during {what}: its host's connection ended ({exc})")
        elif not connected(self._ray, host):  # Ray was shut down: calling it would start a new cluster
            self._lose(host, f"the ray sandbox was lost during {what}: this process left its Ray cluster")
        else:
            exceptions = self._ray.exceptions
            try:
                ok, value = self._ray.get(getattr(host.actor, name).remote(*args, **kwargs), timeout=timeout)
            except exceptions.GetTimeoutError:
                self._lose(host, f"the ray sandbox did not answer {what} within {timeout:.0f}s "
                                 f"(node {self.placement.get('node_ip', '?')})", timed_out=True)
            except exceptions.RayError as exc:
                self._lose(host, f"the ray sandbox was lost during {what}: {_first_line(exc)}")
        if not ok:
            raise value
        return value

    def _lose(self, host: Host, reason: str, *, timed_out: bool = False) -> NoReturn:
        """Mark the sandbox lost (every later call fails the same way), kill its actor, raise."""
        with self._lock:
            self._lost = reason
        kill(self._ray, host)
        raise HostLostError(reason, timed_out=timed_out)


class HostLostError(SandboxError):
    """The sandbox's host died, or did not answer in time (``timed_out``): an infrastructure failure."""

    def __init__(self, reason: str, *, timed_out: bool) -> None:
        super().__init__(reason)
        self.timed_out = timed_out


def _connect(address: Any, token: bytes) -> Channel | None:
    """The channel to a new host, or None (calls then go through Ray) when it cannot be reached from
    here: a Ray Client driver outside the cluster's network, say."""
    if not address:
        return None
    try:
        return Channel(tuple(address), token)
    except OSError as exc:
        log.info("ray sandbox host at %s:%s cannot be reached directly (calls go through Ray): %s",
                 address[0], address[1], exc)
        return None


@lru_cache(maxsize=1)
def _actor_class(ray: Any) -> Any:
    """SandboxHost as a Ray actor class (made once)."""
    return ray.remote(SandboxHost)


def _bundle_of(source: str) -> tuple[str, bytes]:
    """The repository at ``source`` as a git bundle: (digest, bytes), sent with the node's ``open``
    (over the host's connection, else through Ray's object store, which takes large arguments).

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
            _bundles[key] = (hashlib.sha256(data).hexdigest(), data)
        return _bundles[key]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    died = [line for line in lines if "died" in line.lower() or "node" in line.lower()]
    return f"{type(exc).__name__}: {(died or lines or [''])[0][:300]}"
