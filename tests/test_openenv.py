"""OpenEnv's env-server protocol (server/openenv.py) over a real uvicorn server: openenv-core's own
GenericEnvClient drives whole episodes on /ws; a raw WebSocket client sends what that client never
would (bad messages, dropped sockets); the HTTP routes are checked for OpenEnv's shapes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from patchgym.server.app import create_app
from tests.serving import serve
from tests.test_server import SUBMIT, TASK, apply_via_bash, bash

TOOLS = {"bash", "str_replace_editor", "submit"}


def generic_client_class() -> Any:
    """openenv-core's client, or a skip saying how to get it (CI installs it with the test extra)."""
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as exc:
        pytest.skip(f"openenv-core is not importable ({exc}); pip install '.[test]' installs it")
    return GenericEnvClient


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://", 1) + "/ws"


def ask(ws: ClientConnection, message: dict | str) -> dict:
    """Send one message, return the server's answer."""
    ws.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(ws.recv(timeout=120))


@pytest.fixture(scope="module")
def app(calc_tasks_file):
    return create_app(tasks=calc_tasks_file, max_sessions=4)


@pytest.fixture(scope="module")
def url(app) -> Iterator[str]:
    with serve(app) as u:
        yield u


@pytest.fixture(autouse=True)
def no_leftover_sessions(request):
    """Every test must leave no session behind: a socket's session dies with the socket."""
    yield
    if "app" in request.fixturenames:
        manager = request.getfixturevalue("app").state.manager
        wait_for(lambda: len(manager) == 0, 30, "the test's sessions to close")


def test_generic_client_resolves_the_gold_fix(url, app, calc_task):
    GenericEnvClient = generic_client_class()
    with GenericEnvClient(base_url=url, message_timeout_s=300).sync() as env:
        r = env.reset(task_id=TASK)
        obs = r.observation
        assert calc_task.problem_statement in obs["output"] and obs["instance_id"] == TASK
        assert {t["function"]["name"] for t in obs["tools"]} == TOOLS
        assert r.reward is None and r.done is False and not obs["infrastructure_failure"]
        state = env.state()
        assert state["step_count"] == 0 and state["instance_id"] == TASK and state["episode_id"]
        assert len(app.state.manager) == 1

        r = env.step(bash("ls calc"))
        assert "__init__.py" in r.observation["output"] and r.observation["exit_code"] == 0
        assert r.reward == 0.0 and r.done is False
        r = env.step(apply_via_bash(calc_task.patch))
        assert r.observation["exit_code"] == 0, r.observation["output"]
        assert env.state()["step_count"] == 2

        r = env.step(SUBMIT)
        assert r.reward == 1.0 and r.done is True
        assert r.observation["resolved"] and r.observation["terminated"] and not r.observation["truncated"]
        assert env.state()["done"] is True
        with pytest.raises(RuntimeError, match="SESSION_ERROR"):  # the episode is over: reset first
            env.step(SUBMIT)

        # A second episode on the same connection reuses its session; no change scores 0.
        r = env.reset(instance_id=TASK, episode_id="episode-2")
        assert r.observation["instance_id"] == TASK and not r.done
        assert env.state() == {"episode_id": "episode-2", "step_count": 0, "instance_id": TASK, "done": False}
        assert len(app.state.manager) == 1
        r = env.step(SUBMIT)
        assert r.reward == 0.0 and r.done is True and not r.observation["resolved"]
    wait_for(lambda: len(app.state.manager) == 0, 30, "the connection's session to close")


def test_async_generic_client_needs_a_reset_first(url, app):
    GenericEnvClient = generic_client_class()

    async def episode() -> tuple[str, Any]:
        async with GenericEnvClient(base_url=url, message_timeout_s=300) as env:
            with pytest.raises(RuntimeError, match="SESSION_ERROR") as before:
                await env.step(SUBMIT)
            assert (await env.state())["episode_id"] is None  # nothing opened: a default state
            assert len(app.state.manager) == 0
            r = await env.reset(seed=3)  # no task named: drawn with the seed
            assert r.observation["instance_id"] == TASK
            return str(before.value), await env.step(SUBMIT)

    message, result = asyncio.run(episode())
    assert "send a reset first" in message
    assert result.reward == 0.0 and result.done is True


def test_bad_messages_get_error_codes_and_the_connection_survives(url, app):
    with connect(ws_url(url), open_timeout=30) as ws:
        def error(message: dict | str) -> dict:
            reply = ask(ws, message)
            assert reply["type"] == "error", reply
            return reply["data"]

        assert error("{not json")["code"] == "INVALID_JSON"
        assert error({"type": "dance"})["code"] == "UNKNOWN_TYPE"
        assert error("[1, 2]")["code"] == "VALIDATION_ERROR"
        assert error({"type": "state", "extra": 1})["code"] == "VALIDATION_ERROR"
        assert error({"type": "step", "data": 3})["code"] == "VALIDATION_ERROR"
        assert error({"type": "reset", "data": {"taskid": TASK}})["code"] == "VALIDATION_ERROR"
        assert error({"type": "reset", "data": {"seed": -1}})["code"] == "VALIDATION_ERROR"
        assert error({"type": "reset", "data": {"task_id": TASK, "instance_id": "other"}})["code"] == \
            "VALIDATION_ERROR"
        unknown = error({"type": "reset", "data": {"task_id": "no-such-task"}})
        assert unknown["code"] == "VALIDATION_ERROR" and "no-such-task" in unknown["message"]
        early = error({"type": "step", "data": SUBMIT})
        assert early["code"] == "SESSION_ERROR" and "reset" in early["message"]
        assert len(app.state.manager) == 0  # no mistake above took a slot

        assert ask(ws, {"type": "state"}) == {"type": "state", "data": {
            "episode_id": None, "step_count": 0, "instance_id": None, "done": False}}
        reply = ask(ws, {"type": "reset", "data": {"task_id": TASK}})
        assert reply["type"] == "observation" and reply["data"]["observation"]["instance_id"] == TASK
        # A malformed tool call is the model's mistake, not the protocol's: an observation.
        reply = ask(ws, {"type": "step", "data": {"name": "dance", "arguments": {}}})
        assert reply["type"] == "observation" and reply["data"]["done"] is False
        assert reply["data"]["observation"]["invalid_action"] and "unknown tool" in reply["data"]["observation"]["output"]
        assert ask(ws, {"type": "state"})["data"]["step_count"] == 1

        ws.send(json.dumps({"type": "close"}))
        with pytest.raises(ConnectionClosed):  # the server ends the connection
            ws.recv(timeout=30)
    wait_for(lambda: len(app.state.manager) == 0, 30, "the closed connection's session to close")
    metrics = httpx.get(f"{url}/metrics").text
    assert 'patchgym_errors_total{kind="no_episode"}' in metrics
    assert 'patchgym_sessions_created_total{protocol="openenv"}' in metrics


def test_capacity_reached_is_an_error_message(calc_tasks_file):
    app = create_app(tasks=calc_tasks_file, max_sessions=1)
    with serve(app) as url, connect(ws_url(url)) as first, connect(ws_url(url)) as second:
        assert ask(first, {"type": "reset", "data": {"task_id": TASK}})["type"] == "observation"
        full = ask(second, {"type": "reset", "data": {"task_id": TASK}})
        assert full["type"] == "error" and full["data"]["code"] == "CAPACITY_REACHED"
        assert full["data"]["max_sessions"] == 1 and full["data"]["active_sessions"] == 1
        assert httpx.post(f"{url}/reset", json={"task_id": TASK}, timeout=120).status_code == 429
        first.close()
        wait_for(lambda: len(app.state.manager) == 0, 30, "the first connection's session to close")
        # the refused connection is still usable once a slot is free
        assert ask(second, {"type": "reset", "data": {"task_id": TASK}})["type"] == "observation"
        assert len(app.state.manager) == 1
    assert len(app.state.manager) == 0


def drop(ws: ClientConnection) -> None:
    """Cut the TCP connection without a WebSocket close frame, as a crashed client would."""
    ws.socket.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        ws.close()


def test_dropping_the_socket_closes_the_session(url, app):
    # after a reset, closed without a "close" message
    with connect(ws_url(url)) as ws:
        assert ask(ws, {"type": "reset", "data": {"task_id": TASK}})["type"] == "observation"
        assert len(app.state.manager) == 1
    wait_for(lambda: len(app.state.manager) == 0, 10, "the session of a closed socket to close")

    # cut mid-step: the session goes at once, not when the 5 s command ends
    with connect(ws_url(url)) as ws:
        assert ask(ws, {"type": "reset", "data": {"task_id": TASK}})["type"] == "observation"
        (session,) = app.state.manager._sessions.values()
        ws.send(json.dumps({"type": "step", "data": bash("sleep 5")}))
        wait_for(lambda: session.busy, 10, "the step to start")
        dropped = time.monotonic()
        drop(ws)
        wait_for(lambda: len(app.state.manager) == 0, 10, "the dropped socket's session to close")
        assert time.monotonic() - dropped < 4, "the session outlived the socket until its step finished"
    # the abandoned step finishes in its thread, then closes the environment (its sandbox)
    wait_for(lambda: session.closed and session.env is None, 60, "the environment to close")


def test_http_routes_are_stateless(url, app, calc_task):
    with httpx.Client(base_url=url, timeout=120) as http:
        assert http.get("/health").json() == {"status": "healthy"}
        schema = http.get("/schema").json()
        assert set(schema) == {"action", "observation", "state"}
        assert set(schema["action"]["properties"]["name"]["enum"]) == TOOLS
        assert {v["properties"]["name"]["const"] for v in schema["action"]["oneOf"]} == TOOLS
        assert {"output", "instance_id", "resolved"} <= set(schema["observation"]["properties"])
        assert {"episode_id", "step_count"} <= set(schema["state"]["properties"])
        state = http.get("/state").json()  # no tokens: everyone is one tenant, whose limits it shows
        assert state == {"episode_id": None, "step_count": 0, "instance_id": None, "done": False,
                         "limits": {**state["limits"], "sessions": 0, "verifications": 0}}

        r = http.post("/reset", json={"task_id": TASK, "seed": 1, "episode_id": "e"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"observation", "reward", "done"} and body["reward"] is None and body["done"] is False
        assert calc_task.problem_statement in body["observation"]["output"]
        assert len(app.state.manager) == 0  # the session it opened is gone
        assert http.post("/reset").json()["observation"]["instance_id"] == TASK  # no body: a drawn task

        r = http.post("/step", json={"action": bash("ls calc"), "task_id": TASK, "timeout_s": 30, "request_id": "x"})
        assert r.status_code == 200, r.text
        assert "__init__.py" in r.json()["observation"]["output"] and r.json()["done"] is False
        r = http.post("/step", json={"action": SUBMIT, "instance_id": TASK}).json()
        assert r["reward"] == 0.0 and r["done"] is True and r["observation"]["resolved"] is False
        assert len(app.state.manager) == 0

        assert http.post("/reset", json={"task_id": "no-such-task"}).status_code == 404
        assert http.post("/reset", json={"taskid": TASK}).status_code == 422
        assert http.post("/step", json={"task_id": TASK}).status_code == 422
        paths = http.get("/openapi.json").json()["paths"]
        assert {"/reset", "/step", "/state", "/schema", "/health", "/v1/sessions", "/healthz"} <= set(paths)


def test_token_is_required_before_the_upgrade(calc_tasks_file):
    app = create_app(tasks=calc_tasks_file, token="sesame")
    with serve(app) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic sesame"}):
            with pytest.raises(InvalidStatus) as refused:
                connect(ws_url(url), additional_headers=headers)
            assert refused.value.response.status_code == 403  # closed (1008) before accepting
        with connect(ws_url(url), additional_headers={"Authorization": "Bearer sesame"}) as ws:
            assert ask(ws, {"type": "reset", "data": {"task_id": TASK}})["type"] == "observation"
        with httpx.Client(base_url=url, timeout=120) as http:
            assert http.post("/reset", json={"task_id": TASK}).status_code == 401
            assert http.post("/step", json={"action": SUBMIT, "task_id": TASK}).status_code == 401
            assert http.post("/reset", json={"task_id": TASK},
                             headers={"Authorization": "Bearer sesame"}).status_code == 200
            for path in ("/health", "/schema", "/state"):  # constants: no token needed, as for /healthz
                assert http.get(path).status_code == 200
        wait_for(lambda: len(app.state.manager) == 0, 30, "the sessions to close")


def test_generic_client_with_a_token(calc_tasks_file):
    """The subclass docs/openenv.md shows: GenericEnvClient sends no headers of its own."""
    GenericEnvClient = generic_client_class()
    from websockets.asyncio.client import connect as ws_connect

    class TokenEnvClient(GenericEnvClient):
        def __init__(self, base_url: str, token: str, **kwargs: Any) -> None:
            super().__init__(base_url, **kwargs)
            self._token = token

        async def connect(self) -> TokenEnvClient:
            if self._ws is None:
                self._ws = await ws_connect(self._ws_url, open_timeout=self._connect_timeout,
                                            max_size=self._max_message_size,
                                            additional_headers={"Authorization": f"Bearer {self._token}"})
            return self

    app = create_app(tasks=calc_tasks_file, token="sesame")
    with serve(app) as url:
        with TokenEnvClient(url, "sesame").sync() as env:
            assert env.reset(task_id=TASK).observation["instance_id"] == TASK
        with pytest.raises(ConnectionError), GenericEnvClient(base_url=url).sync() as env:
            env.reset(task_id=TASK)
        wait_for(lambda: len(app.state.manager) == 0, 30, "the session to close")


def test_a_reaped_session_says_so_and_a_reset_starts_anew(calc_tasks_file):
    app = create_app(tasks=calc_tasks_file, idle_ttl=0.5)
    with serve(app) as url, connect(ws_url(url)) as ws:
        assert ask(ws, {"type": "reset", "data": {"task_id": TASK}})["type"] == "observation"
        wait_for(lambda: len(app.state.manager) == 0, 30, "the idle session to be reaped")
        reply = ask(ws, {"type": "step", "data": bash("true")})
        assert reply["type"] == "error" and reply["data"]["code"] == "SESSION_ERROR"
        assert "closed" in reply["data"]["message"]
        assert ask(ws, {"type": "state"})["data"]["episode_id"] is None
        assert ask(ws, {"type": "reset", "data": {"task_id": TASK}})["type"] == "observation"
        assert ask(ws, {"type": "step", "data": bash("true")})["data"]["observation"]["exit_code"] == 0
    wait_for(lambda: len(app.state.manager) == 0, 30, "the session to close")
