"""The bundled task catalog: task rows in ``instances/*.jsonl`` and their repositories as git
bundles in ``repos/*.bundle`` (so every ``base_commit`` is a real commit id).

This package holds data only; :mod:`gym_envs.catalog` loads it.
"""

from pathlib import Path

CATALOG_DIR = Path(__file__).resolve().parent
INSTANCES_DIR = CATALOG_DIR / "instances"
REPOS_DIR = CATALOG_DIR / "repos"
