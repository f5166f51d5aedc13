"""The text blocks of a trajectory as the page shows them: messages, tool outputs, tool-call
arguments and diffs, each cut to what the page's budget allows (head and tail kept, the cut said).

These are plain values for the templates; nothing here writes HTML (the templates escape).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_OUTPUT_CHARS = 20_000  # each message / tool output shown at most this long (head and tail)
MAX_DIFF_CHARS = 200_000   # the final diff of an episode
# The whole page: once this many characters of messages, outputs and diffs are shown, every later
# one is cut to SMALL_OUTPUT_CHARS (a 500 x 50-step run of 20,000-char outputs would be ~700 MB).
MAX_PAGE_CHARS = 20_000_000
SMALL_OUTPUT_CHARS = 1_000

# Lines of a diff that are its headers, not its content (shown in the muted ``dm`` style).
_DIFF_META = ("+++", "---", "diff ", "index ", "new file", "deleted file", "rename ", "similarity ",
              "old mode", "new mode")


class Budget:
    """How much text the page shows: ``per`` characters per block until ``total`` is spent, then
    ``small``."""

    def __init__(self, per: int, total: int, small: int = SMALL_OUTPUT_CHARS):
        self.per, self.left, self.small = per, total, small
        self.exhausted_at: str | None = None  # the instance id whose text spent the budget
        self.current = ""  # the instance id being rendered

    def take(self, length: int, per: int | None = None) -> int:
        """The most characters of a block of ``length`` the page may show; spends them."""
        cap = (per or self.per) if self.left > 0 else min(self.small, per or self.per)
        self.left -= min(length, cap)
        if self.left <= 0 and self.exhausted_at is None:
            self.exhausted_at = self.current
        return cap


@dataclass(slots=True)
class Shown:
    """A text cut to ``limit``: all of it (``hidden == 0``: ``head`` is the text), or the first 3/4
    and the last 1/4 of the limit with ``hidden`` characters between them not shown."""

    head: str
    tail: str
    hidden: int
    total: int


def clip(text: str, limit: int) -> Shown:
    if len(text) <= limit:
        return Shown(text, "", 0, len(text))
    head_len = limit * 3 // 4
    tail_len = limit - head_len
    return Shown(text[:head_len], text[len(text) - tail_len:] if tail_len else "", len(text) - limit, len(text))


def content_text(content: Any) -> str:
    """A message's content as text: a string, or OpenAI content parts, or anything as JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(json.dumps(part, ensure_ascii=False, default=str))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, indent=2, default=str)


def block(text: Any, budget: Budget) -> Shown | None:
    """A message or output as shown (None: there is no content at all)."""
    if text is None:
        return None
    if not isinstance(text, str):
        text = content_text(text)
    return clip(text, budget.take(len(text)))


@dataclass(slots=True)
class Arguments:
    """A tool call's arguments: ``items`` (key, value as shown) when they are a JSON object, else
    ``whole`` (the JSON re-indented, or the text as sent when ``invalid``)."""

    items: list[tuple[str, Shown | None]]
    whole: Shown | None = None
    invalid: bool = False


def arguments(value: Any, budget: Budget) -> Arguments:
    """Tool-call arguments pretty-printed: one entry per key, strings verbatim (a multi-line
    command or a replaced block reads as itself), other values as indented JSON."""
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return Arguments([], block(value, budget), invalid=True)
    if not isinstance(parsed, dict):
        return Arguments([], block(json.dumps(parsed, ensure_ascii=False, indent=2, default=str), budget))
    return Arguments([(str(key), block(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, indent=2,
                                                                                default=str), budget))
                      for key, v in parsed.items()])


@dataclass(slots=True)
class Diff:
    """A diff as shown: its lines as (CSS class, line) pairs, head and tail when it was cut."""

    head: list[tuple[str, str]]
    tail: list[tuple[str, str]]
    hidden: int
    total: int


def _diff_lines(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith(_DIFF_META):
            cls = "dm"
        elif line.startswith("@@"):
            cls = "dh"
        elif line.startswith("+"):
            cls = "da"
        elif line.startswith("-"):
            cls = "dd"
        else:
            cls = ""
        out.append((cls, line))
    return out


def diff(patch: Any, budget: Budget) -> Diff | None:
    """The final diff of an episode (None: empty, no change to the workspace)."""
    if not isinstance(patch, str) or not patch.strip():
        return None
    shown = clip(patch, budget.take(len(patch), per=MAX_DIFF_CHARS))
    return Diff(_diff_lines(shown.head), _diff_lines(shown.tail), shown.hidden, shown.total)
