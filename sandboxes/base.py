"""The sandbox protocol: what every backend (local, docker, ray) offers the gym.

A sandbox holds one repository checkout (the *workspace*) at a base commit, with the task's
environment ready, and runs untrusted commands in it. The gym never touches a backend's internals:
it only calls the methods of :class:`Sandbox`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from .files import PathOutsideWorkspaceError  # relative: copied into sandboxes as the package pgrt

__all__ = ["ClosesItself", "EnvironmentBuildError", "ExecResult", "PathOutsideWorkspaceError", "Sandbox",
           "SandboxClosedError", "SandboxError", "SandboxUsage", "WorkspaceError", "usage_of"]

_Self = TypeVar("_Self", bound="ClosesItself")


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command.

    ``output`` is stdout and stderr interleaved, decoded as UTF-8 (invalid bytes replaced) and capped:
    when the command printed more than the limit, the head and the tail are kept around a visible
    truncation marker and ``truncated`` is set.
    """

    exit_code: int
    output: str
    timed_out: bool
    duration: float
    truncated: bool = False
    # CPU time (user + system) the command's processes used, where the backend can measure it:
    # reports charge it to the tests or to the environment (cost per episode).
    cpu_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class SandboxUsage:
    """What a sandbox has cost the machine so far: the CPU time (user + system) of every process it
    ran, ended ones included (its own start-up too, not only commands), and the most memory it held
    at once. None where the backend cannot measure it."""

    cpu_seconds: float | None = None
    peak_memory_bytes: int | None = None


def usage_of(sandbox: object) -> SandboxUsage:
    """``sandbox.usage()`` where the backend offers it (an optional part of the protocol, read
    before ``close()``), else nothing measured."""
    usage = getattr(sandbox, "usage", None)
    return usage() if callable(usage) else SandboxUsage()


class SandboxError(RuntimeError):
    """An infrastructure failure: the sandbox could not be built or stopped working.

    Raised for faults that are not the agent's doing (an environment that fails to build, a
    workspace that cannot be created, a crashed backend). Graders report it apart from agent
    failure so that a trainer can mask the sample instead of scoring it 0.
    """


class EnvironmentBuildError(SandboxError):
    """The task's environment (interpreter, packages, install steps) could not be built."""


class SandboxClosedError(SandboxError):
    """An operation was attempted on a sandbox after ``close()``."""


class WorkspaceError(Exception):
    """The agent left its workspace in a state no patch can be read from (the reason says why).

    Deliberately not a :class:`SandboxError`: that one means infrastructure failure, which a trainer
    masks, and nothing an agent does to its own workspace may get its sample masked. This is the
    agent's failure.
    """


@runtime_checkable
class Sandbox(Protocol):
    """A repository workspace at a base commit where untrusted commands run.

    ``workdir`` is the workspace's path as commands inside the sandbox see it (``/testbed`` when
    isolated). File paths given to ``read_file``/``write_file`` are relative to it, or absolute
    inside it.

    Optional: ``usage() -> SandboxUsage``, what the sandbox has cost so far (the local backend,
    from its cgroups); :func:`usage_of` reads it where it exists. It is not part of this protocol's
    runtime check, so a backend that cannot measure still is a ``Sandbox``.
    """

    workdir: str
    base_commit: str

    def exec(
        self,
        command: str,
        timeout: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        """Run ``command`` with bash in the workspace; kill its whole process tree on timeout."""
        ...

    def read_file(self, path: str) -> bytes:
        """Return the bytes of a file in the workspace."""
        ...

    def write_file(self, path: str, data: bytes | str) -> None:
        """Create or overwrite a file in the workspace (parent directories are created)."""
        ...

    def diff(self) -> str:
        """The workspace's change against ``base_commit`` as a git diff (new files included).

        Computed by the harness with a git directory the agent cannot reach; raises
        :class:`WorkspaceError` when the workspace cannot be expressed as a patch (too large, a
        tracked path replaced by a FIFO, ...)."""
        ...

    def reset(self) -> None:
        """Put the workspace back to the pristine base commit and kill every process."""
        ...

    def close(self) -> None:
        """Free everything the sandbox holds. Idempotent."""
        ...


class ClosesItself:
    """What every backend shares around its ``close()``: a context manager, and a finalizer as the
    last resort (``close()`` is the contract; a sandbox dropped without it still frees what it holds)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
