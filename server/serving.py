"""How ``patchgym serve`` runs an app on uvicorn: with the descriptors it may use counted, its
connections guarded (:mod:`patchgym.server.connections`) and its per-connection log lines
throttled. Tests run their servers through :func:`server_config` too, so what they test is what
``patchgym serve`` runs.

Descriptors: the soft ``RLIMIT_NOFILE`` is raised to the hard one, then split. Sandboxes keep
theirs (:data:`FDS_PER_SESSION` per session slot, :data:`FDS_RESERVED` for the server itself),
connections accepted in one batch before the guard can close any (:data:`ACCEPT_BATCH`, three
batches in flight) get theirs, and the rest is the connection cap. So accepting never fails for
lack of a descriptor, and a flood of connections never starves a sandbox.

asyncio accepts as many connections per wake-up as the listen backlog it was given, so uvicorn's
backlog is :data:`ACCEPT_BATCH`; :class:`Server` then deepens the kernel's queue to
:data:`LISTEN_BACKLOG`, so that a burst of connections waits there rather than being refused (a
dropped SYN costs a client a 1 s retransmit).
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import time
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from patchgym.server.connections import ConnectionBudget, guarded

FDS_RESERVED = 64  # the server's own: listener, logs, event loop, thread pools, task files
FDS_PER_SESSION = 16  # a local sandbox holds 4 between steps; a step or a grading run a few more
ACCEPT_BATCH = 64  # uvicorn's backlog: how many connections asyncio accepts in one go
LISTEN_BACKLOG = 2048  # the kernel's queue of connections not yet accepted
MIN_CONNECTIONS = 16
MAX_CONNECTIONS = 4096
READ_TIMEOUT = 30.0
KEEP_ALIVE = 75  # past clients' own idle expiry (httpx 5 s, aiohttp 15 s): see server_config
LOG_INTERVAL = 10.0
THROTTLED_LOGGERS = ("asyncio", "uvicorn.error")  # accept failures; invalid requests; one line per connection


def raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one (a process may); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_limit(descriptors: int, max_sessions: int, max_connections: int = MAX_CONNECTIONS) -> int:
    """How many connections may be open at once with ``descriptors`` in all and ``max_sessions``
    sandboxes to keep theirs. Raises ValueError when that leaves fewer than :data:`MIN_CONNECTIONS`."""
    room = descriptors - FDS_RESERVED - FDS_PER_SESSION * max_sessions - 3 * ACCEPT_BATCH
    if room < MIN_CONNECTIONS:
        raise ValueError(f"{descriptors} file descriptors leave room for {max(room, 0)} connections beside "
                         f"{max_sessions} sessions (at least {MIN_CONNECTIONS} are needed): raise the limit "
                         f"(ulimit -n) or lower --max-sessions")
    return min(room, max_connections)


class LogThrottle(logging.Filter):
    """At most one record per message per ``interval`` seconds; the next one says how many were
    dropped meanwhile. A line per connection (an accept that fails, an invalid request) is a flood
    when connections are: 20,000 half-open ones once wrote ~30 MB of tracebacks in 40 s."""

    def __init__(self, interval: float = LOG_INTERVAL) -> None:
        super().__init__()
        self.interval = interval
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # (logger, message) -> (last shown, dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        shown, dropped = self._last.get(key, (float("-inf"), 0))
        if now - shown < self.interval:
            self._last[key] = (shown, dropped + 1)
            return False
        self._last[key] = (now, 0)
        if dropped:
            record.msg = f"{record.msg} [{dropped} more like this in the last {now - shown:.0f} s, not shown]"
        return True


_THROTTLE = LogThrottle()


def server_config(app: FastAPI, *, host: str, port: int, max_connections: int = MAX_CONNECTIONS,
                  read_timeout: float = READ_TIMEOUT, log_level: str = "info", **uvicorn_options: Any,
                  ) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` (made by :func:`patchgym.server.app.create_app`), its
    connections guarded: at most :func:`connection_limit` open, each request read within
    ``read_timeout`` seconds. Raises ValueError when the descriptor limit is too low."""
    descriptors = raise_descriptor_limit()
    limit = connection_limit(descriptors, app.state.service.manager.max_sessions, max_connections)
    budget = ConnectionBudget(limit, read_timeout)
    registry = app.state.service.metrics.registry
    if getattr(app.state, "connections", None) is not None:  # the app served before: its old figures go
        registry.unregister(app.state.connections)
    registry.register(budget)
    app.state.connections = budget
    # In-flight requests get a short grace on shutdown; then the lifespan closes every sandbox.
    # Keep-alive well past clients' own idle expiry: when both sides expire an idle connection at
    # the same moment, a request sent on it fails mid-flight.
    options: dict[str, Any] = {"timeout_graceful_shutdown": 10, "timeout_keep_alive": KEEP_ALIVE, **uvicorn_options}
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, backlog=ACCEPT_BATCH,
                            http=guarded(AutoHTTPProtocol, budget), **options)
    for name in THROTTLED_LOGGERS:  # after uvicorn.Config, which configures logging; added once
        logging.getLogger(name).addFilter(_THROTTLE)
    return config


class Server(uvicorn.Server):
    """uvicorn's server, its listening sockets' kernel queue deepened once they listen."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for server in getattr(self, "servers", ()):
            for listener in server.sockets:
                with socket.socket(fileno=os.dup(listener.fileno())) as again:  # the same socket; the dup closes
                    again.listen(LISTEN_BACKLOG)
