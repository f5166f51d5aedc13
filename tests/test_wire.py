"""The command servers' error kinds (sandboxes/wire.py): what the workspace's state makes a file
operation raise is the agent's doing and must come back as an OSError the editor shows, never as a
SandboxError, which would mask the episode."""

import errno

import pytest

from patchgym.sandboxes.base import PathOutsideWorkspaceError, SandboxError
from patchgym.sandboxes.wire import error_kind, server_error


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
