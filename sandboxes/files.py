"""Harness-side file access inside an agent-controlled workspace.

Pure standard library: the Docker backend runs this same module inside its containers.
The agent can leave symlinks and FIFOs where the harness will read or write; paths must resolve
inside the workspace, the last component must not be a symlink, and only regular files are opened
(an open() on a FIFO would block the harness forever).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class PathOutsideWorkspaceError(ValueError):
    """A file path points outside the sandbox's workspace."""


def resolve_in_workspace(workspace: Path, path: str, aliases: tuple[str, ...] = ()) -> Path:
    """The real path of ``path`` (relative, or absolute under the workspace or one of its
    ``aliases``, e.g. ``/testbed``); symlinks may not lead outside the workspace."""
    ws = workspace.resolve()
    p = Path(path)
    if p.is_absolute():
        for prefix in (*aliases, str(workspace), str(ws)):
            try:
                p = Path(path).relative_to(prefix)
                break
            except ValueError:
                continue
        else:
            raise PathOutsideWorkspaceError(f"{path} is outside the workspace")
    host = (ws / p).resolve()
    if host != ws and ws not in host.parents:
        raise PathOutsideWorkspaceError(f"{path} resolves outside the workspace")
    return host


def open_regular(path: Path, flags: int, mode: int = 0o644) -> int:
    """Open a regular file without following a final symlink and without blocking on a FIFO."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathOutsideWorkspaceError(f"{path} is a symbolic link") from None
        if exc.errno == errno.ENXIO:
            raise IsADirectoryError(f"{path} is not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_regular(workspace: Path, path: str, aliases: tuple[str, ...] = ()) -> bytes:
    fd = open_regular(resolve_in_workspace(workspace, path, aliases), os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def write_regular(workspace: Path, path: str, data: bytes, aliases: tuple[str, ...] = ()) -> None:
    target = resolve_in_workspace(workspace, path, aliases)
    target.parent.mkdir(parents=True, exist_ok=True)
    resolve_in_workspace(workspace, str(target.parent))  # mkdir must not have crossed a symlink
    fd = open_regular(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
