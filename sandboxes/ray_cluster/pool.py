"""Warm sandbox hosts on the driver: an actor whose sandbox closed cleanly hosts the next one.

Starting a host is starting a process on its node: Python, Ray's core worker and patchgym's imports,
about 2 s of wall time and over a second of CPU here, against about 0.1 s to open a sandbox in a
warm one (bench/README.md). A grading of small tasks is shorter than that start, so a driver keeps
each host for ``keep_warm`` seconds after its sandbox closed and gives it to its next sandbox with
the same actor options. An idle host still holds its slot (its ``patchgym_sandbox`` unit), so it is
killed after ``keep_warm``, and at once when this driver needs a host of other options (whose slot
it might be holding).

Only hosts that closed their sandbox cleanly come back here; a host that lost a call, or whose
close failed, is killed (its guard cleans its node). Hosts are Ray actors owned by this process:
they die with it whatever happens here.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from patchgym.sandboxes.ray_cluster.channel import Channel

#: Scheduling strategies a warm host can stand for: their placement depends on nothing but the
#: strategy itself. Others (placement groups, label selectors) always get a new host.
REUSABLE_STRATEGIES = ("SPREAD", "DEFAULT", None)


@dataclass(eq=False)
class Host:
    """One host actor as the driver holds it."""

    actor: Any
    key: tuple
    session: str | None  # the Ray connection (job) it belongs to
    channel: Channel | None = None
    node_id: str = ""
    counted: bool = False  # in use, and counted on its node for SPREAD's choice
    keep_warm: float = 0.0
    idle_since: float = 0.0


def pool_key(resource: str, num_cpus: float, strategy: Any) -> tuple | None:
    """What a warm host must share with a new sandbox's options to stand for it; None: never reused."""
    if strategy in REUSABLE_STRATEGIES:
        return (resource, float(num_cpus), strategy or "DEFAULT")
    node_id, soft = getattr(strategy, "node_id", None), getattr(strategy, "soft", None)
    if type(strategy).__name__ == "NodeAffinitySchedulingStrategy" and node_id:
        return (resource, float(num_cpus), "node", node_id, bool(soft))
    return None


def session_of(ray: Any) -> str | None:
    """This process's Ray connection: hosts of an earlier one (before ``ray.shutdown()``) died with it."""
    try:
        return ray.get_runtime_context().get_job_id() if ray.is_initialized() else None
    except Exception:
        return None


class HostPool:
    """The idle hosts of this process, by :func:`pool_key`."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._idle: dict[tuple, list[Host]] = {}
        self._busy: Counter[str] = Counter()  # hosts in use per node, for SPREAD's choice
        self._ray: Any = None
        self._sweeper: threading.Thread | None = None

    def take(self, ray: Any, key: tuple) -> Host | None:
        """An idle host for ``key`` (for SPREAD, on the node where this driver uses fewest), or None."""
        session = session_of(ray)
        with self._lock:
            self._ray = ray
            self._forget_other_sessions(session)
            idle = self._idle.get(key)
            if not idle:
                return None
            if key[2] == "SPREAD":
                host = min(reversed(idle), key=lambda h: self._busy[h.node_id])
                idle.remove(host)
            else:
                host = idle.pop()  # the most recently used: the warmest
            self._count(host)
            return host

    def make_room(self, ray: Any, key: tuple) -> None:
        """A new host of ``key`` is about to start: idle hosts of other options are killed, since one
        of them may hold the slot it needs."""
        with self._lock:
            self._ray = ray
            others = [h for k, idle in self._idle.items() if k != key for h in idle]
            for k in [k for k in self._idle if k != key]:
                del self._idle[k]
        for other in others:
            kill(ray, other)

    def started(self, host: Host) -> None:
        """A new host is in use on ``host.node_id``."""
        with self._lock:
            self._count(host)

    def give_back(self, ray: Any, host: Host, keep_warm: float) -> None:
        """``host``'s sandbox closed cleanly: keep it ``keep_warm`` seconds for the next one."""
        # only a host that has opened a sandbox (its node known) of this very connection is kept
        session = session_of(ray)
        keep = keep_warm > 0 and bool(host.key and host.node_id) and session is not None and host.session == session
        with self._lock:
            self._uncount(host)
            if keep:
                host.keep_warm, host.idle_since = keep_warm, time.monotonic()
                self._idle.setdefault(host.key, []).append(host)
                if self._sweeper is None:
                    self._sweeper = threading.Thread(target=self._sweep, daemon=True, name="patchgym-ray-pool")
                    self._sweeper.start()
                self._lock.notify_all()
        if not keep:
            kill(ray, host)

    def discard(self, ray: Any, host: Host) -> None:
        """``host`` is no longer usable (lost, or its close failed): kill it."""
        with self._lock:
            self._uncount(host)
        kill(ray, host)

    def release_all(self) -> int:
        """Kill every idle host now (their slots free at once); how many there were."""
        with self._lock:
            idle = [h for hosts in self._idle.values() for h in hosts]
            self._idle.clear()
            ray = self._ray
        for host in idle:
            kill(ray, host)
        return len(idle)

    def idle_count(self) -> int:
        with self._lock:
            return sum(len(hosts) for hosts in self._idle.values())

    # -- internals ------------------------------------------------------------------------

    def _count(self, host: Host) -> None:
        self._busy[host.node_id] += 1
        host.counted = True

    def _uncount(self, host: Host) -> None:
        if host.counted:
            self._busy[host.node_id] -= 1
            host.counted = False

    def _forget_other_sessions(self, session: str | None) -> None:
        for key, hosts in list(self._idle.items()):
            for host in [h for h in hosts if h.session != session]:
                hosts.remove(host)
                if host.channel is not None:
                    host.channel.close()
            if not hosts:
                del self._idle[key]
        for node in [n for n, count in self._busy.items() if count <= 0]:
            del self._busy[node]

    def _sweep(self) -> None:
        """Kill hosts idle past their ``keep_warm``; ends when none is idle."""
        while True:
            with self._lock:
                now = time.monotonic()
                expired = [h for hosts in self._idle.values() for h in hosts if h.idle_since + h.keep_warm <= now]
                for host in expired:
                    self._idle[host.key].remove(host)
                for key in [k for k, hosts in self._idle.items() if not hosts]:
                    del self._idle[key]
                due = [h.idle_since + h.keep_warm for hosts in self._idle.values() for h in hosts]
                ray = self._ray
                if not expired and not due:
                    self._sweeper = None
                    return
                if not expired:
                    self._lock.wait(min(due) - now)
                    continue
            for host in expired:
                kill(ray, host)


def connected(ray: Any, host: Host) -> bool:
    """Whether this process is still on the Ray connection ``host`` was made on. Ray's calls made
    without one start a new cluster (``ray.kill`` and ``.remote()`` call ``ray.init()``), and the
    host died with its connection anyway."""
    return host.session is not None and session_of(ray) == host.session


def kill(ray: Any, host: Host) -> None:
    """Kill ``host`` (its guard cleans its node): close its channel, then its actor."""
    if host.channel is not None:
        host.channel.close()
    if connected(ray, host):
        try:
            ray.kill(host.actor, no_restart=True)
        except Exception:
            pass  # already dead


#: This process's pool (Ray's connection is per process, and so are its actors).
POOL = HostPool()
