"""Run one command to completion: closed stdin, capped output, a deadline, and no survivors.

Hangs are the field's most reported failure after leaks: commands that read stdin, background
children that keep the output pipe open, pipes nobody drains. Here stdin is /dev/null, the pipe is
drained continuously into a bounded buffer, and when the main process exits (or the deadline
passes) every process left in its tree is killed, so reading always reaches end-of-file.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from .base import ExecResult
from .output import CappedOutput

KillTree = Callable[[subprocess.Popen], None]


PF_EXITING = 0x4  # kernel task flag: the process is past the point of no return in exit()


def is_dead_or_exiting(pid: int) -> bool:
    """True for a process that is dead (zombie) or already exiting, or gone: nothing to kill."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & PF_EXITING)
    except (OSError, IndexError, ValueError):
        return True  # gone already


def kill_process_group(proc: subprocess.Popen) -> None:
    """SIGKILL the session/process group the command was started in."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_capped(
    argv: Sequence[str],
    *,
    timeout: float,
    output_limit: int,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    kill_tree: KillTree = kill_process_group,
    pass_fds: Sequence[int] = (),
    user: int | None = None,
) -> ExecResult:
    """Run ``argv`` and return its :class:`ExecResult`.

    The command starts in a new session (so its group can be killed); ``kill_tree`` is called on
    timeout and again once the main process has exited, to remove background leftovers. ``user``
    runs it as that uid (and gid), with no supplementary groups.
    """
    start = time.monotonic()
    out = CappedOutput(output_limit)
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
        **({"user": user, "group": user, "extra_groups": []} if user is not None else {}),
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    deadline = start + timeout
    timed_out = False
    killed_after_exit = False
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        while True:
            now = time.monotonic()
            if not timed_out and now >= deadline:
                timed_out = True
                kill_tree(proc)
                kill_process_group(proc)
                # Leftovers may still hold the pipe; give the drain a short grace period.
                deadline = now + 2.0
            elif timed_out and now >= deadline:
                break
            if proc.poll() is not None and not killed_after_exit:
                # Main process is gone: kill whatever it left in the background, then drain.
                killed_after_exit = True
                kill_tree(proc)
                kill_process_group(proc)
            events = sel.select(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            if not events:
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                break
            out.feed(chunk)
    finally:
        sel.close()
        proc.stdout.close()
        if proc.poll() is None:
            kill_tree(proc)
            kill_process_group(proc)
        exit_code = proc.wait()
    if timed_out:
        out.feed(f"\n[patchgym: command timed out after {timeout:g}s and was killed]\n".encode())
    return ExecResult(
        exit_code=exit_code if not timed_out else -signal.SIGKILL,
        output=out.text(),
        timed_out=timed_out,
        duration=time.monotonic() - start,
        truncated=out.truncated,
    )
