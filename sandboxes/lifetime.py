"""Children that die with the process that started them, also when it is SIGKILLed.

A killed harness must not leave an installer writing into a cache entry, or a sandbox running,
after it is gone: the next run would find the entry half-written under its feet. Each long-lived
child patchgym starts is wrapped by :func:`parent_checked`, which runs it under
``setpriv --pdeathsig`` (util-linux): the kernel signals the child when its starter dies, however
it dies. The death signal is set after the fork, so a starter that dies in between would leave an
orphan; the tiny shell that follows closes that window: it goes on only if its parent is still the
starter, else it exits 125 and nothing runs.

Two forms. The plain one (``group=False``) execs the command with SIGKILL as its death signal: for
a child that takes its own descendants down with it (bubblewrap holding a pid namespace). The group
one (``group=True``, started in a session of its own, as :func:`run_checked` does) keeps the shell
as a supervisor with SIGTERM as its death signal, which it answers by SIGKILLing its whole process
group: installers and builds fork compilers and build backends that a death signal to the direct
child would not reach.

The death signal follows the *thread* that started the child (a kernel rule), not its process: a
sandbox made in a worker thread that ends (a server's request thread) would die with that thread.
Children that outlive the call that starts them are therefore started by :func:`spawn`, from one
thread that lives as long as the process; :func:`run_checked` waits for its child in the calling
thread, which cannot end first.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from functools import cache

ORPHANED_EXIT = 125  # the starter was gone before the child could tie itself to it
# $0 is the starter's pid, "$@" the command: go on only while the starter is still the parent.
_CHECK = '[ "$PPID" = "$0" ] || exit 125; '
_EXEC = _CHECK + 'exec "$@"'
# A background job's stdin would be /dev/null: hand it the shell's own through a descriptor that
# is free (inherited ones, such as a lock's, are left alone). `kill -KILL -$$` hits only the
# shell's own group, and only when the shell leads one (started in a session of its own).
_SUPERVISE = (_CHECK + "trap 'kill -KILL -$$' TERM; "
              'for n in 9 8 7 6 5 4 3; do [ -e "/proc/$$/fd/$n" ] || break; done; '
              'eval "exec $n<&0"; eval "\\"\\$@\\" <&$n $n<&- &"; child=$!; eval "exec $n<&-"; '
              'while :; do wait "$child"; status=$?; kill -0 "$child" 2>/dev/null || exit "$status"; done')


@cache
def setpriv_path() -> str | None:
    """``setpriv`` (util-linux, on every Debian), or None where it is missing."""
    return shutil.which("setpriv")


def parent_checked(argv: Sequence[str], starter: int | None = None, *, group: bool = False,
                   death_signal: str = "KILL") -> list[str]:
    """``argv`` wrapped so that it dies when ``starter`` (by default this process) dies, and never
    runs at all if the starter died before the child could ask for that (exit 125).

    ``group=True``: the whole process group dies, not only the command; start it in a session of
    its own (``start_new_session=True``). Otherwise ``death_signal`` is what the command gets: KILL,
    or TERM for one that answers it by cleaning up and ending within a deadline of its own (a
    grading worker). Where ``setpriv`` is missing, ``argv`` is returned unchanged (the child would
    outlive a killed starter, as before this module)."""
    setpriv = setpriv_path()
    if setpriv is None:
        return list(argv)
    pid = os.getpid() if starter is None else starter
    if group:
        return [setpriv, "--pdeathsig", "TERM", "--", "/bin/sh", "-c", _SUPERVISE, str(pid), *argv]
    return [setpriv, "--pdeathsig", death_signal, "--", "/bin/sh", "-c", _EXEC, str(pid), *argv]


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (what a build step left running, if anything)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_checked(argv: Sequence[str], *, timeout: float | None = None, input: bytes | None = None,
                **popen_kwargs) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` for a build step: its whole process group dies with this process,
    and is SIGKILLed on timeout, on any exception here (Ctrl-C), and once the step has exited
    (background leftovers). Raises :class:`subprocess.TimeoutExpired` as ``subprocess.run`` does."""
    proc = subprocess.Popen(parent_checked(argv, group=True), start_new_session=True, **popen_kwargs)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        kill_group(proc.pid)
        proc.wait()
        raise
    finally:
        kill_group(proc.pid)
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


_spawner_lock = threading.Lock()
_spawner: tuple[int, queue.SimpleQueue] | None = None  # (pid it belongs to, its requests)


def _serve(requests: queue.SimpleQueue) -> None:
    while True:
        start, answer = requests.get()
        try:
            answer.put((True, start()))
        except BaseException as exc:  # handed to the caller
            answer.put((False, exc))


def _requests() -> queue.SimpleQueue:
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # none yet, or inherited through a fork
            requests: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(requests,), name="patchgym-spawner", daemon=True).start()
            _spawner = (os.getpid(), requests)
        return _spawner[1]


def spawn(argv: Sequence[str], *, death_signal: str = "KILL", **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(parent_checked(argv, death_signal=...), **popen_kwargs)`` for a child
    that outlives the call (a sandbox's init): started from a thread that lives as long as this
    process, so that the child dies with the process, not with the thread that asked for it."""
    wrapped = parent_checked(argv, death_signal=death_signal)
    start: Callable[[], subprocess.Popen] = lambda: subprocess.Popen(wrapped, **popen_kwargs)  # noqa: E731
    answer: queue.SimpleQueue = queue.SimpleQueue()
    _requests().put((start, answer))
    ok, result = answer.get()
    if not ok:
        raise result
    return result
