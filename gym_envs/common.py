"""What the repository and patch environments share: choosing a task, grading, and reporting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from patchgym.grading.labels import settle
from patchgym.grading.verifier import InstanceReport
from patchgym.tasks.catalog import TaskSet, load_task_set
from patchgym.tasks.model import Task

MAX_OBSERVATION_CHARS = 1 << 18
MAX_ACTION_CHARS = 1 << 20


def fit_observation(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    """Keep an observation inside the observation space: head and tail around a marker."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit + 200} characters omitted ...]\n"
    keep = (limit - len(marker)) // 2
    return text[:keep] + marker + text[len(text) - (limit - len(marker) - keep):]


def resolve_tasks(tasks: TaskSet | str | Path | None) -> TaskSet:
    """A task set from a TaskSet, a task file or directory, or the bundled catalog (None)."""
    task_set = tasks if isinstance(tasks, TaskSet) else load_task_set(tasks)
    if len(task_set) == 0:
        raise ValueError(f"the task set {task_set.origin!r} is empty")
    return task_set


def choose_task(task_set: TaskSet, rng: np.random.Generator, options: dict[str, Any] | None) -> Task:
    """The task named by ``options["task_id"]``, else a choice drawn from the env's seeded RNG."""
    task_id = (options or {}).get("task_id")
    if task_id is not None:
        return task_set.get(str(task_id))
    return task_set.get(task_set.ids[int(rng.integers(len(task_set)))])


def task_briefing(task: Task, workdir: str) -> str:
    """The first observation: the bug report and the facts an agent needs, never the answers."""
    return (
        f"{task.problem_statement.strip()}\n\n"
        f"---\n"
        f"Repository: {task.repo} (version {task.version or 'unknown'}), checked out at {workdir} "
        f"on commit {task.base_commit[:12]}.\n"
        f"Its tests run with: {task.test_spec.command}\n"
        "Fix the issue in the source code so that it behaves as the report expects. "
        "Hidden tests will check the fix; changes to tests or test configuration are ignored."
    )


def grading_info(report: InstanceReport, patch: str | None) -> dict[str, Any]:
    """The terminal step's info: the report, and what a trainer needs to mask infra failures."""
    return {
        "report": report.swebench_dict(),
        "resolved": report.resolved,
        "infrastructure_failure": report.infrastructure_failure,
        "infrastructure_failure_reason": report.infrastructure_failure_reason,
        "tampering": bool(report.tampering_detected and not report.infrastructure_failure),
        "outcome": str(settle(report).outcome),  # grading.labels: one vocabulary everywhere
        "outcome_detail": report.outcome_detail,
        "patch": patch or "",
    }
