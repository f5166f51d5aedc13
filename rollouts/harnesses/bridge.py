"""An agent-in-sandbox episode's way out: a host directory bound read-only into the agent's sandbox
(at :data:`SANDBOX_DIR`) holding the model proxy's unix socket, the task, the launcher and the
harness's own files. Nothing else leaves the sandbox: it keeps no network (bubblewrap's own network
namespace, Docker's ``none``); a unix socket is reached through the file system, not a network, and
this one leads only to the proxy (:mod:`patchgym.rollouts.proxy`), which holds the key and calls
only the run's endpoint.

The directory is named for this process (``bridges/<pid>-<random>``), so what a killed run left is
reaped like its sandboxes (:mod:`patchgym.sandboxes.reaper`). The grading sandbox never gets it.
"""

from __future__ import annotations

import shutil
import uuid
from importlib import resources
from typing import Any

from patchgym.sandboxes.paths import cache_dir
from patchgym.sandboxes.reaper import owned_name

SANDBOX_DIR = "/run/patchgym"
SOCKET, STOP, TASK, LAUNCHER, FILES = "model.sock", "stop", "task.md", "launcher.py", "files"
MAX_SOCKET_PATH = 107  # sun_path, less its terminating null


def bound_path(sandbox: Any, host: Any) -> str:
    """Where ``sandbox`` sees the host directory ``host`` it was given read-only (``read_only_binds``):
    the path asked for, or its own on an unisolated local sandbox. RuntimeError for a backend that
    takes no binds (it cannot run a harness inside its sandbox)."""
    binds = getattr(sandbox, "binds", None) or {}
    if str(host) not in binds:
        raise RuntimeError(f"the {type(sandbox).__name__} backend cannot run a harness inside its sandbox")
    return binds[str(host)]


class Bridge:
    """One episode's directory (closed with the episode). ``files``: name -> content, placed under
    ``files/`` for the harness (its script, its config)."""

    def __init__(self, problem_statement: str, files: dict[str, bytes] | None = None) -> None:
        self.root = cache_dir("bridges") / owned_name(uuid.uuid4().hex[:8])
        self.socket = self.root / SOCKET
        if len(str(self.socket)) > MAX_SOCKET_PATH:
            raise ValueError(f"{self.socket} is too long for a unix socket; set a shorter PATCHGYM_HOME")
        self.root.mkdir(mode=0o755)
        try:
            (self.root / TASK).write_text(problem_statement, encoding="utf-8")
            launcher = resources.files("patchgym.rollouts.harnesses").joinpath("sandbox_launcher.py").read_bytes()
            (self.root / LAUNCHER).write_bytes(launcher)
            (self.root / FILES).mkdir(mode=0o755)
            for name, data in (files or {}).items():
                if "/" in name or name.startswith("."):
                    raise ValueError(f"a harness file needs a plain name, not {name!r}")
                (self.root / FILES / name).write_bytes(data)
            for path in self.root.rglob("*"):
                path.chmod(0o755 if path.is_dir() else 0o644)
        except BaseException:
            self.close()
            raise

    def sandbox_options(self) -> dict[str, Any]:
        """What the agent's sandbox needs to see the directory (``RepoEnv(agent_sandbox_options=...)``)."""
        return {"read_only_binds": {str(self.root): SANDBOX_DIR}}

    def path_in(self, sandbox: Any) -> str:
        """Where ``sandbox`` sees the directory (its own path on an unisolated local sandbox)."""
        return bound_path(sandbox, self.root)

    def stop(self, reason: str) -> None:
        """Ask the launcher to end the harness now (it polls for the file)."""
        stop = self.root / STOP
        if not stop.exists():
            tmp = self.root / f".{STOP}.tmp"
            tmp.write_text(reason[:500], encoding="utf-8")
            tmp.rename(stop)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
