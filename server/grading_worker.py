"""A grading worker of :mod:`patchgym.server.grading_pool`: reads its configuration, joins the
grading cgroup, then grades one request at a time until its stdin closes.

    python -m patchgym.server.grading_worker

Frames on stdin and stdout: an 8-byte big-endian size, then a pickle (the server is this
process's parent: nothing else writes here). The first frame is the configuration; each next one
is ``(task, patch, run_empty)``, answered with ``(True, report)`` or ``(False, exception)``.

SIGTERM (the pool closing, a supervisor, ``kill``), SIGINT and SIGHUP end the worker by unwinding:
Python's default action would kill it on the spot and leave the sandbox it grades in (a workspace
and cgroups, a container) to ``patchgym sandboxes gc``. :class:`Terminated` is raised where the
grading is, so the verifier's own ``finally`` closes its sandbox; it is no :class:`Exception`, so
nothing in grading takes it for the patch's failure. Later signals are ignored (they would cut that
cleanup in half), and :data:`EXIT_DEADLINE` bounds it: past it SIGALRM's default action ends the
worker, and what is left is named for a dead pid, for gc. An answer being written is finished
first, so the pool never reads half a frame.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# From the first signal to the end, exit handlers included: a local sandbox closes in well under a
# second; docker's exit handler waits up to 5 s for the engine to remove containers let go of.
EXIT_DEADLINE = 10.0
_signalled: int | None = None  # the first signal, once one came
_answering = False  # an answer's frame is being written: a signal waits for its end


class Terminated(BaseException):
    """A signal asked this worker to end: the grading under way is abandoned by unwinding."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """The first signal unwinds (at once, or once the answer being written is whole) and starts the
    exit's deadline; later ones change nothing, so that the cleanup they would interrupt finishes."""
    global _signalled
    if _signalled is not None:
        return
    _signalled = signum
    signal.setitimer(signal.ITIMER_REAL, EXIT_DEADLINE)  # SIGALRM's default action: the process ends
    if not _answering:
        raise Terminated(signum)


def read_frame(stream: BinaryIO) -> Any | None:
    size = stream.read(8)
    if len(size) < 8:
        return None
    return pickle.loads(stream.read(int.from_bytes(size, "big")))


def write_answer(stream: BinaryIO, answer: tuple[bool, Any]) -> None:
    """Write ``answer`` as one whole frame, not cut by a signal (which is raised after it: the
    grading was over, its answer counts)."""
    global _answering
    data = pickle.dumps(answer)
    _answering = True
    try:
        stream.write(len(data).to_bytes(8, "big") + data)
        stream.flush()
    finally:
        _answering = False
    if _signalled is not None:
        raise Terminated(_signalled)


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Join the configured cgroup, then grade each request until stdin closes."""
    config = read_frame(stdin)
    if config is None:
        return
    if config["group"]:
        try:
            Path(config["group"], "cgroup.procs").write_text("0")  # this process; what it starts follows
        except OSError as exc:
            print(f"patchgym grading worker: cannot join {config['group']}: {exc}", file=sys.stderr)
    from patchgym.grading.verifier import Verifier
    from patchgym.tasks.backends import sandbox_factory

    verifier = Verifier(sandbox_factory(config["backend"], **config["sandbox_options"]),
                        partial_credit=config["partial_credit"], prices=config["prices"],
                        tampering_reward=config["tampering_reward"])
    while (request := read_frame(stdin)) is not None:
        task, patch, run_empty = request
        try:
            answer: tuple[bool, Any] = (True, verifier.verify(task, patch, run_empty=run_empty))
        except Exception as exc:  # handed to the server's caller
            answer = (False, exc)
        write_answer(stdout, answer)


def frame_streams() -> tuple[BinaryIO, BinaryIO]:
    """The frames' pipes, moved off descriptors 0 and 1: what this process starts inherits
    /dev/null and stderr there, so nothing it prints or reads can break a frame."""
    stdin, stdout = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")  # not inherited
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stdin, stdout


def main() -> None:
    for signum in SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:  # one its starter ignores (nohup) stays ignored
            signal.signal(signum, _on_signal)
    stdin, stdout = frame_streams()
    try:
        serve(stdin, stdout)
    except Terminated as exc:
        for signum in SIGNALS:  # ignored from here: the interpreter's end would restore their default action
            signal.signal(signum, signal.SIG_IGN)
        print(f"patchgym grading worker: {exc}; the grading under way was abandoned", file=sys.stderr)
        sys.exit(128 + exc.signum)  # the shell's convention; exit handlers run within the deadline


if __name__ == "__main__":
    main()
