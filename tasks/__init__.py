"""What a task is and where tasks come from: the task model (:mod:`patchgym.tasks.model`), the catalog of
task sets (:mod:`patchgym.tasks.catalog`), the sandbox a task needs (:mod:`patchgym.tasks.backends`), SWE-bench rows
and predictions (:mod:`patchgym.tasks.swebench_io`, :mod:`patchgym.tasks.predictions`), and the bundled tasks
themselves: rows in ``instances/*.jsonl`` and their repositories as git bundles in
``repos/*.bundle`` (so every ``base_commit`` is a real commit id).

It sits right above :mod:`sandboxes` and below grading: nothing here grades or runs an agent.
"""

from pathlib import Path

CATALOG_DIR = Path(__file__).resolve().parent
INSTANCES_DIR = CATALOG_DIR / "instances"
REPOS_DIR = CATALOG_DIR / "repos"
