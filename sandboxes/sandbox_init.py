"""The first process of a local sandbox where no C compiler built ``sandbox_init.c``: pid 1 of its
namespaces, it runs each command it is sent, as the C init does (about 8.5 MiB idle against its
100 KiB: init_process.py chooses).

Started once per sandbox (and again after a reset) inside bubblewrap, with the sandbox's
namespaces, mounts, cgroups and rlimits already in place, so a command costs one process spawn
instead of building all of those again (about 10 ms on 2 cores). Standard library only: the
host's modules it reuses are mounted next to it as the package ``pgrt`` (the same capped,
hang-free process runner the plain fallback uses).

Requests and answers are the command servers' binary messages (``wire.py``): ``X`` (script,
timeout, output limit, environment), ``R`` and ``W`` (a workspace file, by files.py's rules) and
``P``, as the C init. Nothing a command starts survives it: as
pid 1 of the sandbox's pid namespace, this process ends every command with ``kill(-1, SIGKILL)``,
which reaches every other process of the namespace at once (a fork racing with it is aborted by
the kernel) and never itself, then reaps them all. Commands cannot signal or trace it: init of a
pid namespace ignores signals it has no handler for, and it makes itself non-dumpable.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pgrt.files import read_regular, write_regular  # noqa: E402
from pgrt.output import CappedOutput  # noqa: E402
from pgrt.process import ProcessLimitWatch, is_dead_or_exiting, run_capped  # noqa: E402
from pgrt.wire import ERROR, OK, decode, encode, error_kind  # noqa: E402

PR_SET_DUMPABLE = 4
WORKSPACE = Path("/testbed")
BASH = shutil.which("bash") or "bash"  # looked up once: a PATH search costs every command failed execs
# The sandbox's pids cgroup (mounted read-only at its host path), for the fork-bomb watchdog.
PIDS_CGROUP = sys.argv[1] if len(sys.argv) > 1 else ""


def end_strays(proc: subprocess.Popen | None = None) -> None:
    """SIGKILL every process of the namespace but this one. A command already on its way out is
    let finish first, so that its own exit status stands (it closed its output before exiting)."""
    if proc is not None and is_dead_or_exiting(proc.pid):
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass


def reap_all(timeout: float = 5.0) -> bool:
    """Kill and reap until no process but this one is left (all are its descendants, being pid 1)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            if time.monotonic() > deadline:
                return False
            end_strays()
            time.sleep(0.0005)


def clear_ipc() -> None:
    """Remove what a command could leave without a process: POSIX shared memory (``/dev/shm``)
    and System V IPC objects. With a namespace per command (as before this init) they died with
    it; here the namespaces outlive the command, so they are cleared after it instead."""
    for entry in os.scandir("/dev/shm"):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            os.unlink(entry.path)
    for kind in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{kind}") as fh:
            if len(fh.read().splitlines()) > 1:
                subprocess.run(["ipcrm", "--all"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
                return


def handle(op: bytes, fields: list[bytes]) -> tuple[bytes, ...]:
    """The answer's fields to one request; ValueError for a malformed one."""
    if op == b"P" and not fields:
        return (str(os.getpid()).encode(),)
    if op == b"R" and len(fields) == 1:
        return (read_regular(WORKSPACE, os.fsdecode(fields[0])),)
    if op == b"W" and len(fields) == 2:
        write_regular(WORKSPACE, os.fsdecode(fields[0]), fields[1])
        return ()
    if op != b"X" or len(fields) != 4:
        raise ValueError(f"malformed request (op {op!r}, {len(fields)} fields)")
    script, timeout, limit, environment = fields
    env = dict(os.environ)
    env.update(entry.split("=", 1) for entry in os.fsdecode(environment).split("\0") if "=" in entry)
    watch = ProcessLimitWatch(Path(PIDS_CGROUP)) if PIDS_CGROUP else None
    before = _children_cpu()
    output = CappedOutput(int(limit))
    result = run_capped([BASH, "-c", os.fsdecode(script)], timeout=float(timeout), output_limit=int(limit), cwd="/",
                        env=env, kill_tree=end_strays, watchdog=watch, capture=output)
    if not reap_all():
        raise RuntimeError("processes of the command could not be killed")
    clear_ipc()
    head, tail = output.parts()
    return (str(result.exit_code).encode(), b"1" if result.timed_out else b"0", f"{result.duration:.6f}".encode(),
            str(output.total).encode(), f"{_children_cpu() - before:.6f}".encode(), head, tail)


def _children_cpu() -> float:
    """CPU time of every reaped descendant: being pid 1, this process reaps every process a
    command made, so the difference around a command is exactly what it used."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    stdin, out = sys.stdin.buffer, sys.stdout.buffer
    out.write(encode(OK, b"ready", str(os.getpid()).encode()))
    out.flush()
    while len(head := stdin.read(4)) == 4:
        body = stdin.read(int.from_bytes(head, "big"))
        try:
            op, fields = decode(body)
            answer = encode(OK, *handle(op, fields))
        except Exception as exc:  # reported to the host, never fatal to the sandbox
            kind = error_kind(exc)
            message = str(exc) if kind != "internal" else f"{type(exc).__name__}: {exc}"
            answer = encode(ERROR, kind.encode(), message.encode(errors="surrogateescape"))
        out.write(answer)
        out.flush()


if __name__ == "__main__":
    main()
