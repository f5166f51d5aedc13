"""Schema-driven fuzzing of every operation the server's OpenAPI schema lists (schemathesis), on a
real uvicorn server: no request, valid or not, may get a 5xx, and every answer must match the
schema (status code, content type, body).

Operations come from ``/openapi.json`` at run time, so routes added later (NeMo Gym, OpenEnv...)
are fuzzed without touching this file. Random ids almost never name a live session or a task, so
half the cases (by a stable hash of the generated value) get a real one: the operations then run
on live sessions, not only into 404s. After each case every session but the live one is closed
(through a route the test adds, hidden from the schema, so sessions of any protocol are freed),
and the server's idle reaper (``idle_ttl`` of a few seconds) is the backstop: with
``max_sessions=2`` a 429 is a valid answer, but a slot held for the rest of the run would leave
the session-opening routes fuzzed only into 429s.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Response
from hypothesis import HealthCheck, settings

schemathesis = pytest.importorskip("schemathesis")

from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from patchgym.server.app import create_app  # noqa: E402
from tests.serving import serve  # noqa: E402

TASK = "fixture__calc-1"
CLOSE_OTHERS = "/_fuzz/close-others"
TOKEN = "fuzz-token"  # with auth on, a case missing its token must get a 401, not run
EXAMPLES_PER_OPERATION = 25
# FastAPI's own answer to a body it cannot even decode (not UTF-8): a 400 no route documents.
UNDECODABLE_BODY = "There was an error parsing the body"


def documented_status(ctx: Any, response: Any, case: Any) -> bool | None:
    """``status_code_conformance``, but for the framework's 400 to an undecodable body: a client
    mistake answered with a 4xx, which is all that matters, though no operation documents it."""
    if response.status_code == 400:
        try:
            if response.json().get("detail") == UNDECODABLE_BODY:
                return None
        except (ValueError, AttributeError):
            pass
    return status_code_conformance(ctx, response, case)


CHECKS = [not_a_server_error, documented_status, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection]
SESSION_KEYS = ("session_id",)  # path parameters or body fields naming a session
TASK_KEYS = ("task_id", "instance_id")  # ... naming a task


class Live:
    """A session kept open for the fuzzer to aim at (re-opened when a fuzzed DELETE or the reaper
    closed it)."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"})
        self.session_id: str | None = None

    def session(self) -> str:
        if self.session_id is not None and self.http.get(f"/v1/sessions/{self.session_id}").status_code == 200:
            return self.session_id
        deadline = time.monotonic() + 20
        while True:  # fuzzed creates of other protocols may hold the slots until they are reaped
            r = self.http.post("/v1/sessions", json={"task_id": TASK})
            if r.status_code == 201:
                self.session_id = r.json()["session_id"]
                return self.session_id
            assert r.status_code == 429 and time.monotonic() < deadline, r.text
            time.sleep(0.2)

    def close_others(self) -> None:
        """Close every session the fuzzer opened, whatever protocol opened it (see the module doc)."""
        r = self.http.post(CLOSE_OTHERS, params={"keep": self.session_id or ""})
        assert r.status_code == 204, r.text


def add_close_others_route(app: FastAPI) -> None:
    """A test-only route, left out of the schema (so never fuzzed), closing every session but one.
    It runs on the server's event loop, where the session manager lives."""
    manager = app.state.manager

    @app.post(CLOSE_OTHERS, status_code=204, include_in_schema=False)
    async def close_others(keep: str = "") -> Response:
        for session in list(manager._sessions.values()):
            if session.id != keep:
                await manager.close(session)
        return Response(status_code=204)


@pytest.fixture(scope="module")
def fuzz_server(calc_tasks_file) -> Iterator[tuple[str, Live]]:
    app = create_app(tasks=calc_tasks_file, max_sessions=2, idle_ttl=3, operation_timeout=60, token=TOKEN,
                     env_options={"command_timeout": 10})
    add_close_others_route(app)
    with serve(app) as url:
        live = Live(url)
        try:
            yield url, live
        finally:
            live.http.close()


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    url, _ = fuzz_server
    config = schemathesis.Config.from_dict({
        "auth": {"openapi": {"HTTPBearer": {"bearer": TOKEN}}},  # the security scheme FastAPI names
        # valid and invalid requests; the same cases every run, so a failure reproduces
        "generation": {"mode": "all", "max-examples": EXAMPLES_PER_OPERATION, "deterministic": True},
    })
    return schemathesis.openapi.from_url(f"{url}/openapi.json", config=config)


def aim(case: Any, live: Live) -> None:
    """Point about half the cases at a live session and the real task (chosen by a stable hash of
    what was generated, so a run is reproducible)."""
    def pick(value: Any) -> bool:
        return isinstance(value, str) and zlib.crc32(value.encode("utf-8", "surrogatepass")) % 2 == 0

    params = case.path_parameters or {}
    for key in SESSION_KEYS:
        if pick(params.get(key)):
            params[key] = live.session()
    for key in TASK_KEYS:
        if pick(params.get(key)):
            params[key] = TASK
    if isinstance(case.body, dict):
        for key in TASK_KEYS:
            if pick(case.body.get(key)):
                case.body[key] = TASK
        for key in SESSION_KEYS:
            if pick(case.body.get(key)):
                case.body[key] = live.session()


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.mark.timeout(300)
@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=True, database=None)
def test_no_request_gets_a_5xx_and_every_answer_matches_the_schema(case, fuzz_server):
    """One subtest per operation of the schema (so new routes are fuzzed as they appear)."""
    url, live = fuzz_server
    aim(case, live)
    try:
        response = case.call(base_url=url, timeout=60)
    finally:
        live.close_others()
    case.validate_response(response, checks=CHECKS)
