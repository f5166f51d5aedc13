"""Gymnasium environments: ``patchgym/RepoEnv-v0`` (multi-turn) and ``patchgym/PatchEnv-v0``."""

from gym_envs.envs.patch_env import PatchEnv
from gym_envs.envs.repo_env import RepoEnv

__all__ = ["PatchEnv", "RepoEnv"]
