"""``AsyncClient``: the native HTTP API for batched rollouts, with retries a trainer can rely on.

    from patchgym.server.async_client import AsyncClient, run_many

    async with AsyncClient("http://127.0.0.1:8000", token=None, max_retries=8) as client:
        async def episode(task_id: str) -> float:
            session = await client.create_session(task_id=task_id)
            try:
                result = await client.step(session.session_id, {"name": "submit", "arguments": {}})
                return result.reward
            finally:
                await client.close_session(session.session_id, missing_ok=True)

        rewards = await run_many([lambda t=t: episode(t) for t in task_ids], concurrency=16)

What is retried, and why:

* **429 and 503** (the server is full or its sandboxes are unavailable) are retried after the
  ``Retry-After`` the server sent (seconds or an HTTP date), else after an exponential backoff
  with jitter; every wait is capped at ``max_retry_delay``. A 429 means the server did nothing
  (capacity is checked before a slot or sandbox is taken), so every request retries it. A 503
  is retried only by requests that are safe to repeat (below): for ``step`` and ``reset`` this
  server's 503 means the session's sandbox broke and the session was closed, so repeating could
  only answer 404 and hide the real failure.
* **Connection errors before the request was sent** (connect error or timeout, pool timeout):
  the server never saw it, so every request retries them.
* **Transport errors after the request may have reached the server** (read errors, timeouts,
  a dropped connection) are retried only by requests that are safe to repeat: ``tasks``,
  ``task``, ``session`` and ``healthz`` (GET), ``close_session`` (DELETE; a 404 after such a
  retry means the first attempt deleted it) and ``verify`` (stateless: a second grading gives
  the same report). ``create_session`` is **not** retried then: the server may have opened a
  session whose id we never received, and a blind retry would open another; that orphan holds a
  capacity slot until the server's idle reaper closes it (``idle_ttl``), so repeated retries
  under a flaky network could fill the server with orphans. ``step`` (it runs a command) and
  ``reset`` (a new sandbox; with no task id it draws another task) are not retried either.
* Any other status (404, 409, 422, 504...) is raised at once.

After ``max_retries`` retries the last failure is raised: a :class:`RetriesExhausted` (a
:class:`~server.client.RemoteEnvError` with ``status_code`` and ``detail``) for a status, the
``httpx`` transport error otherwise. Any 4xx/5xx that is not retried raises
:class:`~server.client.RemoteEnvError`.
"""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import timezone
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from patchgym.server.client import RemoteEnvError
from patchgym.server.models import (
    CreateSessionResponse,
    Health,
    ResetResponse,
    SessionStatus,
    StepResponse,
    TaskView,
    VerifyResponse,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

RETRY_STATUSES = frozenset({429, 503})
# Raised before a byte of the request left: the server cannot have acted on it.
NOT_SENT_ERRORS: tuple[type[httpx.TransportError], ...] = (httpx.ConnectError, httpx.ConnectTimeout,
                                                            httpx.PoolTimeout)


class RetriesExhausted(RemoteEnvError):
    """The server kept answering a retryable status (429/503) for ``attempts`` attempts."""

    def __init__(self, status_code: int, detail: str, attempts: int) -> None:
        super().__init__(status_code, f"{detail} (gave up after {attempts} attempts)")
        self.detail = detail
        self.attempts = attempts


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date (RFC 9110).
    None when absent or unreadable, so the caller falls back to its own backoff; never negative."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # an HTTP date is GMT; a naive one is read as such
            when = when.replace(tzinfo=timezone.utc)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds or seconds == float("inf"):  # NaN or infinite: unreadable
        return None
    return max(0.0, seconds)


def backoff_delay(retry: int, retry_after: float | None, *, base: float, cap: float,
                  rng: random.Random | None = None) -> float:
    """The wait before retry number ``retry`` (0-based). The server's ``Retry-After`` when it sent
    one (plus up to 10% jitter, so a batch told "5 s" does not come back in one burst); else
    ``base * 2**retry`` with "equal jitter" (half fixed, half random). Capped at ``cap`` either way,
    so a server (or a clock) saying "an hour" cannot stall a trainer."""
    rng = rng or random
    if retry_after is not None:
        delay = retry_after + rng.uniform(0, 0.1 * retry_after)
    else:
        exp = base * (2 ** min(retry, 30))
        delay = exp / 2 + rng.uniform(0, exp / 2)
    return max(0.0, min(delay, cap))


def _detail(response: httpx.Response) -> str:
    """The error body's ``detail`` as text (FastAPI's 422 detail is a list: stringified)."""
    try:
        body = response.json()
    except ValueError:
        return response.text
    detail = body.get("detail", response.text) if isinstance(body, dict) else body
    return detail if isinstance(detail, str) else str(detail)


class AsyncClient:
    """An async client of the native ``/v1`` API; one per event loop, shared by many rollouts.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8000``.
        token: bearer token, when the server requires one.
        max_retries: retries after the first attempt (see the module docstring for which failures).
        timeout: seconds one request may take (a reset may build an environment; a submit runs the
            tests); ``connect_timeout`` for connecting.
        max_retry_delay: cap of one wait between attempts, seconds (also caps ``Retry-After``).
        backoff_base: first backoff, seconds, when the server sent no ``Retry-After``.
        max_connections: connection pool size (the server bounds sessions anyway).
        transport: an ``httpx`` transport (tests: ``httpx.MockTransport``, ``httpx.ASGITransport``).
    """

    def __init__(self, url: str, token: str | None = None, *, max_retries: int = 5, timeout: float = 1800.0,
                 connect_timeout: float = 10.0, max_retry_delay: float = 60.0, backoff_base: float = 0.5,
                 max_connections: int = 100, transport: httpx.AsyncBaseTransport | None = None) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.url = url.rstrip("/")
        self.max_retries = max_retries
        self.max_retry_delay = max_retry_delay
        self.backoff_base = backoff_base
        self.attempts = 0  # requests sent, retries included (for tests and logs)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, transport=transport,
                                       timeout=httpx.Timeout(timeout, connect=connect_timeout),
                                       limits=httpx.Limits(max_connections=max_connections))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (sessions stay open on the server: close them first)."""
        await self._http.aclose()

    # -- sessions -------------------------------------------------------------------------

    async def create_session(self, task_id: str | None = None, seed: int | None = None,
                             max_steps: int | None = None, time_limit: float | None = None) -> CreateSessionResponse:
        """Open a session on ``task_id`` (or one drawn with ``seed``). Retries 429/503 (the server
        did not keep a session then) but no transport error once the request may have been sent."""
        body = {"task_id": task_id, "seed": seed, "max_steps": max_steps, "time_limit": time_limit}
        response = await self._request("POST", "/v1/sessions", body, repeatable=True, transport_safe=False)
        return CreateSessionResponse.model_validate(response.json())

    async def step(self, session_id: str, action: dict[str, Any] | str) -> StepResponse:
        """One tool call. Never repeated once sent: the command may have run."""
        response = await self._request("POST", f"/v1/sessions/{session_id}/step", {"action": action},
                                       repeatable=False, transport_safe=False)
        return StepResponse.model_validate(response.json())

    async def reset(self, session_id: str, task_id: str | None = None, seed: int | None = None) -> ResetResponse:
        """A new episode in the session. Never repeated once sent (see the module docstring)."""
        response = await self._request("POST", f"/v1/sessions/{session_id}/reset",
                                       {"task_id": task_id, "seed": seed}, repeatable=False, transport_safe=False)
        return ResetResponse.model_validate(response.json())

    async def session(self, session_id: str) -> SessionStatus:
        """The session's status (steps, done, idle time): read-only, so retried like any GET."""
        response = await self._request("GET", f"/v1/sessions/{session_id}")
        return SessionStatus.model_validate(response.json())

    async def close_session(self, session_id: str, *, missing_ok: bool = False) -> bool:
        """Delete the session; True if this call deleted it. A 404 raises unless ``missing_ok``,
        except after a retried transport error, when it means the lost attempt deleted it."""
        try:
            await self._request("DELETE", f"/v1/sessions/{session_id}", missing_ok_after_retry=True)
        except RemoteEnvError as exc:
            if exc.status_code == 404 and missing_ok:
                return False
            raise
        return True

    # -- stateless ------------------------------------------------------------------------

    async def verify(self, instance_id: str, patch: str) -> VerifyResponse:
        """Grade ``patch`` in a fresh sandbox. Stateless, so every failure above is retried."""
        response = await self._request("POST", "/v1/verify", {"instance_id": instance_id, "patch": patch})
        return VerifyResponse.model_validate(response.json())

    async def tasks(self) -> list[TaskView]:
        """The served tasks' public views (never the answers): what a batch draws its ids from."""
        response = await self._request("GET", "/v1/tasks")
        return [TaskView.model_validate(t) for t in response.json()]

    async def task(self, instance_id: str) -> TaskView:
        """One task's public view; a 404 for an id the server does not serve."""
        response = await self._request("GET", f"/v1/tasks/{instance_id}")
        return TaskView.model_validate(response.json())

    async def healthz(self) -> Health:
        """Liveness and session occupancy: a trainer can size its concurrency to ``max_sessions``."""
        response = await self._request("GET", "/healthz")
        return Health.model_validate(response.json())

    # -- the retry loop -------------------------------------------------------------------

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                       repeatable: bool = True, transport_safe: bool = True,
                       missing_ok_after_retry: bool = False) -> httpx.Response:
        """Send with retries. ``repeatable``: a 503 may be retried; ``transport_safe``: a transport
        error after the request may have been sent may be retried (429 and not-sent errors are
        always retried). Returns a 2xx response (or a 404 of a DELETE repeated after a lost answer)."""
        if body is not None:
            body = {k: v for k, v in body.items() if v is not None}
        retry = 0
        lost_answer = False  # an earlier attempt may have reached the server
        while True:
            self.attempts += 1
            try:
                response = await self._http.request(method, path, json=body)
            except httpx.TransportError as exc:
                retryable = isinstance(exc, NOT_SENT_ERRORS) or transport_safe
                if not retryable or retry >= self.max_retries:
                    raise
                lost_answer = lost_answer or not isinstance(exc, NOT_SENT_ERRORS)
                await asyncio.sleep(self._delay(retry, None))
                retry += 1
                continue
            status = response.status_code
            if status < 400:
                return response
            if status == 404 and missing_ok_after_retry and lost_answer:
                return response
            if status in RETRY_STATUSES and (status == 429 or repeatable):
                if retry >= self.max_retries:
                    raise RetriesExhausted(status, _detail(response), attempts=retry + 1)
                await asyncio.sleep(self._delay(retry, parse_retry_after(response.headers.get("Retry-After"))))
                retry += 1
                continue
            raise RemoteEnvError(status, _detail(response))

    def _delay(self, retry: int, retry_after: float | None) -> float:
        return backoff_delay(retry, retry_after, base=self.backoff_base, cap=self.max_retry_delay)


async def run_many(jobs: Iterable[Callable[[], Awaitable[T]] | Awaitable[T]], *, concurrency: int = 8,
                   return_exceptions: bool = False) -> list[T | BaseException]:
    """Run ``jobs`` with at most ``concurrency`` at once; their results in order.

    A job is a zero-argument callable returning an awaitable (preferred: nothing starts before its
    turn) or an awaitable. Without ``return_exceptions`` the first failure cancels the others and
    is raised; with it, failures take their job's place in the list (a batch of rollouts usually
    wants every other episode's result even when one fails)."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    jobs = list(jobs)
    slots = asyncio.Semaphore(concurrency)

    failed = False

    async def run(job: Callable[[], Awaitable[T]] | Awaitable[T]) -> T:
        nonlocal failed
        async with slots:
            if failed:  # the batch is over: a job woken by a failed job's slot must not start
                raise asyncio.CancelledError
            try:
                return await (job() if callable(job) else job)
            except Exception:
                failed = not return_exceptions
                raise

    tasks = [asyncio.ensure_future(run(job)) for job in jobs]
    if not tasks:
        return []
    if return_exceptions:
        return list(await asyncio.gather(*tasks, return_exceptions=True))
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:  # the first failure ends the batch: do not leave the rest running
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for job in jobs:  # a coroutine cancelled before its turn never ran: close it, no warning
            if inspect.iscoroutine(job):
                job.close()


__all__ = ["AsyncClient", "RemoteEnvError", "RetriesExhausted", "backoff_delay", "parse_retry_after", "run_many"]
