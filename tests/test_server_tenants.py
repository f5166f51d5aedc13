"""Tenants of one server: each token's fair share of sessions and verifications, the limits
``/state`` shows to the token that asks, and the gate that refuses a request on its headers before
any of it is read."""

from __future__ import annotations

import socket
import threading
import time

import anyio
import httpx
import pytest

from patchgym.server.app import create_app
from patchgym.server.sessions import CapacityError, SessionManager
from tests.serving import serve

TASK = "fixture__calc-1"
ALPHA, BETA = {"Authorization": "Bearer alpha"}, {"Authorization": "Bearer beta"}


def test_a_token_at_its_cap_gets_429_while_another_token_creates(calc_tasks_file):
    app = create_app(tasks=calc_tasks_file, token=["alpha", "beta"], max_sessions=4)  # 2 each by default
    with serve(app) as url, httpx.Client(base_url=url, timeout=120) as http:
        first = [http.post("/v1/sessions", json={"task_id": TASK}, headers=ALPHA) for _ in range(2)]
        assert [r.status_code for r in first] == [201, 201]
        over = http.post("/v1/sessions", json={"task_id": TASK}, headers=ALPHA)
        assert over.status_code == 429 and int(over.headers["Retry-After"]) > 0
        assert "this token has all of its 2 sessions in use" in over.json()["detail"]
        assert http.post("/v1/sessions", json={"task_id": TASK}, headers=BETA).status_code == 201  # room for beta
        assert http.get("/state", headers=ALPHA).json()["limits"] == {
            "max_sessions": 2, "sessions": 2, "max_verifications": 2, "verifications": 0,
            "server_max_sessions": 4, "server_sessions": 3}
        assert http.get("/state", headers=BETA).json()["limits"]["sessions"] == 1
        assert http.get("/state").json()["limits"] is None  # public: no tenant's figures without a token
        assert http.get("/state", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert http.delete(f"/v1/sessions/{first[0].json()['session_id']}", headers=ALPHA).status_code == 204
        assert http.post("/v1/sessions", json={"task_id": TASK}, headers=ALPHA).status_code == 201


def test_a_token_at_its_verification_cap_gets_429_while_another_verifies(calc_tasks_file):
    app = create_app(tasks=calc_tasks_file, token=["alpha", "beta"], max_sessions=2)  # 1 each
    with serve(app) as url, httpx.Client(base_url=url, timeout=120) as http:
        body = {"instance_id": TASK, "patch": ""}
        running = threading.Thread(target=lambda: http.post("/v1/verify", json=body, headers=ALPHA))
        running.start()
        deadline = time.monotonic() + 30
        while http.get("/state", headers=ALPHA).json()["limits"]["verifications"] != 1:
            assert time.monotonic() < deadline and running.is_alive()
            time.sleep(0.02)
        over = http.post("/v1/verify", json=body, headers=ALPHA)
        assert over.status_code == 429 and "1 verifications running" in over.json()["detail"]
        assert http.post("/v1/verify", json=body, headers=BETA).json()["resolved"] is False  # graded
        running.join(timeout=120)


def test_an_owner_at_its_cap_holds_up_no_other_waiter():
    """Queued creates (NeMo Gym's seeds wait): an owner at its cap waits for its own sessions, and
    the waiter behind it whose owner has room goes first."""

    async def main() -> None:
        manager = SessionManager(max_sessions=3, max_per_owner=2)
        a1, _ = await manager.create("a", lambda s: None)
        await manager.create("a", lambda s: None)
        with pytest.raises(CapacityError, match="this token has all of its 2 sessions"):
            await manager.create("a", lambda s: None)
        order: list[str] = []

        async def waiter(owner: str) -> None:
            await manager.create(owner, lambda s: None, wait=10)
            order.append(owner)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, "a")
            await anyio.sleep(0.05)
            tg.start_soon(waiter, "b")  # the one free slot: b's, though a queued first
            await anyio.sleep(0.05)
            assert order == ["b"] and manager.held("a") == 2
            await manager.close(a1)  # now a's own session frees
        assert order == ["b", "a"] and manager.held("a") == 2 and manager.held("b") == 1
        assert len(manager) == 3

    anyio.run(main)


def _answer_of(url: str, request: bytes, within: float = 5.0) -> bytes:
    """What the server answers to ``request`` (headers only: the body announced is never sent)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=within) as s:
        s.sendall(request)
        return s.recv(4096)


def test_the_gate_answers_on_the_headers_before_reading_a_body(calc_tasks_file):
    app = create_app(tasks=calc_tasks_file, token="alpha")
    with serve(app) as url:
        start = time.monotonic()
        headers = b"POST /v1/verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        # No token: refused at once, though the 100 MB body it announces never comes.
        assert _answer_of(url, headers + b"Content-Length: 100000000\r\n\r\n").startswith(b"HTTP/1.1 401")
        bearer = b"Authorization: Bearer alpha\r\n"
        assert _answer_of(url, headers + bearer + b"Content-Length: 100000000\r\n\r\n").startswith(b"HTTP/1.1 413")
        assert _answer_of(url, headers + bearer + b"Transfer-Encoding: chunked\r\n\r\n").startswith(b"HTTP/1.1 411")
        assert time.monotonic() - start < 5  # none of them waited for a body (the read deadline is 30 s)
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.get("/healthz").status_code == 200 and http.get("/metrics").status_code == 200
            assert http.get("/nothing-here").status_code == 401  # not even a 404 without a token
