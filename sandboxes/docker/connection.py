"""Talking to a sandbox's command server (``server.c``) over the container's attached stdin/stdout.

One hijacked HTTP connection to the engine per sandbox, opened before the container starts: no
``docker exec``, no CLI process, no thread. Requests and answers are the command servers'
length-prefixed binary messages (:mod:`patchgym.sandboxes.wire`).

The engine multiplexes the container's stdout and stderr on the connection in frames (an 8-byte
header: the stream, then the payload length); stdout carries the answers, stderr is kept for
errors. Closing the connection closes the server's stdin (the container is created with
``StdinOnce``), and the server ends: a client that dies leaves no running sandbox behind.
:func:`attach` is that tie, for build containers too.
"""

from __future__ import annotations

import socket
import time

from patchgym.sandboxes.base import SandboxError
from patchgym.sandboxes.wire import MalformedAnswer, answer_fields, encode


def attach(api, container_id: str) -> ServerConnection:
    """Attach to a container's stdin, stdout and stderr before it starts: the life tie of every
    long-lived container patchgym starts.

    The container must be created with ``stdin_open=True, detach=False`` (the engine then sets
    ``StdinOnce``), ``auto_remove`` and a main process that reads its stdin to the end (a sandbox's
    command server, a build container's ``cat``). When this stream closes, by
    :meth:`ServerConnection.close` or by the kernel as this process dies, SIGKILL included, the
    engine closes the container's stdin, its main process ends, its other processes die with it
    (they are in its pid namespace), and the engine removes the container."""
    stream = api.attach_socket(container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
    return ServerConnection(getattr(stream, "_sock", stream), getattr(stream, "close", None))


class ServerConnection:
    """A request/answer channel to the command server of one container."""

    def __init__(self, sock: socket.socket, closer=None) -> None:
        self._sock = sock
        self._closer = closer
        self._buffer = bytearray()
        self._stderr = bytearray()
        # Set while a request's answer is unread: a request cut short (a timeout, a signal's
        # exception) leaves its answer on the stream, where the next request would read it as its own.
        self._unanswered = False

    def wait_ready(self, timeout: float) -> None:
        """Wait for the server's greeting (sent once /testbed is filled)."""
        fields = self._answer(time.monotonic() + timeout, "the container's command server did not start")
        if not fields or fields[0] != b"ready":
            raise SandboxError(f"the container's command server did not start: {fields!r}")

    def request(self, op: bytes, fields: tuple[bytes, ...], timeout: float) -> list[bytes]:
        """Send one request; its answer's fields, or :class:`~patchgym.sandboxes.wire.ServerError`.
        After a request cut short, :class:`SandboxError` at once: the stream is out of step."""
        if self._unanswered:
            raise SandboxError("the container's command server is out of step: an earlier request was cut short")
        self._unanswered = True
        try:
            self._sock.sendall(encode(op, *fields))
        except OSError as exc:
            raise SandboxError(f"lost the container's command server: {exc}") from None
        return self._answer(time.monotonic() + timeout, "the container's command server stopped answering")

    @property
    def in_step(self) -> bool:
        """No request's answer is left unread (none was cut short)."""
        return not self._unanswered

    def close(self) -> None:
        for closer in (self._sock.close, self._closer):
            try:
                if closer is not None:
                    closer()
            except OSError:
                pass

    def _answer(self, deadline: float, late: str) -> list[bytes]:
        size = int.from_bytes(self._read(4, deadline, late), "big")
        body = self._read(size, deadline, late)
        self._unanswered = False  # in step again
        try:
            return answer_fields(body)
        except MalformedAnswer:
            raise SandboxError("the container's command server sent a malformed answer") from None

    def _read(self, n: int, deadline: float, late: str) -> bytes:
        """``n`` bytes of the server's stdout (stderr frames set aside)."""
        while len(self._buffer) < n:
            stream, payload = self._frame(deadline, late)
            if stream == 2:
                self._stderr += payload
                del self._stderr[:-4000]
            else:
                self._buffer += payload
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def _frame(self, deadline: float, late: str) -> tuple[int, bytes]:
        header = self._read_exact(8, deadline, late)
        return header[0], self._read_exact(int.from_bytes(header[4:8], "big"), deadline, late)

    def _read_exact(self, n: int, deadline: float, late: str) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxError(late)
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(min(n - len(chunks), 1 << 20))
            except TimeoutError:
                continue
            except OSError as exc:
                raise SandboxError(f"lost the container's command server: {exc}") from None
            if not chunk:
                detail = self._stderr.decode(errors="replace")[-1500:].strip()
                raise SandboxError(f"the container's command server exited{': ' + detail if detail else ''}")
            chunks += chunk
        return bytes(chunks)
