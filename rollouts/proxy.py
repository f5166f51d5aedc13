"""The recording model proxy: an OpenAI-compatible endpoint between a harness and the real model.

A harness (mini-swe-agent, a command-line agent) is pointed at the proxy instead of the model. The
proxy forwards ``POST /v1/chat/completions`` and ``POST /v1/responses`` to the endpoint of a
:class:`~patchgym.rollouts.model.ModelConfig`, through :meth:`ChatModel.send`, so deadlines, retries
and failure classes are those of ``patchgym run``, and records every exchange (:attr:`ModelProxy.calls`),
with the token ids and log-probabilities where the endpoint returns them (it asks vLLM-style servers
for them, and stops asking an endpoint that refuses the fields: :mod:`patchgym.rollouts.token_ids`).

What the harness cannot choose: the upstream (one endpoint per proxy), the key (the proxy adds it;
the harness gets none, so none enters a sandbox), the model name and the run's sampling settings
(both overwritten), the size of a request and how many calls an episode makes (``max_calls``).
After the budget is spent, the endpoint failed, or the episode was stopped, every call is refused
(400) and :attr:`ModelProxy.stopped` is set, so a harness ends instead of retrying.

Streaming is answered from one upstream call: ``stream: true`` requests get the whole answer as
server-sent events (:mod:`patchgym.rollouts.streaming`: one chunk for chat completions; for
responses, the event sequence the OpenAI API sends, which Codex CLI and the OpenAI SDK read).

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from patchgym.rollouts.model import ChatModel, ContextOverflow, ModelConfig, ModelError, RequestRejected
from patchgym.rollouts.streaming import chat_events, responses_events
from patchgym.rollouts.token_ids import ASK, token_info, without_token_fields

MAX_BODY_BYTES = 32 << 20  # one request, as the harness sends it
MAX_CONCURRENT_CALLS = 4  # a harness's calls in flight at once (the rest wait)
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
        self._tokens_refused: set[str] = set(ASK) if record_tokens == "off" else set()  # APIs not asked
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
                events = chat_events(answer, body) if api == "chat" else responses_events(answer)
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
            status, answer = self._call(api, path, sent, record)
        record["seconds"] = round(time.monotonic() - started, 3)
        record["status"] = status
        if status == 200:
            record.update(token_info(api, answer))
            record["response"] = without_token_fields(api, answer)
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
        if api not in self._tokens_refused:
            sent.update(ASK[api])
        return sent

    def _call(self, api: str, path: str, sent: dict[str, Any], record: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            try:
                return 200, self._chat.send(path, sent).json()
            except RequestRejected as exc:
                if self.record_tokens != "auto" or not _names_token_fields(exc.text, sent, api):
                    raise
                self._tokens_refused.add(api)  # this endpoint does not take them: ask no more
                for field in ASK[api]:
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


def _names_token_fields(text: str, sent: dict[str, Any], api: str) -> bool:
    lowered = text.lower()
    return any(field in lowered for field in ASK[api] if field in sent)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": f"patchgym proxy: {message}", "type": "invalid_request_error"}},
                        status_code=status)


def _refusal(reason: str) -> tuple[int, dict[str, Any]]:
    return 400, {"error": {"message": f"patchgym proxy: no more model calls: {reason}", "type": "episode_over"}}
