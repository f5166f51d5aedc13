"""The gym: grading (:mod:`gym_envs.grading`), the Gymnasium environments (:mod:`gym_envs.envs`),
task making (:mod:`gym_envs.making`) and model rollouts (:mod:`gym_envs.rollouts`); the task model
and catalog are the :mod:`tasks` package, the command line the :mod:`cli` package.
``docs/architecture.md`` maps the layers.

Importing this package registers ``patchgym/RepoEnv-v0`` (multi-turn, tool calls) and
``patchgym/PatchEnv-v0`` (one step, a unified diff) with Gymnasium, as Gymnasium's plugins do
(``import gym_envs`` before ``gym.make``, or ``gym.make("gym_envs:patchgym/RepoEnv-v0")``); the
environments' own modules are imported only when one is made. The names below are kept here for
the code that imports them from ``gym_envs``.
"""

from importlib import import_module
from typing import Any

import gymnasium

# nondeterministic: grading runs a real test suite, and a seeded reset draws the same task but the
# world (time, the sandbox) is not replayed.
for _env_id, _entry_point in (("patchgym/RepoEnv-v0", "gym_envs.envs.repo_env:RepoEnv"),
                              ("patchgym/PatchEnv-v0", "gym_envs.envs.patch_env:PatchEnv")):
    if _env_id not in gymnasium.registry:
        gymnasium.register(id=_env_id, entry_point=_entry_point, nondeterministic=True)

_EXPORTS = {
    "InstanceReport": "gym_envs.grading.verifier", "Verifier": "gym_envs.grading.verifier",
    "TrajectoryRecorder": "gym_envs.envs.trajectory",
    "Task": "tasks.model", "TaskFileError": "tasks.model", "load_tasks": "tasks.model", "save_tasks": "tasks.model",
    "TaskSet": "tasks.catalog", "UnknownTaskError": "tasks.catalog", "load_task_set": "tasks.catalog",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gym_envs' has no attribute {name!r}")
