"""Namespace isolation with bubblewrap: no network, a read-only host, a private /tmp.

Only what a command needs is mounted: the system's binaries and libraries, a short list of
``/etc`` files (not ``/etc/shadow``), the interpreter's prefix and the task's venv, all read-only;
the workspace at ``/testbed`` and the sandbox's own ``/tmp`` are the only writable places. Paths the
agent must never read (the task catalog with its hidden tests and gold patches, other checkouts)
are covered with empty tmpfs mounts when they fall under a mounted directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

SANDBOX_WORKDIR = "/testbed"

# /etc entries that programs commonly need; everything else in /etc stays invisible.
ETC_ENTRIES = (
    "alternatives", "ca-certificates", "ca-certificates.conf", "ssl", "pki", "ld.so.cache",
    "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "nsswitch.conf", "passwd", "group",
    "hosts", "host.conf", "resolv.conf", "protocols", "services", "mime.types", "gitconfig",
    "pip.conf", "xdg", "python3", "python3.11", "bash.bashrc", "profile", "inputrc", "environment",
    "locale.alias", "locale.gen", "magic", "terminfo",
)
TOP_LEVEL_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")


_probe_lock = threading.Lock()


def bwrap_path() -> str | None:
    """The bubblewrap binary, if it is installed *and* works here (namespaces may be forbidden)."""
    with _probe_lock:  # probed once per process, even when workers ask at the same time
        return _probe_bwrap()


@lru_cache(maxsize=1)
def _probe_bwrap() -> str | None:
    if os.environ.get("PATCHGYM_NO_BWRAP") == "1":
        return None
    path = shutil.which("bwrap")
    if path is None:
        return None
    # The probe mounts what every real command mounts: inside some containers namespaces work but
    # mounting a new /proc is refused, and a probe without it would wrongly pass.
    probe = [path, "--unshare-all", "--die-with-parent", *_system_binds(), "--proc", "/proc",
             "--dev", "/dev", "--tmpfs", "/tmp", "--", "true"]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        log.warning("bubblewrap is installed but cannot create namespaces here; not using it")
        return None
    return path


@lru_cache(maxsize=1)
def sandbox_etc() -> Path:
    """A copy of the allowed ``/etc`` entries, mounted read-only as ``/etc`` in one bind.

    One mount instead of thirty halves the cost of starting a sandboxed command. The copy is shared
    by every process of this host and keyed by what it copies (each entry's name, type, size, mtime
    and link target), so a host change (a new CA bundle) makes a new copy on the next process start.
    Making it costs about a second (hundreds of CA symlinks): once per host state, not once per
    process, which matters where every sandbox is a new process (the ray backend's actors).
    """
    from patchgym.sandboxes.locks import file_lock
    from patchgym.sandboxes.paths import cache_dir
    from patchgym.sandboxes.reaper import staging_path

    root = cache_dir("etc-shared")
    key = _etc_key()
    target = root / key
    if target.is_dir():
        return target
    with file_lock(root / f"{key}.lock"):
        if not target.is_dir():
            tmp = staging_path(target)
            try:
                _copy_etc(tmp)
                tmp.rename(target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _etc_entries() -> list[Path]:
    """Every path :func:`_copy_etc` copies (links not followed, ``private`` directories left out)."""
    paths = []
    for entry in ETC_ENTRIES:
        src = Path("/etc") / entry
        paths.append(src)
        if src.is_dir() and not src.is_symlink():
            for dirpath, dirnames, filenames in os.walk(src):
                dirnames[:] = [d for d in dirnames if d != "private"]
                paths += [Path(dirpath) / n for n in sorted(dirnames + filenames)]
    return paths


def _etc_key() -> str:
    import hashlib

    digest = hashlib.sha256()
    for path in _etc_entries():
        try:
            st = path.lstat()
        except OSError:
            continue
        link = os.readlink(path) if path.is_symlink() else ""
        digest.update(f"{path}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{link}\n".encode())
    return digest.hexdigest()[:20]


def _copy_etc(target: Path) -> None:
    target.mkdir(parents=True)
    for entry in ETC_ENTRIES:
        src = Path("/etc") / entry
        dst = target / entry
        try:
            if src.is_symlink() or src.is_file():
                shutil.copy2(src, dst, follow_symlinks=False)
            elif src.is_dir():
                shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("private"))
        except OSError as exc:
            log.debug("not copying %s into the sandbox /etc: %s", src, exc)


def _system_binds() -> list[str]:
    args: list[str] = []
    for name in TOP_LEVEL_SYSTEM_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    return args


@dataclass
class Mounts:
    """What one bubblewrap invocation mounts besides the system directories."""

    workspace: Path
    tmp: Path
    read_only: list[Path] = field(default_factory=list)
    read_write: list[Path] = field(default_factory=list)
    hidden: list[Path] = field(default_factory=list)
    network: bool = False
    # host path -> where the sandbox sees it, read-only: an episode's harness files and the model
    # proxy's unix socket (patchgym.rollouts.harnesses.bridge), its only way out
    binds: dict[Path, str] = field(default_factory=dict)


def bwrap_argv(mounts: Mounts, env: dict[str, str], argv: list[str], cwd: str) -> list[str]:
    """The full command line that runs ``argv`` inside a fresh set of namespaces."""
    return with_command(bwrap_prefix(mounts), env, argv, cwd)


def with_command(prefix: list[str], env: dict[str, str], argv: list[str], cwd: str) -> list[str]:
    """Complete a :func:`bwrap_prefix` with the environment, working directory and command."""
    args = prefix + ["--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args + ["--chdir", cwd, "--"] + argv


def bwrap_prefix(mounts: Mounts) -> list[str]:
    """The namespace and mount part of a bubblewrap command line (the same for every command of a
    sandbox, so it is computed once: resolving the hidden paths costs more than running bwrap)."""
    binary = bwrap_path()
    if binary is None:
        raise RuntimeError("bubblewrap is not available")
    args = [binary, "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    args += ["--unshare-user-try", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
             "--unshare-cgroup-try", "--hostname", "sandbox"]
    if not mounts.network:
        args.append("--unshare-net")
    args += _system_binds()
    args += ["--ro-bind", str(sandbox_etc()), "/etc"]
    # /tmp first: the read-only mounts below may live under the host's /tmp and must stay visible.
    args += ["--bind", str(mounts.tmp), "/tmp"]
    mounted: list[Path] = [Path("/usr")]
    for path in mounts.read_only:
        args += ["--ro-bind", str(path), str(path)]
        mounted.append(path)
    for path in mounts.read_write:
        args += ["--bind", str(path), str(path)]
        mounted.append(path)
    args += ["--dev", "/dev", "--proc", "/proc"]
    args += ["--bind", str(mounts.workspace), SANDBOX_WORKDIR]
    for host, target in mounts.binds.items():
        args += ["--ro-bind", str(host), target]
    # Each path resolved once: resolving them pairwise cost a sandbox start about 100 ms of CPU.
    resolved = [os.path.realpath(m) for m in mounted]
    for secret in mounts.hidden:
        real = os.path.realpath(secret)
        if any(_is_within(m, real) for m in resolved):
            log.warning("cannot hide %s: a mounted path lies inside it", secret)
            continue
        if any(_is_within(real, m) for m in resolved) and secret.exists():
            if secret.is_dir():
                args += ["--tmpfs", str(secret)]
            else:
                args += ["--ro-bind", "/dev/null", str(secret)]
    return args


def _is_within(path: str, parent: str) -> bool:
    """Whether the resolved ``path`` is the resolved ``parent`` or lies under it."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")
