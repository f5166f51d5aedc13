"""``patchgym/PatchEnv-v0``: one step, the action is a unified diff, the reward is the verifier's.

For models that answer a bug report with a patch in one go (SWE-bench's single-turn setting, or RL
on patch generation). No sandbox is held between reset and step: grading makes its own, and the
step's ``info["cost"]`` is what grading cost (:mod:`patchgym.grading.cost`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym

from patchgym.grading.cost import Prices
from patchgym.grading.verifier import Verifier
from patchgym.gym_envs.actions import InvalidAction, parse_tool_call
from patchgym.gym_envs.common import (
    MAX_ACTION_CHARS,
    MAX_OBSERVATION_CHARS,
    choose_task,
    fit_observation,
    grading_info,
    resolve_tasks,
    task_briefing,
)
from patchgym.gym_envs.spaces import UnicodeText
from patchgym.tasks.backends import sandbox_factory
from patchgym.tasks.catalog import TaskSet
from patchgym.tasks.model import Task

PATCH_WORKDIR = "/testbed"


class PatchEnv(gym.Env[str, str]):
    """Single-step patch environment: observe the bug report, answer with a unified diff.

    The action may be a diff string, or a dict/JSON tool call ``{"name": "submit", "arguments":
    {"patch": ...}}`` (so the same client code can drive both environments).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        tasks: TaskSet | str | Path | None = None,
        backend: str = "local",
        partial_credit: bool = False,
        sandbox_options: dict[str, Any] | None = None,
        prices: Prices | None = None,
        tampering_reward: float = 0.0,
    ) -> None:
        self.task_set = resolve_tasks(tasks)
        self.verifier = Verifier(sandbox_factory(backend, **(sandbox_options or {})), partial_credit=partial_credit,
                                 prices=prices, tampering_reward=tampering_reward)
        self.observation_space = UnicodeText(MAX_OBSERVATION_CHARS)
        self.action_space = UnicodeText(MAX_ACTION_CHARS)
        self.task: Task | None = None
        self._done = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.task = choose_task(self.task_set, self.np_random, options)
        self._done = False
        observation = task_briefing(self.task, PATCH_WORKDIR) + (
            "\nAnswer with a unified diff (as `git diff` prints it) against that commit.")
        info = {"instance_id": self.task.instance_id, "repo": self.task.repo, "base_commit": self.task.base_commit}
        return fit_observation(observation), info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done or self.task is None:
            raise RuntimeError("the episode is over (or was never started): call reset()")
        self._done = True
        patch = _patch_from(action)
        report = self.verifier.verify(self.task, patch, run_empty=True)
        info = {"step": 1, "invalid_action": not report.patch_successfully_applied, "error": report.error}
        info.update(grading_info(report, patch))
        info["cost"] = report.cost.to_dict() if report.cost is not None else None
        if report.infrastructure_failure:
            text = f"The patch could not be graded: {report.infrastructure_failure_reason}"
        elif not report.patch_successfully_applied:
            text = f"The patch was not applied: {report.error}"
        else:
            text = "The hidden tests pass." if report.resolved else "The hidden tests do not pass."
        return text, float(report.reward), True, False, info

    def close(self) -> None:
        self._done = True


def _patch_from(action: Any) -> str:
    """The diff in an action: the string itself, or a ``submit`` tool call's ``patch`` argument."""
    if isinstance(action, dict) or (isinstance(action, str) and action.lstrip().startswith("{")):
        try:
            _, arguments = parse_tool_call(action)
            return str(arguments.get("patch", ""))
        except InvalidAction:
            pass
    return action if isinstance(action, str) else ""
