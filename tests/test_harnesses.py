"""Bring your own agent (rollouts/harnesses): mini-swe-agent (sandbox as tool) and a command-line
agent (agent in sandbox, its only way out the proxy's socket) driven by the scripted endpoint; the
workspace graded as any episode's; every call's token ids recorded; harnesses that hang, crash,
write garbage or never call the model end with a clear label and nothing left running."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.gym_envs.repo_env import RepoEnv
from patchgym.rollouts.harnesses import harness_from_spec
from patchgym.rollouts.harnesses.episode import run_harness_episode
from patchgym.rollouts.model import ModelConfig
from patchgym.tasks.catalog import load_task_set
from tests.fake_openai import Turn, call, scripted_endpoint
from tests.serving import serve
from tests.test_server import TASK

AGENT = Path(__file__).with_name("harness_agent.py")
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def oracle(patch: str) -> list[Turn]:
    """mini-swe-agent's protocol: the fix through bash, then its submit command."""
    return [call("bash", {"command": f"printf %s {shlex.quote(patch)} | git apply"}), call("bash", {"command": SUBMIT})]


def noop() -> list[Turn]:
    return [call("bash", {"command": SUBMIT})]


def command_agent(*args: str):
    """The stdlib agent of tests/harness_agent.py, run inside the sandbox by the task's Python."""
    return harness_from_spec(f"cmd: python3 {{harness_dir}}/agent.py {' '.join(args)}",
                             files={"agent.py": AGENT.read_bytes()})


@pytest.fixture(scope="module")
def fake():
    with scripted_endpoint() as model:
        yield model


@pytest.fixture(scope="module")
def mini():
    return harness_from_spec("mini-swe-agent")


def episode(fake, tasks, harness, instance_id=TASK, backend="local", **kw):
    task_set = load_task_set(tasks)
    config = ModelConfig(name="scripted", base_url=fake.url, api_key="sk-secret-of-the-run", backoff=0.01,
                         timeout=30, retries=1)
    return run_harness_episode(lambda extra: RepoEnv(task_set, backend=backend, agent_sandbox_options=extra),
                               task_set, harness, config, instance_id, **{"time_limit": 120, **kw})


def leftovers(marker: str) -> str:
    return subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout.strip()


def test_mini_swe_agent_resolves_with_the_oracle_and_records_every_call(fake, mini, calc_tasks_file, calc_task):
    fake.default = oracle(calc_task.patch)
    ep = episode(fake, calc_tasks_file, mini)
    assert (ep.outcome, ep.end_reason, ep.reward, ep.grading_outcome) == ("resolved", "finished", 1.0, "resolved")
    assert ep.harness["name"] == "mini-swe-agent" and ep.harness["version"] == "2.4.6"
    assert ep.harness_result["exit_status"] == "Submitted" and ep.steps == 2 and ep.turns == 2
    assert all(c["token_ids"] and c["prompt_token_ids"] and c["logprobs"] for c in ep.model_calls)
    assert ep.sample["contiguous"] and ep.sample["calls_with_tokens"] == 2
    # its own SWE-bench prompt, through the proxy (the first user message holds its template)
    assert "<pr_description>" in ep.messages[1]["content"] and ep.messages[-1]["role"] == "assistant"
    assert "raise ValueError" in ep.patch and ep.tokens_in == 210
    fake.default = noop()
    ep = episode(fake, calc_tasks_file, mini)
    assert (ep.outcome, ep.end_reason, ep.reward) == ("unresolved", "finished", 0.0) and ep.patch == ""


def test_the_environment_class_works_as_mini_swe_agent_uses_it(calc_tasks_file, calc_task):
    from minisweagent.exceptions import Submitted

    from patchgym.rollouts.harnesses.mini_swe_agent import PatchgymEnvironment

    env = PatchgymEnvironment(instance_id=TASK, tasks=str(calc_tasks_file), timeout=5)
    try:
        assert env.execute({"command": "ls calc"})["returncode"] == 0
        out = env.execute({"command": "sleep 30"})
        assert out["returncode"] == -1 and "timed out" in out["exception_info"]
        with pytest.raises(Submitted):
            env.execute({"command": SUBMIT})
        assert env.get_template_vars()["cwd"] == env.sandbox.workdir
        assert env.serialize()["info"]["config"]["environment_type"].endswith("PatchgymEnvironment")
    finally:
        env.close()


def test_the_command_harness_resolves_through_the_socket_and_never_sees_the_key(fake, calc_tasks_file, calc_task):
    fake.default = oracle(calc_task.patch)
    ep = episode(fake, calc_tasks_file, command_agent("--stream"))
    assert (ep.outcome, ep.end_reason, ep.reward) == ("resolved", "finished", 1.0), ep.harness_result
    assert ep.harness["pattern"] == "in-sandbox" and ep.harness["version"].startswith("sha256:")
    assert all(c["token_ids"] for c in ep.model_calls) and ep.sample["contiguous"]
    # what the harness's environment holds lands in the graded diff: the proxy's address, no key
    fake.default = [call("bash", {"command": "env > seen.txt; ls -l /run/patchgym >> seen.txt"}),
                    call("bash", {"command": SUBMIT})]
    ep = episode(fake, calc_tasks_file, command_agent())
    assert "OPENAI_BASE_URL=http://127.0.0.1:" in ep.patch and "model.sock" in ep.patch
    assert "sk-secret" not in ep.patch and "OPENAI_API_KEY=patchgym-proxy" in ep.patch


def test_the_sandbox_has_no_way_out_but_the_proxy(fake, calc_tasks_file):
    """Attack: from inside, reach the real endpoint (its loopback port), the host's loopback, the
    bridge's files; each is refused, and the grading sandbox is a plain one."""
    host, port = fake.url.removeprefix("http://").split("/")[0].split(":")
    probe = ("import socket\nfor target in [(%r, %d), ('127.0.0.1', 22)]:\n"
             "    try:\n        socket.create_connection(target, timeout=2); print('REACHED', target)\n"
             "    except OSError as exc: print('refused', target, exc)\n") % (host, int(port))
    fake.default = [call("bash", {"command": f"python3 -c {shlex.quote(probe)} > out.txt 2>&1; "
                                             "rm -f /run/patchgym/model.sock 2>> out.txt; "
                                             "touch /run/patchgym/x 2>> out.txt; echo done >> out.txt"}),
                    call("bash", {"command": SUBMIT})]
    ep = episode(fake, calc_tasks_file, command_agent())
    assert "REACHED" not in ep.patch and "refused" in ep.patch and "Read-only file system" in ep.patch
    task_set = load_task_set(calc_tasks_file)
    env = RepoEnv(task_set, agent_sandbox_options={"read_only_binds": {"/tmp": "/run/patchgym"}})
    try:
        env.reset(options={"task_id": TASK})
        assert env.unwrapped.sandbox.binds
        grading = env.verifier.factory(task_set.get(TASK))
        try:
            assert not getattr(grading, "binds", {}), "the grading sandbox gets no bridge"
        finally:
            grading.close()
    finally:
        env.close()


@pytest.mark.parametrize("template, end_reason, detail", [
    ("sleep 6543", "time_limit", "ran past"),  # hangs: killed at the deadline
    ("echo starting; exit 3", "harness_crashed", "code 3"),  # crashes
    ("head -c 300000 /dev/urandom; printf 'not json' | python3 -c \"import os,sys,urllib.request as u; "
     "u.urlopen(u.Request(os.environ['OPENAI_BASE_URL']+'/chat/completions', data=b'\\xff{', method='POST'))\"",
     "harness_crashed", "code 1"),  # writes garbage (to its output, to the proxy), then dies of the 400
    ("true", "no_model_call", ""),  # never calls the model
])
def test_harnesses_that_misbehave_end_with_a_clear_label(fake, calc_tasks_file, template, end_reason, detail):
    ep = episode(fake, calc_tasks_file, harness_from_spec(f"cmd: {template}"), time_limit=4)
    assert ep.end_reason == end_reason and ep.outcome == "unresolved" and ep.grading_outcome, ep.harness_result
    assert detail in ep.harness_result["detail"] and ep.model_calls == []
    assert leftovers("sleep 6543") == "", "nothing left running"


def test_a_spent_budget_stops_the_harness_and_a_failing_endpoint_masks_it(fake, calc_tasks_file, calc_task):
    fake.default = [call("bash", {"command": "sleep 0.1; echo 5432"})] * 50
    ep = episode(fake, calc_tasks_file, command_agent(), max_turns=3)
    assert ep.end_reason == "max_turns" and ep.outcome == "unresolved" and ep.turns == 3
    assert ep.harness_result["status"] in ("stopped", "crashed")  # killed, or it gave up on the refusal first
    fake.default = [Turn(failures=99, status=503)]
    for harness in (command_agent(), harness_from_spec("mini-swe-agent")):
        ep = episode(fake, calc_tasks_file, harness)
        assert (ep.outcome, ep.end_reason) == ("masked", "model_error") and "503" in ep.mask_reason
        assert ep.report is None, "not graded: the endpoint failed"


def test_mini_swe_agent_stops_at_the_deadline(fake, mini, calc_tasks_file):
    fake.default = [call("bash", {"command": "sleep 6544"})] * 10
    ep = episode(fake, calc_tasks_file, mini, time_limit=3)
    assert ep.end_reason == "time_limit" and ep.outcome == "unresolved"
    assert leftovers("sleep 6544") == ""


def test_patchgym_run_with_a_harness_and_the_server(fake, calc_tasks_file, calc_task, tmp_path):
    fake.default = oracle(calc_task.patch)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--model", "scripted", "--base-url", fake.url, "--output", str(out),
                                      "--tasks", str(calc_tasks_file), "--harness",
                                      "cmd: python3 {harness_dir}/harness_agent.py", "--harness-file", str(AGENT)])
    assert result.exit_code == 0, result.output
    assert "resolved 1/1" in result.output and "harness: cmd sha256:" in result.output
    report = json.loads((out / "report.json").read_text())
    assert report["params"]["harness"]["name"] == "cmd" and 'id="harness"' in (out / "report.html").read_text()
    line = json.loads((out / "trajectories.jsonl").read_text().splitlines()[0])
    assert line["model_calls"][0]["token_ids"] and line["sample"]["contiguous"]
    again = CliRunner().invoke(app, ["run", "--model", "scripted", "--base-url", fake.url, "--output", str(out),
                                     "--tasks", str(calc_tasks_file), "--harness", "cmd: true"])
    assert again.exit_code == 2 and "other settings" in again.output
    bad = CliRunner().invoke(app, ["run", "--model", "m", "--base-url", fake.url, "--output", str(tmp_path / "b"),
                                   "--harness", "openhands"])
    assert bad.exit_code == 2 and "unknown harness" in bad.output

    from patchgym.server.app import create_app

    server = create_app(tasks=calc_tasks_file, max_sessions=1, model_endpoints=[fake.url])
    body = {"task_id": TASK, "model": {"base_url": fake.url, "name": "scripted", "retries": 0},
            "harness": "mini-swe-agent"}
    with serve(server) as url, httpx.Client(base_url=url, timeout=300) as http:
        v = http.post("/v1/rollouts", json=body).json()
        assert v["reward"] == 1.0 and not v["mask_sample"] and v["trajectory"]["harness"]["name"] == "mini-swe-agent"
        assert v["trajectory"]["model_calls"][0]["prompt_token_ids"] and v["trajectory"]["sample"]["segments"]
        assert http.get("/healthz").json()["sessions"] == 0
        assert http.post("/v1/rollouts", json={**body, "harness": "nope"}).status_code == 422
