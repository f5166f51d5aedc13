"""The gym: grading (:mod:`gym_envs.grading`), the Gymnasium environments (:mod:`gym_envs.envs`),
task making (:mod:`gym_envs.making`) and model rollouts (:mod:`gym_envs.rollouts`); the task model
and catalog are the :mod:`tasks` package, the command line the :mod:`cli` package.
``docs/architecture.md`` maps the layers.

Importing this package registers ``patchgym/RepoEnv-v0`` (multi-turn, tool calls) and
``patchgym/PatchEnv-v0`` (one step, a unified diff) with Gymnasium (``gym.make("gym_envs:...")``
works too). Unlike other Gymnasium plugins it does not import Gymnasium to do so: a hook registers
them the moment ``gymnasium`` is imported (at once if it already is). Measured reason: importing
Gymnasium and NumPy here made every ``patchgym eval`` (whose grading lives in this package but
never uses Gymnasium) 140 ms slower to its first sandbox, 401 ms instead of 262 ms (bench/startup.py,
medians; bench/README.md). The names below are kept for the code that imports them from ``gym_envs``.
"""

import importlib.util
import sys
from importlib import import_module
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from typing import Any

_ENVS = (("patchgym/RepoEnv-v0", "gym_envs.envs.repo_env:RepoEnv"),
         ("patchgym/PatchEnv-v0", "gym_envs.envs.patch_env:PatchEnv"))


def _register(gymnasium: Any) -> None:
    # nondeterministic: grading runs a real test suite, and a seeded reset draws the same task but
    # the world (time, the sandbox) is not replayed.
    for env_id, entry_point in _ENVS:
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point, nondeterministic=True)


class _RegisterWhenGymnasiumLoads(MetaPathFinder):
    """Registers the environments the moment ``gymnasium`` finishes importing: nobody can reach
    Gymnasium's registry without importing ``gymnasium``, so registering then is the same to every
    caller."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname != "gymnasium":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: the real finders locate it from here on
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_then_register(module: Any) -> None:
            load(module)
            _register(module)

        spec.loader.exec_module = exec_then_register
        return spec


if "gymnasium" in sys.modules:
    _register(sys.modules["gymnasium"])
elif not any(isinstance(f, _RegisterWhenGymnasiumLoads) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWhenGymnasiumLoads())

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
