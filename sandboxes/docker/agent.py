"""The in-container command server of the Docker backend (standard library only).

Started once per container (one ``docker exec`` through the API), it answers JSON-line requests on
stdin — exec, read, write, reset, ping — so a command costs a process spawn inside the container
instead of a Docker API round trip and a new exec session (tens of milliseconds). It reuses the
host's own modules, copied next to it as the package ``pgrt``: the same capped, hang-free process
runner and the same workspace file checks as the local backend.

After every command, every process that was not there when the server started is killed: nothing a
command starts survives it, exactly as with the local backend; a command that keeps the container's
pids limit reached is killed within seconds (the same watchdog as the local backend's). Commands
run as an unprivileged user (uid 1000) who owns /testbed: they cannot touch this server, the
pristine tree of the repository, or its code, all root's and out of reach.

/testbed and every other place uid 1000 can write are size- and inode-bounded tmpfs mounts made by
the engine. A tmpfs starts empty, so the server fills /testbed from the pristine tree the instance
image keeps (hard-linked, so at no cost in image size) at ``/var/lib/patchgym/testbed``, on start
and on reset. The workspace diff is computed here, as root, against that tree's ``.git``.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pgrt.base import WorkspaceError  # noqa: E402
from pgrt.files import (  # noqa: E402
    PathOutsideWorkspaceError,
    read_regular,
    resolve_in_workspace,
    write_regular,
)
from pgrt.gitops import Pristine, workspace_diff  # noqa: E402
from pgrt.process import ProcessLimitWatch, is_dead_or_exiting, run_capped  # noqa: E402

WORKSPACE = Path("/testbed")
SCRATCH = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path("/run/lock"))  # cleared on reset
HOME = Path(os.path.dirname(os.path.abspath(__file__)))
PRISTINE = Path("/var/lib/patchgym/testbed")
AGENT_UID = 1000
ALIASES = (str(WORKSPACE),)
PROTECTED = {int(p) for p in os.listdir("/proc") if p.isdigit()} | {os.getpid()}
# The container's own pids cgroup (cgroup v1 mounts it here; v2 has one hierarchy).
PIDS_CGROUP = Path("/sys/fs/cgroup/pids") if Path("/sys/fs/cgroup/pids/pids.max").exists() else Path("/sys/fs/cgroup")
_pristine: Pristine | None = None


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


def _fill_workspace() -> None:
    """Copy the pristine tree into the (empty) workspace, give it to the command user, and note
    the files' stats for the diff."""
    global _pristine
    shutil.copytree(PRISTINE, WORKSPACE, symlinks=True, dirs_exist_ok=True)
    _give_to_agent(WORKSPACE)
    if _pristine is None:
        _pristine = Pristine.load(PRISTINE / ".git")
    _pristine.snapshot(WORKSPACE)


def handle(request: dict) -> dict:
    op = request.get("op")
    if op == "exec":
        # The shell enters the working directory, so that one the agent made unreadable fails
        # the command instead of the server's spawn.
        cwd = request.get("cwd") or str(WORKSPACE)
        script = f"cd -- {shlex.quote(cwd)} || exit 1\n{request['command']}"
        result = run_capped(["bash", "-c", script], timeout=float(request["timeout"]),
                            output_limit=int(request["limit"]), cwd="/",
                            env=_command_environ(request.get("env")), kill_tree=kill_strays, user=AGENT_UID,
                            watchdog=ProcessLimitWatch(PIDS_CGROUP))
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
        for directory in SCRATCH:
            _clear(directory)
        _fill_workspace()
        return {}
    if op == "diff":
        assert _pristine is not None
        return {"diff": workspace_diff(WORKSPACE, _pristine, HOME, int(request["limit"]))}
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
    _fill_workspace()


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
        except WorkspaceError as exc:
            response = {"error": "workspace", "message": str(exc)}
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
