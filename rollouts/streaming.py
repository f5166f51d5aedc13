"""A whole answer as the server-sent events a streaming client reads (the recording proxy,
:mod:`patchgym.rollouts.proxy`, calls the endpoint once, without streaming, and replays the answer).

Chat completions: one chunk holding the whole message, then the usage chunk if asked for, then
``[DONE]``. Responses: the event sequence the OpenAI API sends, so that clients which build the
answer from the events (Codex CLI reads ``response.output_item.done``; the OpenAI SDK's stream
accumulator checks every delta against the part it was opened for) get the same answer as from the
final ``response.completed``: ``response.created``, ``response.in_progress``, then per output item
``output_item.added`` (the item, empty), its parts opened, their text as one delta, closed, and
``output_item.done`` (the item whole), then ``response.completed`` (or ``response.incomplete`` /
``response.failed``, as the answer's status says).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

Event = Callable[..., str]
FINAL_EVENTS = {"incomplete": "response.incomplete", "failed": "response.failed"}


def sse(data: dict[str, Any], name: str | None = None) -> str:
    """One server-sent event (named, for the Responses API)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def chat_events(answer: dict[str, Any], body: dict[str, Any]) -> Iterator[str]:
    """A chat completion as the stream of one chunk a streaming client reads."""
    base = {k: answer.get(k) for k in ("id", "created", "model")}
    choices = []
    for choice in answer.get("choices") or []:
        message = dict(choice.get("message") or {})
        delta: dict[str, Any] = {"role": message.get("role", "assistant"), "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        for key in ("reasoning_content", "reasoning"):
            if message.get(key):
                delta[key] = message[key]
        choices.append({"index": choice.get("index", 0), "delta": delta, "finish_reason": choice.get("finish_reason")})
    yield sse({**base, "object": "chat.completion.chunk", "choices": choices})
    if (body.get("stream_options") or {}).get("include_usage") and answer.get("usage"):
        yield sse({**base, "object": "chat.completion.chunk", "choices": [], "usage": answer["usage"]})
    yield "data: [DONE]\n\n"


def responses_events(answer: dict[str, Any]) -> Iterator[str]:
    """A response as the Responses API streams it (see the module's docstring)."""
    numbers = itertools.count()

    def event(kind: str, **fields: Any) -> str:
        return sse({"type": kind, "sequence_number": next(numbers), **fields}, kind)

    opening = {**answer, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=opening)
    yield event("response.in_progress", response=opening)
    for index, item in enumerate(answer.get("output") or []):
        if isinstance(item, dict):
            yield from _item_events(event, index, item)
    yield event(FINAL_EVENTS.get(str(answer.get("status")), "response.completed"), response=answer)


def _item_events(event: Event, index: int, item: dict[str, Any]) -> Iterator[str]:
    where = {"output_index": index, "item_id": item.get("id")}
    kind = item.get("type")
    if kind == "message":
        yield event("response.output_item.added", output_index=index,
                    item={**item, "status": "in_progress", "content": []})
        for part_index, part in enumerate(item.get("content") or []):
            yield from _part_events(event, {**where, "content_index": part_index}, part)
    elif kind == "reasoning":
        yield event("response.output_item.added", output_index=index,
                    item={**item, "summary": [], **({"content": []} if "content" in item else {})})
        for part_index, part in enumerate(item.get("summary") or []):
            text, at = part.get("text") or "", {**where, "summary_index": part_index}
            yield event("response.reasoning_summary_part.added", **at, part={**part, "text": ""})
            yield event("response.reasoning_summary_text.delta", **at, delta=text)
            yield event("response.reasoning_summary_text.done", **at, text=text)
            yield event("response.reasoning_summary_part.done", **at, part=part)
        for part_index, part in enumerate(item.get("content") or []):
            text, at = part.get("text") or "", {**where, "content_index": part_index}
            yield event("response.reasoning_text.delta", **at, delta=text)
            yield event("response.reasoning_text.done", **at, text=text)
    elif kind in ("function_call", "custom_tool_call"):
        field, stem = ("arguments", "function_call_arguments") if kind == "function_call" else (
            "input", "custom_tool_call_input")
        text = item.get(field) or ""
        yield event("response.output_item.added", output_index=index, item={**item, field: "", "status": "in_progress"})
        yield event(f"response.{stem}.delta", **where, delta=text)
        yield event(f"response.{stem}.done", **where, **{field: text})
    else:
        yield event("response.output_item.added", output_index=index, item=item)
    yield event("response.output_item.done", output_index=index, item=item)


def _part_events(event: Event, at: dict[str, Any], part: dict[str, Any]) -> Iterator[str]:
    kind = part.get("type")
    field = {"output_text": "text", "refusal": "refusal"}.get(str(kind))
    if field is None:
        yield event("response.content_part.added", **at, part=part)
    else:
        text = part.get(field) or ""
        stem = "output_text" if kind == "output_text" else "refusal"
        yield event("response.content_part.added", **at, part={**part, field: ""})
        yield event(f"response.{stem}.delta", **at, delta=text, **({"logprobs": []} if field == "text" else {}))
        yield event(f"response.{stem}.done", **at, **{field: text}, **({"logprobs": []} if field == "text" else {}))
    yield event("response.content_part.done", **at, part=part)
