"""Connection hygiene in front of uvicorn's HTTP protocol: a cap on open connections and a deadline
on reading each request, so that no client, with or without a token, can hold the server's
descriptors.

uvicorn accepts every connection and waits for its request headers for ever: half-sent requests
(headers never finished) once held every descriptor of ``patchgym serve``, and ``/healthz``, new
sessions and running ones all hung. :func:`guarded` wraps whichever protocol uvicorn would use
(h11 or httptools) in a :class:`ConnectionGuard` that

- closes a connection whose request (headers and body) is not all in within ``read_timeout``
  seconds of its first byte, or of the connection's opening;
- keeps at most ``limit`` connections open. A new one past it takes the place of the oldest
  connection still reading its request (a half-sent request, most likely: a client that sends
  at once is served long before it gets old), else of the least recently used idle keep-alive
  connection; a connection whose request is being answered, or a WebSocket, is never closed for
  a newcomer. Only when every connection is busy is the newcomer answered 503 and closed.

The guard stays the transport's protocol for the connection's whole life (after a WebSocket
upgrade too), so its count never drifts; it reads the wrapped protocol's current request
(``cycle``: ``more_body``, ``response_complete``), which both of uvicorn's HTTP protocols keep.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 5\r\ncontent-type: text/plain\r\n"
                 b"connection: close\r\ncontent-length: 35\r\n\r\nevery connection slot is busy; retry")


class ConnectionBudget:
    """The open connections of one server: at most ``limit``, each request read within
    ``read_timeout`` seconds; counts of what it closed, by why (``evicted``, ``timed_out``,
    ``refused``)."""

    def __init__(self, limit: int, read_timeout: float) -> None:
        if limit < 1:
            raise ValueError("the connection limit must be at least 1")
        self.limit = limit
        self.read_timeout = read_timeout
        self.open: set[ConnectionGuard] = set()
        self.reading: OrderedDict[ConnectionGuard, None] = OrderedDict()  # oldest first
        self.closed = {"evicted": 0, "timed_out": 0, "refused": 0}

    def admit(self, guard: ConnectionGuard) -> bool:
        """Make room for ``guard`` (closing the oldest reader, else the least recently used idle
        connection); False when every open connection is busy."""
        if len(self.open) >= self.limit:
            victim = next(iter(self.reading), None) or self._least_recently_used_idle()
            if victim is None:
                self.closed["refused"] += 1
                return False
            self.closed["evicted"] += 1
            victim.drop()
        self.open.add(guard)
        return True

    def forget(self, guard: ConnectionGuard) -> None:
        self.open.discard(guard)
        self.reading.pop(guard, None)

    def collect(self) -> Iterator[Metric]:
        """Prometheus figures (the budget registers as a collector of the app's metrics)."""
        yield GaugeMetricFamily("patchgym_connections_open", "HTTP connections open.", value=len(self.open))
        yield GaugeMetricFamily("patchgym_connections_max", "HTTP connections allowed open at once.", value=self.limit)
        closed = CounterMetricFamily("patchgym_connections_closed", "HTTP connections the server closed, by why: "
                                     "evicted (for a newcomer), timed_out (request not read in time), refused "
                                     "(every slot busy).", labels=["reason"])
        for reason, count in self.closed.items():
            closed.add_metric([reason], count)
        yield closed

    def _least_recently_used_idle(self) -> ConnectionGuard | None:
        # Reached only when no connection is reading: the cap is full of keep-alive and busy ones.
        idle = [g for g in self.open if g.idle()]
        return min(idle, key=lambda g: g.last_used) if idle else None


class ConnectionGuard(asyncio.Protocol):
    """One connection: forwards everything to the wrapped uvicorn protocol (``inner``), under the
    budget's cap and read deadline. Subclasses made by :func:`guarded` set ``inner_class`` and
    ``budget``."""

    inner_class: type[asyncio.Protocol]
    budget: ConnectionBudget

    def __init__(self, *args: Any, _loop: asyncio.AbstractEventLoop | None = None, **kwargs: Any) -> None:
        self.loop = _loop or asyncio.get_event_loop()
        self.inner: Any = self.inner_class(*args, _loop=_loop, **kwargs)
        self.transport: asyncio.Transport | None = None
        self.refused = False
        self.upgraded = False  # a WebSocket now: never evicted, no read deadline (it pings)
        self.last_used = time.monotonic()
        self._deadline: asyncio.TimerHandle | None = None
        self._before: object = None  # the request that was current when reading began

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.budget.admit(self):
            self.refused = True
            transport.write(BUSY_RESPONSE)
            transport.close()
            return
        self.inner.connection_made(transport)
        self._begin_read()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        self.last_used = time.monotonic()
        if not self.upgraded and self._deadline is None and self._between_requests():
            self._begin_read()
        self.inner.data_received(data)
        transport = self.transport
        assert transport is not None
        if transport.get_protocol() is not self:  # uvicorn handed the connection to a WebSocket protocol
            self.inner = transport.get_protocol()
            transport.set_protocol(self)
            self.upgraded = True
            self._end_read()
        elif self._deadline is not None and self._request_in():
            self._end_read()

    def eof_received(self) -> bool | None:
        return None if self.refused else self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_read()
        self.budget.forget(self)
        if not self.refused:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()

    # -- the budget's view -------------------------------------------------------------------

    def idle(self) -> bool:
        """Open between requests (keep-alive), nothing being read or answered."""
        return not self.upgraded and self._deadline is None and self._between_requests()

    def drop(self) -> None:
        """Close for a newcomer (the budget has already stopped counting it)."""
        self.budget.forget(self)
        self._end_read()
        if self.transport is not None:
            self.transport.close()

    # -- internals ---------------------------------------------------------------------------

    def _cycle(self) -> Any:
        return getattr(self.inner, "cycle", None)

    def _between_requests(self) -> bool:
        cycle = self._cycle()
        return cycle is None or cycle.response_complete

    def _request_in(self) -> bool:
        """Whether a request that began after reading did has been read whole."""
        cycle = self._cycle()
        return cycle is not None and cycle is not self._before and not cycle.more_body

    def _begin_read(self) -> None:
        self._before = self._cycle()
        self.budget.reading[self] = None
        self._deadline = self.loop.call_later(self.budget.read_timeout, self._read_timed_out)

    def _end_read(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.budget.reading.pop(self, None)

    def _read_timed_out(self) -> None:
        self._deadline = None
        self.budget.reading.pop(self, None)
        if self.transport is not None and not self.transport.is_closing():
            self.budget.closed["timed_out"] += 1
            self.transport.close()


def guarded(inner: type[asyncio.Protocol], budget: ConnectionBudget) -> type[ConnectionGuard]:
    """A protocol class for uvicorn's ``Config(http=...)``: ``inner`` (uvicorn's own HTTP protocol)
    under ``budget``."""
    return type("GuardedHTTPProtocol", (ConnectionGuard,), {"inner_class": inner, "budget": budget})
