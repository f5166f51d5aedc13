"""An OpenAI-compatible chat endpoint for the tests, over real HTTP, that replays scripted turns.

A script is a list of turns; the turn a request asks for is the number of assistant messages
already in it. A turn is a reply (tool calls or text), or a failure: an HTTP status with a body, a
delay past the client's deadline, or a refusal of ``tools``. Requests are recorded.

Asked for them as vLLM is (``return_token_ids``, ``logprobs``), it returns token ids and
log-probabilities: each message is tokenized on its own (role, content, tool calls: one id per
word), so a conversation's prompt is its previous prompt, the reply and what came after, as a real
chat template gives. ``/v1/responses`` answers the same scripts in the Responses API's shape, its
token ids as vLLM or a NeMo Gym model server returns them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


@dataclass
class Turn:
    """One answer: ``calls`` [(name, arguments)] or ``text``. Before it, ``failures`` requests for
    this turn get ``status`` with ``error`` (and ``retry_after``), or wait ``delay`` seconds first
    (past the client's deadline: it gives up, and its retry is the next request)."""

    calls: list[tuple[str, Any]] = field(default_factory=list)
    text: str | None = None
    failures: int = 0
    status: int = 500
    error: str = "internal error"
    retry_after: float | None = None
    delay: float = 0.0


def call(name: str, arguments: Any) -> Turn:
    return Turn(calls=[(name, arguments)])


class FakeModel:
    """The app and its state: ``scripts`` by a marker found in the first user message (else the
    ``default`` script), and every request received."""

    def __init__(self, default: list[Turn] | None = None) -> None:
        self.scripts: dict[str, list[Turn]] = {}
        self.default = default or []
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str] = []  # each request's Authorization header ("" when none)
        self.refuse_tools = False  # a model served without tool calling (vLLM without auto tool choice)
        self.models: list[str] | None = None  # what GET /v1/models lists (None: no such route, a 404)
        self.key: str | None = None  # the only API key accepted (None: any, or none)
        self.failures_served: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self.app = FastAPI()
        self.app.get("/healthz")(lambda: {"status": "ok"})
        self.app.post("/v1/chat/completions")(self._complete)
        self.app.post("/v1/responses")(self._respond)
        self.app.get("/v1/models")(self._models)
        self.token_fields = True  # False: a server that refuses vLLM's token fields (400), as OpenAI's does
        self.responses_tokens = "vllm"  # or "nemo": how /v1/responses returns token ids (see _respond)

    def reset(self) -> None:
        """Forget every script, record and setting (one server serves many tests)."""
        with self._lock:
            self.scripts.clear()
            self.default = []
            self.requests.clear()
            self.authorizations.clear()
            self.failures_served.clear()
            self.refuse_tools = False
            self.models = None
            self.key = None
            self.token_fields = True
            self.responses_tokens = "vllm"

    def _refused(self, request: Request) -> JSONResponse | None:
        if self.key is not None and request.headers.get("authorization") != f"Bearer {self.key}":
            return JSONResponse({"error": {"message": "Incorrect API key provided"}}, status_code=401)
        return None

    async def _models(self, request: Request) -> JSONResponse:
        if self.models is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return self._refused(request) or JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model"} for m in self.models]})

    def script_for(self, body: dict[str, Any]) -> tuple[str, list[Turn]]:
        """The script whose marker a user message holds (text, or the text of its parts)."""
        users = [_text(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user"]
        for marker, script in self.scripts.items():
            if any(marker in text for text in users):
                return marker, script
        return "", self.default

    async def _record(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
            self.authorizations.append(request.headers.get("authorization", ""))
        return body

    async def _failure(self, marker: str, turn_index: int, turn: Turn) -> JSONResponse | None:
        """The turn's failure, while it has failures left to serve."""
        with self._lock:
            served = self.failures_served.get((marker, turn_index), 0)
            failing = served < turn.failures
            if failing:
                self.failures_served[(marker, turn_index)] = served + 1
        if not failing:
            return None
        if turn.delay:
            await asyncio.sleep(turn.delay)
        headers = {"Retry-After": str(turn.retry_after)} if turn.retry_after is not None else None
        return JSONResponse({"error": {"message": turn.error}}, status_code=turn.status, headers=headers)

    async def _complete(self, request: Request) -> JSONResponse:
        body = await self._record(request)
        refused = self._refused(request)
        if refused is not None:
            return refused
        if self.models is not None and body.get("model") not in self.models:
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist."}},
                                status_code=404)
        if not self.token_fields and "return_token_ids" in body:
            return JSONResponse({"error": {"message": "Unrecognized request argument supplied: return_token_ids"}},
                                status_code=400)
        if self.refuse_tools and body.get("tools"):
            return JSONResponse({"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice'}},
                                status_code=400)
        marker, script = self.script_for(body)
        turn_index = sum(m.get("role") == "assistant" for m in body.get("messages", []))
        turn = script[turn_index] if turn_index < len(script) else Turn(text="I am done.")
        failure = await self._failure(marker, turn_index, turn)
        if failure is not None:
            return failure
        message: dict[str, Any] = {"role": "assistant", "content": turn.text}
        if turn.calls:
            message["tool_calls"] = [
                {"id": f"call_{turn_index}_{i}", "type": "function",
                 "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                for i, (name, args) in enumerate(turn.calls)]
        choice: dict[str, Any] = {"index": 0, "message": message,
                                  "finish_reason": "tool_calls" if turn.calls else "stop"}
        answer: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "model": body.get("model"),
                                  "choices": [choice],
                                  "usage": {"prompt_tokens": 100 + 10 * turn_index, "completion_tokens": 7,
                                            "total_tokens": 107 + 10 * turn_index}}
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = [t for m in body.get("messages", []) for t in tokens(m)]
            choice["token_ids"] = tokens(message)
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": f"t{t}", "logprob": -0.5, "bytes": None, "top_logprobs": []}
                                              for t in tokens(message)]}
        return JSONResponse(answer)

    async def _respond(self, request: Request) -> JSONResponse:
        """The Responses API: the script's turn as output items (function calls or a message). Asked
        as vLLM is (``enable_response_messages``), the prompt's and the generation's token ids as its
        ``input_messages`` / ``output_messages``; with ``responses_tokens = "nemo"``, as a NeMo Gym
        model server returns them (on one output item, with log-probabilities)."""
        body = await self._record(request)
        if not self.token_fields and "enable_response_messages" in body:
            return JSONResponse({"error": {"message": "Unknown parameter: 'enable_response_messages'."}},
                                status_code=400)
        items = body.get("input") if isinstance(body.get("input"), list) else [
            {"role": "user", "content": body.get("input") or ""}]
        marker, script = self.script_for({"messages": [i for i in items if isinstance(i, dict) and "role" in i]})
        turn_index = _model_turns(items)
        turn = script[turn_index] if turn_index < len(script) else Turn(text="I am done.")
        failure = await self._failure(marker, turn_index, turn)
        if failure is not None:
            return failure
        output: list[dict[str, Any]] = [
            {"type": "function_call", "id": f"fc_{turn_index}_{i}", "call_id": f"call_{turn_index}_{i}", "name": name,
             "arguments": args if isinstance(args, str) else json.dumps(args), "status": "completed"}
            for i, (name, args) in enumerate(turn.calls)]
        if turn.text is not None:
            output.append({"type": "message", "id": f"msg_{turn_index}", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": turn.text, "annotations": []}]})
        answer: dict[str, Any] = {"id": f"resp_{turn_index}", "object": "response", "model": body.get("model"),
                                  "status": "completed", "output": output,
                                  "usage": {"input_tokens": 100 + 10 * turn_index, "output_tokens": 7,
                                            "total_tokens": 107 + 10 * turn_index}}
        prompt = tokens({"content": body.get("instructions")}) + [t for i in items for t in item_tokens(i)]
        generated = [t for item in output for t in item_tokens(item)]
        if self.responses_tokens == "nemo" and output:
            output[-1].update(prompt_token_ids=prompt, generation_token_ids=generated,
                              generation_log_probs=[-0.25] * len(generated))
        elif body.get("enable_response_messages"):
            answer["input_messages"] = [{"type": "raw_message_tokens", "message": "(prompt)", "tokens": prompt}]
            answer["output_messages"] = [{"type": "raw_message_tokens", "message": "(reply)", "tokens": generated}]
        return JSONResponse(answer)


def tokens(message: dict[str, Any]) -> list[int]:
    """A message's token ids: one per word of its role, content and tool calls (name, arguments)."""
    parts = [str(message.get("role") or ""), str(message.get("content") or "")]
    for tool_call in message.get("tool_calls") or []:
        function = tool_call.get("function") or {}
        parts += [str(function.get("name") or ""), str(function.get("arguments") or "")]
    return [zlib.crc32(word.encode()) % 150_000 for word in " ".join(parts).split()]


def item_tokens(item: dict[str, Any]) -> list[int]:
    """A Responses API item's token ids, as :func:`tokens` counts a message's: an output item and
    the same item sent back as input count the same, so consecutive prompts extend each other."""
    kind = item.get("type") or "message"
    if kind == "message":
        return tokens({"role": item.get("role"), "content": _text(item.get("content"))})
    if kind in ("function_call", "custom_tool_call"):
        return tokens({"content": f"{item.get('name')} {item.get('arguments') or item.get('input') or ''}"})
    if kind in ("function_call_output", "custom_tool_call_output"):
        return tokens({"content": _text(item.get("output"))})
    return tokens({"content": " ".join(_text(part.get("text")) for part in item.get("summary") or [])})


def _model_turns(items: list[Any]) -> int:
    """How many answers of the model a Responses API input holds: each unbroken run of its items
    (messages of the assistant, function calls, reasoning) is one answer."""
    turns, inside = 0, False
    for item in items:
        mine = isinstance(item, dict) and (item.get("role") == "assistant" or item.get("type") in (
            "function_call", "custom_tool_call", "reasoning"))
        turns += mine and not inside
        inside = mine
    return turns


def _text(content: Any) -> str:
    """A message's text: itself, or its parts' text joined."""
    if isinstance(content, list):
        return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return str(content or "")


@contextlib.contextmanager
def scripted_endpoint() -> Iterator[FakeModel]:
    """A :class:`FakeModel` on a real server; its API root (``.../v1``) in ``.url``."""
    from tests.serving import serve

    model = FakeModel()
    with serve(model.app) as url:
        model.url = f"{url}/v1"
        yield model
