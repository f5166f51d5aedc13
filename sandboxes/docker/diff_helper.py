"""The workspace diff inside a Docker sandbox: run as root by the command server (``server.c``), once
per ``diff()``, then gone, so that no Python process sits in an idle sandbox.

Standard library only (the container's own ``/usr/bin/python3``, any release from 3.9): it reuses
the host's ``sandboxes/gitops.py`` (and what it imports), mounted next to it as the package
``pgrt``. The diff is taken against the pristine tree's git directory, root's only; the stat of
every file as the server copied it into /testbed (``/var/lib/patchgym/stats``) lets an unchanged
file keep its pristine blob without being read. Prints ``D`` and the diff as git wrote it (bytes,
at most LIMIT of them: the host holds no escaped or re-encoded copy), or ``E`` and one JSON
object, ``{"error": kind, "message": ...}``.

    python3 -I -S diff_helper.py LIMIT
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pgrt.base import SandboxError, WorkspaceError  # noqa: E402
from pgrt.gitops import Pristine, workspace_diff_bytes  # noqa: E402

WORKSPACE = Path("/testbed")
STATE = Path("/var/lib/patchgym")  # root's only: the pristine tree, the stats, the diff's scratch
PRISTINE_GIT = STATE / "testbed" / ".git"
STATS = STATE / "stats"
RECORD = struct.Struct("<5q")  # ino, mode, size, mtime_ns, ctime_ns after each path's NUL


def load_stats(pristine: Pristine, data: bytes) -> None:
    """Fill ``pristine.stats`` with the recorded stat of each tracked path."""
    at = 0
    while at < len(data):
        end = data.index(b"\0", at)
        path = data[at:end]
        values = RECORD.unpack_from(data, end + 1)
        at = end + 1 + RECORD.size
        if path in pristine.entries:
            pristine.stats[path] = values


def main() -> None:
    limit = int(sys.argv[1])
    try:
        pristine = Pristine.load(PRISTINE_GIT)
        load_stats(pristine, STATS.read_bytes())
    except Exception as exc:  # root's own state: reported to the host as the sandbox's failure
        answer = b"E" + json.dumps({"error": "internal", "message": f"{type(exc).__name__}: {exc}"}).encode()
    else:
        answer = diff_answer(pristine, limit)
    sys.stdout.buffer.write(answer)


def diff_answer(pristine: Pristine, limit: int) -> bytes:
    """The diff, or the error: a SandboxError is the sandbox's failure (``internal``); anything
    else raised while reading the workspace came from what the agent left there (``workspace``),
    as on the local backend (``patchgym.gym_envs.repo_env``)."""
    try:
        return b"D" + workspace_diff_bytes(WORKSPACE, pristine, STATE, limit)
    except WorkspaceError as exc:
        error = {"error": "workspace", "message": str(exc)}
    except SandboxError as exc:
        error = {"error": "internal", "message": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:
        error = {"error": "workspace", "message": f"{type(exc).__name__}: {exc}"[:2000]}
    return b"E" + json.dumps(error).encode()


if __name__ == "__main__":
    main()
