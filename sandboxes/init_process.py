"""The host's end of a local sandbox's init process: started once per sandbox (and again after a
reset), it holds the sandbox's namespaces, mounts, cgroups and rlimits and runs each command it is
sent. This module makes it, starts it, talks to it with deadlines (a read never blocks past one),
and says plainly when it is gone.

The init is ``sandbox_init.c``, compiled once per host (by ``$CC`` or ``cc``, static where the C
library allows) into a runtime directory keyed by its sources: about 100 KiB of private memory
idle and a millisecond to start. Where no C compiler is, the same protocol is spoken by
``sandbox_init.py`` on patchgym's own interpreter, about 8.5 MiB idle and 40 ms of a core to
start (bench/density.py). Both speak the command servers' binary messages (:mod:`.wire`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from patchgym.sandboxes.base import SandboxError
from patchgym.sandboxes.lifetime import spawn
from patchgym.sandboxes.paths import cache_dir
from patchgym.sandboxes.reaper import staging_path
from patchgym.sandboxes.wire import MalformedAnswer, answer_fields, encode

log = logging.getLogger(__name__)

RUNTIME_MODULES = ("base.py", "files.py", "output.py", "process.py", "wire.py")  # sandbox_init.py's pgrt
C_SOURCES = ("sandbox_init.c", "command_server.h")
C_BINARY = "sandbox_init"
CFLAGS = ("-Os", "-Wall", "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections")


@lru_cache(maxsize=1)
def runtime_dir() -> Path:
    """A directory holding the init (``sandbox_init``, compiled here when a C compiler is, and
    ``sandbox_init.py`` with the modules it reuses, as the package ``pgrt``), keyed by their
    content and shared by every process of this host; sandboxes mount it read-only."""
    here = Path(__file__).resolve().parent
    files = {"sandbox_init.py": here / "sandbox_init.py", "pgrt/__init__.py": None}
    files.update({f"pgrt/{name}": here / name for name in RUNTIME_MODULES})
    files.update({name: here / name for name in C_SOURCES})
    contents = {name: path.read_bytes() if path else b"" for name, path in files.items()}
    digest = hashlib.sha256(" ".join(CFLAGS).encode())
    digest.update(b"".join(n.encode() + b"\0" + c + b"\0" for n, c in sorted(contents.items())))
    target = cache_dir("runtime") / digest.hexdigest()[:16]
    if not target.is_dir():
        staging = staging_path(target)
        for name, data in contents.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(data)
        _compile(staging)
        try:
            staging.rename(target)
        except OSError:  # another process made it first
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _compile(directory: Path) -> None:
    """Compile ``sandbox_init.c`` into ``directory``: static if the C library allows, else linked
    against the host's (which sandboxes mount). Nothing when there is no compiler or it fails."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.info("no C compiler (cc): local sandboxes run the Python init (about 8.5 MiB each when idle)")
        return
    for link in (["-static"], []):
        argv = [compiler, *link, *CFLAGS, "-o", str(directory / C_BINARY), str(directory / "sandbox_init.c")]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            done = None
            error = str(exc)
        else:
            error = done.stderr.strip()[-2000:]
        if done is not None and done.returncode == 0:
            return
    log.warning("compiling the local sandbox init failed (%s): sandboxes run the Python init", error)


@dataclass(frozen=True)
class InitCommand:
    """How to run the init inside a sandbox: its argv (the pids cgroup is appended), and what the
    sandbox must mount read-only for it and hide."""

    argv: tuple[str, ...]
    read_only: tuple[Path, ...]
    hidden: tuple[Path, ...] = ()


def init_command() -> InitCommand:
    """The compiled init where there is one (unless ``$PATCHGYM_PYTHON_INIT`` is set), else the
    Python init on patchgym's interpreter."""
    runtime = runtime_dir()
    if os.access(runtime / C_BINARY, os.X_OK) and not os.environ.get("PATCHGYM_PYTHON_INIT"):
        return InitCommand((str(runtime / C_BINARY),), (runtime,))
    python, prefix, site = init_interpreter()
    return InitCommand((python, "-I", "-S", str(runtime / "sandbox_init.py")), (prefix, runtime), site)


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

    def request(self, op: bytes, fields: tuple[bytes, ...], deadline: float) -> list[bytes] | None:
        """Send one request and return its answer's fields; None when the process ended first.
        Raises :class:`~.wire.ServerError` for an error answer, TimeoutError past ``deadline``
        (``time.monotonic()``)."""
        if not self.ready:
            greeting = self._answer(deadline)
            if greeting is None:
                return None
            if greeting[:1] != [b"ready"]:
                raise SandboxError(f"the sandbox's init process greeted with {greeting!r:.200}")
            self.ready = True
        data = memoryview(encode(op, *fields))
        try:
            while data:  # a pipe takes 64 KiB at a time; the init reads as it comes
                data = data[os.write(self._in, data):]
        except (BrokenPipeError, ConnectionResetError):
            return None
        return self._answer(deadline)

    def _answer(self, deadline: float) -> list[bytes] | None:
        head = self._read(4, deadline)
        body = None if head is None else self._read(int.from_bytes(head, "big"), deadline)
        if body is None:
            return None
        try:
            return answer_fields(body)
        except MalformedAnswer:
            raise SandboxError("the sandbox's init process sent a malformed answer") from None

    def _read(self, n: int, deadline: float) -> bytes | None:
        """``n`` bytes of its stdout; None at its end."""
        while len(self._buffer) < n:
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
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

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
