"""``patchgym/RepoEnv-v0``: a multi-turn coding environment over a real repository.

The agent works through tool calls (``bash``, ``str_replace_editor``, ``submit``) in a sandbox at
the task's base commit. Reward is 0 until the terminal step, where the verifier grades the
workspace's diff in a fresh sandbox: nothing the agent left behind in its own sandbox can touch
the grading run. The terminal step's ``info["cost"]`` is what the whole episode cost, grading
included (:mod:`patchgym.grading.cost`).
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from patchgym.grading.cost import CostMeter, Prices
from patchgym.grading.labels import Outcome, of_infrastructure
from patchgym.grading.verifier import InstanceReport, Verifier
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
from patchgym.gym_envs.spaces import ToolCalls, UnicodeText
from patchgym.gym_envs.tools import StrReplaceEditor, ToolError
from patchgym.sandboxes import ExecResult, Sandbox, SandboxError, WorkspaceError
from patchgym.sandboxes.base import usage_of
from patchgym.sandboxes.phases import phase
from patchgym.tasks.backends import sandbox_factory
from patchgym.tasks.catalog import TaskSet
from patchgym.tasks.model import Task

log = logging.getLogger(__name__)

BASH_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": (
            "Run a bash command at the repository root and return its output (stdout and stderr) "
            "and exit code. Each call starts a fresh shell: files persist between calls, the "
            "working directory, variables and background processes do not. Stdin is closed, there "
            "is no network, long output is truncated in the middle, and a command that runs past "
            "the time limit is killed."
        ),
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to run."}},
            "required": ["command"],
        },
    },
}
SUBMIT_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Submit the current state of the repository as your fix. This ends the episode.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}


class RepoEnv(gym.Env[str, Any]):
    """Multi-turn repository environment.

    Args:
        tasks: a :class:`~tasks.catalog.TaskSet`, a task file or directory, or None for the
            bundled catalog.
        backend: sandbox backend name (``"local"``); ``sandbox_options`` are passed to it.
        max_steps: the episode is truncated after this many steps.
        time_limit: wall-clock seconds per episode (None: no limit); checked after each step.
        grade_on_truncation: grade the diff when the episode is truncated (else reward 0).
        partial_credit: reward = fraction of FAIL_TO_PASS passing (0 if a PASS_TO_PASS breaks).
        tampering_reward: the reward of a grading that found tampering (``info["tampering"]``);
            below 0 it gives forging a price (docs/grading.md).
        command_timeout: seconds a ``bash`` call may run.
        output_limit: characters of tool output returned (head and tail kept).
        prices: dollars per core-hour and GB-hour for ``info["cost"]`` (default: :class:`Prices`).
        agent_sandbox_options: more options for the agent's sandbox only, never the grading one's
            (a harness's files and the model proxy's socket bound into it).

    Observations are text. Actions are tool calls, ``{"name": ..., "arguments": {...}}`` as a dict
    or a JSON string (``action_space``: :class:`~patchgym.gym_envs.spaces.ToolCalls` of ``tools``).
    ``info["invalid_action"]`` flags a call that could not be carried out (the episode continues,
    the observation says why); ``info["infrastructure_failure"]`` flags an episode whose outcome
    should be masked rather than scored.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        tasks: TaskSet | str | Path | None = None,
        backend: str = "local",
        max_steps: int = 50,
        time_limit: float | None = None,
        grade_on_truncation: bool = True,
        partial_credit: bool = False,
        command_timeout: float = 120.0,
        output_limit: int = 16_000,
        sandbox_options: dict[str, Any] | None = None,
        prices: Prices | None = None,
        agent_sandbox_options: dict[str, Any] | None = None,
        tampering_reward: float = 0.0,
    ) -> None:
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        self.task_set = resolve_tasks(tasks)
        self.max_steps = max_steps
        self.time_limit = time_limit
        self.grade_on_truncation = grade_on_truncation
        self.command_timeout = command_timeout
        self.output_limit = output_limit
        self._factory = sandbox_factory(backend, **(sandbox_options or {}))
        self._agent_factory = sandbox_factory(backend, **{**(sandbox_options or {}), **(agent_sandbox_options or {})})
        self.prices = prices or Prices()
        self.verifier = Verifier(self._factory, partial_credit=partial_credit, prices=self.prices,
                                 tampering_reward=tampering_reward)
        self.observation_space = UnicodeText(MAX_OBSERVATION_CHARS)
        self.action_space = ToolCalls(self.tools, max_length=MAX_ACTION_CHARS)
        self.task: Task | None = None
        self.sandbox: Sandbox | None = None
        self.editor: StrReplaceEditor | None = None
        self._steps = 0
        self._started = 0.0
        self._step_started = 0.0
        self._done = True
        self._start_error: str | None = None
        self._meter: CostMeter | None = None

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The OpenAI tool schemas to hand to a model (a fresh copy each time)."""
        return copy.deepcopy([BASH_SCHEMA, StrReplaceEditor.schema, SUBMIT_SCHEMA])

    # -- Gymnasium API --------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on ``options["task_id"]``, or on a task drawn with the seeded RNG.

        A sandbox that cannot be started does not raise: the observation says so and
        ``info["infrastructure_failure"]`` is set; the next step ends the episode with reward 0.
        """
        super().reset(seed=seed)
        self._close_sandbox()
        self._meter = CostMeter()
        with self._meter.charging():
            return self._reset(options)

    def _reset(self, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        self.task = choose_task(self.task_set, self.np_random, options)
        self._steps = 0
        self._started = time.monotonic()
        self._done = False
        self._start_error = None
        try:
            with phase(f"{self.task.instance_id}: sandbox start"):  # said in a log when it takes long
                self.sandbox = self._agent_factory(self.task)
            self.editor = StrReplaceEditor(self.sandbox, max_output_chars=self.output_limit)
            workdir = self.sandbox.workdir
            observation = task_briefing(self.task, workdir)
        except SandboxError as exc:
            self._start_error = f"{type(exc).__name__}: {exc}"
            workdir = ""
            observation = f"The environment could not be started ({self._start_error})."
        info = {
            "instance_id": self.task.instance_id, "repo": self.task.repo, "base_commit": self.task.base_commit,
            "workdir": workdir, "max_steps": self.max_steps, "time_limit": self.time_limit,
            "test_command": self.task.test_spec.command,
            "infrastructure_failure": self._start_error is not None,
        }
        if self._start_error is not None:
            info["outcome"] = str(of_infrastructure(self._start_error))
        placement = getattr(self.sandbox, "placement", None)
        if placement and self._start_error is None:
            info["placement"] = dict(placement)  # ray backend: the node, and this sandbox's warm-up
        return fit_observation(observation), info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done or self.task is None or self._meter is None:
            raise RuntimeError("the episode is over (or was never started): call reset()")
        meter = self._meter
        with meter.charging():
            observation, reward, terminated, truncated, info = self._step(action)
        if self._done:
            info["cost"] = meter.result(self.prices).to_dict()
        return observation, reward, terminated, truncated, info

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._steps += 1
        self._step_started = time.monotonic()
        info: dict[str, Any] = {"step": self._steps, "tool": None, "invalid_action": False, "error": None,
                                "exit_code": None}
        if self._start_error is not None:
            return self._finish(self._start_error_report(), None, info, truncated=False)
        try:
            name, arguments = parse_tool_call(action)
            info["tool"] = name
            if name == "submit":
                return self._grade(info, truncated=False)
            observation = self._run_tool(name, arguments, info)
        except (InvalidAction, ToolError) as exc:
            info["invalid_action"] = True
            info["error"] = str(exc)
            observation = f"Error: {exc}"
        except SandboxError as exc:  # the sandbox broke under us: mask, do not score
            report = InstanceReport(instance_id=self.task.instance_id, infrastructure_failure=True,
                                    infrastructure_failure_reason=f"{type(exc).__name__}: {exc}")
            return self._finish(report, None, info, truncated=False)
        info["elapsed"] = self._step_elapsed()
        observation = fit_observation(observation)
        if self._out_of_budget():
            if self.grade_on_truncation:
                return self._grade(info, truncated=True, observation=observation)
            self._done = True
            self._close_sandbox()
            return observation, 0.0, False, True, info
        return observation, 0.0, False, False, info

    def close(self) -> None:
        """Free the sandbox. Idempotent."""
        self._close_sandbox()
        self._done = True

    # -- internals ------------------------------------------------------------------------

    def _run_tool(self, name: str, arguments: dict[str, Any], info: dict[str, Any]) -> str:
        """Carry out a tool call; the sandbox's CPU meanwhile is the agent's (where the sandbox
        cannot say, a bash command's own CPU, and the editor's is unknown)."""
        assert self.sandbox is not None and self._meter is not None
        before = usage_of(self.sandbox).cpu_seconds
        results: list[ExecResult] = []
        try:
            return self._call_tool(name, arguments, info, results)
        finally:
            after = usage_of(self.sandbox).cpu_seconds if self.sandbox is not None else None
            if before is not None and after is not None:
                self._meter.add_agent(after - before)
            elif name == StrReplaceEditor.name:
                self._meter.add_agent(None)  # its helper commands ran unmeasured
            else:
                self._meter.add_agent(sum(r.cpu_seconds for r in results)
                                      if all(r.cpu_seconds is not None for r in results) else None)

    def _call_tool(self, name: str, arguments: dict[str, Any], info: dict[str, Any],
                   results: list[ExecResult]) -> str:
        assert self.sandbox is not None and self.editor is not None
        if name == "bash":
            command = arguments.get("command")
            extra = set(arguments) - {"command"}
            if not isinstance(command, str) or not command.strip():
                raise InvalidAction("bash needs a non-empty string argument 'command'")
            if extra:
                raise InvalidAction(f"bash got unexpected arguments: {', '.join(sorted(extra))}")
            result = self.sandbox.exec(command, timeout=self.command_timeout, output_limit=self.output_limit)
            results.append(result)
            info["exit_code"] = result.exit_code
            return format_exec(result)
        if name == StrReplaceEditor.name:
            return self.editor(**arguments)
        known = ", ".join(t["function"]["name"] for t in self.tools)
        raise InvalidAction(f"unknown tool {name!r}; the tools are: {known}")

    def _step_elapsed(self) -> float:
        return round(time.monotonic() - self._step_started, 4)

    def _out_of_budget(self) -> bool:
        if self._steps >= self.max_steps:
            return True
        return self.time_limit is not None and time.monotonic() - self._started >= self.time_limit

    def _grade(self, info: dict[str, Any], *, truncated: bool, observation: str = "") -> tuple:
        assert self.sandbox is not None and self.task is not None
        try:
            patch = self.sandbox.diff()
        except SandboxError as exc:
            report = InstanceReport(instance_id=self.task.instance_id, infrastructure_failure=True,
                                    infrastructure_failure_reason=f"could not read the workspace diff: {exc}")
            return self._finish(report, None, info, truncated=truncated, observation=observation)
        except Exception as exc:  # WorkspaceError, or anything else the tree made the harness raise:
            # the agent's own doing (a sandbox failure is a SandboxError, above): scored 0, never masked
            # and never out of step().
            if not isinstance(exc, WorkspaceError):
                log.warning("%s: the workspace diff raised", self.task.instance_id, exc_info=True)
            reason = str(exc) if isinstance(exc, WorkspaceError) else f"{type(exc).__name__}: {exc}"
            report = InstanceReport(instance_id=self.task.instance_id, patch_exists=True,
                                    error=f"the workspace cannot be diffed: {reason[:2000]}",
                                    outcome=Outcome.AGENT_FAILURE)
            return self._finish(report, None, info, truncated=truncated, observation=observation)
        self._close_sandbox()  # grading uses a fresh sandbox; free this one first
        report = self.verifier.verify(self.task, patch, run_empty=True)
        if self._meter is not None:
            self._meter.include(report.cost)
        return self._finish(report, patch, info, truncated=truncated, observation=observation)

    def _finish(self, report: InstanceReport, patch: str | None, info: dict[str, Any], *, truncated: bool,
                observation: str = "") -> tuple:
        self._done = True
        self._close_sandbox()
        info.update(grading_info(report, patch))
        info["elapsed"] = self._step_elapsed()
        if report.infrastructure_failure:
            verdict = f"The episode ended by an infrastructure failure: {report.infrastructure_failure_reason}"
        else:
            verdict = "Submitted: the hidden tests pass." if report.resolved else \
                "Submitted: the hidden tests do not pass."
        text = f"{observation}\n\n{verdict}" if observation else verdict
        return fit_observation(text), float(report.reward), not truncated, truncated, info

    def _start_error_report(self) -> InstanceReport:
        assert self.task is not None
        return InstanceReport(instance_id=self.task.instance_id, infrastructure_failure=True,
                              infrastructure_failure_reason=self._start_error)

    def _close_sandbox(self) -> None:
        sandbox, self.sandbox, self.editor = self.sandbox, None, None
        if sandbox is not None:
            if self._meter is not None:
                self._meter.sandbox_closed(usage_of(sandbox))
            sandbox.close()


def format_exec(result: ExecResult) -> str:
    """A bash result as the agent sees it: the output, then the exit code (a timed-out command's
    output already ends with the sandbox's note that it was killed)."""
    if result.timed_out:
        return result.output
    sep = "" if not result.output or result.output.endswith("\n") else "\n"
    return f"{result.output}{sep}[exit code: {result.exit_code}]"
