"""One episode of a model on a task: the model's tool calls drive ``RepoEnv`` until it submits,
runs out of steps or time, stops calling tools, overflows its context, or its endpoint fails.

Two ways to call tools: the API's own (``tools`` / ``tool_calls``), or, for models served without
tool calling, text: one fenced shell block per turn, which runs as ``bash`` (a block holding only
``submit`` submits). ``auto`` starts with the API's and falls back to text when the endpoint
refuses ``tools``.

How it ends decides what the episode is worth. Submitting, running out of steps or time, not
calling tools, and overflowing the context are the policy's: the workspace is graded as it is (the
final diff is the prediction). A failing endpoint is not: the episode is masked, never scored 0.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from patchgym.gym_envs.common import fit_observation
from patchgym.gym_envs.repo_env import RepoEnv
from patchgym.rollouts.model import ChatModel, ContextOverflow, ModelError, ToolsUnsupported, parse_arguments

SYSTEM_PROMPT = (
    "You are fixing a bug in a software repository. Use the tools to explore the code, edit it and run "
    "its tests; call submit when the fix is done. Hidden tests will grade the fix."
)
TEXT_PROTOCOL = (
    "\n\nYou act by replying with exactly one fenced shell block per turn, e.g.\n```bash\nls\n```\n"
    "It runs in the repository and you get its output back. When the fix is done, reply with a block "
    "holding only the word submit:\n```bash\nsubmit\n```"
)
NUDGE = "Continue: make a tool call (call submit when the fix is done)."
TEXT_NUDGE = "Reply with exactly one fenced shell block (```bash ... ```), or a block holding only: submit"
END_NOTE = "[patchgym: the episode ended: "  # a note in the conversation, not a turn of it
MAX_IDLE_TURNS = 3  # turns in a row without a tool call before the episode ends
_FENCE = re.compile(r"```[ \t]*(?:bash|sh|shell|console)?[ \t]*\n(.*?)```", re.S)
TOOL_MODES = ("auto", "native", "text")


@dataclass
class Episode:
    """How one episode went: the conversation, the outcome and what it cost."""

    instance_id: str
    model: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = "unresolved"  # resolved | unresolved | masked
    end_reason: str = ""
    reward: float = 0.0
    resolved: bool = False
    mask_reason: str | None = None
    # How the grading ended (grading.labels: tests_could_not_start, tampering, ...); None
    # when the episode never reached one (the model endpoint failed first).
    grading_outcome: str | None = None
    steps: int = 0
    turns: int = 0
    invalid_calls: int = 0  # tool calls the environment refused (unknown tool, bad arguments)
    format_errors: int = 0  # turns with no tool call it could read (none, or not one fenced block)
    wall_seconds: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    patch: str = ""
    report: dict[str, Any] | None = None
    tool_mode: str = "native"
    tools: list[dict[str, Any]] = field(default_factory=list)  # offered to the model (native mode)
    # What the environment spent (the terminal step's info["cost"], grading.cost): wall time,
    # harness, agent and test CPU, peak memory, dollars. None when the episode never reached one.
    cost: dict[str, Any] | None = None
    # Harness episodes (rollouts.harnesses): the harness (name, version, pattern), how its run
    # ended, every model call the proxy recorded, and those calls as one training sample.
    harness: dict[str, Any] | None = None
    harness_result: dict[str, Any] | None = None
    model_calls: list[dict[str, Any]] = field(default_factory=list)
    sample: dict[str, Any] | None = None

    def token_cost(self, input_per_mtok: float, output_per_mtok: float) -> float:
        """The model's dollars for the episode's tokens."""
        return (self.tokens_in * input_per_mtok + self.tokens_out * output_per_mtok) / 1e6


def run_episode(env: RepoEnv, model: ChatModel, instance_id: str, *, max_turns: int = 100,
                tool_mode: str = "auto", observation_limit: int = 20_000, deadline: float | None = None) -> Episode:
    """Run ``model`` on ``instance_id`` in ``env`` (reset here; the caller closes ``env``).
    ``observation_limit``: characters of each tool output the model sees (head and tail kept).
    ``deadline`` (``time.monotonic()``): no model turn starts after it; the workspace is graded as
    it stands (``time_limit``), so a caller's own deadline is not spent in model calls."""
    if tool_mode not in TOOL_MODES:
        raise ValueError(f"tool_mode must be one of {', '.join(TOOL_MODES)}, not {tool_mode!r}")
    started = time.monotonic()
    episode = Episode(instance_id=instance_id, model=model.config.name,
                      tool_mode="text" if tool_mode == "text" else "native")
    try:
        _drive(env, model, episode, max_turns=max_turns, tool_mode=tool_mode, observation_limit=observation_limit,
               deadline=deadline)
    finally:
        episode.wall_seconds = round(time.monotonic() - started, 3)
    return episode


def _drive(env: RepoEnv, model: ChatModel, episode: Episode, *, max_turns: int, tool_mode: str,
           observation_limit: int, deadline: float | None) -> None:
    observation, info = env.reset(options={"task_id": episode.instance_id})
    if info.get("infrastructure_failure"):
        mask_episode(episode, "environment_error", observation)
        return
    messages = episode.messages
    messages += [{"role": "system", "content": _system(episode.tool_mode)}, {"role": "user", "content": observation}]
    if episode.tool_mode == "native":
        episode.tools = env.tools
    idle = 0
    while True:
        if episode.turns >= max_turns:
            return _grade_as_is(env, episode, "max_turns")
        if deadline is not None and time.monotonic() >= deadline:
            return _grade_as_is(env, episode, "time_limit")
        try:
            reply = model.complete(messages, episode.tools or None)
        except ToolsUnsupported:
            if tool_mode != "auto":
                return mask_episode(episode, "model_error",
                                    "the endpoint does not support tool calls (use --tool-mode text)")
            episode.tool_mode, episode.tools = "text", []
            messages[0] = {"role": "system", "content": _system("text")}
            continue
        except ContextOverflow as exc:
            return _grade_as_is(env, episode, "context_overflow", str(exc))
        except ModelError as exc:
            return mask_episode(episode, "model_error", str(exc))
        episode.turns += 1
        episode.tokens_in += reply.tokens_in
        episode.tokens_out += reply.tokens_out
        message = _clean(reply.message)
        messages.append(message)
        calls = _calls(message, episode.tool_mode)
        if not calls:
            episode.format_errors += 1
            idle += 1
            if idle >= MAX_IDLE_TURNS:
                return _grade_as_is(env, episode, "no_tool_call")
            messages.append({"role": "user", "content": TEXT_NUDGE if episode.tool_mode == "text" else NUDGE})
            continue
        idle = 0
        for call_id, name, arguments in calls:
            observation, reward, terminated, truncated, info = env.step({"name": name, "arguments": arguments})
            episode.steps += 1
            episode.invalid_calls += bool(info.get("invalid_action"))
            text = fit_observation(observation, observation_limit)
            if episode.tool_mode == "native":
                messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
            else:
                messages.append({"role": "user", "content": text})
            if terminated or truncated:
                reason = "submitted" if name == "submit" and terminated else _budget_reason(env, info)
                return record_grade(episode, reward, info, reason)


def _system(tool_mode: str) -> str:
    return SYSTEM_PROMPT + (TEXT_PROTOCOL if tool_mode == "text" else "")


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as it goes back to the API: role, content, tool calls (ids filled in)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        calls.append({"id": call.get("id") or f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                      "function": {"name": str(function.get("name") or ""),
                                   "arguments": function.get("arguments") if isinstance(function.get("arguments"), str)
                                   else _json_text(function.get("arguments"))}})
    if calls:
        out["tool_calls"] = calls
    return out


def _json_text(value: Any) -> str:
    return json.dumps(value if value is not None else {})


def _calls(message: dict[str, Any], tool_mode: str) -> list[tuple[str | None, str, Any]]:
    """The tool calls of a turn: (call id, tool name, arguments)."""
    if tool_mode == "native":
        return [(c["id"], c["function"]["name"], parse_arguments(c["function"]["arguments"]))
                for c in message.get("tool_calls") or []]
    blocks = _FENCE.findall(message.get("content") or "")
    if len(blocks) != 1:
        return []
    command = blocks[0].strip()
    if command == "submit":
        return [(None, "submit", {})]
    return [(None, "bash", {"command": command})] if command else []


def _budget_reason(env: RepoEnv, info: dict[str, Any]) -> str:
    """Why the environment cut the episode short: its step budget, else its time limit."""
    return "max_steps" if info.get("step", 0) >= env.unwrapped.max_steps else "time_limit"


def _grade_as_is(env: RepoEnv, episode: Episode, reason: str, note: str | None = None) -> None:
    """End the episode on the policy's account: submit the workspace as it is."""
    _, reward, _, _, info = env.step({"name": "submit", "arguments": {}})
    record_grade(episode, reward, info, reason)
    if note:
        episode.messages.append({"role": "user", "content": f"{END_NOTE}{note[:500]}]"})


def record_grade(episode: Episode, reward: float, info: dict[str, Any], reason: str) -> None:
    """Put the terminal step's grading (``reward``, ``info``) into ``episode``, ended for ``reason``;
    masked when the environment failed (its grading says so)."""
    episode.end_reason = reason
    episode.cost = info.get("cost")
    episode.grading_outcome = info.get("outcome")
    if info.get("infrastructure_failure"):
        detail = info.get("infrastructure_failure_reason") or "the environment failed"
        mask_episode(episode, "environment_error", detail)
        episode.report = info.get("report")
        return
    episode.reward = float(reward)
    episode.resolved = bool(info.get("resolved"))
    episode.outcome = "resolved" if episode.resolved else "unresolved"
    episode.patch = info.get("patch") or ""
    episode.report = info.get("report")


def mask_episode(episode: Episode, reason: str, detail: str) -> None:
    """End ``episode`` as masked: not a result, whatever its reward would have been."""
    episode.outcome, episode.end_reason, episode.mask_reason = "masked", reason, detail
    episode.reward, episode.resolved = 0.0, False
