"""The server's handlers and their helpers are module-level functions: called here directly, with a
service of their own, without HTTP, a running server or a sandbox."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from fastapi import HTTPException
from starlette.requests import Request

from patchgym.sandboxes import SandboxError
from patchgym.server.app import (
    EXCEPTION_HANDLERS,
    _allowed_endpoint,
    capacity_reached,
    create_app,
    healthz,
    rollout,
    session_not_found,
)
from patchgym.server.core import EnvService
from patchgym.server.deps import service_of
from patchgym.server.models import RolloutRequest
from patchgym.server.nemo_gym.bodies import NemoGymSeedSessionRequest
from patchgym.server.nemo_gym.routes import (
    NemoGymState,
    _Recent,
    _task_choice,
    ended_outcome,
    failed_outcome,
    failure,
    nemo_gym_router,
    require_cookie,
)
from patchgym.server.openenv import schema
from patchgym.server.sessions import CapacityError, SessionNotFound


@pytest.fixture(scope="module")
def app(calc_tasks_file):
    return create_app(tasks=calc_tasks_file, max_sessions=3, model_endpoints=["http://vllm:8000/v1"])


@pytest.fixture
def service(app) -> EnvService:
    return app.state.service


def errors(service: EnvService, kind: str) -> float:
    return service.metrics.registry.get_sample_value("patchgym_errors_total", {"kind": kind}) or 0.0


def request_to(app) -> Request:
    return Request({"type": "http", "app": app, "method": "POST", "path": "/v1/sessions", "headers": []})


# -- the native API -----------------------------------------------------------------------------


def test_handlers_find_the_service_on_the_app(app, service):
    assert service_of(request_to(app)) is service
    assert asyncio.run(healthz(service)).model_dump() == {"status": "ok", "sessions": 0, "max_sessions": 3}


@pytest.mark.parametrize("base_url, allowed", [
    ("http://vllm:8000/v1", True),
    ("http://vllm:8000/v1/", True),
    ("http://vllm:8000/v1/chat", True),  # a path below an allowed root
    ("http://vllm:8000/v1x", False),  # a prefix, not a path below
    ("http://vllm:8000", False),
    ("http://elsewhere/v1", False),
])
def test_the_model_endpoint_allow_list(base_url, allowed):
    assert _allowed_endpoint(base_url, ["http://vllm:8000/v1/"]) is allowed
    assert not _allowed_endpoint(base_url, [])  # none given: none called


def test_a_rollout_to_an_endpoint_the_server_was_not_started_with_is_403(service):
    before = errors(service, "forbidden_endpoint")
    body = RolloutRequest.model_validate({"task_id": "fixture__calc-1",
                                          "model": {"name": "m", "base_url": "http://elsewhere/v1"}})
    response = asyncio.run(rollout(body, service, None))
    assert response.status_code == 403 and "'http://elsewhere/v1' is not one of them" in json.loads(response.body)["detail"]
    assert errors(service, "forbidden_endpoint") == before + 1
    assert len(service.manager) == 0  # refused before a session was opened


def test_a_full_server_answers_429_with_retry_after_and_counts_it(app, service):
    before = errors(service, "capacity")
    response = asyncio.run(capacity_reached(request_to(app), CapacityError("all 3 sessions are in use")))
    assert response.status_code == 429 and response.headers["retry-after"] == "5"
    assert json.loads(response.body) == {"detail": "all 3 sessions are in use; retry later"}
    assert errors(service, "capacity") == before + 1


def test_exception_handlers_are_chosen_by_type(app, service):
    assert EXCEPTION_HANDLERS[SessionNotFound] is session_not_found
    before = errors(service, "infrastructure")
    response = asyncio.run(EXCEPTION_HANDLERS[SandboxError](request_to(app), SandboxError("no cgroup")))
    assert response.status_code == 503 and "SandboxError: no cgroup" in json.loads(response.body)["detail"]
    assert errors(service, "infrastructure") == before + 1


# -- NeMo Gym -----------------------------------------------------------------------------------


@pytest.mark.parametrize("row, choice", [
    ({"instance_id": "a", "task_id": "b"}, ("a", None)),  # instance_id first
    ({"task_id": "b", "seed": 3}, ("b", None)),  # a named task wins over a seed
    ({"task_data": {"task_id": "c"}}, ("c", None)),
    ({"task_id": {"task_id": "d"}}, ("d", None)),  # NeMo Gym 0.7.0's TaskId
    ({"seed": 7}, (None, 7)),
    ({"task_data": {"seed": 8}}, (None, 8)),
    ({}, (None, None)),
])
def test_the_task_a_seed_body_names(row, choice):
    assert _task_choice(NemoGymSeedSessionRequest.model_validate(row)) == choice


@pytest.mark.parametrize("seed", [-1, True, "3"])
def test_a_bad_seed_in_the_rows_task_data_is_422(seed):
    with pytest.raises(HTTPException) as caught:
        _task_choice(NemoGymSeedSessionRequest.model_validate({"task_data": {"seed": seed}}))
    assert caught.value.status_code == 422


def test_recent_forgets_the_oldest_entries():
    recent: _Recent[str, int] = _Recent(limit=2)
    recent["a"], recent["b"] = 1, 2
    recent["a"] = 3  # set again: the newest now
    recent["c"] = 4
    assert dict(recent) == {"a": 3, "c": 4}


def test_a_remembered_failure_belongs_to_its_owner(service):
    state = NemoGymState()
    outcome, status, kind = failure(state, "s1", "alice", SandboxError("gone"))
    assert (status, kind) == (503, "infrastructure") and outcome.mask_sample
    assert failed_outcome(state, "s1", "alice") is outcome
    assert failed_outcome(state, "s1", "bob") is None  # another token learns nothing of it
    assert ended_outcome(service, state, "s1", "alice") is outcome
    assert ended_outcome(service, state, "s2", "alice") is None  # unknown, not ended


def test_a_tool_call_without_the_cookie_is_400_and_counted(service):
    assert require_cookie(service, "s1") == "s1"
    before = errors(service, "no_session")
    with pytest.raises(HTTPException) as caught:
        require_cookie(service, None)
    assert caught.value.status_code == 400 and errors(service, "no_session") == before + 1


def test_a_tool_may_not_take_another_routes_path():
    clashing = SimpleNamespace(tools=[{"function": {"name": "verify", "parameters": {"type": "object"}}}])
    with pytest.raises(ValueError, match="verify"):
        nemo_gym_router(clashing)


# -- OpenEnv ------------------------------------------------------------------------------------


def test_the_action_schema_is_the_services_tools(service):
    got = asyncio.run(schema(service))
    assert got["action"]["properties"]["name"]["enum"] == [t["function"]["name"] for t in service.tools]
    assert set(got) == {"action", "observation", "state"}
