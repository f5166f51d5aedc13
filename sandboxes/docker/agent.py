"""The in-container command server of the Docker backend (standard library only).

Started once per container (one ``docker exec`` through the API), it answers JSON-line requests on
stdin — exec, read, write, reset, ping — so a command costs a process spawn inside the container
instead of a Docker API round trip and a new exec session (tens of milliseconds). It reuses the
host's own modules, copied next to it as the package ``pgrt``: the same capped, hang-free process
runner and the same workspace file checks as the local backend.

After every command, every process that was not there when the server started is killed: nothing a
command starts survives it, exactly as with the local backend. Commands run as an unprivileged user
(uid 1000) who owns /testbed: they cannot touch this server, its pristine copy of the repository, or
its code, all root's and out of reach.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pgrt.files import (  # noqa: E402
    PathOutsideWorkspaceError,
    read_regular,
    resolve_in_workspace,
    write_regular,
)
from pgrt.process import is_dead_or_exiting, run_capped  # noqa: E402

WORKSPACE = Path("/testbed")
HOME = Path(os.path.dirname(os.path.abspath(__file__)))
PRISTINE = HOME / "pristine"
AGENT_UID = 1000
ALIASES = (str(WORKSPACE),)
PROTECTED = {int(p) for p in os.listdir("/proc") if p.isdigit()} | {os.getpid()}


def kill_strays(_proc: object = None) -> None:
    """SIGKILL every live process started after this server (zombies are the init's to reap)."""
    for _ in range(400):
        victims = [pid for pid in (int(p) for p in os.listdir("/proc") if p.isdigit())
                   if pid not in PROTECTED and not is_dead_or_exiting(pid)]
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)


def _clear(directory: Path) -> None:
    for entry in directory.iterdir() if directory.exists() else ():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _give_to_agent(path: Path) -> None:
    """Make ``path`` (a tree) the command user's, symlinks included but never followed."""
    os.lchown(path, AGENT_UID, AGENT_UID)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), AGENT_UID, AGENT_UID)


def _command_environ(extra: dict) -> dict:
    env = dict(os.environ)
    env.update({"HOME": "/tmp", "USER": "agent", "LOGNAME": "agent"})
    env.update(extra or {})
    return env


def handle(request: dict) -> dict:
    op = request.get("op")
    if op == "exec":
        result = run_capped(["bash", "-c", request["command"]], timeout=float(request["timeout"]),
                            output_limit=int(request["limit"]), cwd=request.get("cwd") or str(WORKSPACE),
                            env=_command_environ(request.get("env")), kill_tree=kill_strays, user=AGENT_UID)
        return {"exit_code": result.exit_code, "output": result.output, "timed_out": result.timed_out,
                "duration": result.duration, "truncated": result.truncated}
    if op == "read":
        return {"data": base64.b64encode(read_regular(WORKSPACE, request["path"], ALIASES)).decode()}
    if op == "write":
        target = resolve_in_workspace(WORKSPACE, request["path"], ALIASES)
        first_new = target
        while not first_new.parent.exists():
            first_new = first_new.parent
        write_regular(WORKSPACE, request["path"], base64.b64decode(request["data"]), ALIASES)
        _give_to_agent(first_new)  # the file and any directories made for it
        return {}
    if op == "reset":
        kill_strays()
        _clear(WORKSPACE)
        shutil.copytree(PRISTINE, WORKSPACE, symlinks=True, dirs_exist_ok=True)
        _give_to_agent(WORKSPACE)
        _clear(Path("/tmp"))
        return {}
    if op == "ping":
        return {"pid": os.getpid()}
    raise ValueError(f"unknown op {op!r}")


def prepare() -> None:
    """Once per container: the command user, its workspace, and the pristine copy out of its reach."""
    try:
        pwd.getpwuid(AGENT_UID)
    except KeyError:
        with open("/etc/passwd", "a") as fh:
            fh.write(f"agent:x:{AGENT_UID}:{AGENT_UID}::/tmp:/bin/bash\n")
        with open("/etc/group", "a") as fh:
            fh.write(f"agent:x:{AGENT_UID}:\n")
    os.chmod(HOME, 0o700)
    if not PRISTINE.exists():  # the pristine copy reset() restores from
        shutil.copytree(WORKSPACE, PRISTINE, symlinks=True)
    _give_to_agent(WORKSPACE)


def main() -> None:
    prepare()
    out = sys.stdout
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            response = handle(request)
        except PathOutsideWorkspaceError as exc:
            response = {"error": "outside", "message": str(exc)}
        except FileNotFoundError as exc:
            response = {"error": "notfound", "message": str(exc)}
        except IsADirectoryError as exc:
            response = {"error": "notregular", "message": str(exc)}
        except Exception as exc:  # reported to the host, never fatal to the server
            response = {"error": "internal", "message": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(response) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
