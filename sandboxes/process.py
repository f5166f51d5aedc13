"""Run one command to completion: closed stdin, capped output, a deadline, and no survivors.

Hangs are the field's most reported failure after leaks: commands that read stdin, background
children that keep the output pipe open, pipes nobody drains. Here stdin is /dev/null, the pipe is
drained continuously into a bounded buffer, and when the main process exits (or the deadline
passes) every process left in its tree is killed, so reading always reaches end-of-file. A
``watchdog`` polled while the command runs can end it early, for a reason printed in its output.
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .base import ExecResult  # relative: copied into sandboxes as the package pgrt
from .output import CappedOutput

KillTree = Callable[[subprocess.Popen], None]
Watchdog = Callable[[], "str | None"]  # a reason to kill the command now, or None


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


class ProcessLimitWatch:
    """A :data:`Watchdog` that fires when a pids cgroup stays at its limit (a fork bomb).

    The pids controller stops a fork bomb from growing, but the bomb keeps its tree at the limit,
    retrying forks, until the command's timeout (900 s for a test run). A tree whose forks keep
    failing (``pids.events``) while it sits at the limit (``pids.current``) for ``hold`` seconds is
    not going to finish. Both backends use it: on the host with the sandbox's own cgroup, in a
    container with the container's.
    """

    def __init__(self, cgroup: Path, *, hold: float = 2.0, poll: float = 0.1, gap: float = 0.5) -> None:
        self.cgroup = cgroup
        self.hold, self.poll, self.gap = hold, poll, gap
        self.limit: int | None = None
        self._failures: int | None = None  # failed forks when first looked at
        self._since: float | None = None
        self._last_hit = 0.0
        # The first look is one poll into the command: a short command reads no cgroup file at all.
        self._next_poll = time.monotonic() + poll

    def _failed_forks(self) -> int:
        try:
            for line in (self.cgroup / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def __call__(self) -> str | None:
        now = time.monotonic()
        if now < self._next_poll:
            return None
        self._next_poll = now + self.poll
        if self._failures is None:
            self.limit = _read_number(self.cgroup / "pids.max")  # None when unlimited: nothing to watch
            self._failures = self._failed_forks()
            return None
        if self.limit is None:
            return None
        failures = self._failed_forks()
        failing, self._failures = failures > self._failures, failures
        at_limit = (_read_number(self.cgroup / "pids.current") or 0) >= self.limit
        # A streak starts with a failed fork and lasts while forks fail or the tree stays at the
        # limit, with pauses of at most ``gap``; it fires once it has lasted ``hold``.
        if failing or (at_limit and self._since is not None):
            if self._since is None or now - self._last_hit > self.gap:
                self._since = now if failing else None
            self._last_hit = now
        elif self._since is not None and now - self._last_hit > self.gap:
            self._since = None
        if self._since is not None and now - self._since >= self.hold:
            return f"process limit ({self.limit}) reached"
        return None


def _await_exit(proc: subprocess.Popen, deadline: float, watchdog: Watchdog | None) -> tuple[bool, str | None]:
    """Wait for ``proc`` to exit, woken the moment it does (a pidfd, where the kernel has them),
    polling ``watchdog`` meanwhile; return (timed out, why it must be killed)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # kernels before 5.3: poll instead
        pidfd = None
    pause = 0.0002
    try:
        while proc.poll() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True, None
            reason = watchdog() if watchdog is not None else None
            if reason:
                return False, reason
            if pidfd is not None:
                select.select([pidfd], [], [], min(0.05, remaining))
            else:
                time.sleep(min(pause, remaining))
                pause = min(pause * 2, 0.05)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return False, None


def _read_number(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


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
    watchdog: Watchdog | None = None,
    capture: CappedOutput | None = None,
) -> ExecResult:
    """Run ``argv`` and return its :class:`ExecResult`.

    The command starts in a new session (so its group can be killed); ``kill_tree`` is called on
    timeout and again once the main process has exited, to remove background leftovers. ``user``
    runs it as that uid (and gid), with no supplementary groups. When ``watchdog`` returns a
    reason, the tree is killed and the command ends with that reason in its output and a non-zero
    exit code (not a timeout). ``capture``, when given, receives the output (its head and tail
    apart, for a caller that passes them on) instead of a new one of ``output_limit``.
    """
    start = time.monotonic()
    out = capture if capture is not None else CappedOutput(output_limit)
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
    killed: str | None = None
    killed_after_exit = False
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        while True:
            now = time.monotonic()
            if not timed_out and killed is None:
                if now >= deadline:
                    timed_out = True
                elif watchdog is not None:
                    killed = watchdog()
                if timed_out or killed:
                    kill_tree(proc)
                    kill_process_group(proc)
                    # Leftovers may still hold the pipe; give the drain a short grace period.
                    deadline = now + 2.0
            elif now >= deadline:
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
                # A command that closed its output may still be running (coreutils close stdout
                # before they exit): it ends when its main process does, as it would had its
                # output stayed open. Killing it now could take its own exit status from it.
                if not (timed_out or killed) and proc.poll() is None:
                    timed_out, killed = _await_exit(proc, deadline, watchdog)
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
    elif killed:
        out.feed(f"\n[patchgym: command killed: {killed}]\n".encode())
    return ExecResult(
        exit_code=exit_code if not (timed_out or killed) else -signal.SIGKILL,
        output=out.text(),
        timed_out=timed_out,
        duration=time.monotonic() - start,
        truncated=out.truncated,
    )
