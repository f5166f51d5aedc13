"""Trajectories as training data (SFT, rejection sampling): only resolved episodes unless asked
otherwise, never masked ones (the infrastructure failed: the conversation says nothing of the
policy).

``chat``: ``{"messages": [...], "instance_id", "reward", "resolved"}`` (the conversation as the
API saw it, tool calls and tool outputs included). ``openai-ft``: OpenAI's fine-tuning format for
tool use, ``{"messages": [...], "tools": [...]}``, with ``parallel_tool_calls`` false when a turn
never made more than one call.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from patchgym.rollouts.loop import END_NOTE
from patchgym.rollouts.run import read_trajectories

FORMATS = ("chat", "openai-ft")


def export_trajectories(source: Path, fmt: str, *, include_unresolved: bool = False) -> Iterator[dict[str, Any]]:
    """Rows for ``source`` (a run directory or a trajectories.jsonl) in ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; one of: {', '.join(FORMATS)}")
    if not (source / "trajectories.jsonl" if source.is_dir() else source).exists():
        raise FileNotFoundError(f"no trajectories in {source}")
    for line in read_trajectories(source).values():
        if line["outcome"] == "masked" or (line["outcome"] != "resolved" and not include_unresolved):
            continue
        messages = [m for m in line["messages"] if not _is_note(m)]
        if fmt == "chat":
            yield {"messages": messages, "instance_id": line["instance_id"], "reward": line["reward"],
                   "resolved": line["resolved"]}
        else:
            row: dict[str, Any] = {"messages": messages}
            if line.get("tools"):
                row["tools"] = line["tools"]
                row["parallel_tool_calls"] = any(len(m.get("tool_calls") or []) > 1 for m in messages)
            yield row


def _is_note(message: dict[str, Any]) -> bool:
    return message.get("role") == "user" and str(message.get("content") or "").startswith(END_NOTE)
