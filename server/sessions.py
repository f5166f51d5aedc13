"""Sessions: RepoEnv instances held for remote clients, bounded, owned, reaped when idle.

RepoEnv calls block (sandboxes, test runs), so every operation runs in a worker thread under a
deadline, one at a time per session. A session is closed exactly once: at once when it is idle,
else by the operation running on it when that finishes (a timed-out operation's thread cannot be
killed; it is abandoned and closes its session when it returns).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from patchgym.gym_envs.repo_env import RepoEnv

log = logging.getLogger(__name__)
T = TypeVar("T")


class CapacityError(RuntimeError):
    """Every session slot is taken, or every one the caller's token may hold."""


class SessionNotFound(KeyError):
    """No such session (or it belongs to another token)."""

    def __str__(self) -> str:
        return f"unknown session {self.args[0]!r}" if self.args else "unknown session"


class SessionBusy(RuntimeError):
    """Another operation is running on this session."""


class OperationTimeout(RuntimeError):
    """An operation ran past its deadline; its session has been closed."""


# How many sessions closed for idling are remembered (so a late call on one can say so).
REMEMBERED_EXPIRED = 65_536
# Why a session was closed (the ``reason`` of ``patchgym_sessions_closed_total``): a client asked
# (``/close_session``, ``DELETE``, OpenEnv's close); the episode was graded and nobody will close it
# (NeMo Gym's ``/verify`` of a rollout seeded without ``resources_session_id``, a whole
# ``/v1/rollouts``); it idled past its TTL; its sandbox or deadline failed; the server stopped.
CLOSED_BY_CLIENT = "client"
CLOSED_GRADED = "graded"
CLOSED_IDLE = "idle"
CLOSED_BY_FAILURE = "failure"
CLOSED_AT_SHUTDOWN = "shutdown"


class Session:
    def __init__(self, owner: str | None, session_id: str | None = None, idle_ttl: float | None = None,
                 protocol: str = "native") -> None:
        self.id = session_id or uuid.uuid4().hex
        self.owner = owner
        self.protocol = protocol  # which API opened it (a metrics label)
        self.idle_ttl = idle_ttl  # None: the manager's
        self.env: RepoEnv | None = None
        self.instance_id: str | None = None
        self.steps = 0
        self.done = False
        self.created = self.last_used = time.monotonic()
        self._state = threading.Lock()  # guards busy/closing/closed, touched from threads
        self.busy = False
        self.closing = False
        self.closed = False

    def idle_seconds(self) -> float:
        return 0.0 if self.busy else time.monotonic() - self.last_used

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def try_begin(self) -> bool:
        with self._state:
            if self.busy or self.closing:
                return False
            self.busy = True
            return True

    def end(self) -> bool:
        """Finish an operation; True when the caller must now close the environment."""
        with self._state:
            self.busy = False
            self.last_used = time.monotonic()
            if self.closing and not self.closed:
                self.closed = True
                return True
            return False

    def request_close(self) -> bool:
        """Ask for the session to be closed; True when the caller must close it now (it is idle)."""
        with self._state:
            self.closing = True
            if self.busy or self.closed:
                return False
            self.closed = True
            return True

    def close_env(self) -> None:
        env, self.env = self.env, None
        if env is None:
            return
        try:
            env.close()
        except Exception as exc:  # a close failure must not take the server down
            log.warning("session %s: closing its environment failed: %s", self.id, exc)


class SessionManager:
    """Sessions by id, at most ``max_sessions`` (creating counts from the start), each owned by a
    token digest (or None without auth), at most ``max_per_owner`` per owner (default: no bound
    but ``max_sessions``), so that one tenant cannot take every slot; idle longer than
    ``idle_ttl`` seconds (or the session's own): closed by :meth:`reap_idle`, and remembered as
    expired.

    A create on a full manager, or by an owner at its cap, fails at once (:class:`CapacityError`)
    unless it may wait: then it queues until a slot frees or its wait runs out, first come first
    served among the waiters whose owner may take one (an owner at its cap holds up no one else).
    Clients that retry (the native API, with ``Retry-After``) should not wait; NeMo Gym's agent
    never retries a seed, so its seeds queue instead of failing a whole batch."""

    def __init__(self, max_sessions: int = 32, idle_ttl: float = 900.0, operation_timeout: float = 1800.0,
                 max_per_owner: int | None = None) -> None:
        if max_sessions < 1 or (max_per_owner is not None and max_per_owner < 1):
            raise ValueError("max_sessions and max_per_owner must be at least 1")
        self.max_sessions = max_sessions
        self.max_per_owner = min(max_per_owner or max_sessions, max_sessions)
        self.idle_ttl = idle_ttl
        self.operation_timeout = operation_timeout
        self._sessions: dict[str, Session] = {}
        self._pending = 0
        self._held: Counter[str | None] = Counter()  # sessions open or starting, by owner
        self._starting: set[str] = set()
        self._limiter: anyio.CapacityLimiter | None = None
        self._waiters: deque[tuple[object, str | None]] = deque()  # (waiter, owner), first come first
        self._freed: anyio.Event | None = None  # set (and replaced) whenever a slot may have freed
        self._expired: OrderedDict[str, str | None] = OrderedDict()
        self.waited_seconds: Callable[[float], None] = lambda seconds: None  # observer of queued creates
        self.closed_by: Callable[[Session, str], None] = lambda session, reason: None  # once per registered session

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def limiter_if_started(self) -> anyio.CapacityLimiter | None:
        return self._limiter

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        # Created lazily: a limiter needs a running event loop. One thread per session is enough
        # (a session runs one operation at a time) and keeps sessions off the shared default pool.
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.max_sessions)
        return self._limiter

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Creates queued for a free slot."""
        return len(self._waiters)

    def held(self, owner: str | None) -> int:
        """Sessions ``owner`` has open or starting."""
        return self._held[owner]

    def _has_room(self) -> bool:
        return len(self._sessions) + self._pending < self.max_sessions

    def _next_in_line(self) -> object | None:
        """The first waiter whose owner may take a slot (None: there is none)."""
        return next((w for w, owner in self._waiters if self._held[owner] < self.max_per_owner), None)

    def _release(self, owner: str | None) -> None:
        self._held[owner] -= 1
        if self._held[owner] <= 0:
            del self._held[owner]

    def _slot_freed(self) -> None:
        """Wake the queue: a slot may be free (called wherever a session or a pending start goes)."""
        if self._freed is not None:
            self._freed.set()
            self._freed = None

    def _full_for(self, owner: str | None) -> str:
        """Why ``owner`` may not take a slot now."""
        if self._held[owner] >= self.max_per_owner:
            return f"this token has all of its {self.max_per_owner} sessions in use"
        return f"all {self.max_sessions} sessions are in use"

    async def _reserve(self, owner: str | None, wait: float) -> None:
        """Take a slot for ``owner`` (``_pending``, ``_held``), queueing up to ``wait`` seconds
        behind earlier waiters that may take one."""
        if self._has_room() and self._held[owner] < self.max_per_owner and self._next_in_line() is None:
            self._take(owner)
            return
        if wait <= 0:
            raise CapacityError(self._full_for(owner))
        me = object()
        self._waiters.append((me, owner))
        started = time.monotonic()
        try:
            with anyio.fail_after(wait):
                while not (self._has_room() and self._next_in_line() is me):
                    if self._freed is None:
                        self._freed = anyio.Event()
                    await self._freed.wait()
        except TimeoutError:
            raise CapacityError(f"{self._full_for(owner)} (waited {wait:g}s)") from None
        finally:
            self._waiters.remove((me, owner))
            self.waited_seconds(time.monotonic() - started)
            self._slot_freed()  # the next in line may go too
        self._take(owner)

    def _take(self, owner: str | None) -> None:
        self._pending += 1
        self._held[owner] += 1

    async def create(self, owner: str | None, start: Callable[[Session], T], session_id: str | None = None, *,
                     wait: float = 0.0, idle_ttl: float | None = None, protocol: str = "native") -> tuple[Session, T]:
        """Reserve a slot (waiting up to ``wait`` seconds for one), run ``start(session)`` (which
        sets ``session.env``) in a thread, and register the session once it succeeded. Raises
        :class:`CapacityError` when no slot is free in time. ``session_id``: the id to use
        (default: a random one); it must not be in use. ``idle_ttl``: this session's own."""
        if session_id is not None and (session_id in self._sessions or session_id in self._starting):
            raise SessionBusy(session_id)
        await self._reserve(owner, wait)
        session = Session(owner, session_id, idle_ttl, protocol)
        self._starting.add(session.id)
        registered = False
        try:
            if not session.try_begin():  # cannot happen: nobody else knows this session yet
                raise SessionBusy(session.id)
            try:
                result = await self.run(session, lambda: start(session))
            except BaseException:
                self._discard_now(session, CLOSED_BY_FAILURE)
                raise
            self._sessions[session.id] = session
            registered = True  # its owner's count now goes with the session (_forget)
            return session, result
        finally:
            self._pending -= 1
            if not registered:
                self._release(owner)
            self._starting.discard(session.id)
            self._slot_freed()

    def expired(self, session_id: str, owner: str | None) -> bool:
        """Whether ``session_id`` (of ``owner``) was closed for idling (remembered for the last
        65,536 such sessions)."""
        return session_id in self._expired and self._expired[session_id] == owner

    def get(self, session_id: str, owner: str | None) -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:  # another token's session does not exist for you
            raise SessionNotFound(session_id)
        return session

    async def operate(self, session: Session, fn: Callable[[], T]) -> T:
        """Run ``fn`` on ``session`` in a thread; :class:`SessionBusy` if one is running already."""
        if not session.try_begin():
            if session.closing:
                raise SessionNotFound(session.id)
            raise SessionBusy(session.id)
        return await self.run(session, fn)

    async def run(self, session: Session, fn: Callable[[], T]) -> T:
        """Run ``fn`` in a worker thread for a session already marked busy, under the deadline."""
        guard = threading.Lock()
        started = abandoned = False

        def work() -> T:
            nonlocal started
            with guard:
                if abandoned:
                    raise RuntimeError("abandoned before it started")
                started = True
            try:
                return fn()
            finally:
                if session.end():
                    session.close_env()

        finished = False
        try:
            with anyio.fail_after(self.operation_timeout):
                result = await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=self.limiter)
            finished = True
            return result
        except TimeoutError:
            self._discard_now(session, CLOSED_BY_FAILURE)
            raise OperationTimeout(
                f"the operation ran past its {self.operation_timeout:g}s deadline; the session was closed"
            ) from None
        except BaseException:
            finished = started  # fn ran and raised: work() already ended the operation
            raise
        finally:
            if not finished:  # abandoned (deadline, cancellation): end it ourselves if it never ran
                with guard:
                    abandoned = True
                    never_ran = not started
                if never_ran and session.end():
                    _close_in_background(session)

    async def close(self, session: Session, reason: str = CLOSED_BY_CLIENT) -> None:
        """Forget the session and close its environment (now if idle, else after its operation);
        ``reason`` says why, for the metrics (counted once, by whoever forgets it first)."""
        self._forget(session, reason)
        if session.request_close():
            await self._close_env(session)

    def _discard_now(self, session: Session, reason: str) -> None:
        """Like :meth:`close`, for places that cannot await: the close runs in a background thread."""
        self._forget(session, reason)
        if session.request_close():
            _close_in_background(session)

    def _forget(self, session: Session, reason: str) -> None:
        if self._sessions.pop(session.id, None) is not None:
            self._release(session.owner)
            self._slot_freed()
            self.closed_by(session, reason)

    async def _close_env(self, session: Session) -> None:
        try:
            with anyio.move_on_after(120):
                await anyio.to_thread.run_sync(session.close_env, abandon_on_cancel=True)
        except Exception as exc:
            log.warning("session %s: close failed: %s", session.id, exc)

    async def reap_idle(self) -> list[str]:
        """Close sessions idle for longer than their idle TTL; their ids (remembered as expired)."""
        now = time.monotonic()
        stale = [s for s in self._sessions.values()
                 if not s.busy and now - s.last_used > (self.idle_ttl if s.idle_ttl is None else s.idle_ttl)]
        for session in stale:
            log.info("session %s: idle for %.0fs, closing it", session.id, now - session.last_used)
            self._expired[session.id] = session.owner
            while len(self._expired) > REMEMBERED_EXPIRED:
                self._expired.popitem(last=False)
            await self.close(session, CLOSED_IDLE)
        return [s.id for s in stale]

    async def close_all(self) -> None:
        sessions = list(self._sessions.values())
        for session in sessions:
            await self.close(session, CLOSED_AT_SHUTDOWN)

    def stats(self) -> dict[str, Any]:
        return {"sessions": len(self._sessions), "pending": self._pending, "waiting": len(self._waiters),
                "max_sessions": self.max_sessions, "max_per_owner": self.max_per_owner}


def _close_in_background(session: Session) -> None:
    threading.Thread(target=session.close_env, name=f"close-{session.id[:8]}", daemon=True).start()
