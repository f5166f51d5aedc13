"""Gymnasium environments: ``patchgym/RepoEnv-v0`` (multi-turn) and ``patchgym/PatchEnv-v0``."""

from .patch_env import PatchEnv
from .repo_env import RepoEnv

__all__ = ["PatchEnv", "RepoEnv"]
