"""The embedded default backend: a workspace on this host, isolated with bubblewrap when possible.

Each sandbox owns a directory with the workspace (a copy of the pristine checkout) and its own
``/tmp``; commands run in fresh namespaces (no network, read-only host, private /tmp) inside the
sandbox's cgroups. Without bubblewrap the same commands run as plain processes, with a warning:
that mode bounds resources and cleans up, but it does not contain hostile code.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .base import ExecResult, PathOutsideWorkspaceError, SandboxClosedError, SandboxError
from .environments import BuiltEnvironment, EnvironmentSpec, ensure_environment, run_logged, venv_environ
from .isolation import SANDBOX_WORKDIR, Mounts, bwrap_argv, bwrap_path, bwrap_prefix, with_command
from .limits import LAUNCH_FAILED, ProcessGroup, ResourceLimits, launcher
from .output import DEFAULT_OUTPUT_LIMIT
from .paths import cache_dir
from .process import run_capped
from .reaper import owned_name
from .repos import copy_checkout, pristine_checkout

log = logging.getLogger(__name__)

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_warned_unisolated = False


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


class LocalSandbox:
    """A :class:`~sandboxes.base.Sandbox` on this host.

    ``isolation`` is ``"auto"`` (bubblewrap when it works here, plain processes otherwise),
    ``"bwrap"`` (fail when bubblewrap is unavailable) or ``"none"``.
    """

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        limits: ResourceLimits | None = None,
        isolation: str = "auto",
    ) -> None:
        if isolation not in ("auto", "bwrap", "none"):
            raise ValueError(f"isolation must be auto, bwrap or none, not {isolation!r}")
        self.spec = spec
        self.base_commit = spec.base_commit
        self.limits = limits or ResourceLimits()
        self.isolated = isolation != "none" and bwrap_path() is not None
        if isolation == "bwrap" and not self.isolated:
            raise SandboxError("bubblewrap isolation was required but bwrap is not usable here")
        if not self.isolated and isolation == "auto":
            _warn_unisolated()
        self._lock = threading.RLock()
        self._closed = False
        self.id = owned_name(uuid.uuid4().hex[:12])
        self.root = cache_dir("sandboxes") / self.id
        self.workspace = self.root / "testbed"
        self.tmp = self.root / "tmp"
        self._group: ProcessGroup | None = None
        self._bwrap_prefix: list[str] | None = None
        try:
            self._template = pristine_checkout(spec.repo, spec.base_commit)
            self.env: BuiltEnvironment = ensure_environment(
                spec.environment, checkout=self._template,
                checkout_id=f"{spec.repo}@{spec.base_commit}", run_install=self._run_install_step,
            )
            self.root.mkdir(parents=True)
            self._hidden = [Path(p) for p in spec.hidden_paths] + list(self.env.masked) + [
                cache_dir("checkouts"), cache_dir("mirrors"), cache_dir("sandboxes")]
            self._group = ProcessGroup(self.limits)
            self._bwrap_prefix = bwrap_prefix(Mounts(
                workspace=self.workspace, tmp=self.tmp, read_only=list(self.env.mounts),
                hidden=self._hidden)) if self.isolated else None
            self._fill()
        except BaseException:
            self.close()
            raise
        self.workdir = SANDBOX_WORKDIR if self.isolated else str(self.workspace)

    # -- protocol -------------------------------------------------------------------------

    def exec(
        self,
        command: str,
        timeout: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        with self._lock:
            self._check_open()
            workdir = self.workdir
            run_cwd = workdir if cwd is None else self._sandbox_path(cwd)
            full_env = self._command_env(env)
            argv = ["bash", "-c", command]
            if self._bwrap_prefix is not None:
                argv = with_command(self._bwrap_prefix, full_env, argv, run_cwd)
                host_cwd = None
            else:
                host_cwd = run_cwd
            try:
                result = run_capped(
                    launcher(self.limits, self._group) + argv, timeout=timeout,
                    output_limit=output_limit or DEFAULT_OUTPUT_LIMIT, cwd=host_cwd, env=full_env,
                    kill_tree=self._kill_tree,
                )
            except FileNotFoundError as exc:
                raise SandboxError(f"cannot run command: {exc}") from exc
            if result.exit_code == 125 and result.output.startswith(LAUNCH_FAILED):
                raise SandboxError(f"sandbox {self.id} is broken: {result.output.strip()[:500]}")
            return result

    def read_file(self, path: str) -> bytes:
        with self._lock:
            self._check_open()
            host = self._host_path(path)
            fd = _open_regular(host, os.O_RDONLY)
            with os.fdopen(fd, "rb") as fh:
                return fh.read()

    def write_file(self, path: str, data: bytes | str) -> None:
        with self._lock:
            self._check_open()
            host = self._host_path(path)
            host.parent.mkdir(parents=True, exist_ok=True)
            self._host_path(str(host.parent))  # re-check: mkdir must not have crossed a symlink
            fd = _open_regular(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data.encode() if isinstance(data, str) else data)

    def diff(self) -> str:
        """Workspace change against the base commit, computed *inside* the sandbox.

        Git in an agent-controlled repository can run agent-chosen programs (hooks, fsmonitor,
        external diff drivers), so it never runs on the host here.
        """
        name = f".patchgym-diff-{uuid.uuid4().hex}"
        index = f"$TMPDIR/{name}.index"  # TMPDIR: /tmp isolated, the sandbox's tmp otherwise
        cmd = (
            f"export GIT_INDEX_FILE={index}; "
            "G='git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c diff.external= "
            "-c core.pager=cat'; "
            f"$G add -A . && $G diff --cached --binary --no-color --no-ext-diff {self.base_commit} "
            f"> $TMPDIR/{name}; rc=$?; rm -f {index}; exit $rc"
        )
        result = self.exec(cmd, timeout=120)
        if not result.ok:
            raise SandboxError(f"could not compute the workspace diff: {result.output[-2000:]}")
        host = self.tmp / name
        try:
            fd = _open_regular(host, os.O_RDONLY)
            with os.fdopen(fd, "rb") as fh:
                return fh.read().decode("utf-8", errors="replace")
        finally:
            host.unlink(missing_ok=True)

    def reset(self) -> None:
        with self._lock:
            self._check_open()
            self._kill_tree(None)
            shutil.rmtree(self.workspace, ignore_errors=True)
            shutil.rmtree(self.tmp, ignore_errors=True)
            if self.workspace.exists() or self.tmp.exists():
                raise SandboxError(f"could not clear sandbox {self.id}")
            self._fill()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._group is not None:
                self._group.destroy()
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # last resort; close() is the contract
        try:
            self.close()
        except Exception:
            pass

    # -- internals ------------------------------------------------------------------------

    def _fill(self) -> None:
        copy_checkout(self._template, self.workspace)
        self.tmp.mkdir(mode=0o1777)
        os.chmod(self.tmp, 0o1777)

    def _kill_tree(self, proc) -> None:
        if self._group is not None and self._group.active:
            self._group.kill_all()

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.id} is closed")

    def _command_env(self, extra: dict[str, str] | None) -> dict[str, str]:
        env = {
            "PATH": f"{self.env.bin_dir}:{SYSTEM_PATH}",
            "VIRTUAL_ENV": str(self.env.venv),
            "HOME": "/tmp" if self.isolated else str(self.tmp),
            "TMPDIR": "/tmp" if self.isolated else str(self.tmp),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "PIP_NO_INPUT": "1",
            "PAGER": "cat",
            "GIT_PAGER": "cat",
            "TERM": "dumb",
        }
        if not self.isolated and self.spec.environment.install:
            # Install steps ran against the cached checkout; make this workspace win on imports.
            env["PYTHONPATH"] = str(self.workspace)
        if extra:
            env.update(extra)
        return env

    def _run_install_step(self, command: str, built: BuiltEnvironment, log_file: Path) -> None:
        """Run an environment ``install`` step with the checkout where sandboxes will have it:
        at ``/testbed``, so that an editable install serves every sandbox's own workspace."""
        env = venv_environ(built.venv)
        if not bwrap_path():
            run_logged(["bash", "-c", command], log_file, cwd=self._template, env=env)
            return
        build_dir = cache_dir("builds") / owned_name(uuid.uuid4().hex[:12])
        try:
            copy_checkout(self._template, build_dir / "testbed")
            (build_dir / "tmp").mkdir()
            env["HOME"] = str(Path.home())  # the host's pip configuration and cache
            mounts = Mounts(workspace=build_dir / "testbed", tmp=build_dir / "tmp",
                            read_only=[Path(built.interpreter.base_prefix)],
                            read_write=[built.venv] + [p for p in _pip_config_dirs() if p.exists()],
                            network=True)
            argv = bwrap_argv(mounts, env, ["bash", "-c", command], SANDBOX_WORKDIR)
            run_logged(argv, log_file, cwd=build_dir)
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)

    def _sandbox_path(self, path: str) -> str:
        """Map a user path to the path commands see, refusing anything outside the workspace."""
        host = self._host_path(path)
        rel = host.relative_to(self.workspace.resolve())
        return str(Path(self.workdir) / rel) if str(rel) != "." else self.workdir

    def _host_path(self, path: str) -> Path:
        """The host path for a workspace path; symlinks may not lead outside the workspace."""
        ws = self.workspace.resolve()
        p = Path(path)
        if p.is_absolute():
            for prefix in (SANDBOX_WORKDIR, str(self.workspace), str(ws)):
                try:
                    p = Path(path).relative_to(prefix)
                    break
                except ValueError:
                    continue
            else:
                raise PathOutsideWorkspaceError(f"{path} is outside the workspace {self.workdir}")
        host = (ws / p).resolve()
        if host != ws and ws not in host.parents:
            raise PathOutsideWorkspaceError(f"{path} resolves outside the workspace {self.workdir}")
        return host


def _open_regular(path: Path, flags: int, mode: int = 0o644) -> int:
    """Open a regular file without following a final symlink and without blocking on a FIFO
    (an agent can leave either where the harness will read or write)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathOutsideWorkspaceError(f"{path} is a symbolic link") from None
        if exc.errno == errno.ENXIO:
            raise IsADirectoryError(f"{path} is not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _pip_config_dirs() -> list[Path]:
    home = Path.home()
    return [home / ".config" / "pip", home / ".pip", home / ".cache" / "pip"]


def _warn_unisolated() -> None:
    global _warned_unisolated
    if not _warned_unisolated:
        _warned_unisolated = True
        log.warning(
            "bubblewrap (bwrap) is not usable here: local sandboxes run as plain processes, with "
            "resource limits but WITHOUT network or filesystem isolation. Install bubblewrap "
            "(Debian: apt-get install bubblewrap) before running untrusted code."
        )

