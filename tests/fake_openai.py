"""An OpenAI-compatible chat endpoint for the tests, over real HTTP, that replays scripted turns.

A script is a list of turns; the turn a request asks for is the number of assistant messages
already in it. A turn is a reply (tool calls or text), or a failure: an HTTP status with a body, a
delay past the client's deadline, or a refusal of ``tools``. Requests are recorded.
"""

from __future__ import annotations

import asyncio
import json
import threading
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
        self.refuse_tools = False  # a model served without tool calling (vLLM without auto tool choice)
        self.models: list[str] | None = None  # what GET /v1/models lists (None: no such route, a 404)
        self.key: str | None = None  # the only API key accepted (None: any, or none)
        self.failures_served: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self.app = FastAPI()
        self.app.get("/healthz")(lambda: {"status": "ok"})
        self.app.post("/v1/chat/completions")(self._complete)
        self.app.get("/v1/models")(self._models)

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
        user = next((m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "user"), "")
        for marker, script in self.scripts.items():
            if marker in user:
                return marker, script
        return "", self.default

    async def _complete(self, request: Request) -> JSONResponse:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
        refused = self._refused(request)
        if refused is not None:
            return refused
        if self.models is not None and body.get("model") not in self.models:
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist."}},
                                status_code=404)
        if self.refuse_tools and body.get("tools"):
            return JSONResponse({"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice'}},
                                status_code=400)
        marker, script = self.script_for(body)
        turn_index = sum(m.get("role") == "assistant" for m in body.get("messages", []))
        turn = script[turn_index] if turn_index < len(script) else Turn(text="I am done.")
        with self._lock:
            served = self.failures_served.get((marker, turn_index), 0)
            failing = served < turn.failures
            if failing:
                self.failures_served[(marker, turn_index)] = served + 1
        if failing:
            if turn.delay:
                await asyncio.sleep(turn.delay)
            headers = {"Retry-After": str(turn.retry_after)} if turn.retry_after is not None else None
            return JSONResponse({"error": {"message": turn.error}}, status_code=turn.status, headers=headers)
        message: dict[str, Any] = {"role": "assistant", "content": turn.text}
        if turn.calls:
            message["tool_calls"] = [
                {"id": f"call_{turn_index}_{i}", "type": "function",
                 "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                for i, (name, args) in enumerate(turn.calls)]
        return JSONResponse({"id": "chatcmpl-1", "object": "chat.completion", "model": body.get("model"),
                             "choices": [{"index": 0, "message": message,
                                          "finish_reason": "tool_calls" if turn.calls else "stop"}],
                             "usage": {"prompt_tokens": 100 + 10 * turn_index, "completion_tokens": 7,
                                       "total_tokens": 107 + 10 * turn_index}})
