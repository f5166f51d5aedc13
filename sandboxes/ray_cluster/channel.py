"""A direct connection from the driver to one sandbox host: the ray backend's calls, without Ray.

A call through Ray (a task submitted to the actor, its reply fetched) costs about 0.8 ms here and
CPU in both processes' Ray core workers; a sandbox command costs about 1.4 ms, so each step through
Ray cost twice a local one (bench/README.md). Each host therefore also listens on its node's
address (the one Ray itself uses), and the driver sends its calls over TCP connections it keeps
open: one length-prefixed pickle each way per call. Ray still places, starts and kills the actor, and
carries the calls where this connection cannot be made (a Ray Client driver outside the cluster's
network).

Who may call: whoever sends the host's token first, 32 random bytes the driver made and handed to
the actor through Ray. Nothing a connection sends is unpickled before its token matched, so the
port runs nothing for anyone else; sandboxed commands have no network at all. The cluster's network
must still be private (docs/ray.md): Ray's own ports take anything from anyone on it.

Nothing here imports Ray.
"""

from __future__ import annotations

import hmac
import pickle
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

HELLO = b"patchgym-host/1\n"
TOKEN_BYTES = 32
ACCEPTED = b"ok"
AUTH_TIMEOUT = 10.0  # a connection that has not sent its token by then is dropped
MAX_FRAME = 1 << 32  # a read_file/write_file of 4 GiB; anything larger is a broken peer
_HEADER = struct.Struct(">Q")

Handler = Callable[[str, tuple, dict], Any]


class ChannelServer:
    """The host's end: accepts authenticated connections on ``(address, port 0)`` and answers each
    request ``(name, args, kwargs)`` with ``handle(name, args, kwargs)``, one thread per connection."""

    def __init__(self, address: str, token: bytes, handle: Handler) -> None:
        if len(token) != TOKEN_BYTES:
            raise ValueError(f"a channel token is {TOKEN_BYTES} bytes")
        self._hello = HELLO + token
        self._handle = handle
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.create_server((address, 0), family=family, backlog=16)
        self.address: tuple[str, int] = (address, self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True, name="patchgym-channel").start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="patchgym-channel-call").start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(AUTH_TIMEOUT)
                if not hmac.compare_digest(_recv_exact(conn, len(self._hello), None), self._hello):
                    return  # not our driver: drop it without reading (let alone unpickling) anything more
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.sendall(ACCEPTED)
                while True:
                    name, args, kwargs = _loads(_recv_frame(conn, None))
                    _send_frame(conn, _dumps_answer(self._handle(name, args, kwargs)))
            except (OSError, EOFError):
                return  # the driver went away (or dropped this connection after a timeout)


class Channel:
    """The driver's end: connections to one :class:`ChannelServer`, one per call in flight (a call
    never waits for another, e.g. ``close`` for a long ``exec``). Raises :class:`OSError` when the
    server cannot be reached or does not take the token."""

    def __init__(self, address: tuple[str, int], token: bytes, connect_timeout: float = 5.0) -> None:
        self.address = (address[0], int(address[1]))
        self._hello = HELLO + token
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._idle.append(self._connect(connect_timeout))

    def request(self, name: str, args: tuple, kwargs: dict, timeout: float) -> Any:
        """Send one call and return its answer. Raises :class:`TimeoutError` when the answer has not
        come within ``timeout`` seconds and :class:`ConnectionError`/:class:`EOFError` when the host
        is gone; the connection is dropped then (it may be mid-frame)."""
        deadline = time.monotonic() + timeout
        conn = self._take(timeout)
        try:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            _send_frame(conn, pickle.dumps((name, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL))
            answer = _loads(_recv_frame(conn, deadline))
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if self._closed:
                conn.close()
            else:
                self._idle.append(conn)
        return answer

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self, timeout: float) -> socket.socket:
        with self._lock:
            if self._closed:
                raise ConnectionError("the channel is closed")
            if self._idle:
                return self._idle.pop()
        return self._connect(min(timeout, 30.0))

    def _connect(self, timeout: float) -> socket.socket:
        conn = socket.create_connection(self.address, timeout=timeout)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(self._hello)
            try:
                accepted = _recv_exact(conn, len(ACCEPTED), time.monotonic() + timeout) == ACCEPTED
            except EOFError:
                accepted = False
            if not accepted:
                raise ConnectionError(f"{self.address[0]}:{self.address[1]} is not this sandbox host (token refused)")
        except BaseException:
            conn.close()
            raise
        return conn


def _dumps_answer(answer: Any) -> bytes:
    try:
        return pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # an answer that cannot cross: say what it was instead
        from patchgym.sandboxes.base import SandboxError

        return pickle.dumps((False, SandboxError(f"the host's answer cannot be sent: {type(exc).__name__}: {exc}")))


def _loads(frame: bytearray) -> Any:
    try:
        return pickle.loads(frame)
    except Exception as exc:  # a class the other side has and this one lacks (versions differ)
        raise EOFError(f"an unreadable frame: {type(exc).__name__}: {exc}") from None


def _send_frame(conn: socket.socket, payload: bytes) -> None:
    if len(payload) < 65536:  # one segment for the usual small call (header and body joined)
        conn.sendall(_HEADER.pack(len(payload)) + payload)
    else:  # no copy of a large body
        conn.sendall(_HEADER.pack(len(payload)))
        conn.sendall(payload)


def _recv_frame(conn: socket.socket, deadline: float | None) -> bytearray:
    (size,) = _HEADER.unpack(_recv_exact(conn, _HEADER.size, deadline))
    if size > MAX_FRAME:
        raise EOFError(f"a frame of {size} bytes")
    return _recv_exact(conn, size, deadline)


def _recv_exact(conn: socket.socket, size: int, deadline: float | None) -> bytearray:
    """``size`` bytes from ``conn``; EOFError when it closes first, TimeoutError past ``deadline``."""
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer in time")
            conn.settimeout(remaining)
        n = conn.recv_into(view[got:])
        if n == 0:
            raise EOFError("the connection closed")
        got += n
    return buffer
