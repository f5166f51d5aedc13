"""The embedded default backend: a workspace on this host, isolated with bubblewrap when possible.

Each sandbox owns a directory with the workspace and its own ``/tmp``. As root it is a tmpfs
bounded by ``disk_bytes``/``disk_files``, and the workspace an overlay of the shared pristine
checkout (see ``mounts.py``); elsewhere the workspace is a copy and the disk is not bounded (a
warning says so). Commands run in fresh namespaces (no network, read-only host, private /tmp)
inside the sandbox's cgroups. Without bubblewrap the same commands run as plain processes, with a
warning: that mode bounds resources and cleans up, but it does not contain hostile code.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .base import ClosesItself, ExecResult, SandboxClosedError, SandboxError
from .environments import BuiltEnvironment, EnvironmentSpec, ensure_environment, run_logged, venv_environ
from .files import read_regular, resolve_in_workspace, write_regular
from .gitops import Pristine, workspace_diff
from .isolation import SANDBOX_WORKDIR, Mounts, bwrap_argv, bwrap_path, bwrap_prefix, with_command
from .limits import LAUNCH_FAILED, ProcessGroup, ResourceLimits, launcher
from .mounts import mount_overlay, mount_tmpfs, quota_unavailable_reason, remove_tree, unmount_all
from .output import DEFAULT_OUTPUT_LIMIT
from .paths import cache_dir
from .process import ProcessLimitWatch, run_capped
from .reaper import owned_name
from .repos import copy_checkout, pristine_checkout

log = logging.getLogger(__name__)

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_warned_unisolated = False
_warned_unbounded = False


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


class LocalSandbox(ClosesItself):
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
        self.disk_bounded = quota_unavailable_reason() is None
        if not self.disk_bounded:
            _warn_unbounded()
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
            self._pristine = _pristine(self._template)
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
            status_read, status_write = os.pipe() if self._bwrap_prefix is not None else (-1, -1)
            try:
                if self._bwrap_prefix is not None:
                    # The shell inside the sandbox writes one byte to this pipe before the command
                    # runs: without it, a failure is bubblewrap's own (infrastructure), whatever
                    # the output says; with it, it is the command's. The shell, not bubblewrap,
                    # enters the working directory: one the agent made unreadable fails its command.
                    started = (f"printf S >&{status_write} && exec {status_write}>&-\n"
                               f"cd -- {shlex.quote(run_cwd)} || exit 1\n{command}")
                    argv = with_command(self._bwrap_prefix, full_env, ["bash", "-c", started], "/")
                    host_cwd = None
                else:
                    host_cwd = run_cwd
                cpu_before = self._group.cpu_seconds() if self._group is not None else None
                try:
                    result = run_capped(
                        launcher(self.limits, self._group) + argv, timeout=timeout,
                        output_limit=output_limit or DEFAULT_OUTPUT_LIMIT, cwd=host_cwd, env=full_env,
                        kill_tree=self._kill_tree, pass_fds=(status_write,) if status_write >= 0 else (),
                        watchdog=self._watchdog(),
                    )
                except FileNotFoundError as exc:
                    raise SandboxError(f"cannot run command: {exc}") from exc
                if result.exit_code == 125 and result.output.startswith(LAUNCH_FAILED):
                    raise SandboxError(f"sandbox {self.id} is broken: {result.output.strip()[:500]}")
                if status_write >= 0:
                    os.close(status_write)
                    status_write = -1
                    if not _read_all(status_read) and not result.timed_out:
                        raise SandboxError(f"bubblewrap could not start the command: {result.output.strip()[:500]}")
                cpu_after = self._group.cpu_seconds() if cpu_before is not None and self._group is not None else None
                if cpu_before is not None and cpu_after is not None:
                    result = dataclasses.replace(result, cpu_seconds=round(max(0.0, cpu_after - cpu_before), 6))
                return result
            finally:
                for fd in (status_read, status_write):
                    if fd >= 0:
                        os.close(fd)

    def read_file(self, path: str) -> bytes:
        with self._lock:
            self._check_open()
            return read_regular(self.workspace, path, (SANDBOX_WORKDIR,))

    def write_file(self, path: str, data: bytes | str) -> None:
        with self._lock:
            self._check_open()
            write_regular(self.workspace, path, data.encode() if isinstance(data, str) else data,
                          (SANDBOX_WORKDIR,))

    def diff(self) -> str:
        with self._lock:
            self._check_open()
            return workspace_diff(self.workspace, self._pristine, cache_dir("builds"))

    def reset(self) -> None:
        with self._lock:
            self._check_open()
            self._kill_tree(None)
            self._clear()
            self._fill()

    def close(self) -> None:
        if not self._closed and self._group is not None and self._group.active:
            self._group.kill_all()  # a command running in another thread ends now, not at its timeout
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._group is not None:
                self._group.destroy()
            remove_tree(self.root)

    # -- internals ------------------------------------------------------------------------

    def _fill(self) -> None:
        """Lay out a pristine workspace and an empty /tmp: on a fresh bounded tmpfs, the checkout
        under an overlay; else a copy (whose lstat the diff then takes as pristine)."""
        if self.disk_bounded:
            try:
                mount_tmpfs(self.root, self.limits.disk_bytes, self.limits.disk_files)
                for name in ("upper", "work", "testbed"):
                    (self.root / name).mkdir()
                mount_overlay(self._template, self.root / "upper", self.root / "work", self.workspace)
            except OSError as exc:
                raise SandboxError(f"cannot mount the workspace of sandbox {self.id}: {exc}") from None
        else:
            copy_checkout(self._template, self.workspace)
            self._pristine = _pristine(self._template, snapshot=self.workspace)
        self.tmp.mkdir(mode=0o1777)
        os.chmod(self.tmp, 0o1777)

    def _clear(self) -> None:
        if self.disk_bounded:
            cleared = unmount_all(self.root)  # the tmpfs goes, and all that was written with it
        else:
            shutil.rmtree(self.workspace, ignore_errors=True)
            shutil.rmtree(self.tmp, ignore_errors=True)
            cleared = not (self.workspace.exists() or self.tmp.exists())
        if not cleared:
            raise SandboxError(f"could not clear sandbox {self.id}")

    def _watchdog(self) -> ProcessLimitWatch | None:
        if self._group is None or not self._group.active:
            return None
        return ProcessLimitWatch(self._group.dirs["pids"])

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
        host = resolve_in_workspace(self.workspace, path, (SANDBOX_WORKDIR,))
        rel = host.relative_to(self.workspace.resolve())
        return str(Path(self.workdir) / rel) if str(rel) != "." else self.workdir


@lru_cache(maxsize=64)
def _template_pristine(template: Path) -> Pristine:
    pristine = Pristine.load(template / ".git")
    pristine.snapshot(template)  # under an overlay, unchanged files keep the lower file's lstat
    return pristine


def _pristine(template: Path, *, snapshot: Path | None = None) -> Pristine:
    """The diff's base for a sandbox of ``template``; with ``snapshot``, pristine stats taken from
    that fresh copy instead of the checkout."""
    shared = _template_pristine(template)
    if snapshot is None:
        return shared
    own = Pristine(shared.git_dir, shared.base, shared.entries)
    own.snapshot(snapshot)
    return own


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _pip_config_dirs() -> list[Path]:
    home = Path.home()
    return [home / ".config" / "pip", home / ".pip", home / ".cache" / "pip"]


def _warn_unbounded() -> None:
    global _warned_unbounded
    if not _warned_unbounded:
        _warned_unbounded = True
        log.warning("local sandboxes cannot mount a bounded tmpfs and overlay here (%s): workspaces are "
                    "plain copies and the disk they use is NOT bounded", quota_unavailable_reason())


def _warn_unisolated() -> None:
    global _warned_unisolated
    if not _warned_unisolated:
        _warned_unisolated = True
        log.warning(
            "bubblewrap (bwrap) is not usable here: local sandboxes run as plain processes, with "
            "resource limits but WITHOUT network or filesystem isolation. Install bubblewrap "
            "(Debian: apt-get install bubblewrap) before running untrusted code."
        )

