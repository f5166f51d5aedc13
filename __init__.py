"""patchgym: SWE-bench-style verifiable-reward environments.

One import package; the repository's folders install as its subpackages (``pyproject.toml``'s
``package-dir``), from the ground up (``docs/architecture.md`` maps them):

- :mod:`patchgym.sandboxes`: where code runs (local, docker, ray), knowing nothing of tasks;
- :mod:`patchgym.tasks`: the task model, the catalog with the bundled tasks, SWE-bench rows;
- :mod:`patchgym.grading`: the verifier and its integrity defenses, ``eval``;
- :mod:`patchgym.gym_envs` (the Gymnasium environments) beside :mod:`patchgym.making` (new tasks);
- :mod:`patchgym.rollouts`: a model's episodes, runs and their reports;
- :mod:`patchgym.server`: the HTTP server and its clients; :mod:`patchgym.cli`: the command.

Importing ``patchgym`` imports none of them: the names below load on first use (PEP 562), so
``patchgym eval`` pays only for the layers it drives. The Gymnasium environments are registered by
``import patchgym.gym_envs``, or by Gymnasium itself from a module-qualified id
(``gym.make("patchgym.gym_envs:patchgym/RepoEnv-v0")``).
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Task": "patchgym.tasks.model", "TaskFileError": "patchgym.tasks.model", "load_tasks": "patchgym.tasks.model",
    "save_tasks": "patchgym.tasks.model",
    "TaskSet": "patchgym.tasks.catalog", "UnknownTaskError": "patchgym.tasks.catalog",
    "load_task_set": "patchgym.tasks.catalog",
    "InstanceReport": "patchgym.grading.verifier", "Verifier": "patchgym.grading.verifier",
    "RepoEnv": "patchgym.gym_envs.repo_env", "PatchEnv": "patchgym.gym_envs.patch_env",
    "TrajectoryRecorder": "patchgym.gym_envs.trajectory",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'patchgym' has no attribute {name!r}")
