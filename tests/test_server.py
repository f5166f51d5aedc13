"""The HTTP server: sessions over a real uvicorn server, auth, capacity, verify, tasks, metrics,
and RemoteEnv through gym.make."""

from __future__ import annotations

import shlex
import threading
import time

import gymnasium as gym
import httpx

import patchgym.server  # noqa: F401  (registers patchgym/Remote-v0)
from patchgym.server.app import create_app
from tests.serving import serve

TASK = "fixture__calc-1"


def bash(command: str) -> dict:
    return {"name": "bash", "arguments": {"command": command}}


def apply_via_bash(patch: str) -> dict:
    return bash(f"printf %s {shlex.quote(patch)} | git apply")


SUBMIT = {"name": "submit", "arguments": {}}


def create(http: httpx.Client, **body) -> dict:
    r = http.post("/v1/sessions", json={"task_id": TASK, **body})
    assert r.status_code == 201, r.text
    return r.json()


def test_gold_fix_through_bash_resolves(http, calc_task):
    s = create(http, max_steps=10)
    sid = s["session_id"]
    assert calc_task.problem_statement in s["observation"] and s["info"]["instance_id"] == TASK
    assert {t["function"]["name"] for t in s["tools"]} == {"bash", "str_replace_editor", "submit"}
    r = http.post(f"/v1/sessions/{sid}/step", json={"action": bash("ls calc")}).json()
    assert "__init__.py" in r["observation"] and r["reward"] == 0 and not r["terminated"] and r["info"]["exit_code"] == 0
    r = http.post(f"/v1/sessions/{sid}/step", json={"action": apply_via_bash(calc_task.patch)}).json()
    assert r["info"]["exit_code"] == 0, r["observation"]
    status = http.get(f"/v1/sessions/{sid}").json()
    assert status == {**status, "session_id": sid, "instance_id": TASK, "steps": 2, "done": False}
    r = http.post(f"/v1/sessions/{sid}/step", json={"action": '{"name": "submit", "arguments": {}}'}).json()
    assert r["reward"] == 1.0 and r["terminated"] and not r["truncated"] and r["info"]["resolved"]
    assert http.get(f"/v1/sessions/{sid}").json()["done"]
    # stepping a finished episode is the client's mistake: 409, then reset works again
    assert http.post(f"/v1/sessions/{sid}/step", json={"action": SUBMIT}).status_code == 409
    r = http.post(f"/v1/sessions/{sid}/reset", json={"task_id": TASK})
    assert r.status_code == 200 and r.json()["info"]["instance_id"] == TASK
    r = http.post(f"/v1/sessions/{sid}/step", json={"action": SUBMIT}).json()
    assert r["reward"] == 0.0 and r["terminated"] and not r["info"]["resolved"]  # immediate submit
    assert http.delete(f"/v1/sessions/{sid}").status_code == 204
    assert http.get(f"/v1/sessions/{sid}").status_code == 404


def test_client_mistakes_are_4xx(http):
    assert http.get("/v1/sessions/nope").status_code == 404
    assert http.post("/v1/sessions/nope/step", json={"action": SUBMIT}).status_code == 404
    assert http.delete("/v1/sessions/nope").status_code == 404
    r = http.post("/v1/sessions", json={"task_id": "no-such-task"})
    assert r.status_code == 404 and "no-such-task" in r.json()["detail"]
    assert http.post("/v1/sessions", json={"seed": -1}).status_code == 422
    assert http.post("/v1/sessions", json={"max_steps": 0}).status_code == 422
    assert http.post("/v1/sessions", json={"taskid": TASK}).status_code == 422
    assert http.post("/v1/sessions", content=b"{not json", headers={"content-type": "application/json"}).status_code == 422
    assert http.get("/healthz").json() == {"status": "ok", "sessions": 0, "max_sessions": 32}
    sid = create(http)["session_id"]
    try:
        assert http.post(f"/v1/sessions/{sid}/step", json={}).status_code == 422
        assert http.post(f"/v1/sessions/{sid}/step", json={"action": 3}).status_code == 422
        r = http.post(f"/v1/sessions/{sid}/step", json={"action": "not a tool call"}).json()
        assert r["info"]["invalid_action"] and not r["terminated"]
        assert http.post(f"/v1/sessions/{sid}/reset", json={"task_id": "nope"}).status_code == 404
    finally:
        http.delete(f"/v1/sessions/{sid}")


def test_second_concurrent_step_is_409(http):
    sid = create(http)["session_id"]
    try:
        results: list[int] = []
        slow = threading.Thread(target=lambda: results.append(
            http.post(f"/v1/sessions/{sid}/step", json={"action": bash("sleep 2")}).status_code))
        slow.start()
        time.sleep(0.7)
        assert http.post(f"/v1/sessions/{sid}/step", json={"action": bash("true")}).status_code == 409
        slow.join()
        assert results == [200]
        assert http.post(f"/v1/sessions/{sid}/step", json={"action": bash("true")}).status_code == 200
    finally:
        http.delete(f"/v1/sessions/{sid}")


def test_verify_is_stateless(http, calc_task):
    r = http.post("/v1/verify", json={"instance_id": TASK, "patch": calc_task.patch}).json()
    assert r["reward"] == 1.0 and r["resolved"] and not r["infrastructure_failure"]
    assert r["report"]["instance_id"] == TASK
    assert r["outcome"] == r["report"]["outcome"] == "resolved" and r["outcome_detail"] is None
    r = http.post("/v1/verify", json={"instance_id": TASK, "patch": ""}).json()
    assert r["reward"] == 0.0 and not r["resolved"] and r["outcome"] == "unresolved"
    assert http.post("/v1/verify", json={"instance_id": "nope", "patch": ""}).status_code == 404


def test_tasks_hide_the_answers(http, calc_task):
    listed = http.get("/v1/tasks")
    one = http.get(f"/v1/tasks/{TASK}")
    assert listed.status_code == one.status_code == 200
    assert [t["instance_id"] for t in listed.json()] == [TASK] and one.json() == listed.json()[0]
    for text in (listed.text, one.text):
        assert "diff --git" not in text and "FAIL_TO_PASS" not in text and "PASS_TO_PASS" not in text
        assert not any(test_id in text for test_id in calc_task.FAIL_TO_PASS + calc_task.PASS_TO_PASS)
    assert one.json()["problem_statement"] == calc_task.problem_statement
    assert http.get("/v1/tasks/nope").status_code == 404


def test_metrics_are_prometheus_text(http):
    http.get("/v1/sessions/nope")
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in ("patchgym_sessions_active ", "patchgym_steps_total ", "patchgym_step_latency_seconds_sum ",
                 "patchgym_step_latency_seconds_count ", 'patchgym_errors_total{kind="session_not_found"}'):
        assert name in text, name
    assert "# TYPE patchgym_sessions_active gauge" in text


def test_openapi_lists_every_route(http):
    schema = http.get("/openapi.json").json()
    paths = schema["paths"]
    expected = {
        "/v1/sessions": {"post"}, "/v1/sessions/{session_id}/step": {"post"},
        "/v1/sessions/{session_id}/reset": {"post"}, "/v1/sessions/{session_id}": {"get", "delete"},
        "/v1/verify": {"post"}, "/v1/rollouts": {"post"}, "/v1/tasks": {"get"}, "/v1/tasks/{instance_id}": {"get"},
        "/healthz": {"get"}, "/metrics": {"get"},
    }
    for path, methods in expected.items():
        assert methods <= set(paths[path]), path
    step = paths["/v1/sessions/{session_id}/step"]["post"]
    assert step["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/StepResponse")
    assert {"StepRequest", "StepResponse", "CreateSessionRequest", "VerifyResponse", "TaskView"} <= set(
        schema["components"]["schemas"])


def test_remote_env_resolves_the_gold_fix(url, http, calc_task):
    env = gym.make("patchgym/Remote-v0", url=url, max_steps=5)
    try:
        obs, info = env.reset(options={"task_id": TASK})
        assert calc_task.problem_statement in obs and info["instance_id"] == TASK
        assert env.observation_space.contains(obs)
        assert [t["function"]["name"] for t in env.unwrapped.tools][-1] == "submit"
        sid = env.unwrapped.session_id
        assert http.get(f"/v1/sessions/{sid}").status_code == 200
        obs, reward, terminated, truncated, info = env.step(apply_via_bash(calc_task.patch))
        assert info["exit_code"] == 0 and reward == 0.0 and not terminated
        obs, reward, terminated, truncated, info = env.step(SUBMIT)
        assert reward == 1.0 and terminated and not truncated and info["resolved"]
        obs, info = env.reset(options={"task_id": TASK})  # same session, new episode
        assert env.unwrapped.session_id == sid
    finally:
        env.close()
        env.close()  # idempotent
    assert http.get(f"/v1/sessions/{sid}").status_code == 404


def test_capacity_is_429_with_retry_after(calc_tasks_file):
    app = create_app(tasks=calc_tasks_file, max_sessions=1)
    with serve(app) as u, httpx.Client(base_url=u, timeout=120) as c:
        first = c.post("/v1/sessions", json={"task_id": TASK})
        assert first.status_code == 201
        r = c.post("/v1/sessions", json={"task_id": TASK})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
        assert c.get("/healthz").json() == {"status": "ok", "sessions": 1, "max_sessions": 1}
        assert c.delete(f"/v1/sessions/{first.json()['session_id']}").status_code == 204
        assert c.post("/v1/sessions", json={"task_id": TASK}).status_code == 201
    # leaving the context ran the lifespan's shutdown: every session closed
    assert len(app.state.manager) == 0


def test_token_auth_and_ownership(calc_tasks_file):
    app = create_app(tasks=calc_tasks_file, token=["alpha", "beta"])
    with serve(app) as u, httpx.Client(base_url=u, timeout=120) as c:
        assert c.get("/v1/tasks").status_code == 401
        r = c.get("/v1/tasks", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert c.get("/v1/tasks", headers={"Authorization": "Bearer ålpha".encode()}).status_code == 401
        assert c.post("/v1/sessions", json={"task_id": TASK}).status_code == 401
        alpha, beta = {"Authorization": "Bearer alpha"}, {"Authorization": "Bearer beta"}
        assert c.get("/v1/tasks", headers=alpha).status_code == 200
        assert c.get("/healthz").status_code == 200  # probes need no token
        sid = c.post("/v1/sessions", json={"task_id": TASK}, headers=alpha).json()["session_id"]
        assert c.get(f"/v1/sessions/{sid}", headers=alpha).status_code == 200
        assert c.get(f"/v1/sessions/{sid}", headers=beta).status_code == 404
        assert c.post(f"/v1/sessions/{sid}/step", json={"action": SUBMIT}, headers=beta).status_code == 404
        assert c.delete(f"/v1/sessions/{sid}", headers=beta).status_code == 404
        assert c.get(f"/v1/sessions/{sid}").status_code == 401
        assert c.delete(f"/v1/sessions/{sid}", headers=alpha).status_code == 204


def test_idle_sessions_are_reaped_and_deadlines_close_sessions(calc_tasks_file):
    with serve(create_app(tasks=calc_tasks_file, idle_ttl=0.5)) as u, httpx.Client(base_url=u, timeout=120) as c:
        sid = c.post("/v1/sessions", json={"task_id": TASK}).json()["session_id"]
        deadline = time.monotonic() + 10
        while c.get(f"/v1/sessions/{sid}").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert c.get(f"/v1/sessions/{sid}").status_code == 404
    app = create_app(tasks=calc_tasks_file, operation_timeout=15)
    with serve(app) as u, httpx.Client(base_url=u, timeout=120) as c:
        sid = c.post("/v1/sessions", json={"task_id": TASK}).json()["session_id"]
        app.state.manager.operation_timeout = 0.5
        r = c.post(f"/v1/sessions/{sid}/step", json={"action": bash("sleep 2")})
        assert r.status_code == 504 and "deadline" in r.json()["detail"]
        assert c.get(f"/v1/sessions/{sid}").status_code == 404


def test_serve_refuses_a_public_host_without_token():
    from typer.testing import CliRunner

    from patchgym.cli import app

    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0"], env={"PATCHGYM_SERVER_TOKEN": ""})
    assert result.exit_code == 2 and "token" in result.output


def test_sandbox_failure_is_503_and_closes_the_session(calc_tasks_file, monkeypatch):
    import patchgym.server.core as server_core
    from patchgym.gym_envs.repo_env import RepoEnv
    from patchgym.sandboxes import SandboxError

    class BrokenEnv(RepoEnv):
        def step(self, action):
            raise SandboxError("the sandbox vanished")

    monkeypatch.setattr(server_core, "RepoEnv", BrokenEnv)
    with serve(create_app(tasks=calc_tasks_file)) as u, httpx.Client(base_url=u, timeout=120) as c:
        sid = c.post("/v1/sessions", json={"task_id": TASK}).json()["session_id"]
        r = c.post(f"/v1/sessions/{sid}/step", json={"action": SUBMIT})
        assert r.status_code == 503 and "the sandbox vanished" in r.json()["detail"]
        assert c.get(f"/v1/sessions/{sid}").status_code == 404
        assert 'patchgym_errors_total{kind="infrastructure"} 1.0' in c.get("/metrics").text
