"""The gym: task model, verifier, Gymnasium environments, evaluation, validation and the CLI.

Importing this package registers ``patchgym/RepoEnv-v0`` (multi-turn, tool calls) and
``patchgym/PatchEnv-v0`` (one step, a unified diff) with Gymnasium.
"""

import gymnasium

from .catalog import TaskSet, UnknownTaskError, load_task_set
from .task import Task, TaskFileError, load_tasks, save_tasks
from .trajectory import TrajectoryRecorder
from .verifier import InstanceReport, Verifier

# nondeterministic: grading runs a real test suite, and a seeded reset draws the same task but the
# world (time, the sandbox) is not replayed.
for _id, _entry in (("patchgym/RepoEnv-v0", "gym_envs.envs.repo_env:RepoEnv"),
                    ("patchgym/PatchEnv-v0", "gym_envs.envs.patch_env:PatchEnv")):
    if _id not in gymnasium.registry:
        gymnasium.register(id=_id, entry_point=_entry, nondeterministic=True)

__all__ = ["InstanceReport", "Task", "TaskFileError", "TaskSet", "TrajectoryRecorder", "UnknownTaskError",
           "Verifier", "load_task_set", "load_tasks", "save_tasks"]
