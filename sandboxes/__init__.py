"""Where untrusted code runs: one protocol (:class:`Sandbox`) and what every backend shares
(:mod:`.base`), and the backends as siblings: :mod:`.local` (the embedded default), :mod:`.docker`
and :mod:`.ray_cluster`.

``sandboxes`` knows nothing of tasks or rewards: it is given a repository, a commit and an
environment spec, and runs commands there. Importing one backend loads no other: the names of the
local backend below load on first use (PEP 562).
"""

from importlib import import_module
from typing import Any

from patchgym.sandboxes.base import (
    EnvironmentBuildError,
    EnvironmentSpec,
    ExecResult,
    PathOutsideWorkspaceError,
    ResourceLimits,
    Sandbox,
    SandboxClosedError,
    SandboxError,
    SandboxSpec,
    WorkspaceError,
)

_LAZY = {"LocalSandbox": "patchgym.sandboxes.local", "reap_stale": "patchgym.sandboxes.cleanup"}

__all__ = [
    "EnvironmentBuildError", "EnvironmentSpec", "ExecResult", "LocalSandbox",
    "PathOutsideWorkspaceError", "ResourceLimits", "Sandbox", "SandboxClosedError", "SandboxError",
    "SandboxSpec", "WorkspaceError", "reap_stale",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'patchgym.sandboxes' has no attribute {name!r}")
