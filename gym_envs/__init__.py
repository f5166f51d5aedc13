"""The gym: task model, verifier, evaluation, validation and the command line.

Gymnasium environments are registered here once they exist (``patchgym/RepoEnv-v0``,
``patchgym/PatchEnv-v0``).
"""

from .catalog import TaskSet, UnknownTaskError, load_task_set
from .task import Task, TaskFileError, load_tasks, save_tasks
from .verifier import InstanceReport, Verifier

__all__ = ["InstanceReport", "Task", "TaskFileError", "TaskSet", "UnknownTaskError", "Verifier",
           "load_task_set", "load_tasks", "save_tasks"]
