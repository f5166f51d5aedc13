"""Where untrusted code runs: one protocol (:class:`Sandbox`), several backends.

``sandboxes`` knows nothing of tasks or rewards: it is given a repository, a commit and an
environment spec, and runs commands there.
"""

from patchgym.sandboxes.base import (
    EnvironmentBuildError,
    ExecResult,
    PathOutsideWorkspaceError,
    Sandbox,
    SandboxClosedError,
    SandboxError,
    WorkspaceError,
)
from patchgym.sandboxes.cleanup import reap_stale
from patchgym.sandboxes.environments import EnvironmentSpec
from patchgym.sandboxes.limits import ResourceLimits
from patchgym.sandboxes.local import LocalSandbox, SandboxSpec

__all__ = [
    "EnvironmentBuildError", "EnvironmentSpec", "ExecResult", "LocalSandbox",
    "PathOutsideWorkspaceError", "ResourceLimits", "Sandbox", "SandboxClosedError", "SandboxError",
    "SandboxSpec", "WorkspaceError", "reap_stale",
]
