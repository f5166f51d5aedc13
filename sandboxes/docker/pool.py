"""A warm pool: sandbox containers started ahead of need, handed out at once.

A container start costs about 0.3 s (create, attach, start, the server filling /testbed; more for
a large working tree); a container from the pool costs one request to its running server. Once an
(image, limits, network) key has been asked for ``warm_after`` times (or prefilled), acquiring a
container for it starts its replacement in the background, so a key in use stays warm: the next
rollout of the same task, and its grading sandbox.

What it costs: every replacement is a container start, wasted when no sandbox of that key is asked
for again, and on a busy machine it competes with the tests for the cores. Measured on 2 cores
(bench/docker_pool.py, bench/README.md): episodes of tasks seen again were 0.3 s shorter (the reset
and most gradings warm) for 6 % more container starts; ``patchgym eval`` (each instance graded
once, but some images shared) was 8-10 % slower with it. Refilling from a key's first use would
waste a start on every task seen once, hence ``warm_after`` 2. Waiting containers are let go after
``idle`` seconds, and at most ``max_waiting`` wait at once (the longest-waiting goes first); a
waiting container holds about 3 MiB of the host plus its /testbed (bench/docker_sandbox.py).
Nothing leaks: a waiting container's server ends when the pool lets it go or when the pool's
process ends (its stream closes), the engine then removes it, and it carries the sandbox labels,
so ``patchgym sandboxes gc`` and the reaper find any left.

``make_sandbox(task, "docker")`` (the server, ``patchgym run``, RepoEnv) uses the process-wide pool
of :func:`default_pool_size` (``PATCHGYM_DOCKER_POOL``, 0 turns it off; the sandbox option
``pool_size`` overrides it); the grading commands (``eval``, ``tasks validate``, ...) use none
unless ``PATCHGYM_DOCKER_POOL`` is set; ``DockerSandbox(...)`` uses a pool only when given one.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import deque

from patchgym.sandboxes.base import ResourceLimits, SandboxError
from patchgym.sandboxes.docker.containers import DEFAULT_LIFETIME, start_container
from patchgym.sandboxes.docker.retire import retirements

log = logging.getLogger(__name__)

DEFAULT_IDLE = 120.0  # seconds a started container waits for a sandbox before it is let go
DEFAULT_MAX_WAITING = 8
DEFAULT_WARM_AFTER = 2  # acquisitions of a key before it is kept warm (see above)
POOL_ENV = "PATCHGYM_DOCKER_POOL"
DEFAULT_POOL_SIZE = 1


class WarmPool:
    """Started containers per (image, limits, network), handed out at once, refilled in the background.

    ``size`` containers are kept ready per key once the key has been asked for ``warm_after``
    times or prefilled (``size`` 0 disables the pool); one that waits ``idle`` seconds is let go; at
    most ``max_waiting`` wait in all.
    """

    def __init__(self, size: int = DEFAULT_POOL_SIZE, *, lifetime: int = DEFAULT_LIFETIME, idle: float = DEFAULT_IDLE,
                 max_waiting: int = DEFAULT_MAX_WAITING, warm_after: int = DEFAULT_WARM_AFTER) -> None:
        self.size = size
        self.lifetime = lifetime
        self.idle = idle
        self.max_waiting = max_waiting
        self.warm_after = warm_after
        self._ready: dict[tuple, deque] = {}  # key -> (container, connection, ready since)
        self._starting: dict[tuple, int] = {}
        self._asked: dict[tuple, int] = {}  # key -> times acquired, until it is kept warm
        self._warm: set[tuple] = set()
        self._lock = threading.Condition()
        self._closed = False
        self._reaper: threading.Thread | None = None

    def acquire(self, image: str, limits: ResourceLimits, network: bool):
        """A started container for ``image`` and a connection to its server: a waiting one if the
        pool has one that still answers, else one started now. Its replacement starts meanwhile."""
        key = (image, limits, network)
        with self._lock:
            if key not in self._warm:
                self._asked[key] = self._asked.get(key, 0) + 1
                if self._asked[key] >= self.warm_after:
                    self._warm.add(key)
                    del self._asked[key]
        item = None
        while True:
            with self._lock:
                queue = self._ready.get(key)
                item = queue.popleft() if queue else None
            if item is None or _answers(item[1]):
                break
            _let_go(item)  # its server is gone (its lifetime ended, or it was killed)
        self._refill_later(key)
        if item is not None:
            return item[0], item[1]
        return start_container(image, limits, self.lifetime, network)

    def prefill(self, image: str, limits: ResourceLimits, network: bool = False) -> None:
        """Start the pool's containers for ``image`` now (blocking)."""
        key = (image, limits, network)
        with self._lock:
            self._warm.add(key)
            needed = self._needed(key)
        self._start(key, needed)

    def waiting(self) -> int:
        """How many started containers wait in the pool now."""
        with self._lock:
            return sum(len(q) for q in self._ready.values())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            items = [item for queue in self._ready.values() for item in queue]
            self._ready.clear()
            self._lock.notify_all()
        for item in items:
            _let_go(item)

    def _needed(self, key: tuple) -> int:
        """Containers to start for ``key`` (called with the lock held; counted as starting)."""
        if self._closed or self.size <= 0 or key not in self._warm:
            return 0
        needed = self.size - len(self._ready.get(key, ())) - self._starting.get(key, 0)
        if needed > 0:
            self._starting[key] = self._starting.get(key, 0) + needed
        return max(needed, 0)

    def _refill_later(self, key: tuple) -> None:
        with self._lock:
            needed = self._needed(key)
        if needed:
            threading.Thread(target=self._start, args=(key, needed), name="patchgym-docker-pool", daemon=True).start()

    def _start(self, key: tuple, count: int) -> None:
        for done in range(count):
            try:
                item = (*start_container(key[0], key[1], self.lifetime, key[2]), time.monotonic())
            except Exception as exc:
                log.warning("warm pool could not start a container for %s: %s", key[0], exc)
                with self._lock:
                    self._starting[key] -= count - done
                return
            evicted = []
            with self._lock:
                self._starting[key] -= 1
                if self._closed:
                    evicted.append(item)
                else:
                    self._ready.setdefault(key, deque()).append(item)
                    while sum(len(q) for q in self._ready.values()) > self.max_waiting:
                        oldest = min((q for q in self._ready.values() if q), key=lambda q: q[0][2])
                        evicted.append(oldest.popleft())
                    self._ensure_reaper()
            for old in evicted:
                _let_go(old)

    def _ensure_reaper(self) -> None:
        """Called with the lock held: a thread that lets go of containers waiting past ``idle``."""
        if self._reaper is None or not self._reaper.is_alive():
            self._reaper = threading.Thread(target=self._reap, name="patchgym-docker-pool-reaper", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        while True:
            expired = []
            with self._lock:
                if self._closed or not any(self._ready.values()):
                    self._reaper = None
                    return
                now = time.monotonic()
                for queue in self._ready.values():
                    while queue and now - queue[0][2] >= self.idle:
                        expired.append(queue.popleft())
                if not expired:
                    oldest = min(q[0][2] for q in self._ready.values() if q)
                    self._lock.wait(timeout=max(0.05, oldest + self.idle - now))
            for item in expired:
                _let_go(item)


def _answers(connection) -> bool:
    try:
        connection.request(b"P", (), 5.0)
        return True
    except Exception:
        return False


def _let_go(item: tuple) -> None:
    retirements.retire(item[0], item[1])  # the server ends, and the engine removes its container


_pools: dict[int, WarmPool] = {}
_pools_lock = threading.Lock()


def default_pool_size() -> int:
    """The size of the pool ``make_sandbox`` uses: ``$PATCHGYM_DOCKER_POOL``, else 1 (0: none)."""
    value = os.environ.get(POOL_ENV, "").strip()
    if not value:
        return DEFAULT_POOL_SIZE
    try:
        size = int(value)
    except ValueError:
        raise SandboxError(f"{POOL_ENV} must be a number of containers (0 turns the pool off), not {value!r}") from None
    return max(size, 0)


def shared_pool(size: int) -> WarmPool | None:
    """The process-wide warm pool of ``size`` containers per image (closed at exit); None for 0."""
    if size <= 0:
        return None
    with _pools_lock:
        if size not in _pools:
            _pools[size] = WarmPool(size)
            atexit.register(_pools[size].close)
        return _pools[size]
