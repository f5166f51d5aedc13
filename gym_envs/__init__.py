"""The Gymnasium environments: ``patchgym/RepoEnv-v0`` (multi-turn tool calls) and
``patchgym/PatchEnv-v0`` (one step, a unified diff), and the recorder of their episodes.

Importing this package registers both ids with Gymnasium, as Gymnasium 1.x's own environment
packages do. Gymnasium 1.x has no plugin entry points (1.0 removed them), so a process that never
imports patchgym names the package in the id instead: ``gym.make("patchgym.gym_envs:patchgym/RepoEnv-v0")``
makes Gymnasium import it first. Grading lives in :mod:`patchgym.grading`, so ``patchgym eval`` never
imports this package (nor Gymnasium).
"""

import gymnasium

from patchgym.gym_envs.patch_env import PatchEnv
from patchgym.gym_envs.repo_env import RepoEnv
from patchgym.gym_envs.trajectory import TrajectoryRecorder

ENV_IDS = {"patchgym/RepoEnv-v0": "patchgym.gym_envs.repo_env:RepoEnv",
           "patchgym/PatchEnv-v0": "patchgym.gym_envs.patch_env:PatchEnv"}

# nondeterministic: grading runs a real test suite, and a seeded reset draws the same task but the
# world (time, the sandbox) is not replayed.
for _env_id, _entry_point in ENV_IDS.items():
    if _env_id not in gymnasium.registry:
        gymnasium.register(id=_env_id, entry_point=_entry_point, nondeterministic=True)

__all__ = ["ENV_IDS", "PatchEnv", "RepoEnv", "TrajectoryRecorder"]
