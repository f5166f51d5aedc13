"""Recording episodes as JSONL: one line per episode, usable as SFT or rejection-sampling data."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

# Step info keys worth keeping per step (the terminal report is kept once, at the episode level).
STEP_INFO_KEYS = ("step", "tool", "invalid_action", "error", "exit_code", "elapsed")


class TrajectoryRecorder(gym.Wrapper):
    """Append each episode to ``path`` as one JSON line.

    A line holds the task, the first observation and its info, every step (action, observation,
    reward, termination, timing), the final reward, the verifier's report and what the episode
    cost (``cost``: :mod:`patchgym.grading.cost`). An episode cut short
    by ``reset()`` or ``close()`` is still written, with ``"finished": false``. ``metadata`` (for
    instance the model name and sampling settings) is copied into every line.
    """

    _locks: dict[str, threading.Lock] = {}

    def __init__(self, env: gym.Env, path: str | Path, *, metadata: dict[str, Any] | None = None) -> None:
        super().__init__(env)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.metadata_extra = dict(metadata or {})
        self._lock = self._locks.setdefault(str(self.path.resolve()), threading.Lock())
        self._episode: dict[str, Any] | None = None
        self._last_step = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._flush(finished=False)
        observation, info = self.env.reset(seed=seed, options=options)
        now = time.time()
        self._episode = {
            "instance_id": info.get("instance_id"), "seed": seed, "options": options,
            "metadata": self.metadata_extra, "started_at": now,
            "observation": observation, "info": _jsonable(info), "steps": [],
        }
        self._last_step = time.monotonic()
        return observation, info

    def step(self, action: Any):
        started = time.monotonic()
        observation, reward, terminated, truncated, info = self.env.step(action)
        if self._episode is not None:
            self._episode["steps"].append({
                "action": _jsonable(action), "observation": observation, "reward": float(reward),
                "terminated": bool(terminated), "truncated": bool(truncated),
                "info": {k: _jsonable(info[k]) for k in STEP_INFO_KEYS if k in info},
                "seconds": round(time.monotonic() - started, 4),
                "think_seconds": round(started - self._last_step, 4),  # time the agent took to act
            })
            if terminated or truncated:
                self._episode.update({
                    "reward": float(reward), "resolved": info.get("resolved"),
                    "infrastructure_failure": info.get("infrastructure_failure", False),
                    "report": _jsonable(info.get("report")), "patch": info.get("patch"),
                    "cost": _jsonable(info.get("cost")),
                })
                self._flush(finished=True)
        self._last_step = time.monotonic()
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        self._flush(finished=False)
        super().close()

    def _flush(self, *, finished: bool) -> None:
        episode, self._episode = self._episode, None
        if episode is None:
            return
        episode["finished"] = finished
        episode["seconds"] = round(time.time() - episode["started_at"], 3)
        episode.setdefault("reward", 0.0)
        line = json.dumps(episode, ensure_ascii=False) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(line)


def _jsonable(value: Any) -> Any:
    """Best-effort JSON form (actions may be dicts, JSON strings, or anything a client sent)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)
