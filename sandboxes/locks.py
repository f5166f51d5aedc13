"""Inter-process file locks, so that concurrent workers build each cache entry exactly once."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_thread_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


@contextmanager
def file_lock(path: Path) -> Iterator[int]:
    """Hold an exclusive lock on ``path`` across threads of this process and other processes.

    Yields the lock's descriptor: children given it (``pass_fds``) hold the lock with it, so a
    lock whose holder was killed stays held while an orphan of its still runs (an explicit
    release here releases it for all of them)."""
    key = str(path)
    with _guard:
        tlock = _thread_locks.setdefault(key, threading.Lock())
    with tlock:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
