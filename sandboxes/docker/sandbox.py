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
    SandboxError,
    SandboxSpec,
    SandboxUsage,
    WorkspaceError,
)
from patchgym.sandboxes.docker.connection import ServerError
from patchgym.sandboxes.docker.containers import DEFAULT_LIFETIME, WORKDIR, removals, remove_container, start_container
from patchgym.sandboxes.docker.pool import WarmPool
from patchgym.sandboxes.gitops import DIFF_LIMIT
from patchgym.sandboxes.output import DEFAULT_OUTPUT_LIMIT, CappedOutput

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
        entries = [f"{key}={value}" for key, value in (env or {}).items()]
        if any("\0" in entry for entry in entries):
            raise ValueError("embedded null byte in the command's environment")
        environment = b"".join(_encode(entry) + b"\0" for entry in entries)
        code, timed_out, duration, total, cpu, head, tail = self._request(
            b"X", (_encode(script), repr(float(timeout)).encode(), str(limit).encode(), environment), timeout + GRACE)
        output = CappedOutput(limit)
        output.feed(head)
        output.feed(tail)
        output.total = int(total)  # the head and the tail the server kept, of this many bytes
        return ExecResult(exit_code=int(code), output=output.text(), timed_out=timed_out == b"1",
                          duration=float(duration), truncated=output.truncated, cpu_seconds=float(cpu))

    def read_file(self, path: str) -> bytes:
        return self._request(b"R", (_encode(path),), 120)[0]

    def write_file(self, path: str, data: bytes | str) -> None:
        self._request(b"W", (_encode(path), data.encode() if isinstance(data, str) else data), 120)

    def diff(self) -> str:
        answer = json.loads(self._request(b"D", (str(DIFF_LIMIT).encode(),), 600)[0])
        if "error" in answer:
            raise self._error(answer["error"], answer["message"])
        return answer["diff"]

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
            self._conn.close()  # the server ends, and the engine removes its container
            # In case it did not (a server stuck where it cannot read its stream): removing a running
            # container takes 100-200 ms of the engine's time, which a trainer is not kept waiting for.
            try:
                removals.submit(remove_container, self.container)
            except RuntimeError:  # at interpreter exit: the executor is shut down
                remove_container(self.container)

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
        if kind == "outside":
            return PathOutsideWorkspaceError(message)
        if kind == "notfound":
            return FileNotFoundError(message)
        if kind == "notregular":
            return IsADirectoryError(message)
        if kind == "workspace":
            return WorkspaceError(message)
        return SandboxError(f"sandbox {self.id}: {message}")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")
