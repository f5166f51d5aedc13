"""The command servers' error kinds (sandboxes/wire.py): what the workspace's state makes a file
operation raise is the agent's doing and must come back as an OSError the editor shows, never as a
SandboxError, which would mask the episode."""

import errno
import socket

import pytest

from patchgym.sandboxes.base import PathOutsideWorkspaceError, SandboxError
from patchgym.sandboxes.docker.connection import ServerConnection
from patchgym.sandboxes.wire import OK, encode, error_kind, server_error


@pytest.mark.parametrize(("raised", "kind", "back"), [
    (FileNotFoundError("x"), "notfound", FileNotFoundError),
    (IsADirectoryError("x"), "notregular", IsADirectoryError),
    (NotADirectoryError("x"), "notdir", NotADirectoryError),
    (FileExistsError("x"), "notdir", NotADirectoryError),
    (OSError(errno.ENOSPC, "No space left on device"), "oserror", OSError),
    (PermissionError("x"), "oserror", OSError),
    (PathOutsideWorkspaceError("x"), "outside", PathOutsideWorkspaceError),
])
def test_the_workspaces_errors_come_back_as_the_agents(raised, kind, back):
    assert error_kind(raised) == kind
    again = server_error(kind, "message")
    assert isinstance(again, back) and not isinstance(again, SandboxError)


def test_only_the_servers_own_failures_are_sandbox_errors():
    assert error_kind(MemoryError()) == "internal"
    assert isinstance(server_error("internal", "m"), SandboxError)


def _docker_frame(message: bytes) -> bytes:
    """``message`` as the engine sends a container's stdout on an attached stream."""
    return bytes([1, 0, 0, 0]) + len(message).to_bytes(4, "big") + message


def test_a_request_cut_short_never_gets_its_answer_read_as_the_next_ones():
    """A request whose answer is left unread (a deadline, a signal's exception) puts the docker
    connection out of step: the next request fails at once rather than read that stale answer."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        conn = ServerConnection(ours)
        theirs.sendall(_docker_frame(encode(OK, b"1")))
        assert conn.request(b"U", (), 5) == [b"1"]
        with pytest.raises(SandboxError, match="stopped answering"):
            conn.request(b"X", (b"sleep",), 0.1)
        theirs.sendall(_docker_frame(encode(OK, b"the command's output")))  # late
        with pytest.raises(SandboxError, match="out of step"):
            conn.request(b"U", (), 5)
