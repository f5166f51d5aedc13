"""Tool calls in OpenAI function-call form: ``{"name": ..., "arguments": {...}}``, as a dict or JSON."""

from __future__ import annotations

import json
from typing import Any


class InvalidAction(ValueError):
    """The action is not a well-formed tool call; the message is shown to the agent."""


def parse_tool_call(action: Any) -> tuple[str, dict[str, Any]]:
    """Return ``(name, arguments)``; accepts a dict or a JSON string, arguments as a dict or JSON.

    Also accepts the OpenAI ``tool_calls`` element shape ``{"function": {"name", "arguments"}}``.
    """
    if isinstance(action, (bytes, bytearray)):
        action = action.decode("utf-8", errors="replace")
    if isinstance(action, str):
        try:
            action = json.loads(action)
        except json.JSONDecodeError as exc:
            raise InvalidAction(f"the action is not valid JSON ({exc.msg} at position {exc.pos}); send "
                                '{"name": "<tool>", "arguments": {...}}') from None
    if not isinstance(action, dict):
        raise InvalidAction(f"the action must be an object with 'name' and 'arguments', not {type(action).__name__}")
    if "function" in action and isinstance(action["function"], dict):
        action = action["function"]
    name = action.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidAction("the action has no tool 'name'")
    arguments = action.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise InvalidAction(f"the arguments of {name!r} are not valid JSON ({exc.msg})") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise InvalidAction(f"the arguments of {name!r} must be an object, not {type(arguments).__name__}")
    return name, arguments
