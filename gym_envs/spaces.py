"""Spaces for text environments that hold what programs really print, and the tool calls agents send."""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from typing import Any

from gymnasium import spaces

from patchgym.gym_envs.actions import InvalidAction, parse_tool_call

# What sample() draws from; contains() accepts any Unicode (gymnasium's Text only holds its charset).
SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n\téß日本語→✓"
# JSON schema types of tool parameters, as Python types (bool is not an integer here).
_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                            "boolean": (bool,), "array": (list,), "object": (dict,)}


class UnicodeText(spaces.Text):
    """A :class:`gymnasium.spaces.Text` holding any Unicode string of ``min_length``..``max_length``
    characters, the empty string included (tool output is often empty).

    Text cannot travel through Gymnasium's shared memory (strings are immutable and the buffer
    holds charset indices), so vector environments need ``AsyncVectorEnv(..., shared_memory=False)``.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length=max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


class ToolCalls(spaces.Space[Any]):
    """The tool calls an environment carries out: ``{"name": ..., "arguments": {...}}`` for one of
    ``tools`` (OpenAI function schemas), as a dict, as OpenAI's ``tool_calls`` element
    (``{"type": "function", "function": {...}}``) or as JSON text of either, arguments as an object
    or JSON text (what :func:`patchgym.gym_envs.actions.parse_tool_call` reads).

    ``contains`` holds what the environment would run rather than refuse as an invalid action: a
    known tool, every required argument given, none it does not declare, each of its declared
    JSON type (and one of its ``enum``), the whole at most ``max_length`` characters as JSON.
    Anything else is still accepted by ``step``, which answers with an explanation
    (``info["invalid_action"]``): outside the space, yet not an error.

    ``sample`` draws a tool uniformly with arguments that are quick and harmless (``bash`` runs an
    ``echo``, the editor views the repository root, ``submit`` submits), so that a random policy
    and ``check_env`` exercise every tool without running arbitrary text. Like ``Text``, it cannot
    live in Gymnasium's shared memory (``AsyncVectorEnv(..., shared_memory=False)``).
    """

    def __init__(self, tools: Sequence[dict[str, Any]], *, max_length: int, seed: Any = None) -> None:
        self.schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        try:
            name, arguments = parse_tool_call(x)
        except InvalidAction:
            return False
        schema = self.schemas.get(name)
        if schema is None or not _fits(arguments, schema):
            return False
        try:
            return len(x if isinstance(x, (str, bytes, bytearray)) else json.dumps(x)) <= self.max_length
        except (TypeError, ValueError):
            return False

    def sample(self, mask: Any = None, probability: Any = None) -> dict[str, Any]:
        if mask is not None or probability is not None:
            raise NotImplementedError("ToolCalls.sample takes no mask or probability")
        name = list(self.schemas)[int(self.np_random.integers(len(self.schemas)))]
        word = "".join(self.np_random.choice(list(string.ascii_lowercase), size=8))
        arguments: dict[str, Any] = {}
        props = self.schemas[name].get("properties") or {}
        if "command" in props and props["command"].get("enum"):  # the editor: look, change nothing
            arguments = {"command": "view", "path": "."} if "view" in props["command"]["enum"] else {}
        elif "command" in props:  # bash
            arguments = {"command": f"echo {word}"}
        return {"name": name, "arguments": arguments}

    def __repr__(self) -> str:
        return f"ToolCalls({', '.join(self.schemas)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolCalls) and (self.schemas, self.max_length) == (other.schemas, other.max_length)

    def __hash__(self) -> int:
        return hash((tuple(self.schemas), self.max_length))


def _fits(arguments: dict[str, Any], schema: dict[str, Any]) -> bool:
    """Whether ``arguments`` satisfy a tool's parameter schema (required, declared, typed, enum)."""
    props = schema.get("properties") or {}
    if any(key not in arguments for key in schema.get("required") or ()):
        return False
    for key, value in arguments.items():
        spec = props.get(key)
        if spec is None:
            return False
        types = _JSON_TYPES.get(spec.get("type", ""), (object,))
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return False
        if "enum" in spec and value not in spec["enum"]:
            return False
        if isinstance(value, list) and isinstance(spec.get("items"), dict):
            item_types = _JSON_TYPES.get(spec["items"].get("type", ""), (object,))
            if not all(isinstance(v, item_types) and not (isinstance(v, bool) and bool not in item_types)
                       for v in value):
                return False
    return True
