"""A model evaluated on a task set: episodes on a worker pool, written to a run directory as they
finish, so an interrupted run continues where it stopped (``docs/run.md`` documents the files).

    DIR/run.json            the run's settings; a resumed run must match them
    DIR/trajectories.jsonl  one line per finished episode (the last line of an instance wins)
    DIR/predictions.jsonl   SWE-bench predictions (``patchgym eval`` and SWE-bench's harness grade them)
    DIR/report.json         the run report: resolved rate with a 95% interval, per-task outcomes, cost
    DIR/report.html         the same for people (:mod:`.html_report`)

A masked episode (the endpoint or the environment failed) is not a result: a resumed run runs it
again. Every episode's line carries what the environment spent on it (``cost``: wall time, harness,
agent and test CPU, peak memory, dollars at ``RunOptions.prices``; :mod:`patchgym.grading.cost`),
measured per episode whatever the number of workers, and the report sums them up.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from patchgym.grading.cost import EpisodeCost, Prices, summarize
from patchgym.gym_envs.repo_env import RepoEnv
from patchgym.rollouts.harnesses.episode import run_harness_episode
from patchgym.rollouts.loop import Episode, run_episode
from patchgym.rollouts.model import ChatModel, ModelConfig
from patchgym.rollouts.stats import wilson
from patchgym.tasks.catalog import TaskSet

log = logging.getLogger(__name__)
RUN_FILE, TRAJECTORIES, PREDICTIONS, REPORT = "run.json", "trajectories.jsonl", "predictions.jsonl", "report.json"
# Settings a resumed run must share with the run it continues (else its numbers would mix two runs).
RESUME_KEYS = ("model", "base_url", "temperature", "max_tokens", "max_turns", "max_steps", "tool_mode", "backend",
               "harness")


# A run stops when this many episodes in a row, from its start, were masked for the same model error.
ENDPOINT_STOP_AFTER = 3


class RunDirError(ValueError):
    """The output directory holds another run (different settings)."""


class EndpointDown(RuntimeError):
    """Every episode of the run so far was masked for the same model error: the endpoint is not
    serving, and going on would only mask the rest (an hour of retries at 500 tasks)."""


@dataclass
class RunOptions:
    """What a run needs beyond the model: the environment's bounds, the pool and the prices."""

    output: Path
    workers: int = 1
    max_turns: int = 100
    max_steps: int = 50
    time_limit: float | None = None
    tool_mode: str = "auto"
    backend: str = "local"
    env_options: dict[str, Any] = field(default_factory=dict)
    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0
    observation_limit: int = 20_000
    prices: Prices = field(default_factory=Prices)  # the environment's: per core-hour and GB-hour
    # A harness drives the episodes instead of patchgym's own loop (rollouts.harnesses), its model
    # calls through the recording proxy; record_tokens: whether the proxy asks for token ids.
    harness: Any = None
    record_tokens: str = "auto"


@dataclass
class RunProgress:
    """What a progress display shows (:func:`progress_of`)."""

    total: int
    done: int = 0
    resumed: int = 0  # of done, finished before this invocation (not in its rate)
    resolved: int = 0
    masked: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0


def settings(model: ModelConfig, options: RunOptions) -> dict[str, Any]:
    """A run's settings as run.json and the report keep them (the harness with its version)."""
    params = {**model.public(), "max_turns": options.max_turns, "max_steps": options.max_steps,
              "time_limit": options.time_limit, "tool_mode": options.tool_mode, "backend": options.backend}
    if options.harness is not None:
        params["harness"] = options.harness.describe()
    return params


def run_model(task_set: TaskSet, model: ModelConfig, options: RunOptions, *,
              on_episode: Callable[[dict[str, Any], RunProgress], None] | None = None,
              chat: ChatModel | None = None) -> dict[str, Any]:
    """Run ``model`` on every task of ``task_set`` not finished in ``options.output`` yet; the run
    report (also written, with the predictions, after every episode)."""
    out = options.output
    out.mkdir(parents=True, exist_ok=True)
    params = settings(model, options)
    prior = _read_json(out / RUN_FILE)
    if prior is not None:
        differs = {k: (prior["params"].get(k), params.get(k)) for k in RESUME_KEYS
                   if prior["params"].get(k) != params.get(k)}
        if differs:
            raise RunDirError(f"{out} holds a run with other settings ({differs}); use another --output")
    run_info = {"params": params, "price": {"input_per_mtok": options.input_per_mtok,
                                            "output_per_mtok": options.output_per_mtok,
                                            "core_hour": options.prices.core_hour,
                                            "gb_hour": options.prices.gb_hour},
                "started_at": prior["started_at"] if prior else time.time(), "tasks": list(task_set.ids),
                "model": model.name, "base_url": model.base_url}
    _write_json(out / RUN_FILE, run_info)
    lines = read_trajectories(out)  # read once; kept up to date in memory as episodes finish
    todo = [i for i in task_set.ids if lines.get(i, {}).get("outcome") in (None, "masked")]
    before = sum(i in lines for i in task_set.ids)  # done before this invocation: not in its rate
    lock = threading.Lock()
    own_chat = chat is None
    chat = chat or ChatModel(model)

    def make_env(agent_sandbox_options: dict[str, Any] | None) -> RepoEnv:
        return RepoEnv(task_set, backend=options.backend, max_steps=options.max_steps, time_limit=options.time_limit,
                       prices=options.prices, agent_sandbox_options=agent_sandbox_options, **options.env_options)

    def one(instance_id: str) -> dict[str, Any]:
        try:
            if options.harness is not None:
                episode = run_harness_episode(make_env, task_set, options.harness, model, instance_id,
                                              max_turns=options.max_turns, time_limit=options.time_limit,
                                              record_tokens=options.record_tokens, chat=chat)
            else:
                env = make_env(None)
                try:
                    episode = run_episode(env, chat, instance_id, max_turns=options.max_turns,
                                          tool_mode=options.tool_mode, observation_limit=options.observation_limit)
                finally:
                    env.close()
        except Exception as exc:  # one broken episode must not end a run of hundreds: masked, logged
            log.exception("%s: the episode failed", instance_id)
            episode = Episode(instance_id=instance_id, model=model.name, outcome="masked",
                              end_reason="environment_error", mask_reason=f"{type(exc).__name__}: {exc}")
        return trajectory_line(episode, input_per_mtok=options.input_per_mtok,
                               output_per_mtok=options.output_per_mtok)

    try:
        with ThreadPoolExecutor(max_workers=options.workers, thread_name_prefix="patchgym-run") as pool:
            futures = [pool.submit(one, i) for i in todo]
            fresh: list[dict[str, Any]] = []  # this invocation's episodes
            try:
                for future in as_completed(futures):
                    line = future.result()
                    fresh.append(line)
                    with lock:
                        _append_line(out / TRAJECTORIES, json.dumps(line, ensure_ascii=False))
                        lines[line["instance_id"]] = line
                        write_outputs(out, task_set, run_info, lines)
                    if on_episode:
                        on_episode(line, progress_of(task_set, lines, before))
                    down = endpoint_down(fresh, ENDPOINT_STOP_AFTER) if len(fresh) < len(todo) else None
                    if down:  # and episodes are left to mask: stop them
                        raise EndpointDown(f"stopped: the first {len(fresh)} episodes were all masked for the "
                                           f"same model error: {down}")
            except BaseException:  # interrupted: start nothing new; running episodes end and close
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    finally:
        if own_chat:
            chat.close()
    return write_outputs(out, task_set, run_info, lines)


def trajectory_line(episode: Episode, *, input_per_mtok: float = 0.0, output_per_mtok: float = 0.0) -> dict[str, Any]:
    """An episode as a line of trajectories.jsonl (``docs/run.md``), also what /v1/rollouts answers:
    ``cost_usd`` is the model's (tokens), ``cost`` the environment's."""
    line = asdict(episode)
    line["cost_usd"] = round(episode.token_cost(input_per_mtok, output_per_mtok), 6)
    # keyed by instance, as SWE-bench's own report files are
    line["report"] = {episode.instance_id: episode.report} if episode.report is not None else None
    return line


def read_trajectories(out: Path) -> dict[str, dict[str, Any]]:
    """The finished episodes of a run directory, by instance (the last line of an instance wins; a
    line cut short by a crash is skipped)."""
    path = out / TRAJECTORIES if out.is_dir() else out
    lines: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return lines
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict) and "instance_id" in line:
            lines[line["instance_id"]] = line
    return lines


def write_outputs(out: Path, task_set: TaskSet, run_info: dict[str, Any], lines: dict[str, dict[str, Any]]) -> dict:
    """Rewrite predictions.jsonl and report.json from the episodes (atomically each)."""
    model = run_info["model"]
    preds = "".join(json.dumps({"instance_id": i, "model_name_or_path": model, "model_patch": t.get("patch") or ""})
                    + "\n" for i, t in lines.items() if t["outcome"] != "masked")
    _write_text(out / PREDICTIONS, preds)
    report = run_report(task_set, lines, run_info)
    _write_json(out / REPORT, report)
    return report


def run_report(task_set: TaskSet, lines: dict[str, dict[str, Any]], run_info: dict[str, Any]) -> dict[str, Any]:
    done = [lines[i] for i in task_set.ids if i in lines]
    prices = Prices(**{k: v for k, v in run_info["price"].items() if k in ("core_hour", "gb_hour")})
    scored = [t for t in done if t["outcome"] != "masked"]
    resolved = sum(t["outcome"] == "resolved" for t in scored)
    return {
        "model": run_info["model"], "base_url": run_info["base_url"], "params": run_info["params"],
        "price": run_info["price"], "total": len(task_set.ids), "completed": len(done), "scored": len(scored),
        "resolved": resolved, "unresolved": len(scored) - resolved, "masked": len(done) - len(scored),
        "resolved_rate": round(resolved / len(scored), 4) if scored else None,
        # how each grading ended, in grading.labels' vocabulary (episodes never graded: none)
        "grading_outcomes": dict(sorted(Counter(t.get("grading_outcome") or "none" for t in done).items())),
        "ci95": [round(x, 4) for x in wilson(resolved, len(scored))] if scored else None,
        "tokens_in": sum(t["tokens_in"] for t in done), "tokens_out": sum(t["tokens_out"] for t in done),
        "cost_usd": round(sum(t["cost_usd"] for t in done), 6),
        "wall_seconds": round(sum(t["wall_seconds"] for t in done), 3),
        "steps_total": sum(t["steps"] for t in done),
        # the model's slips: refused tool calls and turns with none it could read (episodes before
        # these were counted have none)
        "invalid_calls_total": sum(t.get("invalid_calls") or 0 for t in done),
        "format_errors_total": sum(t.get("format_errors") or 0 for t in done),
        # every episode's environment cost, masked ones too: the machine spent it
        "cost": summarize([EpisodeCost.from_dict(t["cost"]) for t in done if t.get("cost")], prices),
        "instances": [{"repo": task_set.get(t["instance_id"]).repo,
                       **{k: t.get(k) for k in ("instance_id", "outcome", "grading_outcome", "end_reason", "reward",
                                                "steps", "turns", "invalid_calls", "format_errors", "wall_seconds",
                                                "tokens_in", "tokens_out", "cost_usd", "cost", "mask_reason")}}
                      for t in done],
    }


def endpoint_down(episodes: list[dict[str, Any]], needed: int) -> str | None:
    """The model error that masked every one of ``episodes`` (at least ``needed`` of them), else None.
    Errors are the same when they agree up to their detail (``the model answered 503``, ``cannot
    reach the model at URL``): the rest carries request ids and counts."""
    if needed < 1 or len(episodes) < needed:
        return None
    reasons = {str(e.get("mask_reason") or "").split(": ")[0] for e in episodes
               if e.get("outcome") == "masked" and e.get("end_reason") == "model_error"}
    if len(reasons) != 1 or sum(e.get("end_reason") == "model_error" for e in episodes) != len(episodes):
        return None
    return str(episodes[-1].get("mask_reason") or "")[:500]


def progress_of(task_set: TaskSet, lines: dict[str, dict[str, Any]], resumed: int = 0) -> RunProgress:
    """What a progress display shows, from the episodes finished so far (``resumed``: of them,
    those finished before this invocation)."""
    done = [lines[i] for i in task_set.ids if i in lines]
    return RunProgress(total=len(task_set.ids), done=len(done), resumed=resumed,
                       resolved=sum(t["outcome"] == "resolved" for t in done),
                       masked=sum(t["outcome"] == "masked" for t in done),
                       tokens_in=sum(t["tokens_in"] for t in done), tokens_out=sum(t["tokens_out"] for t in done),
                       cost_usd=sum(t["cost_usd"] for t in done))


def _append_line(path: Path, text: str) -> None:
    """Append one line; after a line cut short by a killed run, on a line of its own (else both
    would be one unreadable line)."""
    with path.open("ab") as fh:
        if fh.tell() > 0:
            with path.open("rb") as check:
                check.seek(-1, os.SEEK_END)
                if check.read(1) != b"\n":
                    fh.write(b"\n")
        fh.write(text.encode("utf-8") + b"\n")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, IsADirectoryError):
        return None


def _write_json(path: Path, value: Any) -> None:
    _write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
