"""The recording model proxy: an OpenAI-compatible endpoint between a harness and the real model.

A harness (mini-swe-agent, a command-line agent) is pointed at the proxy instead of the model. The
proxy forwards ``POST /v1/chat/completions`` and ``POST /v1/responses`` to the endpoint of a
:class:`~patchgym.rollouts.model.ModelConfig`, through :meth:`ChatModel.send`, so deadlines, retries
and failure classes are those of ``patchgym run``, and records every exchange (:attr:`ModelProxy.calls`),
with the token ids and log-probabilities where the endpoint returns them (it asks vLLM-style servers
for them, and stops asking an endpoint that refuses the fields).

What the harness cannot choose: the upstream (one endpoint per proxy), the key (the proxy adds it;
the harness gets none, so none enters a sandbox), the model name and the run's sampling settings
(both overwritten), the size of a request and how many calls an episode makes (``max_calls``).
After the budget is spent, the endpoint failed, or the episode was stopped, every call is refused
(400) and :attr:`ModelProxy.stopped` is set, so a harness ends instead of retrying.

Streaming is answered from one upstream call: ``stream: true`` requests get the whole answer as
server-sent events (one chunk for chat completions; ``response.created``, the output items and
``response.completed`` for responses).

It listens on a loopback TCP port (:attr:`ModelProxy.url`) and, when given one, on a unix socket: a
sandbox without a network reaches the proxy only through that socket, bound into it
(:mod:`patchgym.rollouts.harnesses.bridge`).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from patchgym.rollouts.model import ChatModel, ContextOverflow, ModelConfig, ModelError, RequestRejected

MAX_BODY_BYTES = 32 << 20  # one request, as the harness sends it
MAX_CONCURRENT_CALLS = 4  # a harness's calls in flight at once (the rest wait)
# Fields the proxy adds to chat completions to get token ids and log-probabilities back: the
# OpenAI API's logprobs, vLLM's return_token_ids (>= 0.10.2; older vLLM: tokens as "token_id:N").
TOKEN_FIELDS = {"logprobs": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
RECORD_TOKENS = ("auto", "on", "off")
APIS = {"/v1/chat/completions": ("chat", "/chat/completions"), "/v1/responses": ("responses", "/responses")}


class ModelProxy:
    """One episode's proxy (a context manager): ``url`` for harnesses on this host, ``unix_socket``
    for one in a sandbox. ``max_calls``: upstream calls the episode may make (None: no bound).
    ``record_tokens``: ``auto`` asks for token ids and stops asking an endpoint that refuses the
    fields; ``on`` always asks; ``off`` never does. ``on_stop(reason)`` is called once, when the
    proxy starts refusing calls (an in-sandbox harness is stopped then)."""

    def __init__(self, config: ModelConfig, *, max_calls: int | None = None, record_tokens: str = "auto",
                 unix_socket: Path | None = None, chat: ChatModel | None = None,
                 on_stop: Callable[[str], None] | None = None) -> None:
        if record_tokens not in RECORD_TOKENS:
            raise ValueError(f"record_tokens must be one of {', '.join(RECORD_TOKENS)}, not {record_tokens!r}")
        self.config = config
        self.max_calls = max_calls
        self.record_tokens = record_tokens
        self.unix_socket = unix_socket
        self.calls: list[dict[str, Any]] = []  # every exchange, in the order they ended
        self.failure: str | None = None  # the endpoint failed (ModelError): the episode is masked
        self.overflow: str | None = None  # the last call that did not fit the model's context
        self.stopped: str | None = None  # why calls are refused now (budget, failure, stop())
        self.started = 0  # calls let through to the endpoint
        self.budget_spent = False  # a call was refused for max_calls
        self._on_stop = on_stop
        self._own_chat = chat is None
        self._chat = chat or ChatModel(config)
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_CALLS)
        self._tokens_refused = record_tokens == "off"
        self._last_request: dict[str, Any] | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- life -------------------------------------------------------------------------------

    def __enter__(self) -> ModelProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Listen (loopback, and the unix socket if any) and serve in a background thread."""
        sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM)]
        sockets[0].bind(("127.0.0.1", 0))
        if self.unix_socket is not None:
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.unix_socket.unlink(missing_ok=True)
            unix.bind(str(self.unix_socket))
            os.chmod(self.unix_socket, 0o666)  # whatever user the sandbox's commands run as
            sockets.append(unix)
        port = sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": sockets}, daemon=True,
                                        name="patchgym-model-proxy")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the model proxy did not start")
            time.sleep(0.01)

    def close(self) -> None:
        """Stop serving (idempotent); calls still running end with the episode's deadline."""
        self.stop("the episode is over")
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)
        if self._own_chat:
            self._chat.close()

    def stop(self, reason: str) -> None:
        """Refuse every further call (the first reason given stays)."""
        with self._lock:
            first = self.stopped is None
            self.stopped = self.stopped or reason
        if first and self._on_stop is not None:
            self._on_stop(reason)

    # -- the API ----------------------------------------------------------------------------

    def _app(self) -> FastAPI:
        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
        app.get("/healthz")(lambda: {"status": "ok"})
        app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": self.config.name, "object": "model"}]})
        for path in APIS:
            app.post(path)(self._handler(path))
        return app

    def _handler(self, path: str):
        api, upstream_path = APIS[path]

        async def handle(request: Request) -> Response:
            raw = await request.body()
            if len(raw) > MAX_BODY_BYTES:
                return _error(413, f"the request is larger than {MAX_BODY_BYTES} bytes")
            try:
                body = json.loads(raw)
            except ValueError:
                return _error(400, "the request body is not JSON")
            if not isinstance(body, dict):
                return _error(400, "the request body is not a JSON object")
            status, answer = await anyio.to_thread.run_sync(lambda: self.forward(api, upstream_path, body),
                                                            abandon_on_cancel=True)
            if status == 200 and body.get("stream"):
                events = _chat_events(answer, body) if api == "chat" else _responses_events(answer)
                return StreamingResponse(events, media_type="text/event-stream")
            return JSONResponse(answer, status_code=status)

        return handle

    def forward(self, api: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One call of the harness: the status and JSON answer it gets; recorded either way."""
        with self._lock:
            spent = self.stopped is None and self.max_calls is not None and self.started >= self.max_calls
            refused = self.stopped
            if refused is None and not spent:
                self.started += 1
        if spent:
            self.budget_spent = True
            self.stop(f"the episode's {self.max_calls} model calls are spent")
            refused = self.stopped
        if refused is not None:
            return _refusal(refused)
        sent = self._outgoing(api, body)
        started = time.monotonic()
        record: dict[str, Any] = {"api": api, "request": sent}
        with self._slots:
            status, answer = self._call(path, sent, record)
        record["seconds"] = round(time.monotonic() - started, 3)
        record["status"] = status
        if status == 200:
            record.update(_token_info(answer) if api == "chat" else {})
            record["response"] = _without_token_fields(answer)
            usage = answer.get("usage") or {}
            record["tokens_in"] = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
            record["tokens_out"] = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
        else:
            record["error"] = answer.get("error", {}).get("message")
        with self._lock:
            record["index"] = len(self.calls)
            record["request"] = _delta(self._last_request, sent)
            self._last_request = sent
            self.calls.append(record)
        return status, answer

    def _outgoing(self, api: str, body: dict[str, Any]) -> dict[str, Any]:
        """The request as the endpoint gets it: the run's model and sampling, no streaming."""
        sent = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        sent["model"] = self.config.name
        sent["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            sent["max_output_tokens" if api == "responses" else "max_tokens"] = self.config.max_tokens
        sent.update(self.config.extra)
        if api == "chat" and not self._tokens_refused:
            sent.update(TOKEN_FIELDS)
        return sent

    def _call(self, path: str, sent: dict[str, Any], record: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            try:
                return 200, self._chat.send(path, sent).json()
            except RequestRejected as exc:
                if self.record_tokens != "auto" or not _names_token_fields(exc.text, sent):
                    raise
                self._tokens_refused = True  # this endpoint does not take them: ask no more
                for field in TOKEN_FIELDS:
                    sent.pop(field, None)
                return 200, self._chat.send(path, sent).json()
        except ContextOverflow as exc:
            self.overflow = str(exc)
            record["outcome"] = "context_overflow"
            return 400, {"error": {"message": str(exc), "type": "invalid_request_error",
                                   "code": "context_length_exceeded"}}
        except RequestRejected as exc:  # the request's own doing: the harness hears what the endpoint said
            record["outcome"] = "rejected"
            try:
                return exc.status, json.loads(exc.text)
            except ValueError:
                return exc.status, {"error": {"message": exc.text, "type": "invalid_request_error"}}
        except ModelError as exc:
            self._failed(str(exc))
            record["outcome"] = "model_error"
            return 502, {"error": {"message": f"patchgym proxy: {exc}", "type": "model_error"}}
        except ValueError as exc:  # a 200 whose body is not JSON: the endpoint failing
            self._failed(f"the model's answer is not JSON: {exc}")
            record["outcome"] = "model_error"
            return 502, {"error": {"message": "patchgym proxy: the model's answer is not JSON", "type": "model_error"}}

    def _failed(self, reason: str) -> None:
        with self._lock:
            self.failure = self.failure or reason
        self.stop(f"the model endpoint failed: {reason}")

    # -- what a run keeps -------------------------------------------------------------------

    def usage(self) -> tuple[int, int]:
        """Tokens in and out over every answered call."""
        with self._lock:
            return (sum(c.get("tokens_in", 0) for c in self.calls), sum(c.get("tokens_out", 0) for c in self.calls))


def expand_requests(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The full requests of recorded calls (each stores only what its predecessor's did not hold)."""
    full: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    for call in calls:
        request = dict(call["request"])
        prefix = request.pop("prefix", None)
        if prefix is not None and previous is not None:
            key = prefix["field"]
            request[key] = list(previous.get(key) or [])[:prefix["items"]] + list(request.get(key) or [])
        full.append(request)
        previous = request
    return full


def _delta(previous: dict[str, Any] | None, sent: dict[str, Any]) -> dict[str, Any]:
    """``sent`` with the leading messages (or response input items) it shares with ``previous``
    left out: a harness resends its whole conversation on every call, and the record stays linear."""
    key = "messages" if "messages" in sent else "input"
    items, before = sent.get(key), (previous or {}).get(key)
    if not isinstance(items, list) or not isinstance(before, list):
        return sent
    shared = 0
    while shared < min(len(items), len(before)) and items[shared] == before[shared]:
        shared += 1
    if shared == 0:
        return sent
    return {**sent, key: items[shared:], "prefix": {"field": key, "items": shared}}


def _names_token_fields(text: str, sent: dict[str, Any]) -> bool:
    lowered = text.lower()
    return any(field in lowered for field in TOKEN_FIELDS if field in sent)


def _token_info(answer: dict[str, Any]) -> dict[str, Any]:
    """Token ids and log-probabilities of a chat completion, where the endpoint returned them: vLLM's
    ``prompt_token_ids`` and ``choices[0].token_ids``, or its "token_id:N" tokens in ``logprobs``."""
    try:
        choice = answer["choices"][0]
    except (KeyError, IndexError, TypeError):
        return {}
    info: dict[str, Any] = {"finish_reason": choice.get("finish_reason")}
    prompt = answer.get("prompt_token_ids") or choice.get("prompt_token_ids")
    if _ints(prompt):
        info["prompt_token_ids"] = list(prompt)
    content = ((choice.get("logprobs") or {}).get("content")) or []
    logprobs = [float(t["logprob"]) for t in content if isinstance(t, dict) and "logprob" in t]
    ids = choice.get("token_ids")
    if not _ints(ids) and content:
        parsed = [_token_id(t.get("token")) for t in content if isinstance(t, dict)]
        ids = parsed if parsed and all(i is not None for i in parsed) else None
    if _ints(ids):
        info["token_ids"] = list(ids)
    if logprobs and (not _ints(ids) or len(logprobs) == len(ids)):
        info["logprobs"] = logprobs
    return info


def _ints(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(i, int) for i in value)


def _token_id(token: Any) -> int | None:
    if isinstance(token, str) and token.startswith("token_id:") and token[9:].isdigit():
        return int(token[9:])
    return None


def _without_token_fields(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer as recorded: token ids and log-probabilities are kept apart, once."""
    out = {k: v for k, v in answer.items() if k != "prompt_token_ids"}
    if isinstance(out.get("choices"), list):
        out["choices"] = [{k: v for k, v in c.items() if k not in ("logprobs", "token_ids", "prompt_token_ids")}
                          if isinstance(c, dict) else c for c in out["choices"]]
    return out


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": f"patchgym proxy: {message}", "type": "invalid_request_error"}},
                        status_code=status)


def _refusal(reason: str) -> tuple[int, dict[str, Any]]:
    return 400, {"error": {"message": f"patchgym proxy: no more model calls: {reason}", "type": "episode_over"}}


def _sse(event: dict[str, Any], name: str | None = None) -> str:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(event)}\n\n"


def _chat_events(answer: dict[str, Any], body: dict[str, Any]) -> Iterator[str]:
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
    yield _sse({**base, "object": "chat.completion.chunk", "choices": choices})
    if (body.get("stream_options") or {}).get("include_usage") and answer.get("usage"):
        yield _sse({**base, "object": "chat.completion.chunk", "choices": [], "usage": answer["usage"]})
    yield "data: [DONE]\n\n"


def _responses_events(answer: dict[str, Any]) -> Iterator[str]:
    """A response as the events a streaming responses client reads: created, each output item
    added and done, completed."""
    sequence = 0

    def event(kind: str, **fields: Any) -> str:
        nonlocal sequence
        sequence += 1
        return _sse({"type": kind, "sequence_number": sequence, **fields}, kind)

    yield event("response.created", response={**answer, "status": "in_progress", "output": []})
    for index, item in enumerate(answer.get("output") or []):
        yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=answer)
