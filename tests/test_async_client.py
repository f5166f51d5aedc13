"""patchgym.server.async_client: batched rollouts over a real uvicorn server, and the retry policy (which
failures are retried, how long it waits, when it gives up) against scripted transports."""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import re
import shlex
import time
from collections.abc import Callable

import httpx
import pytest

from patchgym.server.app import create_app
from patchgym.server.async_client import AsyncClient, RetriesExhausted, backoff_delay, parse_retry_after, run_many
from patchgym.server.client import RemoteEnvError
from tests.serving import serve

TASK = "fixture__calc-1"
SUBMIT = {"name": "submit", "arguments": {}}
TASK_VIEW = {"instance_id": TASK, "repo": "fixture/calc", "base_commit": "0" * 40, "problem_statement": "p",
             "hints_text": "", "version": "0.1", "created_at": "2026-01-02T12:00:00Z"}


def scripted(*answers: httpx.Response | Exception) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """A transport answering with ``answers`` in turn (the last one repeats), and the requests it saw."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers[min(len(seen), len(answers) - 1)]
        seen.append(request)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.MockTransport(handler), seen


def error(status: int, detail: str = "nope", **headers: str) -> httpx.Response:
    return httpx.Response(status, json={"detail": detail}, headers=headers)


def client(transport: httpx.MockTransport, **options) -> AsyncClient:
    return AsyncClient("http://patchgym.invalid", transport=transport, **{"max_retry_delay": 0.05, **options})


def run(coro_factory: Callable):
    return asyncio.run(coro_factory())


# -- against a real server -------------------------------------------------------------------


def test_a_batch_larger_than_capacity_completes_by_retrying_429(calc_tasks_file, calc_task):
    app = create_app(tasks=calc_tasks_file, max_sessions=2)
    fix = {"name": "bash", "arguments": {"command": f"printf %s {shlex.quote(calc_task.patch)} | git apply"}}

    async def batch(url: str) -> list:
        # The server's Retry-After (5 s) is capped to keep the test short; the retries still wait. The
        # budget (3000 x 0.1 s) outlasts two rounds of episodes on a loaded machine: 200 did not once.
        async with AsyncClient(url, max_retries=3000, max_retry_delay=0.1) as c:
            async def episode(solve: bool) -> tuple[str, float]:
                session = await c.create_session(task_id=TASK, max_steps=5)
                try:
                    if solve:
                        assert (await c.step(session.session_id, fix)).info["exit_code"] == 0
                    result = await c.step(session.session_id, SUBMIT)
                    assert result.terminated
                    return session.info["instance_id"], result.reward
                finally:
                    assert await c.close_session(session.session_id)

            results = await run_many([lambda i=i: episode(i % 2 == 0) for i in range(5)], concurrency=5)
            assert [t.instance_id for t in await c.tasks()] == [TASK]
            assert (await c.healthz()).sessions == 0
            return results

    with serve(app) as url:
        results = asyncio.run(batch(url))
        metrics = httpx.get(f"{url}/metrics").text
    assert results == [(TASK, 1.0), (TASK, 0.0), (TASK, 1.0), (TASK, 0.0), (TASK, 1.0)]
    refused = re.search(r'^patchgym_errors_total\{kind="capacity"\} (\S+)$', metrics, re.M)
    assert refused and float(refused[1]) >= 1, "the server never answered 429: the test proves nothing"


def test_real_server_errors_are_typed_and_not_retried(calc_tasks_file):
    async def go(url: str) -> None:
        async with AsyncClient(url, max_retries=3, max_retry_delay=0.01) as c:
            with pytest.raises(RemoteEnvError) as info:
                await c.create_session(task_id="no-such-task")
            assert info.value.status_code == 404 and "no-such-task" in info.value.detail
            before = c.attempts
            with pytest.raises(RemoteEnvError) as info:
                await c.close_session("nope")
            assert info.value.status_code == 404 and c.attempts == before + 1
            assert await c.close_session("nope", missing_ok=True) is False
            with pytest.raises(RemoteEnvError) as info:
                await c.create_session(seed=-1)
            assert info.value.status_code == 422
            report = await c.verify(TASK, "")
            assert report.reward == 0.0 and not report.resolved

    with serve(create_app(tasks=calc_tasks_file)) as url:
        asyncio.run(go(url))


# -- the retry policy, against scripted answers ---------------------------------------------


def test_retry_after_seconds_is_honoured():
    transport, seen = scripted(error(429, "full", **{"Retry-After": "1"}), httpx.Response(200, json=[TASK_VIEW]))

    async def go() -> float:
        async with client(transport, max_retry_delay=30) as c:
            started = time.monotonic()
            assert [t.instance_id for t in await c.tasks()] == [TASK]
            return time.monotonic() - started

    elapsed = run(go)
    assert len(seen) == 2 and 1.0 <= elapsed < 3.0


def test_retry_after_http_date_and_backoff_without_it():
    now = 1_800_000_000.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == 30
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0  # in the past
    assert parse_retry_after("2.5") == 2.5 and parse_retry_after("-3") == 0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None and parse_retry_after("nan") is None
    rng = random.Random(0)
    # honoured with a little jitter on top (never earlier than asked), and capped
    assert all(4.0 <= backoff_delay(0, 4.0, base=0.5, cap=60, rng=rng) <= 4.4 for _ in range(50))
    assert backoff_delay(0, 3600.0, base=0.5, cap=60, rng=rng) == 60
    # no Retry-After: exponential with jitter, capped
    for retry in range(6):
        delays = [backoff_delay(retry, None, base=0.5, cap=10, rng=rng) for _ in range(50)]
        exp = 0.5 * 2 ** retry
        assert all(min(exp / 2, 10) <= d <= min(exp, 10) for d in delays) and len(set(delays)) > 1


def test_gives_up_after_max_retries_with_a_typed_error():
    transport, seen = scripted(error(503, "sandboxes unavailable"))

    async def go() -> None:
        async with client(transport, max_retries=3) as c:
            await c.verify(TASK, "")

    with pytest.raises(RetriesExhausted) as info:
        run(go)
    assert isinstance(info.value, RemoteEnvError)
    assert info.value.status_code == 503 and info.value.detail == "sandboxes unavailable"
    assert info.value.attempts == 4 and len(seen) == 4


def test_not_retried_404_and_step_503():
    for status, detail in ((404, "unknown session 'x'"), (409, "busy"), (503, "the session was closed")):
        transport, seen = scripted(error(status, detail), httpx.Response(200, json={}))

        async def go(transport: httpx.MockTransport) -> None:
            async with client(transport, max_retries=5) as c:
                await c.step("x", SUBMIT)

        with pytest.raises(RemoteEnvError) as info:
            asyncio.run(go(transport))
        assert not isinstance(info.value, RetriesExhausted)
        assert (info.value.status_code, info.value.detail, len(seen)) == (status, detail, 1)


def test_transport_errors_are_retried_only_when_repeating_is_safe():
    created = {"session_id": "s1", "observation": "o", "info": {"instance_id": TASK}, "tools": []}

    async def call(transport: httpx.MockTransport, what: str):
        async with client(transport, max_retries=2) as c:
            if what == "create":
                return await c.create_session(task_id=TASK)
            if what == "close":
                return await c.close_session("s1")
            return await c.tasks()

    # the answer was lost after the request left: a create may have opened a session -> raise at once
    transport, seen = scripted(httpx.ReadError("connection reset"), httpx.Response(201, json=created))
    with pytest.raises(httpx.ReadError):
        run(lambda: call(transport, "create"))
    assert len(seen) == 1
    # ... but a request that never left is safe to repeat, even a create
    transport, seen = scripted(httpx.ConnectError("refused"), httpx.Response(201, json=created))
    assert run(lambda: call(transport, "create")).session_id == "s1" and len(seen) == 2
    # GET is safe to repeat
    transport, seen = scripted(httpx.ReadTimeout("slow"), httpx.Response(200, json=[TASK_VIEW]))
    assert len(run(lambda: call(transport, "tasks"))) == 1 and len(seen) == 2
    # a DELETE whose answer was lost, then 404: the lost attempt deleted it
    transport, seen = scripted(httpx.RemoteProtocolError("server disconnected"), error(404, "unknown session"))
    assert run(lambda: call(transport, "close")) is True and len(seen) == 2
    # out of retries: the transport error itself
    transport, seen = scripted(httpx.ConnectError("refused"))
    with pytest.raises(httpx.ConnectError):
        run(lambda: call(transport, "tasks"))
    assert len(seen) == 3


def test_the_body_sent_omits_unset_fields_and_carries_the_token():
    created = {"session_id": "s1", "observation": "o", "info": {}, "tools": []}
    transport, seen = scripted(httpx.Response(201, json=created))

    async def go() -> None:
        async with AsyncClient("http://patchgym.invalid/", token="t0k", transport=transport) as c:
            await c.create_session(seed=3)

    run(go)
    assert seen[0].url.path == "/v1/sessions" and json.loads(seen[0].content) == {"seed": 3}
    assert seen[0].headers["Authorization"] == "Bearer t0k"


def test_run_many_bounds_concurrency_keeps_order_and_stops_on_failure():
    async def go() -> None:
        running = peak = 0

        async def job(i: int) -> int:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01 * (5 - i % 5))
            running -= 1
            return i

        assert await run_many([lambda i=i: job(i) for i in range(12)], concurrency=3) == list(range(12))
        assert peak == 3
        assert await run_many([job(1), job(2)], concurrency=1) == [1, 2]  # awaitables too

        started: list[int] = []

        async def failing(i: int) -> int:
            started.append(i)
            await asyncio.sleep(0.01)
            if i == 1:
                raise ValueError("boom")
            await asyncio.sleep(0.2)
            return i

        with pytest.raises(ValueError):
            await run_many([lambda i=i: failing(i) for i in range(10)], concurrency=2)
        assert started == [0, 1]  # the rest never started
        results = await run_many([lambda i=i: failing(i) for i in range(2)], return_exceptions=True)
        assert results[0] == 0 and isinstance(results[1], ValueError)

    run(go)
