"""The Docker backend's sandbox: one container per sandbox, from cached layered images.

Commands, file reads and writes, the diff and reset are requests to the container's command server
(``server.c``, its pid 1) over the container's attached stdin and stdout (``connection.py``): no
``docker exec`` per command. How a container is started and bounded is in ``containers.py``;
``pool.py`` hands out containers started ahead of need. ``reset()`` restores the pristine tree in
place.

An idle sandbox holds its server (about 100 KiB of its own), the kernel's share of the container,
the engine's containerd-shim, and its /testbed without the repository's history (borrowed from the
image): bench/docker_sandbox.py measures it beside mini-swe-agent's container.
"""

from __future__ import annotations

import json
import shlex
import threading

from patchgym.sandboxes.base import (
    ClosesItself,
    ExecResult,
    PathOutsideWorkspaceError,
    ResourceLimits,
    SandboxClosedError,
    SandboxSpec,
    SandboxUsage,
)
from patchgym.sandboxes.docker.client import kill_container
from patchgym.sandboxes.docker.containers import DEFAULT_LIFETIME, WORKDIR, start_container
from patchgym.sandboxes.docker.pool import WarmPool
from patchgym.sandboxes.docker.retire import retirements
from patchgym.sandboxes.output import DEFAULT_OUTPUT_LIMIT
from patchgym.sandboxes.wire import ServerError, exec_request, exec_result, server_error

GRACE = 30.0  # beyond a command's own timeout before the server counts as hung
# (repo, commit, environment, release) -> instance image tag: resolving it asks the engine about
# three images and hashes the spec, which costs far more than a container from the warm pool.
_images: dict[tuple, str] = {}


class DockerSandbox(ClosesItself):
    """A :class:`~sandboxes.base.Sandbox` in a Docker container (workspace at ``/testbed``).

    ``read_only_binds``: host directories the container sees, read-only, at the path given (the
    engine must run on this host); such a container is started for the sandbox, not taken from the
    warm pool."""

    workdir = WORKDIR

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        limits: ResourceLimits | None = None,
        release: str | None = None,
        network: bool = False,
        pool: WarmPool | None = None,
        lifetime: int = DEFAULT_LIFETIME,
        read_only_binds: dict[str, str] | None = None,
    ) -> None:
        from patchgym.sandboxes.docker.images import instance_image

        self.spec = spec
        self.base_commit = spec.base_commit
        self.limits = limits or ResourceLimits()
        self._lock = threading.RLock()
        self._closed = False
        self.binds = dict(read_only_binds or {})  # host path -> container path, read-only
        if self.binds:
            pool = None  # a warm container has no such mount: this one is started for it
        import docker.errors

        key = (spec.repo, spec.base_commit, spec.environment, release)
        for attempt in range(2):
            if key not in _images:
                _images[key] = instance_image(spec.repo, spec.base_commit, spec.environment, release=release)
            self.image = _images[key]
            try:
                if pool is not None:
                    self.container, self._conn = pool.acquire(self.image, self.limits, network)
                else:
                    self.container, self._conn = start_container(self.image, self.limits, lifetime, network,
                                                                 binds=self.binds)
                break
            except docker.errors.ImageNotFound:
                _images.pop(key, None)  # pruned since it was resolved: build it again, once
                if attempt:
                    raise
        self.id = self.container.id[:12]

    def exec(self, command: str, timeout: float = 60.0, cwd: str | None = None,
             env: dict[str, str] | None = None, output_limit: int | None = None) -> ExecResult:
        run_cwd = WORKDIR
        if cwd is not None:
            self._check_path(cwd)
            run_cwd = cwd if cwd.startswith("/") else f"{WORKDIR}/{cwd}"
        # The shell enters the working directory, so that one the agent made unreadable fails the
        # command instead of the server's spawn.
        script = f"cd -- {shlex.quote(run_cwd)} || exit 1\n{command}"
        limit = output_limit or DEFAULT_OUTPUT_LIMIT
        fields = self._request(b"X", exec_request(script, timeout, limit, env), timeout + GRACE)
        return exec_result(fields, limit)

    def read_file(self, path: str) -> bytes:
        return self._request(b"R", (path.encode("utf-8", "surrogateescape"),), 120)[0]

    def write_file(self, path: str, data: bytes | str) -> None:
        self._request(b"W", (path.encode("utf-8", "surrogateescape"), data.encode() if isinstance(data, str) else data),
                      120)

    def diff(self) -> str:
        answer = self._request(b"D", (str(self.limits.diff_bytes).encode(),), 600)[0]
        if answer[:1] == b"D":  # the diff as git wrote it (diff_helper.py), decoded without a copy of the bytes
            return str(memoryview(answer)[1:], "utf-8", "replace")
        error = json.loads(answer[1:])
        raise self._error(error["error"], error["message"])

    def reset(self) -> None:
        self._request(b"Z", (), 300)

    def usage(self) -> SandboxUsage:
        """The CPU time of every process the container ran (its server's start included) and the
        most memory it held at once (its tmpfs mounts included), from its cgroups."""
        cpu, peak = self._request(b"U", (), 30)
        return SandboxUsage(cpu_seconds=int(cpu) / 1e9 if cpu else None, peak_memory_bytes=int(peak) if peak else None)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._conn.in_step:  # a request cut short: its command may still run, and the
                kill_container(self.container)  # server reads its stream's end only between commands
            # The server ends with its stream and the engine removes the container; one that is
            # still there after a grace is removed then (retire.py), off the caller's time.
            retirements.retire(self.container, self._conn)

    def _check_path(self, path: str) -> None:
        if path.startswith("/") and path != WORKDIR and not path.startswith(WORKDIR + "/"):
            raise PathOutsideWorkspaceError(f"{path} is outside the workspace {WORKDIR}")

    def _request(self, op: bytes, fields: tuple[bytes, ...], timeout: float) -> list[bytes]:
        with self._lock:
            if self._closed:
                raise SandboxClosedError(f"sandbox {getattr(self, 'id', '?')} is closed")
            try:
                return self._conn.request(op, fields, timeout)
            except ServerError as exc:
                raise self._error(exc.kind, str(exc)) from None

    def _error(self, kind: str, message: str) -> Exception:
        """The exception for an error the command server answered with."""
        return server_error(kind, message if kind != "internal" else f"sandbox {self.id}: {message}")
