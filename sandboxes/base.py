"""The sandbox protocol, and what every backend (local, docker, ray) shares: what a sandbox is made
of (:class:`SandboxSpec`, :class:`EnvironmentSpec`), its bounds (:class:`ResourceLimits`), what a
command gives back (:class:`ExecResult`) and the errors.

A sandbox holds one repository checkout (the *workspace*) at a base commit, with the task's
environment ready, and runs untrusted commands in it. The gym never touches a backend's internals:
it only calls the methods of :class:`Sandbox`. The backends are siblings that import this module,
never each other.

This module is also copied into sandboxes (as ``pgrt.base``) and run there by another interpreter
(a Docker image's Debian python3): the standard library only, and the relative import below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from .files import PathOutsideWorkspaceError  # relative: copied into sandboxes as the package pgrt

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

__all__ = ["ClosesItself", "EnvironmentBuildError", "EnvironmentSpec", "ExecResult", "PathOutsideWorkspaceError",
           "ResourceLimits", "Sandbox", "SandboxClosedError", "SandboxError", "SandboxSpec", "SandboxUsage",
           "WorkspaceError", "usage_of"]

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
    before ``close()``), else nothing measured. A sandbox that can no longer say (its server gone,
    a request cut short) is not measured either: the close that follows must still happen."""
    usage = getattr(sandbox, "usage", None)
    if not callable(usage):
        return SandboxUsage()
    try:
        return usage()
    except SandboxError:
        return SandboxUsage()


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


# -- what a sandbox is made of ------------------------------------------------------------------


@dataclass(frozen=True)
class EnvironmentSpec:
    """How to build the environment a repository's tests run in.

    ``python`` is a PEP 440 constraint (``">=3.9"``) or a bare version (``"3.11"``). ``pre_install``
    runs first, then ``packages`` are pip-installed, then ``install`` runs in a checkout of the
    repository (at ``/testbed`` when isolated) — e.g. ``pip install -e .``.
    """

    python: str = ">=3.8"
    packages: tuple[str, ...] = ()
    pre_install: tuple[str, ...] = ()
    install: tuple[str, ...] = ()

    def specifier(self) -> SpecifierSet:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet  # here: pgrt has no packaging

        text = self.python.strip()
        if text and text[0].isdigit():
            text = f"=={text}.*" if text.count(".") < 2 else f"=={text}"
        try:
            return SpecifierSet(text)
        except InvalidSpecifier as exc:
            raise EnvironmentBuildError(f"invalid python constraint {self.python!r}: {exc}") from None


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox is made of: a repository at a commit and the environment to run it in.

    ``repo`` is a path or URL git can clone (a directory, a bundle file, a remote). ``hidden_paths``
    are host paths no command may read (the task catalog: hidden tests and gold patches).
    """

    repo: str
    base_commit: str
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    hidden_paths: tuple[str, ...] = ()


# The largest workspace diff taken for grading: no real patch comes near (SWE-bench's gold patches
# are kilobytes), and the server holds a few copies of it per submit.
DIFF_BYTES = 8 << 20


@dataclass(frozen=True)
class ResourceLimits:
    """Bounds on what one sandbox's processes may use.

    ``cpu_seconds``, ``file_size_bytes`` and ``open_files`` are per process (rlimits);
    ``memory_bytes`` and ``max_processes`` bound the sandbox's whole process tree when cgroups are
    available, and fall back to per-process rlimits (which do not bind root) when they are not.
    A command that keeps ``max_processes`` reached (a fork bomb) is killed within seconds.

    ``disk_bytes`` and ``disk_files`` bound what the sandbox may write beyond the repository itself
    (bytes, and files/directories: inodes); writes past them fail with ENOSPC. Local backend: one
    budget for the workspace and ``/tmp`` together. Docker backend: each writable mount
    (``/testbed`` beyond the repository, ``/tmp``, ``/var/tmp``; ``/dev/shm`` and ``/run/lock``
    get a small share) has its own, and all of them are memory of the container, so
    ``memory_bytes`` bounds their sum too.

    ``diff_bytes`` bounds the workspace's diff (:meth:`Sandbox.diff`): past it the workspace is
    refused as a patch (:class:`WorkspaceError`, the agent's failure), before it is read.
    """

    cpu_seconds: int = 900
    memory_bytes: int = 4 << 30
    max_processes: int = 512
    file_size_bytes: int = 1 << 30
    open_files: int = 4096
    cpus: float = 2.0  # CPUs a sandbox may use at once: a CFS quota (Docker's --cpus; the local backend's cpu cgroup)
    disk_bytes: int = 2 << 30
    disk_files: int = 200_000
    diff_bytes: int = DIFF_BYTES


# -- the protocol --------------------------------------------------------------------------------


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
        :class:`WorkspaceError` when the workspace cannot be expressed as a patch (larger than
        ``ResourceLimits.diff_bytes``, a tracked path replaced by a FIFO, ...)."""
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
