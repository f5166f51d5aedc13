"""Talking to the in-container command server over one Docker exec session (no CLI processes)."""

from __future__ import annotations

import io
import json
import posixpath
import socket
import tarfile
import time
from pathlib import Path

from ..base import SandboxError

RUNTIME_MODULES = ("base.py", "output.py", "process.py", "files.py", "gitops.py")
AGENT_DIR = "/opt/patchgym"
AGENT_COMMAND = ["/usr/bin/python3", "-u", f"{AGENT_DIR}/agent.py"]


def agent_archive() -> bytes:
    """A tar of the command server and the host modules it reuses (as the package ``pgrt``)."""
    here = Path(__file__).resolve().parent
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(path: Path, name: str) -> None:
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            with path.open("rb") as fh:
                tar.addfile(info, fh)
        top = posixpath.basename(AGENT_DIR)
        add(here / "agent.py", f"{top}/agent.py")
        tar.addfile(tarfile.TarInfo(f"{top}/pgrt/__init__.py"), io.BytesIO(b""))
        for name in RUNTIME_MODULES:
            add(here.parent / name, f"{top}/pgrt/{name}")
    return buf.getvalue()


class AgentConnection:
    """A JSON-line request/response channel to ``agent.py`` running in a container.

    Docker multiplexes an exec's stdout and stderr on one socket in frames (an 8-byte header: the
    stream, then the payload length); stdout carries the responses, stderr is kept for errors.
    """

    def __init__(self, client, container_id: str, *, start_timeout: float = 60.0) -> None:
        exec_id = client.api.exec_create(container_id, AGENT_COMMAND, stdin=True, stdout=True, stderr=True,
                                         tty=False)["Id"]
        self._socket_io = client.api.exec_start(exec_id, socket=True)
        self._sock: socket.socket = self._socket_io._sock
        self._buffer = bytearray()
        self._stderr = bytearray()
        hello = self._read_line(time.monotonic() + start_timeout)
        if not hello.get("ready"):
            raise SandboxError(f"the container's command server did not start: {hello}")

    def request(self, payload: dict, timeout: float) -> dict:
        try:
            self._sock.sendall(json.dumps(payload).encode() + b"\n")
        except OSError as exc:
            raise SandboxError(f"lost the container's command server: {exc}") from None
        return self._read_line(time.monotonic() + timeout)

    def close(self) -> None:
        for closer in (self._sock.close, self._socket_io.close):
            try:
                closer()
            except OSError:
                pass

    def _read_line(self, deadline: float) -> dict:
        while b"\n" not in self._buffer:
            stream, payload = self._read_frame(deadline)
            if stream == 2:
                self._stderr += payload
                del self._stderr[:-4000]
            else:
                self._buffer += payload
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return json.loads(line)

    def _read_frame(self, deadline: float) -> tuple[int, bytes]:
        header = self._read_exact(8, deadline)
        size = int.from_bytes(header[4:8], "big")
        return header[0], self._read_exact(size, deadline)

    def _read_exact(self, n: int, deadline: float) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxError("the container's command server stopped answering")
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(n - len(chunks))
            except TimeoutError:
                continue
            except OSError as exc:
                raise SandboxError(f"lost the container's command server: {exc}") from None
            if not chunk:
                detail = self._stderr.decode(errors="replace")[-1500:]
                raise SandboxError(f"the container's command server exited{': ' + detail if detail else ''}")
            chunks += chunk
        return bytes(chunks)
