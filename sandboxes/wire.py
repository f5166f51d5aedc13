"""The messages of patchgym's command servers: the Docker sandbox's (``docker/server.c``) and the
local sandbox's init (``sandbox_init.c``, or its Python fallback ``sandbox_init.py``).

Length-prefixed binary messages, no JSON and no base64 (command output and file contents go
through as bytes)::

    request  = u32 size, op (1 byte), fields
    answer   = u32 size, status (b"0" ok, b"E" error: fields kind, message), fields
    field    = u32 size, bytes            (u32: big-endian)

Standard library only: also copied into local sandboxes (as ``pgrt.wire``) for the Python init.
"""

from __future__ import annotations

from .base import ExecResult, PathOutsideWorkspaceError, SandboxError, WorkspaceError  # relative: copied as pgrt
from .output import CappedOutput

OK, ERROR = b"0", b"E"


class ServerError(Exception):
    """An error a command server answered with: ``kind`` (outside, notfound, notregular, notdir,
    oserror, workspace, internal) and its message. All but ``internal`` are the workspace's state,
    which the agent made: never the sandbox's failure (that would mask the episode)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class MalformedAnswer(ValueError):
    """Bytes that are not an answer of a command server."""


def encode(head: bytes, *fields: bytes) -> bytes:
    """A message: ``head`` (a request's op, an answer's status) and its fields, with its size."""
    body = bytearray(head)
    for field in fields:
        body += len(field).to_bytes(4, "big")
        body += field
    return len(body).to_bytes(4, "big") + bytes(body)


encode_request = encode


def decode(body: bytes) -> tuple[bytes, list[bytes]]:
    """The head byte and fields of a message's body (after its size)."""
    head, fields, at = body[:1], [], 1
    while at < len(body):
        size = int.from_bytes(body[at:at + 4], "big")
        fields.append(body[at + 4:at + 4 + size])
        at += 4 + size
    if at != len(body) or not head:
        raise MalformedAnswer("a command server sent a malformed message")
    return head, fields


def answer_fields(body: bytes) -> list[bytes]:
    """The fields of an answer's body; :class:`ServerError` for an error answer."""
    status, fields = decode(body)
    if status == ERROR:
        kind, message = (f.decode(errors="replace") for f in (fields + [b"", b""])[:2])
        raise ServerError(kind, message)
    if status != OK:
        raise MalformedAnswer("a command server sent a malformed answer")
    return fields


# The kinds of error a command server answers with besides "internal" (its own failure, a
# SandboxError): each one's exception on the host, and the exceptions answered with it, matched in
# this order (OSError, the most general, last). One table, so that the two directions agree.
ERROR_KINDS = (
    ("outside", PathOutsideWorkspaceError, (PathOutsideWorkspaceError,)),
    ("notfound", FileNotFoundError, (FileNotFoundError,)),
    ("notregular", IsADirectoryError, (IsADirectoryError,)),
    ("notdir", NotADirectoryError, (NotADirectoryError, FileExistsError)),
    ("workspace", WorkspaceError, (WorkspaceError,)),
    ("oserror", OSError, (OSError,)),
)


def server_error(kind: str, message: str) -> Exception:
    """The exception for an error a command server answered with."""
    for known, exception, _ in ERROR_KINDS:
        if kind == known:
            return exception(message)
    return SandboxError(message)


def error_kind(exc: BaseException) -> str:
    """The kind a command server answers ``exc`` with (:func:`server_error`'s inverse)."""
    for kind, _, types in ERROR_KINDS:
        if isinstance(exc, types):
            return kind
    return "internal"


def exec_request(script: str, timeout: float, limit: int, env: dict[str, str] | None) -> tuple[bytes, ...]:
    """The fields of an exec request (op ``X``)."""
    entries = [f"{key}={value}" for key, value in (env or {}).items()]
    if any("\0" in entry for entry in entries):
        raise ValueError("embedded null byte in the command's environment")
    environment = b"".join(_encode(entry) + b"\0" for entry in entries)
    return _encode(script), repr(float(timeout)).encode(), str(limit).encode(), environment


def exec_result(fields: list[bytes], limit: int) -> ExecResult:
    """The :class:`ExecResult` of an exec answer: exit code, timed out, duration, total bytes, CPU
    seconds, the head and the tail of the output the server kept."""
    code, timed_out, duration, total, cpu, head, tail = fields
    output = CappedOutput(limit)
    output.feed(head)
    output.feed(tail)
    output.total = int(total)  # the head and the tail the server kept, of this many bytes
    return ExecResult(exit_code=int(code), output=output.text(), timed_out=timed_out == b"1",
                      duration=float(duration), truncated=output.truncated, cpu_seconds=float(cpu))


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")
