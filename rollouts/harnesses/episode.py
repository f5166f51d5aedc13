"""One episode of a harness on a task: a sandbox (``RepoEnv``'s, so grading is the same code), the
recording proxy in front of the model, the harness's run, then the workspace diff graded in a fresh
sandbox by the verifier (``RepoEnv``'s ``submit``: same labels, same integrity checks).

How it ends (``Episode.end_reason``) and what it is worth:

- the endpoint failed (the proxy's :class:`~patchgym.rollouts.model.ModelError`): ``model_error``,
  masked, not graded, as ``patchgym run`` does;
- the sandbox failed under the harness (a :class:`~patchgym.sandboxes.SandboxError`):
  ``environment_error``, masked;
- otherwise graded as the workspace stands, ended for the harness's reason: ``finished`` (it exited
  by itself), ``harness_crashed`` (it raised or exited non-zero: the harness and what the model made
  of it are the policy), ``time_limit`` (past the episode's time: the harness was killed),
  ``max_turns`` (the proxy's call budget spent), ``context_overflow`` (the last call did not fit),
  ``no_model_call`` (it never asked the model).

Nothing is left running: an in-sandbox harness ends with its command (the sandbox kills what it
left), is stopped through the bridge when the proxy refuses further calls, and is killed at the
deadline by the sandbox's own timeout; the proxy and the bridge close with the episode.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from patchgym.gym_envs.repo_env import RepoEnv
from patchgym.rollouts.harnesses.base import AGENT_IN_SANDBOX, Harness, HarnessContext, HarnessResult
from patchgym.rollouts.harnesses.bridge import Bridge
from patchgym.rollouts.loop import Episode, mask_episode, record_grade
from patchgym.rollouts.model import ChatModel, ModelConfig
from patchgym.rollouts.proxy import ModelProxy, expand_requests
from patchgym.rollouts.samples import training_sample
from patchgym.sandboxes import SandboxError
from patchgym.tasks.catalog import TaskSet

DEFAULT_TIME_LIMIT = 3600.0  # seconds a harness may run when the run sets no --time-limit
GRADE_MARGIN = 0.8  # of a caller's deadline, the part the harness may use (the rest is the grading's)
END_REASONS = {"crashed": "harness_crashed", "stopped": "time_limit", "out_of_turns": "max_turns"}


def run_harness_episode(make_env: Callable[[dict[str, Any] | None], RepoEnv], task_set: TaskSet, harness: Harness,
                        model: ModelConfig, instance_id: str, *, max_turns: int = 100, time_limit: float | None = None,
                        record_tokens: str = "auto", chat: ChatModel | None = None,
                        deadline: float | None = None) -> Episode:
    """Run ``harness`` on ``instance_id``: ``make_env(agent_sandbox_options)`` gives the episode's
    ``RepoEnv`` (closed here). ``max_turns``: model calls the proxy lets through; ``time_limit``:
    seconds the harness may run; ``deadline`` (``time.monotonic()``): a caller's own, of which the
    harness gets the first part (the grading the rest)."""
    started = time.monotonic()
    if deadline is not None:
        deadline = started + GRADE_MARGIN * max(0.0, deadline - started)
    episode = Episode(instance_id=instance_id, model=model.name, tool_mode="harness", harness=harness.describe())
    bridge: Bridge | None = None
    env: RepoEnv | None = None
    proxy: ModelProxy | None = None
    try:
        if harness.pattern == AGENT_IN_SANDBOX:
            bridge = Bridge(task_set.get(instance_id).problem_statement, getattr(harness, "files", None))
        options = bridge.sandbox_options() if bridge else None
        if options is not None:  # what the harness brings (an installed CLI agent), read-only too
            options["read_only_binds"].update(getattr(harness, "sandbox_binds", dict)())
        env = make_env(options)
        proxy = ModelProxy(model, max_calls=max_turns, record_tokens=record_tokens, chat=chat,
                           unix_socket=bridge.socket if bridge else None,
                           on_stop=bridge.stop if bridge else None)
        proxy.start()
        _drive(env, harness, proxy, bridge, episode, max_turns=max_turns, time_limit=time_limit or DEFAULT_TIME_LIMIT,
               deadline=deadline)
    finally:
        if proxy is not None:
            proxy.close()
            _record_calls(episode, proxy)
        if env is not None:
            env.close()
        if bridge is not None:
            bridge.close()
        episode.wall_seconds = round(time.monotonic() - started, 3)
    return episode


def _drive(env: RepoEnv, harness: Harness, proxy: ModelProxy, bridge: Bridge | None, episode: Episode, *,
           max_turns: int, time_limit: float, deadline: float | None) -> None:
    observation, info = env.reset(options={"task_id": episode.instance_id})
    if info.get("infrastructure_failure"):
        mask_episode(episode, "environment_error", observation)
        return
    # the harness's time runs from a ready sandbox (building an environment is not its to spend)
    deadline = min(time.monotonic() + time_limit, deadline if deadline is not None else float("inf"))
    inner = env.unwrapped
    assert inner.sandbox is not None and inner.task is not None
    context = HarnessContext(sandbox=inner.sandbox, problem_statement=inner.task.problem_statement,
                             instance_id=episode.instance_id, base_url=proxy.url, model=proxy.config.name,
                             deadline=deadline, max_turns=max_turns, stopped=lambda: proxy.stopped, bridge=bridge)
    try:
        result = harness.run(context)
    except SandboxError as exc:  # the sandbox broke under the harness: the environment's failure
        mask_episode(episode, "environment_error", f"{type(exc).__name__}: {exc}")
        return
    except Exception as exc:  # a harness that raises is a crashed harness, graded as it stands
        result = HarnessResult(status="crashed", detail=f"{type(exc).__name__}: {exc}"[:2000])
    proxy.stop("the harness ended")
    episode.harness_result = asdict(result)
    episode.steps = result.steps or 0
    if proxy.failure is not None:
        mask_episode(episode, "model_error", proxy.failure)
        return
    _, reward, _, _, info = env.step({"name": "submit", "arguments": {}})
    record_grade(episode, reward, info, _end_reason(result, proxy))


def _end_reason(result: HarnessResult, proxy: ModelProxy) -> str:
    """Why the episode ended, most telling first: the harness's own ending (killed at the deadline,
    crashed, stopped for the budget or the time), then what the model calls show."""
    if result.status == "timed_out":
        return "time_limit"
    if proxy.budget_spent:  # however the harness took the refusal (stopped, gave up, crashed on it)
        return "max_turns"
    if result.status != "finished":
        return END_REASONS.get(result.status, result.status)
    if not proxy.calls:
        return "no_model_call"
    if proxy.overflow is not None and proxy.calls[-1].get("outcome") == "context_overflow":
        return "context_overflow"
    return "finished"


def _record_calls(episode: Episode, proxy: ModelProxy) -> None:
    """The proxy's record into the episode: the calls, the tokens, the sample, and the conversation
    as the model last saw it (for the trajectory exports)."""
    episode.model_calls = list(proxy.calls)
    episode.turns = sum(c.get("status") == 200 for c in proxy.calls)
    episode.tokens_in, episode.tokens_out = proxy.usage()
    episode.sample = training_sample(episode.model_calls)
    requests = expand_requests(episode.model_calls)
    answered = [(request, call) for request, call in zip(requests, episode.model_calls, strict=True)
                if call.get("status") == 200 and call.get("api") == "chat"]
    if answered:
        request, call = answered[-1]
        choices = (call.get("response") or {}).get("choices") or [{}]
        last = choices[0].get("message") if isinstance(choices[0], dict) else None
        episode.messages = [m for m in request.get("messages") or [] if isinstance(m, dict)] + ([last] if last else [])
        episode.tools = list(request.get("tools") or [])
