"""The host's end of a local sandbox's init process (:mod:`patchgym.sandboxes.sandbox_init`).

One long-lived process per sandbox holds its namespaces, mounts, cgroups and rlimits; each command
is a JSON line to it and an answer back. This module starts it, talks to it with deadlines (a read
never blocks past one), and says plainly when it is gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

from patchgym.sandboxes.base import SandboxError
from patchgym.sandboxes.lifetime import spawn
from patchgym.sandboxes.paths import cache_dir
from patchgym.sandboxes.reaper import staging_path

RUNTIME_MODULES = ("base.py", "files.py", "output.py", "process.py")  # what sandbox_init imports as pgrt


@lru_cache(maxsize=1)
def runtime_dir() -> Path:
    """A directory holding ``sandbox_init.py`` and the modules it reuses (as the package ``pgrt``),
    keyed by their content and shared by every process of this host; sandboxes mount it read-only."""
    here = Path(__file__).resolve().parent
    files = {"sandbox_init.py": here / "sandbox_init.py", "pgrt/__init__.py": None}
    files.update({f"pgrt/{name}": here / name for name in RUNTIME_MODULES})
    contents = {name: path.read_bytes() if path else b"" for name, path in files.items()}
    digest = hashlib.sha256(b"".join(n.encode() + b"\0" + c + b"\0" for n, c in sorted(contents.items())))
    target = cache_dir("runtime") / digest.hexdigest()[:16]
    if not target.is_dir():
        staging = staging_path(target)
        for name, data in contents.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(data)
        try:
            staging.rename(target)
        except OSError:  # another process made it first
            shutil.rmtree(staging, ignore_errors=True)
    return target


class InitProcess:
    """One running ``sandbox_init``: started with ``argv`` (the launcher, bubblewrap, the
    interpreter), asked with :meth:`request`. It is not waited for at start: the first request
    waits for its greeting, so that making or resetting a sandbox does not pay the interpreter's
    start."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        # SIGKILLed with this process, whichever thread makes the sandbox (bubblewrap's
        # --die-with-parent alone leaves a window open before it runs).
        self.proc = spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                          start_new_session=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in = self.proc.stdin.fileno()
        self._out = self.proc.stdout.fileno()
        os.set_blocking(self._out, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._out, selectors.EVENT_READ)
        self._buffer = bytearray()
        self.ready = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, payload: dict, deadline: float) -> dict | None:
        """Send one request and return its answer; None when the process ended first. Raises
        TimeoutError past ``deadline`` (``time.monotonic()``)."""
        if not self.ready:
            greeting = self._read_line(deadline)
            if greeting is None:
                return None
            if not json.loads(greeting).get("ready"):
                raise SandboxError(f"the sandbox's init process greeted with {greeting[:200]!r}")
            self.ready = True
        try:
            os.write(self._in, json.dumps(payload).encode() + b"\n")
        except (BrokenPipeError, ConnectionResetError):
            return None
        line = self._read_line(deadline)
        return None if line is None else json.loads(line)

    def _read_line(self, deadline: float) -> bytes | None:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[:end + 1]
                return line
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the sandbox's init process did not answer in time")
            if not self._selector.select(remaining):
                continue
            try:
                chunk = os.read(self._out, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                return None
            self._buffer += chunk

    def pids(self) -> set[int]:
        """Host pids of bubblewrap and of the init process it holds."""
        found = {self.proc.pid}
        try:
            for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
                found.update(int(c) for c in (task / "children").read_text().split())
        except OSError:
            pass
        return found

    def kill(self) -> None:
        """SIGKILL the init process, which makes the kernel end every process of its pid
        namespace at once, and bubblewrap around it (whose death would end it too)."""
        for pid in [*(self.pids() - {self.proc.pid}), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def errors(self) -> str:
        """What it (or bubblewrap) wrote to stderr; call once it has ended."""
        try:
            self.proc.wait(timeout=5)
            assert self.proc.stderr is not None
            os.set_blocking(self.proc.stderr.fileno(), False)
            return (self.proc.stderr.read() or b"").decode(errors="replace").strip()
        except (subprocess.TimeoutExpired, ValueError, OSError):
            return ""

    def close(self) -> None:
        """Release the pipes and reap it (the caller has killed it)."""
        self._selector.close()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@lru_cache(maxsize=1)
def init_interpreter() -> tuple[str, Path, tuple[Path, ...]]:
    """The interpreter ``sandbox_init`` runs on: patchgym's own (its version is known, whatever
    Python the task uses), with its base installation, which sandboxes mount read-only, and its
    site directories, which they hide."""
    from patchgym.sandboxes.environments import own_site_dirs

    prefix = Path(os.path.realpath(sys.base_prefix))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (getattr(sys, "_base_executable", None), sys.executable, prefix / "bin" / f"python{version}"):
        if candidate and Path(os.path.realpath(candidate)).is_relative_to(prefix) and os.access(candidate, os.X_OK):
            return os.path.realpath(candidate), prefix, tuple(Path(d) for d in own_site_dirs())
    raise SandboxError(f"no interpreter under {prefix} to run the sandbox's init process")
