"""NeMo Gym's resources-server protocol over a real uvicorn server: seed, tool calls, verify and
close, called the way NeMo Gym's agent calls them (each call carries only the cookies of the
previous response), plus the typed session contract, auth, masking and the dataset rows."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from patchgym.server.app import create_app
from patchgym.server.nemo_gym.dataset import nemo_gym_dataset_rows
from patchgym.server.nemo_gym.routes import COOKIE
from patchgym.tasks.catalog import load_task_set
from tests.serving import serve
from tests.test_server import TASK, apply_via_bash

FIX_OLD = "    values = list(values)\n    return sum(values)"
FIX_NEW = '    values = list(values)\n    if not values:\n        raise ValueError("mean() of an empty sequence")\n' \
          "    return sum(values)"


class Rollout:
    """One rollout's calls as NeMo Gym's simple agent makes them: each request sends the cookies of
    the latest response and nothing else (its client keeps no cookie jar)."""

    def __init__(self, http: httpx.Client, headers: dict[str, str] | None = None) -> None:
        self.http = http
        self.headers = headers or {}
        self.cookies: dict[str, str] = {}

    def post(self, path: str, body: object = None, *, raw: bytes | None = None) -> httpx.Response:
        headers = dict(self.headers)
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if raw is not None:
            r = self.http.post(path, content=raw, headers={**headers, "Content-Type": "application/json"})
        else:
            r = self.http.post(path, json=body, headers=headers)
        self.http.cookies.clear()
        self.cookies = dict(r.cookies)
        return r


@pytest.fixture(scope="module")
def row(calc_tasks_file) -> dict:
    return next(nemo_gym_dataset_rows(load_task_set(calc_tasks_file)))


def seeded(http: httpx.Client, body: dict, headers: dict[str, str] | None = None) -> Rollout:
    rollout = Rollout(http, headers)
    r = rollout.post("/seed_session", body)
    assert r.status_code == 200, r.text
    assert COOKIE in rollout.cookies
    return rollout


def verify_body(row: dict) -> dict:
    return {**row, "response": {"id": "resp_1", "output": [], "extra": "kept"}}


def test_gold_patch_through_bash_verifies_to_one(http, row, calc_task):
    rollout = seeded(http, row)
    sid = rollout.cookies[COOKIE]
    assert len(sid) == 32 and int(sid, 16) >= 0
    r = rollout.post("/bash", {"command": "ls calc"})
    assert r.status_code == 200 and r.json() == {"output": "__init__.py\n[exit code: 0]", "reward": 0.0, "done": False}
    assert rollout.cookies == {COOKIE: sid}  # re-set on every answer: the agent keeps only the latest
    r = rollout.post("/bash", apply_via_bash(calc_task.patch)["arguments"])
    assert r.json()["output"].endswith("[exit code: 0]") and not r.json()["done"]
    r = rollout.post("/verify", verify_body(row))
    assert r.status_code == 200, r.text
    v = r.json()
    assert v["reward"] == 1.0 and v["resolved"] and v["mask_sample"] is False and v["failure_kind"] is None
    assert v["instance_id"] == TASK and v["report"]["instance_id"] == TASK and v["report"]["resolved"]
    # the request is echoed, its own fields included
    assert v["responses_create_params"] == row["responses_create_params"] and v["response"]["extra"] == "kept"
    # verify closed the session: its cookie is now unknown
    assert http.post("/bash", json={"command": "true"}, headers={"Cookie": f"{COOKIE}={sid}"}).status_code == 404
    assert http.get("/healthz").json()["sessions"] == 0


def test_no_change_verifies_to_zero_and_a_seed_draws_a_task(http, row):
    drawn = Rollout(http)
    assert drawn.post("/seed_session", {"seed": 3}).json() == {"instance_id": TASK}
    r = drawn.post("/close_session")
    assert r.status_code == 200 and r.json() == {} and not drawn.cookies  # the cookie is dropped too
    rollout = seeded(http, {"responses_create_params": row["responses_create_params"], "seed": 3})
    v = rollout.post("/verify", {"responses_create_params": row["responses_create_params"], "response": {}}).json()
    assert v["reward"] == 0.0 and not v["resolved"] and not v["mask_sample"] and v["instance_id"] == TASK
    assert v["report"]["patch_exists"] is False


def test_editor_and_submit_routes_and_verify_reuses_the_submit(http, row):
    rollout = seeded(http, row)
    r = rollout.post("/str_replace_editor", {"command": "view", "path": "calc/__init__.py"})
    assert r.status_code == 200 and "def mean(values):" in r.json()["output"]
    r = rollout.post("/str_replace_editor", {"command": "str_replace", "path": "calc/__init__.py",
                                             "old_str": FIX_OLD, "new_str": FIX_NEW})
    assert "has been edited" in r.json()["output"] and not r.json()["done"]
    r = rollout.post("/str_replace_editor", {"command": "bogus", "path": "calc/__init__.py"})
    assert r.status_code == 200 and not r.json()["done"] and "bogus" in r.json()["output"]  # told, not 422
    r = rollout.post("/bash", raw=b"{not json")  # arguments that are not JSON reach the model as an error
    assert r.status_code == 200 and "not valid JSON" in r.json()["output"]
    r = rollout.post("/submit", {})
    assert r.json()["reward"] == 1.0 and r.json()["done"] and "hidden tests pass" in r.json()["output"]
    r = rollout.post("/bash", {"command": "true"})  # a call after the end: told, cookie kept for verify
    assert r.status_code == 200 and r.json()["done"] and "over" in r.json()["output"]
    steps = _nemo_steps(http)
    v = rollout.post("/verify", verify_body(row)).json()
    assert v["reward"] == 1.0 and v["resolved"] and not v["mask_sample"]
    assert _nemo_steps(http) == steps  # the submit's grade was reused, not graded again


def test_client_mistakes_are_clear_4xx(http, row):
    r = http.post("/bash", json={"command": "ls"})
    assert r.status_code == 400 and "/seed_session" in r.json()["detail"] and COOKIE in r.json()["detail"]
    r = http.post("/bash", json={"command": "ls"}, headers={"Cookie": f"{COOKIE}={'0' * 32}"})
    assert r.status_code == 404 and "unknown session" in r.json()["detail"]
    r = http.post("/verify", json=verify_body(row))
    assert r.status_code == 400 and "instance_id and patch" in r.json()["detail"]
    r = http.post("/verify", json=verify_body(row), headers={"Cookie": f"{COOKIE}=nope"})
    assert r.status_code == 404
    r = http.post("/seed_session", json={**row, "instance_id": "no-such-task"})
    assert r.status_code == 404 and "no-such-task" in r.json()["detail"] and COOKIE not in r.cookies
    r = http.post("/seed_session", json={"task_data": {"task_id": "no-such-task"}})
    assert r.status_code == 404
    assert http.post("/seed_session", json={"seed": -1}).status_code == 422
    assert http.post("/seed_session", json={"task_data": {"seed": "x"}}).status_code == 422
    assert http.post("/close_session").json() == {}  # nothing to close is not an error
    assert http.get("/healthz").json()["sessions"] == 0


def test_verify_with_a_cookie_of_another_task_is_409(calc_repo, tmp_path, row):
    from tests.conftest import calc_task_row

    repo, info = calc_repo
    tasks = tmp_path / "two.jsonl"
    tasks.write_text("".join(json.dumps(calc_task_row(repo, info, instance_id=i)) + "\n" for i in (TASK, "other-1")))
    with serve(create_app(tasks=tasks)) as u, httpx.Client(base_url=u, timeout=120) as c:
        rollout = seeded(c, {**row, "instance_id": "other-1"})
        r = rollout.post("/verify", verify_body(row))
        assert r.status_code == 409 and "mixed up" in r.json()["detail"]


def test_stateless_verify_grades_a_patch(http, row, calc_task):
    r = http.post("/verify", json={**verify_body(row), "patch": calc_task.patch})
    assert r.status_code == 200, r.text
    v = r.json()
    assert v["reward"] == 1.0 and v["resolved"] and not v["mask_sample"] and v["response"]["extra"] == "kept"
    v = http.post("/verify", json={"instance_id": TASK, "patch": ""}).json()
    assert v["reward"] == 0.0 and not v["resolved"]
    assert http.post("/verify", json={"instance_id": "nope", "patch": ""}).status_code == 404


def test_typed_resources_session_follows_the_contract(http, row):
    """NeMo Gym's check_resources_session_contract: seed, repeated seed, close, repeated close, close
    of a never-seeded id, and no seed after a close."""
    seed = {"resources_session_id": "rs-1", "episode_id": {"rollout_id": "r"},
            "task_id": {"taskset": "patchgym", "task_id": "0"}, "task_data": row}
    first, again = seeded(http, seed), seeded(http, seed)
    assert first.http.post("/seed_session", json=seed).json() == {"resources_session_id": "rs-1"}
    assert first.cookies == again.cookies  # the same session, not a second one
    assert http.get("/healthz").json()["sessions"] == 1
    other_episode = {**seed, "episode_id": {"rollout_id": "r2"}}
    assert http.post("/seed_session", json=other_episode).status_code == 409
    assert again.post("/bash", {"command": "git status --short"}).json()["output"] == "[exit code: 0]"
    close = {"resources_session_id": "rs-1", "episode_id": {"rollout_id": "r"}}
    for _ in range(2):
        r = http.post("/close_session", json=close)
        assert r.status_code == 200 and r.json() == {"resources_session_id": "rs-1"}
    assert http.get("/healthz").json()["sessions"] == 0
    r = http.post("/close_session", json={**close, "resources_session_id": "rs-never"})
    assert r.status_code == 200 and r.json() == {"resources_session_id": "rs-never"}
    for late in ("rs-1", "rs-never"):
        r = http.post("/seed_session", json={**seed, "resources_session_id": late})
        assert r.status_code == 409 and "closed" in r.json()["detail"]
    # a typed seed names its task through task_data (the row's instance_id)
    r = http.post("/seed_session", json={**seed, "resources_session_id": "rs-2",
                                         "task_data": {"instance_id": "no-such-task"}})
    assert r.status_code == 404


def typed_seed(row: dict, rid: str, rollout_id: str = "0-0", attempt: int = 0) -> dict:
    """What NeMo Gym 0.7.0's single_agent_turn sends: its own id, the episode, the task and the row's fields."""
    return {"resources_session_id": rid, "episode_id": {"rollout_id": rollout_id, "attempt": attempt},
            "task_id": {"taskset": "patchgym_agent", "task_id": TASK},
            "task_data": {k: v for k, v in row.items() if k not in ("responses_create_params", "agent_ref")}}


def test_a_typed_episode_as_single_agent_turn_runs_it(http, row, calc_task):
    """NeMo Gym 0.7.0's environment server: typed seed, tool calls with the seed's cookies, verify
    (the row's fields, the prompt and the response, with the cookies), then /close_session, which
    alone frees the sandbox. A repeated verify (a lost reply retried) answers the same grade."""
    closed_before = _closed(http, "client")
    rollout = seeded(http, typed_seed(row, "rs-typed"))
    assert rollout.post("/bash", apply_via_bash(calc_task.patch)["arguments"]).json()["done"] is False
    body = {**typed_seed(row, "-")["task_data"], "responses_create_params": row["responses_create_params"],
            "response": {"id": "resp_1", "output": []}}
    first = rollout.post("/verify", body).json()
    assert first["reward"] == 1.0 and first["resolved"] and first["mask_sample"] is False
    assert first["failure_kind"] is None and first["failure_reason"] is None
    assert http.get("/healthz").json()["sessions"] == 1  # verify left it to its caller's close
    again = rollout.post("/verify", body).json()
    assert again["reward"] == 1.0 and again["report"] == first["report"]
    close = {"resources_session_id": "rs-typed", "episode_id": {"rollout_id": "0-0", "attempt": 0}}
    r = rollout.post("/close_session", close)
    assert r.status_code == 200 and r.json() == {"resources_session_id": "rs-typed"}
    assert http.get("/healthz").json()["sessions"] == 0  # freed at once, not at the idle TTL
    assert _closed(http, "client") == closed_before + 1 and _closed(http, "idle") == 0
    assert http.post("/close_session", json=close).status_code == 200  # and again: idempotent


def test_a_retried_episode_gets_a_fresh_session(http, row):
    """A retry (attempt 1) comes with a new resources_session_id: a session of its own in a fresh
    sandbox, whatever became of attempt 0's; attempt 0's id is not the retry's."""
    first = seeded(http, typed_seed(row, "rs-a0"))
    first.post("/bash", {"command": "echo attempt-0 > left-behind.txt"})
    retry = seeded(http, typed_seed(row, "rs-a1", attempt=1))
    assert retry.cookies != first.cookies
    assert "No such file" in retry.post("/bash", {"command": "cat left-behind.txt"}).json()["output"]
    assert http.post("/seed_session", json=typed_seed(row, "rs-a0", attempt=1)).status_code == 409
    for rid, attempt in (("rs-a0", 0), ("rs-a1", 1)):
        close = {"resources_session_id": rid, "episode_id": {"rollout_id": "0-0", "attempt": attempt}}
        assert http.post("/close_session", json=close).status_code == 200
    assert http.get("/healthz").json()["sessions"] == 0


def test_failure_kinds_name_what_the_report_says():
    from patchgym.server.nemo_gym.outcome import Outcome, failure_of

    assert failure_of({"resolved": True}) == (False, None, None)
    assert failure_of({"infrastructure_failure": True, "infrastructure_failure_reason": "no disk"}) == (
        True, "provider_unavailable", "no disk")
    # the policy's doing: scored 0, named, never masked
    assert failure_of({"tampering_detected": True, "tampering_reason": "forged junit"}) == (
        False, "patchgym:tampering", "forged junit")
    assert failure_of({"test_timed_out": True})[:2] == (False, "patchgym:test_timeout")
    masked = Outcome.graded(1.0, {"resolved": True, "infrastructure_failure": True})
    assert masked.reward == 0.0 and not masked.resolved and masked.mask_sample


def test_cookie_of_another_token_is_404(calc_tasks_file, row):
    app = create_app(tasks=calc_tasks_file, token=["a", "b"])
    with serve(app) as u, httpx.Client(base_url=u, timeout=120) as c:
        a, b = {"Authorization": "Bearer a"}, {"Authorization": "Bearer b"}
        assert c.post("/seed_session", json=row).status_code == 401
        rollout = seeded(c, row, headers=a)
        cookie = {"Cookie": f"{COOKIE}={rollout.cookies[COOKIE]}"}
        r = c.post("/bash", json={"command": "ls"}, headers={**b, **cookie})
        assert r.status_code == 404 and "unknown session" in r.json()["detail"]
        assert c.post("/verify", json=verify_body(row), headers={**b, **cookie}).status_code == 404
        assert c.post("/bash", json={"command": "ls"}, headers=cookie).status_code == 401
        c.post("/close_session", headers={**b, **cookie})  # another token's close closes nothing
        assert rollout.post("/bash", {"command": "true"}).status_code == 200
        # NeMo Gym sends no Authorization header; a token in its server URL arrives as Basic auth
        with httpx.Client(base_url=u.replace("http://", "http://patchgym:a@"), timeout=120) as basic:
            assert basic.post("/bash", json={"command": "true"}, headers=cookie).status_code == 200
        with httpx.Client(base_url=u.replace("http://", "http://patchgym:wrong@"), timeout=120) as wrong:
            assert wrong.post("/bash", json={"command": "true"}, headers=cookie).status_code == 401
        assert rollout.post("/close_session").status_code == 200
        assert len(app.state.manager) == 0


def test_infrastructure_failure_is_masked(calc_tasks_file, row, monkeypatch):
    import patchgym.server.core as server_core
    from patchgym.gym_envs.repo_env import RepoEnv
    from patchgym.sandboxes import SandboxError

    class BrokenEnv(RepoEnv):
        def step(self, action):
            raise SandboxError("the sandbox vanished")

    monkeypatch.setattr(server_core, "RepoEnv", BrokenEnv)
    with serve(create_app(tasks=calc_tasks_file)) as u, httpx.Client(base_url=u, timeout=120) as c:
        rollout = seeded(c, row)
        r = rollout.post("/bash", {"command": "ls"})
        assert r.status_code == 503 and "the sandbox vanished" in r.json()["detail"]
        assert COOKIE in rollout.cookies  # kept, so verify can still name the session
        r = rollout.post("/bash", {"command": "ls"})
        assert r.status_code == 200 and r.json()["done"] and "the sandbox vanished" in r.json()["output"]
        v = rollout.post("/verify", verify_body(row)).json()
        assert v["reward"] == 0.0 and v["mask_sample"] is True and v["failure_kind"] == "provider_unavailable"
        assert "the sandbox vanished" in v["failure_reason"]
        # a failure during verify's own submit is masked too
        rollout = seeded(c, row)
        v = rollout.post("/verify", verify_body(row)).json()
        assert v["mask_sample"] is True and v["failure_kind"] == "provider_unavailable"
        assert c.get("/healthz").json()["sessions"] == 0


def test_aggregate_metrics_in_nemo_gyms_shape_masked_samples_left_out(http):
    """The shape of nemo_gym.reward_profile.compute_aggregate_metrics (0.4.0): one group per
    _ng_task_index with {stat}/{field} (bools as 0/1, usage numbers included) and rollout_infos;
    agent_metrics over every rollout; key_metrics the mean/ ones."""
    usage = {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14}
    responses = [
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "instance_id": "a", "reward": 1.0, "resolved": True,
         "mask_sample": False, "response": {"usage": usage}, "report": {"x": 1}},
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "instance_id": "a", "reward": 0.0, "resolved": False,
         "mask_sample": False, "response": {"usage": {**usage, "output_tokens": 8}}},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "instance_id": "b", "reward": 0.0, "resolved": False,
         "mask_sample": True},
        {"_ng_task_index": 2, "_ng_rollout_index": 0, "instance_id": "c", "reward": 1.0, "resolved": True},
    ]
    m = http.post("/aggregate_metrics", json={"verify_responses": responses}).json()
    first, masked, single = m["group_level_metrics"]
    assert [g["_ng_task_index"] for g in m["group_level_metrics"]] == [0, 1, 2]
    assert first["mean/reward"] == 0.5 and first["max/reward"] == 1.0 and first["min/reward"] == 0.0
    assert first["median/reward"] == 0.5 and first["std/reward"] == pytest.approx(0.7071067811865476)
    assert first["mean/resolved"] == 0.5 and first["mean/output_tokens"] == 6.0 and "mean/report" not in first
    assert first["num_rollouts"] == 2 and first["instance_id"] == "a"
    assert [i["rollout_id"] for i in first["rollout_infos"]] == ["0:0", "0:1"]
    assert first["rollout_infos"][1]["reward"] == 1.0 and first["rollout_infos"][1]["_ng_rollout_index"] == 1
    assert masked["num_masked"] == 1 and masked["num_rollouts"] == 0 and "mean/reward" not in masked
    assert single["std/reward"] == 0.0 and single["mean/reward"] == 1.0
    agent = m["agent_metrics"]
    assert agent["mean/reward"] == pytest.approx(2 / 3) and agent["num_samples"] == 4 and agent["num_masked"] == 1
    assert agent["max/reward"] == 1.0 and "mean/_ng_task_index" not in agent
    assert m["key_metrics"] == {k: v for k, v in agent.items() if k.startswith("mean/")}
    assert http.post("/aggregate_metrics", json={"verify_responses": []}).json() == {
        "group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}


def test_an_unknown_tool_or_a_model_called_verify_keeps_the_rollout_alive(http, row, calc_task):
    """NeMo Gym's agent posts every model call to /<tool name> and keeps only the cookies of the
    latest answer: an unknown tool (or one named like a NeMo Gym route) is a tool output, cookie kept."""
    rollout = seeded(http, row)
    sid = rollout.cookies[COOKIE]
    r = rollout.post("/python", {"code": "print(1)"})
    assert r.status_code == 200 and rollout.cookies == {COOKIE: sid}
    assert not r.json()["done"] and "unknown tool 'python'" in r.json()["output"] and "bash" in r.json()["output"]
    r = rollout.post("/verify", {"anything": 1})  # the model "calling verify": no grading, no close
    assert r.status_code == 200 and rollout.cookies == {COOKIE: sid} and "unknown tool 'verify'" in r.json()["output"]
    rollout.post("/bash", apply_via_bash(calc_task.patch)["arguments"])
    v = rollout.post("/verify", verify_body(row)).json()
    assert v["reward"] == 1.0 and v["resolved"]
    # without a session an unknown path stays a plain 404; an unknown cookie is still an error
    assert http.post("/python", json={}).status_code == 404
    assert http.post("/python", json={}, headers={"Cookie": f"{COOKIE}=nope"}).status_code == 404


def test_a_full_server_queues_nemo_gym_seeds_and_the_native_api_still_says_429(calc_tasks_file, row):
    import concurrent.futures

    app = create_app(tasks=calc_tasks_file, max_sessions=1, seed_wait=30)
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        first = seeded(c, row)
        native = c.post("/v1/sessions", json={"task_id": TASK})
        assert native.status_code == 429 and "Retry-After" in native.headers
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            waiting = [pool.submit(seeded, httpx.Client(base_url=url, timeout=60), row) for _ in range(2)]
            deadline = time.monotonic() + 10
            while _metric(c, "patchgym_sessions_waiting") < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _metric(c, "patchgym_sessions_waiting") == 2
            assert not any(f.done() for f in waiting), "a queued seed answered while the server was full"
            assert first.post("/verify", verify_body(row)).json()["reward"] == 0.0  # frees the slot
            for _ in waiting:  # each queued seed gets the slot the one before it frees
                done = next(f for f in concurrent.futures.as_completed(
                    [f for f in waiting if not getattr(f, "verified", False)], timeout=60))
                assert done.result().post("/verify", verify_body(row)).json()["reward"] == 0.0
                done.verified = True
        text = c.get("/metrics").text
        assert _metric(c, "patchgym_sessions_waiting") == 0
        assert 'patchgym_session_wait_seconds_count 2.0' in text


def test_a_seed_that_waits_too_long_is_429(calc_tasks_file, row):
    app = create_app(tasks=calc_tasks_file, max_sessions=1, seed_wait=0.5)
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        first = seeded(c, row)
        started = time.monotonic()
        r = c.post("/seed_session", json=row)
        assert r.status_code == 429 and 0.4 < time.monotonic() - started < 10
        assert first.post("/verify", verify_body(row)).status_code == 200


def test_an_abandoned_rollout_frees_its_slot_and_a_late_verify_is_masked(calc_tasks_file, row):
    app = create_app(tasks=calc_tasks_file, max_sessions=1, rollout_idle_ttl=1, idle_ttl=600)
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        abandoned = seeded(c, row)
        deadline = time.monotonic() + 20
        while c.get("/healthz").json()["sessions"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert c.get("/healthz").json()["sessions"] == 0, "the idle rollout session was not reaped"
        r = abandoned.post("/bash", {"command": "true"})
        assert r.status_code == 200 and r.json()["done"] and "idling" in r.json()["output"]
        v = abandoned.post("/verify", verify_body(row)).json()
        assert v["mask_sample"] is True and v["failure_kind"] == "session_expired" and v["reward"] == 0.0
        assert _closed(c, "idle") == 1
        native = c.post("/v1/sessions", json={"task_id": TASK})  # the native TTL is its own, not the rollout one
        assert native.status_code in (200, 201), native.text


def _metric(http: httpx.Client, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def test_dataset_rows_are_well_formed(calc_tasks_file, calc_task, tmp_path, http):
    from typer.testing import CliRunner

    from patchgym.cli import app

    out = tmp_path / "data" / "train.jsonl"
    result = CliRunner().invoke(app, ["tasks", "nemo-gym-dataset", "--output", str(out), "--tasks",
                                      str(calc_tasks_file), "--agent-name", "patchgym_agent"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert row["instance_id"] == TASK
    assert row["agent_ref"] == {"type": "responses_api_agents", "name": "patchgym_agent"}
    system, user = row["responses_create_params"]["input"]
    assert system["role"] == "system" and user["role"] == "user"
    assert calc_task.problem_statement in user["content"] and calc_task.test_spec.command in user["content"]
    tools = row["responses_create_params"]["tools"]
    assert [t["name"] for t in tools] == ["bash", "str_replace_editor", "submit"]
    for tool in tools:
        assert set(tool) == {"type", "name", "description", "parameters", "strict"}
        assert tool["type"] == "function" and tool["strict"] is False and tool["description"]
        assert tool["parameters"]["type"] == "object" and isinstance(tool["parameters"]["properties"], dict)
    assert tools[0]["parameters"]["required"] == ["command"]
    text = json.dumps(row)  # never the answers
    assert "diff --git" not in text and not any(t in text for t in calc_task.FAIL_TO_PASS + calc_task.PASS_TO_PASS)
    # every tool of a row has its route, and the route documents the same arguments
    paths = http.get("/openapi.json").json()["paths"]
    for tool in tools:
        body = paths[f"/{tool['name']}"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == tool["parameters"]
    assert {"/seed_session", "/verify", "/close_session", "/aggregate_metrics"} <= set(paths)
    assert paths["/verify"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/NemoGymVerifyResponse")


def _closed(http: httpx.Client, reason: str) -> float:
    """``patchgym_sessions_closed_total`` of NeMo Gym sessions closed for ``reason``."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(f'patchgym_sessions_closed_total{{protocol="nemo_gym",reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def _nemo_steps(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('patchgym_steps_total{protocol="nemo_gym"}'):
            return float(line.split()[-1])
    return 0.0
