"""Which long steps are under way, for progress written as lines (a log, CI, ``nohup``), where a
live bar shows nothing: minutes of an environment build would otherwise be silence.

A step is wrapped in :func:`phase`. An announced one (an environment build and each of its steps:
rare, and long) is said as it starts, on the ``patchgym.phase`` logger. The others (a sandbox
starting, the tests running) are said only once they have taken long, by whoever polls
:func:`overdue` (the command line's progress lines), so that 500 quick instances do not fill a log
with a thousand lines. Only the steps under way are held: nothing grows when nobody polls.

On Ctrl-C the command line calls :func:`stop`: the work under way finishes, but a build starts no
further step (:func:`stopping`), so that "stops within seconds" holds when the signal came between
two steps' processes (an environment build's remaining steps can take minutes).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger("patchgym.phase")


@dataclass
class _Phase:
    what: str
    started: float
    said: float | None  # when it was last said (None: not yet)


_active: dict[int, _Phase] = {}
_lock = threading.Lock()
_ids = itertools.count()
_stopping = threading.Event()


def stop() -> None:
    """The process is winding down (Ctrl-C): long work starts no further step."""
    _stopping.set()


def stopping() -> bool:
    return _stopping.is_set()


@contextmanager
def phase(what: str, *, announce: bool = False) -> Iterator[None]:
    """Mark ``what`` (e.g. ``"semverkit-1: tests"``) as under way for the duration of the block;
    ``announce``: say it now (logged at INFO on ``patchgym.phase``)."""
    now = time.monotonic()
    if announce:
        log.info("%s", what)
    key = next(_ids)
    with _lock:
        _active[key] = _Phase(what, now, now if announce else None)
    try:
        yield
    finally:
        with _lock:
            _active.pop(key, None)


def overdue(after: float, every: float) -> list[tuple[str, float]]:
    """The steps under way that have run ``after`` seconds without being said, or ``every`` seconds
    since they last were, each with its age in seconds; they count as said now."""
    now = time.monotonic()
    due = []
    with _lock:
        for p in _active.values():
            if (p.said is None and now - p.started >= after) or (p.said is not None and now - p.said >= every):
                p.said = now
                due.append((p.what, now - p.started))
    return due
