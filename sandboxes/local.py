"""The embedded default backend: a workspace on this host, isolated with bubblewrap when possible.

Each sandbox owns a directory with the workspace and its own ``/tmp``. As root it is a tmpfs
bounded by ``disk_bytes``/``disk_files``, and the workspace an overlay of the shared pristine
checkout (see ``mounts.py``); elsewhere the workspace is a copy and the disk is not bounded (a
warning says so). Commands run in the sandbox's namespaces (no network, read-only host, private
/tmp) inside its cgroups: one init process per sandbox (``sandbox_init.c``, pid 1 of those
namespaces, started by ``init_process.py``) runs each command and kills whatever it left, so a
command costs one process spawn; reset and close kill the init, and its namespace with it.
With namespaces, the tmpfs and the overlay exist only in the sandbox's own mount namespace (the
host's mount table stays the same size however many sandboxes run): the init reads and writes
files for the host, the diff reads the tree through ``/proc/<pid>/root``, and the workspace lives
as long as the init: a reset starts both afresh, and an init that dies takes the agent's work with
it (an infrastructure error from then on, until a reset).
Without bubblewrap the same commands run as plain processes, with a warning: that mode bounds
resources and cleans up, but it does not contain hostile code.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import posixpath
import shlex
import shutil
import signal
import threading
import time
import uuid
from functools import lru_cache
from pathlib import Path

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
from patchgym.sandboxes.bytecode import PREFIX_ENV
from patchgym.sandboxes.environments import (
    BuiltEnvironment,
    ensure_environment,
    run_logged,
    venv_environ,
)
from patchgym.sandboxes.files import read_regular, resolve_in_workspace, write_regular
from patchgym.sandboxes.gitops import Pristine, workspace_diff
from patchgym.sandboxes.init_process import InitProcess, init_command
from patchgym.sandboxes.install_inputs import install_inputs_digest, shareable_install
from patchgym.sandboxes.isolation import SANDBOX_WORKDIR, Mounts, bwrap_argv, bwrap_path, bwrap_prefix, with_command
from patchgym.sandboxes.lifetime import parent_checked
from patchgym.sandboxes.limits import LAUNCH_FAILED, ProcessGroup, launcher
from patchgym.sandboxes.mounts import (
    mount_overlay,
    mount_tmpfs,
    private_mounts_prefix,
    quota_unavailable_reason,
    remove_tree,
    unmount_all,
)
from patchgym.sandboxes.output import DEFAULT_OUTPUT_LIMIT
from patchgym.sandboxes.paths import cache_dir
from patchgym.sandboxes.process import ProcessLimitWatch, run_capped
from patchgym.sandboxes.reaper import owned_name
from patchgym.sandboxes.repos import copy_checkout, git, pristine_checkout
from patchgym.sandboxes.wire import ServerError, exec_request, exec_result, server_error

log = logging.getLogger(__name__)

# An init killed by the sandbox's own memory limit takes the workspace in its namespace with it: the
# agent's doing (a command can raise the init's oom_score_adj), so its failure from then on, never a
# masked one.
MEMORY_LOST = "the sandbox ran out of memory and lost its workspace with its init process; reset() makes a new one"

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_warned_unisolated = False
_warned_unbounded = False


def environment_checkout_id(spec: SandboxSpec, template: Path) -> str:
    """What of the checkout the environment's install steps depend on (part of its cache key).

    Editable installs made at ``/testbed`` (in bubblewrap, where every sandbox sees its own
    workspace) depend only on the install inputs (:mod:`.install_inputs`): every commit with the
    same ones, of this repository or of a bundle of commits made on it (synthesized bugs), shares
    one venv. Anything else (a copy install, an install made at the checkout's own path without
    bubblewrap) depends on the whole commit."""
    env = spec.environment
    steps = env.pre_install + env.install
    if env.install and bwrap_path() is not None and shareable_install(steps):
        return f"install-inputs:{_tree_inputs_digest(str(template), steps)}"
    return f"{spec.repo}@{spec.base_commit}"


@lru_cache(maxsize=256)
def _tree_inputs_digest(template: str, steps: tuple[str, ...]) -> str:
    """:func:`~.install_inputs.install_inputs_digest` of a pristine checkout (a commit's own, so
    cached by its path)."""
    listing = git("ls-tree", "-r", "-z", "HEAD", cwd=Path(template)).stdout
    tree = []
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        tree.append((path, meta.split()[2]))
    return install_inputs_digest(tree, steps)


class LocalSandbox(ClosesItself):
    """A :class:`~sandboxes.base.Sandbox` on this host.

    ``isolation`` is ``"auto"`` (bubblewrap when it works here, plain processes otherwise),
    ``"bwrap"`` (fail when bubblewrap is unavailable) or ``"none"``. ``read_only_binds``: host
    directories the sandbox sees, read-only, at the path given (without bubblewrap, at their own:
    ``binds`` says where each one is).
    """

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        limits: ResourceLimits | None = None,
        isolation: str = "auto",
        read_only_binds: dict[str, str] | None = None,
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
        self._init: InitProcess | None = None
        self._init_started = False  # the init process has answered once (bubblewrap worked)
        self._closing = False
        self._mounts_prefix: list[str] | None = None  # the workspace's mounts, made in the sandbox's namespace
        self._lost: str | None = None  # why the workspace is gone (its namespace died), until a reset
        self._lost_to_memory = False  # ... and the sandbox's memory limit killed its init (the agent's doing)
        binds = dict(read_only_binds or {})
        self.binds = binds if self.isolated else {host: host for host in binds}
        try:
            self._template = pristine_checkout(spec.repo, spec.base_commit)
            self._pristine = _pristine(self._template)
            self.env: BuiltEnvironment = ensure_environment(
                spec.environment, checkout=self._template,
                checkout_id=environment_checkout_id(spec, self._template), run_install=self._run_install_step,
                checkout_as=SANDBOX_WORKDIR,
            )
            self.root.mkdir(parents=True)
            self._hidden = [Path(p) for p in spec.hidden_paths] + list(self.env.masked) + [
                cache_dir("checkouts"), cache_dir("mirrors"), cache_dir("sandboxes")]
            self._group = ProcessGroup(self.limits)
            if self.isolated and self.disk_bounded:
                self._mounts_prefix = private_mounts_prefix(self.root, self._template, self.limits.disk_bytes,
                                                            self.limits.disk_files)
            if self.isolated:
                init = init_command()
                pids_cgroup = self._group.dirs.get("pids")  # read by the init's fork-bomb watchdog
                read_only = list(dict.fromkeys([*self.env.mounts, *init.read_only]))
                self._init_argv = list(init.argv)
                if pids_cgroup is not None:
                    read_only.append(pids_cgroup)
                    self._init_argv.append(str(pids_cgroup))
                self._bwrap_prefix = bwrap_prefix(Mounts(workspace=self.workspace, tmp=self.tmp, read_only=read_only,
                                                         hidden=list(dict.fromkeys(self._hidden + list(init.hidden))),
                                                         binds={Path(h): t for h, t in binds.items()}))
            self._fill()
            self._start_init()
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
            run_cwd = self.workdir if cwd is None else self._sandbox_path(cwd)
            limit = output_limit or DEFAULT_OUTPUT_LIMIT
            if self._bwrap_prefix is not None:
                return self._exec_in_init(command, timeout, run_cwd, env, limit)
            cpu_before = self._group.cpu_seconds() if self._group is not None else None
            result = self._exec_plain(command, timeout, run_cwd, env, limit)
            cpu_after = self._group.cpu_seconds() if cpu_before is not None and self._group is not None else None
            if cpu_before is not None and cpu_after is not None:
                result = dataclasses.replace(result, cpu_seconds=round(max(0.0, cpu_after - cpu_before), 6))
            return result

    def _exec_in_init(self, command: str, timeout: float, cwd: str, env: dict[str, str] | None,
                      limit: int) -> ExecResult:
        """Run ``command`` through the sandbox's init process (started again if it is gone and the
        workspace is not in its namespace)."""
        if self._lost is not None and self._lost_to_memory:
            return ExecResult(exit_code=-signal.SIGKILL, timed_out=False, duration=0.0,
                              output=f"\n[patchgym: {MEMORY_LOST}]\n")
        self._ensure_init()
        assert self._init is not None
        start = time.monotonic()
        # The shell enters the working directory, so that one the agent made unreadable fails the
        # command instead of the init's spawn.
        script = f"cd -- {shlex.quote(cwd)} || exit 1\n{command}"
        try:
            # The init enforces the timeout itself; the margin covers killing what the command left.
            fields = self._init.request(b"X", exec_request(script, timeout, limit, env), start + timeout + 30.0)
        except TimeoutError:
            self._init_lost(f"its init process did not answer within {timeout + 30:g}s")
            raise SandboxError(f"sandbox {self.id}: its init process did not answer within {timeout + 30:g}s") from None
        except ServerError as exc:
            self._init_lost(str(exc))
            raise SandboxError(f"sandbox {self.id}: {exc}") from None
        if fields is None:
            errors = self._init.errors()
            self._init_lost(f"its init process died: {errors[:500] or 'no message'}")
            if self._closing:
                raise SandboxClosedError(f"sandbox {self.id} was closed while the command ran")
            if self._group is not None and (self._group.oom_kills() or 0) > self._oom_kills_at_start:
                self._lost_to_memory = self._lost is not None
                return ExecResult(exit_code=-signal.SIGKILL, timed_out=False, duration=time.monotonic() - start,
                                  output="\n[patchgym: command killed: out of memory (the sandbox's memory limit)]\n")
            if not self._init_started:
                raise SandboxError(f"bubblewrap could not start the sandbox: {errors[:500]}")
            raise SandboxError(f"sandbox {self.id}: its init process died: {errors[:500] or 'no message'}")
        self._init_started = True
        return exec_result(fields, limit)

    def _exec_plain(self, command: str, timeout: float, cwd: str, env: dict[str, str] | None,
                    limit: int) -> ExecResult:
        """Without bubblewrap: one launcher per command (cgroups and rlimits, no namespaces)."""
        try:
            # Dies with this process: no namespace ends it when a killed harness leaves it.
            argv = parent_checked(launcher(self.limits, self._group) + ["bash", "-c", command])
            result = run_capped(argv, timeout=timeout,
                                output_limit=limit, cwd=cwd, env=self._command_env(env), kill_tree=self._kill_tree,
                                watchdog=self._watchdog())
        except FileNotFoundError as exc:
            raise SandboxError(f"cannot run command: {exc}") from exc
        if result.exit_code == 125 and result.output.startswith(LAUNCH_FAILED):
            raise SandboxError(f"sandbox {self.id} is broken: {result.output.strip()[:500]}")
        return result

    def _start_init(self) -> None:
        """Start the init process (not waited for: the first command waits for its greeting)."""
        if self._bwrap_prefix is None:
            return
        env = self._command_env(None)
        # --as-pid-1: the init is pid 1 of the namespace, so every orphan is its own to kill and reap.
        argv = launcher(self.limits, self._group) + (self._mounts_prefix or []) + with_command(
            self._bwrap_prefix + ["--as-pid-1"], env, self._init_argv, "/")
        self._init_started = False
        # An init that dies mid-command was killed for the memory limit if this count grew since.
        self._oom_kills_at_start = (self._group.oom_kills() if self._group is not None else None) or 0
        try:
            self._init = InitProcess(argv, env)
        except OSError as exc:
            raise SandboxError(f"cannot start sandbox {self.id}: {exc}") from exc

    def command_pids(self) -> set[int]:
        """Host pids of live processes in the sandbox other than its init process (and the
        bubblewrap process that holds it): what the agent's commands left running, if anything."""
        if self._group is None or not self._group.active:
            return set()
        return self._group.live_pids() - (self._init.pids() if self._init is not None else set())

    def _stop_init(self) -> None:
        """Kill the init process: the kernel ends every process of its namespace with it (and the
        workspace's mounts, where they are in its mount namespace)."""
        init, self._init = self._init, None
        if init is not None:
            init.kill()
            init.close()

    def _init_lost(self, why: str) -> None:
        """The init is gone or unusable: stop it, and where the workspace lived in its namespace,
        remember that it is lost (the agent's work cannot be read back)."""
        self._stop_init()
        if self._mounts_prefix is not None and not self._closing:
            self._lost = why

    def _ensure_init(self) -> None:
        if self._lost is not None and self._lost_to_memory:
            raise WorkspaceError(MEMORY_LOST)
        if self._lost is not None:
            raise SandboxError(f"sandbox {self.id} lost its workspace ({self._lost}); reset() makes a new one")
        if self._init is None:
            self._start_init()

    def _init_request(self, op: bytes, fields: tuple[bytes, ...], timeout: float) -> list[bytes]:
        """A file request to the init (the workspace is in its namespace)."""
        self._ensure_init()
        assert self._init is not None
        try:
            answer = self._init.request(op, fields, time.monotonic() + timeout)
        except ServerError as exc:
            raise server_error(exc.kind, f"sandbox {self.id}: {exc}") from None
        except TimeoutError:
            self._init_lost(f"its init process did not answer within {timeout:g}s")
            raise SandboxError(f"sandbox {self.id}: its init process did not answer within {timeout:g}s") from None
        if answer is None:
            errors = self._init.errors()
            self._init_lost(f"its init process died: {errors[:500] or 'no message'}")
            raise SandboxError(f"sandbox {self.id}: its init process died: {errors[:500] or 'no message'}")
        self._init_started = True
        return answer

    def usage(self) -> SandboxUsage:
        """CPU and peak memory of everything the sandbox ran so far (its cgroups; nothing measured
        without them, or after ``close()``)."""
        group = self._group
        if group is None or not group.active:
            return SandboxUsage()
        return SandboxUsage(cpu_seconds=group.cpu_seconds(), peak_memory_bytes=group.peak_memory_bytes())

    def read_file(self, path: str) -> bytes:
        with self._lock:
            self._check_open()
            if self._lost is not None and self._lost_to_memory:
                raise OSError(errno.EIO, MEMORY_LOST)  # the editor's tool error, as any unreadable file
            if self._mounts_prefix is not None:
                return self._init_request(b"R", (path.encode("utf-8", "surrogateescape"),), 120.0)[0]
            return read_regular(self.workspace, path, (SANDBOX_WORKDIR,))

    def write_file(self, path: str, data: bytes | str) -> None:
        data = data.encode() if isinstance(data, str) else data
        with self._lock:
            self._check_open()
            if self._lost is not None and self._lost_to_memory:
                raise OSError(errno.EIO, MEMORY_LOST)
            if self._mounts_prefix is not None:
                self._init_request(b"W", (path.encode("utf-8", "surrogateescape"), data), 120.0)
                return
            write_regular(self.workspace, path, data, (SANDBOX_WORKDIR,))

    def diff(self) -> str:
        with self._lock:
            self._check_open()
            if self._mounts_prefix is None:
                return workspace_diff(self.workspace, self._pristine, cache_dir("builds"), self.limits.diff_bytes)
            self._init_request(b"P", (), 60.0)  # its mounts exist once it answers
            assert self._init is not None  # bubblewrap's process: in the namespace with the mounts
            return workspace_diff(self.workspace, self._pristine, cache_dir("builds"), self.limits.diff_bytes,
                                  mounted_for=self._init.pid)

    def reset(self) -> None:
        with self._lock:
            self._check_open()
            if self._bwrap_prefix is not None:
                self._stop_init()  # its namespace dies with it: nothing there can touch the new workspace
            else:
                self._kill_tree(None)
            if self._mounts_prefix is None:
                self._clear()
                self._fill()
            self._lost, self._lost_to_memory = None, False
            self._start_init()  # where the workspace is in its namespace, a pristine one with it

    def close(self) -> None:
        if not self._closed and self._group is not None and self._group.active:
            self._closing = True  # a command running in another thread ends now, not at its timeout,
            self._group.kill_all()  # and says that the sandbox was closed
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop_init()
            if self._group is not None:
                self._group.destroy()
            remove_tree(self.root)

    # -- internals ------------------------------------------------------------------------

    def _fill(self) -> None:
        """Lay out a pristine workspace and an empty /tmp: on a fresh bounded tmpfs, the checkout
        under an overlay; else a copy (whose lstat the diff then takes as pristine). Where the init
        mounts them in its own namespace, nothing is made here."""
        if self._mounts_prefix is not None:
            return
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
        if self.isolated and self.env.bytecode is not None:
            # Bound read-only (it is one of the environment's mounts): the test runtime's pycache
            # prefix (sandboxes.bytecode). Unisolated commands can write anywhere: they get none.
            env[PREFIX_ENV] = str(self.env.bytecode)
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
        if self._mounts_prefix is not None:  # the tree is in the sandbox's namespace: by the path alone, as docker
            inside = posixpath.normpath(posixpath.join(SANDBOX_WORKDIR, path))
            if inside != SANDBOX_WORKDIR and not inside.startswith(SANDBOX_WORKDIR + "/"):
                raise PathOutsideWorkspaceError(f"{path} is outside the workspace {SANDBOX_WORKDIR}")
            return inside
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

