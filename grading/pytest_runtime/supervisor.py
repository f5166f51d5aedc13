"""The test runner's supervisor: the runner is its child, and the results are written by it alone,
once every process of the run is dead.

:func:`supervise` forks. The child returns at once with the write end of a pipe and becomes the
runner (the reporter writes its records into that pipe). The parent never returns: it makes itself
a *child subreaper* (every process the run orphans, a daemon that double-forks included, becomes
its child, never escapes to the sandbox's init) and non-dumpable (code under test, which runs as
the same user without capabilities, cannot trace it or read its memory or descriptors), ignores
every signal it can, and lets the child go. It collects what the pipe carries while the runner
runs, reaping the orphans as they die; when the runner has exited it kills every live descendant
and reaps them until it has no child left, so that nothing of the run can write anything any more.
Only then does it write the results file (created anew, never followed through a symlink): the
records exactly as they came, and its own ``end`` record with the runner's status and the
interpreter's version. It exits with
that status (``128 + N`` for a runner killed by signal N).

A process of the run can still write into the pipe while it lives; what it writes lands among the
reporter's records, where the harness takes anything that is not a well-formed record in its place
as tampering (:func:`patchgym.grading.integrity.parse_record`). Nothing can write after the ``end``,
and a results file without one was not finished by the supervisor.

Standard library only, Python 3.6+: this runs under the task's interpreter. ``ctypes`` is used here,
in the parent, before the child runs anything of the repository's; never in the child.
"""

import atexit
import json
import os
import signal
import sys

# Bound when the runtime loads, before the repository is importable.
_exit = os._exit
_run_exitfuncs = atexit._run_exitfuncs
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
FAILED = "patchgym-supervisor:"
# Bounds what a process of the run can make the supervisor hold (the records of ~100,000 tests fit).
MAX_RECORDS_BYTES = 64 << 20
# Signals that would end the supervisor by default and that it can ignore (never SIGKILL/SIGSTOP).
IGNORED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGALRM",
           "SIGVTALRM", "SIGPROF", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGXCPU", "SIGXFSZ", "SIGIO")


def supervise(results):
    """Fork the runner: return the write end of the records pipe in the child (the runner); in
    the parent, supervise it and exit with its status (never return)."""
    read_fd, write_fd = os.pipe()
    go_read, go_write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_fd)
        os.close(go_write)
        os.read(go_read, 1)  # nothing runs before the parent is a subreaper
        os.close(go_read)
        return write_fd
    os.close(write_fd)
    os.close(go_read)
    code = 70
    try:
        code = _supervise(child, read_fd, go_write, results)
    except BaseException as exc:  # say why; the harness finds no end record
        try:
            sys.stderr.write(f"{FAILED} {type(exc).__name__}: {exc}\n")
            sys.stderr.flush()
        except Exception:
            pass
    os._exit(code)


def end(code):
    """End the runner (the child) as Python's own exit does, less the teardown: its threads that
    are not daemons joined and its ``atexit`` functions run (code under test sees both, and what a
    forger does there must still reach the harness: a status changed after the last record), the
    standard streams flushed, then ``os._exit(code)``. Tearing the interpreter down, every module's
    objects freed one by one, cost ~38 ms of a ~400 ms grading of a small repository and decides
    nothing: the records are written, the supervisor writes the results."""
    threading = sys.modules.get("threading")  # as the interpreter's own exit finds it
    if threading is not None:
        try:
            threading._shutdown()
        except Exception:
            pass
    _run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    _exit(code)


def _protect():
    """Subreaper and non-dumpable (False where ctypes or prctl is missing), deaf to signals."""
    subreaper = False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except Exception:
        pass
    for name in IGNORED:
        number = getattr(signal, name, None)
        if number is not None:
            signal.signal(number, signal.SIG_IGN)
    return subreaper


def _supervise(child, read_fd, go_write, results):
    import threading

    subreaper = _protect()
    os.write(go_write, b"g")
    os.close(go_write)
    chunks = []
    reader = threading.Thread(target=_collect, args=(read_fd, chunks), daemon=True)
    reader.start()
    status = _wait_for(child)
    killed = _end_descendants()
    reader.join(10.0)  # every writer is dead: the pipe is at its end
    data = b"".join(chunks)[:MAX_RECORDS_BYTES]
    # The interpreter, from the one writer nothing of the run can outlast: the harness reports what
    # it lacks (no audit hook before 3.8).
    end = {"event": "end", "status": status, "killed": killed, "subreaper": subreaper,
           "python": ".".join(map(str, sys.version_info[:3]))}
    _write_results(results, data + json.dumps(end).encode() + b"\n")
    return status if status >= 0 else 128 - status


def _collect(fd, chunks):
    size = 0
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        if size < MAX_RECORDS_BYTES:  # beyond: drained, not kept (the cut record is malformed)
            chunks.append(chunk)
            size += len(chunk)


def _status(raw):
    return -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def _wait_for(child):
    """Reap every child (orphans the run left) until the runner itself ends; its status."""
    while True:
        pid, raw = os.waitpid(-1, 0)
        if pid == child:
            return _status(raw)


def _live_descendants(me):
    """Live (not zombie) descendants of ``me``, from ``/proc`` (none found where it is missing:
    then only what exits by itself is waited for)."""
    parents = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] not in (b"Z", b"X"):
            parents[int(name)] = int(fields[1])
    found = []
    for pid in parents:
        ancestor, hops = parents[pid], 0
        while ancestor != me and ancestor in parents and hops < len(parents):
            ancestor, hops = parents[ancestor], hops + 1
        if ancestor == me:
            found.append(pid)
    return found


def _end_descendants():
    """SIGKILL every live descendant and reap until no child is left (being a subreaper, every
    descendant's death makes its children ours); how many were killed."""
    me, killed = os.getpid(), set()
    while True:
        for pid in _live_descendants(me):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return len(killed)


def _write_results(path, data):
    """Write the results anew at ``path``: never through a symlink, never into a FIFO or a
    directory something of the run put there (the harness then finds no regular file)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600)
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
