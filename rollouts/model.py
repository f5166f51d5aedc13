"""A chat model behind any OpenAI-compatible endpoint (vLLM, SGLang, NIM, a hosted API):
``POST {base_url}/chat/completions`` with deadlines, retries with backoff, and the two ways a call
can fail told apart.

A :class:`ModelError` is the endpoint failing (unreachable, timing out, 5xx past the retries, a
bad key): infrastructure, so the episode is masked, never scored 0. A :class:`ContextOverflow`
is the conversation no longer fitting the model's context: the policy's doing, so the episode
ends and what it did is graded.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

# What servers put in the error of a request that does not fit (OpenAI, vLLM, SGLang, TGI, NIM).
OVERFLOW_MARKERS = ("context_length_exceeded", "maximum context length", "context length", "too many tokens",
                    "prompt is too long", "input is too long", "exceeds the model's", "max_model_len")
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
PROBE_TIMEOUT = 60.0  # seconds each request of ChatModel.check may take at most
# What a request's own content earns (a malformed body, a parameter the server does not take): the
# caller's doing, unlike a bad key (401/403) or an unknown model (404), which are the operator's.
REJECTED_STATUSES = frozenset({400, 413, 422})


class ModelError(RuntimeError):
    """The model endpoint failed (after the retries): infrastructure, not the policy."""


class EndpointUnusable(ModelError):
    """The endpoint cannot serve the run at all (a wrong URL, a refused connection, a bad key, an
    unknown model): found by :func:`check_endpoint` before any episode starts."""


class ContextOverflow(RuntimeError):
    """The conversation does not fit the model's context any more."""


class RequestRejected(RuntimeError):
    """The endpoint refused the request for what it holds (400, 413, 422): not retried, and not the
    endpoint failing. ``status`` and ``text`` are its answer's."""

    def __init__(self, status: int, text: str, message: str) -> None:
        super().__init__(message)
        self.status, self.text = status, text


class ToolsUnsupported(RuntimeError):
    """The endpoint refused the ``tools`` parameter (a model served without tool calling)."""


@dataclass
class ModelConfig:
    """Where the model is and how it is sampled. ``timeout``: one call's deadline (s);
    ``retries``: further attempts after a failed call, with exponential backoff from ``backoff``
    seconds (a server's ``Retry-After`` wins)."""

    name: str
    base_url: str
    api_key: str | None = None
    temperature: float = 0.0
    max_tokens: int | None = None
    timeout: float = 300.0
    retries: int = 4
    backoff: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)  # more body fields (top_p, seed, ...)

    def public(self) -> dict[str, Any]:
        """The settings worth recording with a run (never the key)."""
        return {"model": self.name, "base_url": self.base_url, "temperature": self.temperature,
                "max_tokens": self.max_tokens, **self.extra}


@dataclass
class Reply:
    """One assistant turn: the message as the API gave it, and what it cost."""

    message: dict[str, Any]
    tokens_in: int
    tokens_out: int
    finish_reason: str | None


class ChatModel:
    """Chat completions over one pooled HTTP client (safe to share between threads)."""

    def __init__(self, config: ModelConfig, *, client: httpx.Client | None = None,
                 sleep: Any = time.sleep) -> None:
        self.config = config
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._client = client or httpx.Client(base_url=config.base_url.rstrip("/"), headers=headers,
                                              timeout=httpx.Timeout(config.timeout, connect=min(30.0, config.timeout)))
        self._sleep = sleep
        self._lock = threading.Lock()
        self.calls = 0

    def close(self) -> None:
        self._client.close()

    def check(self) -> str | None:
        """One small look at the endpoint before a run: ``GET /models`` (the model must be listed),
        else a one-token chat completion. Raises :class:`EndpointUnusable` saying what is wrong;
        returns a warning when it cannot tell (the endpoint refused the probe's parameters)."""
        name, where = self.config.name, self.config.base_url
        listed: list[str] | None = None
        response = self._probe("GET", "/models")
        if response.status_code in (401, 403):
            raise EndpointUnusable(f"{where} refused the API key ({response.status_code}): {_short(response)}")
        if response.status_code == 200:
            try:
                listed = [str(m.get("id")) for m in response.json().get("data") or [] if isinstance(m, dict)]
            except (ValueError, AttributeError):
                listed = None
            if listed and name in listed:
                return None
        response = self._probe("POST", "/chat/completions", json={
            "model": name, "messages": [{"role": "user", "content": "Reply with OK."}], "max_tokens": 1})
        unknown = (f"{where} does not serve the model {name!r}"
                   + (f" (it serves {', '.join(listed[:10])}{' …' if len(listed) > 10 else ''})" if listed else ""))
        if response.status_code == 200:
            return None
        if response.status_code in (401, 403):
            raise EndpointUnusable(f"{where} refused the API key ({response.status_code}): {_short(response)}")
        if response.status_code == 404:
            raise EndpointUnusable(f"{unknown}: {_short(response)}" if listed or "model" in response.text.lower()
                                   else f"{where}/chat/completions answered 404 (is --base-url the API root, "
                                        f"e.g. http://host:8000/v1?): {_short(response)}")
        if response.status_code in RETRY_STATUSES:
            raise EndpointUnusable(f"{where} keeps failing ({response.status_code}): {_short(response)}")
        if listed:
            raise EndpointUnusable(f"{unknown}: {response.status_code} {_short(response)}")
        return f"{where} answered a one-token request with {response.status_code} ({_short(response)}); going on"

    def _probe(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request of :meth:`check`: answered (statuses the run would retry are retried as it
        would), or :class:`EndpointUnusable` for a connection that fails."""
        timeout = min(PROBE_TIMEOUT, self.config.timeout)
        for attempt in range(self.config.retries + 1):
            try:
                response = self._client.request(method, path, timeout=timeout, **kwargs)
            except httpx.TimeoutException:
                raise EndpointUnusable(f"{self.config.base_url} did not answer {method} {path} within "
                                       f"{timeout:g}s") from None
            except httpx.HTTPError as exc:
                raise EndpointUnusable(f"cannot reach {self.config.base_url}: {type(exc).__name__}: {exc}") from None
            if response.status_code not in RETRY_STATUSES or attempt == self.config.retries:
                return response
            wait = _retry_after(response)
            self._sleep(min(wait if wait is not None else self.config.backoff * 2 ** attempt, 60.0))
        raise AssertionError("unreachable")

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Reply:
        """One assistant turn for ``messages`` (with ``tools`` offered when given)."""
        body: dict[str, Any] = {"model": self.config.name, "messages": messages,
                                "temperature": self.config.temperature, **self.config.extra}
        if self.config.max_tokens is not None:
            body["max_tokens"] = self.config.max_tokens
        if tools:
            body["tools"] = tools
        try:
            response = self.send("/chat/completions", body)
        except RequestRejected as exc:
            if exc.status == 400 and tools and _mentions_tools(exc.text):
                raise ToolsUnsupported(exc.text) from None
            raise ModelError(str(exc)) from None
        return _reply(response)

    def send(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST ``body`` to ``path`` under the endpoint's root, retried as :meth:`complete` is; the
        200 answer. Raises :class:`ContextOverflow`, :class:`RequestRejected` (a 4xx the request
        itself caused, not retried) or :class:`ModelError` (the endpoint failing, after the retries)."""
        last = "no attempt made"
        for attempt in range(self.config.retries + 1):
            with self._lock:
                self.calls += 1
            wait: float | None = None
            try:
                response = self._client.post(path, json=body)
            except httpx.TimeoutException:
                last = f"the model did not answer within {self.config.timeout:g}s"
            except httpx.HTTPError as exc:
                last = f"cannot reach the model at {self.config.base_url}: {type(exc).__name__}: {exc}"
            else:
                if response.status_code == 200:
                    return response
                text = response.text[:2000]
                if response.status_code in REJECTED_STATUSES and _overflow(text):
                    raise ContextOverflow(f"the conversation does not fit the model's context: {text}")
                last = f"the model answered {response.status_code}: {text}"
                if response.status_code in REJECTED_STATUSES:
                    raise RequestRejected(response.status_code, text, last)
                if response.status_code not in RETRY_STATUSES:
                    raise ModelError(last)
                wait = _retry_after(response)
            if attempt < self.config.retries:
                backoff = self.config.backoff * 2 ** attempt * (0.5 + random.random() / 2)
                self._sleep(min(wait if wait is not None else backoff, 60.0))
        raise ModelError(f"{last} (after {self.config.retries + 1} attempts)")


def url_problem(base_url: str) -> str | None:
    """What is wrong with ``base_url`` as an API root (None: nothing), before any request: a URL
    without ``http://`` or ``https://`` fails every call of a run, an hour later at 500 tasks."""
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError) as exc:
        return f"--base-url {base_url!r} is not a URL ({exc})"
    if url.scheme not in ("http", "https") or not url.host:
        return f"--base-url {base_url!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8000/v1)"
    return None


def check_endpoint(config: ModelConfig) -> str | None:
    """:func:`url_problem`, then :meth:`ChatModel.check`: raises :class:`EndpointUnusable` with one
    line saying what is wrong; returns a warning, or None."""
    problem = url_problem(config.base_url)
    if problem:
        raise EndpointUnusable(problem)
    model = ChatModel(config)
    try:
        return model.check()
    finally:
        model.close()


def _short(response: httpx.Response) -> str:
    """An error answer in a line: its ``error.message`` when it has one, else its text, cut."""
    text = response.text
    try:
        error = response.json().get("error")
        text = str(error.get("message") if isinstance(error, dict) else error or text)
    except (ValueError, AttributeError):
        pass
    return " ".join(text.split())[:300] or "(no body)"


def _reply(response: httpx.Response) -> Reply:
    try:
        data = response.json()
        choice = data["choices"][0]
        message = dict(choice["message"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"the model's answer is not a chat completion: {response.text[:500]}") from exc
    usage = data.get("usage") or {}
    message.setdefault("role", "assistant")
    if message.get("content") is None and not message.get("tool_calls"):
        message["content"] = ""
    return Reply(message=message, tokens_in=int(usage.get("prompt_tokens") or 0),
                 tokens_out=int(usage.get("completion_tokens") or 0), finish_reason=choice.get("finish_reason"))


def _overflow(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in OVERFLOW_MARKERS)


def _mentions_tools(text: str) -> bool:
    lowered = text.lower()
    return "tool" in lowered and any(w in lowered for w in (
        "not support", "unsupported", "not enabled", "enable-auto-tool-choice", "tool-call-parser", "tool_choice",
        "unknown", "unrecognized"))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def parse_arguments(text: Any) -> Any:
    """A tool call's arguments: the JSON text models send, else the value as it is (the environment
    tells the model what was wrong with it)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text
