"""Bring your own agent (rollouts/harnesses): mini-swe-agent (sandbox as tool), a command-line agent
and Codex CLI (agent in sandbox, their only way out the proxy's socket), driven by the scripted
endpoint on the calc task: the agent's sandbox has no way out but the proxy and never sees the key;
harnesses that hang, crash, write garbage, never call the model, spend their budget or meet a
failing endpoint end with a clear label and nothing left running; `patchgym run` and the server.

Each case is a copy of the calc task with its own bug report (the scripted endpoint keys its
scripts by it), so a test's episodes run side by side; all share one environment. That the oracle
resolves and the no-op does not, through each harness on each backend: test_harnesses_bundled.py."""

from __future__ import annotations

import json
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
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
from tests.conftest import calc_task_row
from tests.fake_openai import Turn
from tests.harness_cases import AGENT, SUBMIT, commands, oracle, shell
from tests.serving import serve

CASES = ("escape-cmd", "escape-codex", "garbage", "silent", "codex-hang", "codex-crash", "mini-deadline",
         "codex-budget", "failing-cmd", "failing-mini", "failing-codex", "run", "server")


@pytest.fixture(scope="module")
def cases(calc_repo, tmp_path_factory) -> Path:
    """The calc task once per case: ``fixture__calc-<case>``, its bug report ending ``[<case>]``."""
    repo, info = calc_repo
    path = tmp_path_factory.mktemp("cases") / "cases.jsonl"
    rows = [calc_task_row(repo, info, instance_id=f"fixture__calc-{case}",
                          problem_statement=f"mean([]) raises ZeroDivisionError instead of ValueError [{case}]")
            for case in CASES]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def episode(fake, tasks_file, harness, case: str, **kw):
    task_set = load_task_set(tasks_file)
    config = ModelConfig(name="scripted", base_url=fake.url, api_key="sk-secret-of-the-run", backoff=0.01,
                         timeout=30, retries=1)
    return run_harness_episode(lambda extra: RepoEnv(task_set, agent_sandbox_options=extra), task_set, harness,
                               config, f"fixture__calc-{case}", **{"time_limit": 120, **kw})


def side_by_side(*runs):
    """Run each () -> episode at once (threads: the episodes wait on sandboxes and the endpoint)."""
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        return [future.result() for future in [pool.submit(run) for run in runs]]


def script(fake, case: str, turns: list[Turn]) -> None:
    fake.scripts[f"[{case}]"] = turns


def leftovers(marker: str) -> str:
    return subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout.strip()


def test_the_environment_class_works_as_mini_swe_agent_uses_it(calc_tasks_file):
    from minisweagent.exceptions import Submitted

    from patchgym.rollouts.harnesses.mini_swe_agent import PatchgymEnvironment

    env = PatchgymEnvironment(instance_id="fixture__calc-1", tasks=str(calc_tasks_file), timeout=1)
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


def test_the_agent_in_the_sandbox_has_no_way_out_but_the_proxy(scripted, harnesses, cases, calc_task):
    """Attack, from inside, through the command agent and through Codex CLI: reach the real endpoint
    (its loopback port) and the host's loopback, remove the socket (``unlink``: Codex refuses ``rm -f``
    of its own accord), write the bridge and Codex's install. Each is refused; what the harness's
    environment holds (and Codex's config) lands in the graded diff: the proxy's address, a
    placeholder key, never the run's. Both still resolve through the proxy, with every call's token
    ids."""
    host, port = scripted.url.removeprefix("http://").split("/")[0].split(":")
    probe = ("import socket\nfor target in [(%r, %d), ('127.0.0.1', 22)]:\n"
             "    try:\n        socket.create_connection(target, timeout=2); print('REACHED', target)\n"
             "    except OSError as exc: print('refused', target, exc)\n") % (host, int(port))
    attack = (f"python3 -c {shlex.quote(probe)} > out.txt 2>&1; env >> out.txt; ls -l /run/patchgym >> out.txt; "
              "cat \"$CODEX_HOME/config.toml\" >> out.txt 2>&1; unlink /run/patchgym/model.sock 2>> out.txt; "
              "touch /run/patchgym/x /run/patchgym-harness/x 2>> out.txt; echo done >> out.txt")
    for name in ("cmd", "codex"):
        script(scripted, f"escape-{name}", [shell(name, attack), *oracle(name, calc_task.patch)])
    cmd, codex = side_by_side(*(lambda name=name: episode(scripted, cases, harnesses(name), f"escape-{name}")
                                for name in ("cmd", "codex")))
    for ep in (cmd, codex):
        assert (ep.outcome, ep.end_reason) == ("resolved", "finished"), ep.harness_result
        assert all(c["token_ids"] for c in ep.model_calls) and ep.sample["contiguous"]
        seen = ep.patch
        assert "REACHED" not in seen and seen.count("\n+refused (") == 2 and "model.sock" in seen
        assert "touch: cannot touch '/run/patchgym/x': Read-only file system" in seen
        assert "OPENAI_BASE_URL=http://127.0.0.1:" in seen and "OPENAI_API_KEY=patchgym-proxy" in seen
        assert "sk-secret" not in seen and "sk-secret" not in json.dumps(ep.model_calls)
    assert "'/run/patchgym-harness/x': Read-only file system" in codex.patch, "Codex's install is read-only"
    assert 'wire_api = "responses"' in codex.patch and cmd.harness["version"].startswith("sha256:")
    assert scripted.authorizations and set(scripted.authorizations) == {"Bearer sk-secret-of-the-run"}


def test_the_grading_sandbox_gets_no_bridge(calc_tasks_file):
    task_set = load_task_set(calc_tasks_file)
    env = RepoEnv(task_set, agent_sandbox_options={"read_only_binds": {"/tmp": "/run/patchgym"}})
    try:
        env.reset(options={"task_id": "fixture__calc-1"})
        assert env.unwrapped.sandbox.binds
        grading = env.verifier.factory(task_set.get("fixture__calc-1"))
        try:
            assert not getattr(grading, "binds", {}), "the grading sandbox gets no bridge"
        finally:
            grading.close()
    finally:
        env.close()


def test_harnesses_that_misbehave_end_with_a_clear_label(scripted, harnesses, cases):
    """Each ends with its label, graded as the workspace stands, nothing left running: Codex CLI
    hanging in a command (killed at the deadline with what it started), crashing on its config; a
    command that writes garbage (to its output, to the proxy) and exits non-zero, one that never
    calls the model; mini-swe-agent stopped at the deadline mid-command."""
    garbage = ("head -c 300000 /dev/urandom; printf 'not json' | python3 -c \"import os,sys,urllib.request as u; "
               "u.urlopen(u.Request(os.environ['OPENAI_BASE_URL']+'/chat/completions', data=b'\\xff{', method='POST'))\"; "
               "exit 3")
    script(scripted, "codex-hang", [shell("codex", "sleep 6545")] * 5)
    script(scripted, "mini-deadline", [shell("mini-swe-agent", "sleep 6544")] * 5)
    expected = {  # case: (harness, end_reason, the harness's own detail)
        "garbage": (harness_from_spec(f"cmd: {garbage}"), "harness_crashed", "code 3"),
        "silent": (harness_from_spec("cmd: true"), "no_model_call", ""),
        "codex-hang": (harnesses("codex"), "time_limit", "ran past"),
        "codex-crash": (harness_from_spec("codex", config={"approval_policy": "bogus"}), "harness_crashed", "code 1"),
        "mini-deadline": (harnesses("mini-swe-agent"), "time_limit", ""),
    }
    episodes = side_by_side(*(lambda case=case, h=h: episode(scripted, cases, h, case, time_limit=5)
                              for case, (h, _, _) in expected.items()))
    for (case, (_, end_reason, detail)), ep in zip(expected.items(), episodes, strict=True):
        assert (ep.end_reason, ep.outcome) == (end_reason, "unresolved") and ep.grading_outcome, (case, ep.harness_result)
        assert detail in ep.harness_result["detail"], (case, ep.harness_result)
        assert ep.model_calls == [] or case in ("codex-hang", "mini-deadline"), case
    assert "HTTP Error 400" in episodes[0].harness_result["output_tail"], "the proxy refused the garbage"
    assert "unknown variant `bogus`" in episodes[3].harness_result["output_tail"]
    assert leftovers("sleep 654") == "", "nothing left running"


def test_a_spent_budget_stops_the_harness_and_a_failing_endpoint_masks_it(scripted, harnesses, cases):
    script(scripted, "codex-budget", [shell("codex", "sleep 0.1; echo 5432")] * 50)
    for name in ("cmd", "mini", "codex"):
        script(scripted, f"failing-{name}", [Turn(failures=99, status=503)])
    runs = [("codex-budget", "codex"), ("failing-cmd", "cmd"), ("failing-mini", "mini-swe-agent"),
            ("failing-codex", "codex")]
    episodes = side_by_side(*(lambda case=case, name=name: episode(scripted, cases, harnesses(name), case, max_turns=3)
                              for case, name in runs))
    budget = episodes[0]  # stopped through the bridge, or it gave up on the refusal first; graded
    assert (budget.end_reason, budget.outcome, budget.turns) == ("max_turns", "unresolved", 3), budget.harness_result
    assert budget.harness_result["status"] in ("stopped", "crashed")
    for ep in episodes[1:]:  # the endpoint failed: masked, not graded
        assert (ep.outcome, ep.end_reason) == ("masked", "model_error") and "503" in ep.mask_reason, ep.harness_result
        assert ep.report is None


def test_patchgym_run_with_a_harness_and_the_server(scripted, cases, calc_task, tmp_path):
    script(scripted, "run", commands("cmd", f"printf %s {shlex.quote(calc_task.patch)} | git apply"))
    script(scripted, "server", oracle("codex", calc_task.patch))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--model", "scripted", "--base-url", scripted.url, "--output", str(out),
                                      "--tasks", str(cases), "--instance-ids", "fixture__calc-run", "--harness",
                                      "cmd: python3 {harness_dir}/harness_agent.py", "--harness-file", str(AGENT)])
    assert result.exit_code == 0, result.output
    assert "resolved 1/1" in result.output and "harness: cmd sha256:" in result.output
    report = json.loads((out / "report.json").read_text())
    assert report["params"]["harness"]["name"] == "cmd" and 'id="harness"' in (out / "report.html").read_text()
    line = json.loads((out / "trajectories.jsonl").read_text().splitlines()[0])
    assert line["model_calls"][0]["token_ids"] and line["sample"]["contiguous"]
    again = CliRunner().invoke(app, ["run", "--model", "scripted", "--base-url", scripted.url, "--output", str(out),
                                     "--tasks", str(cases), "--harness", "cmd: true"])
    assert again.exit_code == 2 and "other settings" in again.output
    bad = CliRunner().invoke(app, ["run", "--model", "m", "--base-url", scripted.url, "--output", str(tmp_path / "b"),
                                   "--harness", "openhands"])
    assert bad.exit_code == 2 and "unknown harness" in bad.output

    from patchgym.server.app import create_app

    server = create_app(tasks=cases, max_sessions=1, model_endpoints=[scripted.url])
    body = {"task_id": "fixture__calc-server", "model": {"base_url": scripted.url, "name": "scripted", "retries": 0},
            "harness": "codex"}
    with serve(server) as url, httpx.Client(base_url=url, timeout=300) as http:
        v = http.post("/v1/rollouts", json=body).json()
        assert v["reward"] == 1.0 and not v["mask_sample"] and v["trajectory"]["harness"]["name"] == "codex", v
        assert v["trajectory"]["model_calls"][0]["prompt_token_ids"] and v["trajectory"]["sample"]["segments"]
        assert http.get("/healthz").json()["sessions"] == 0
        assert http.post("/v1/rollouts", json={**body, "harness": "nope"}).status_code == 422
        missing = http.post("/v1/rollouts", json={**body, "harness": "codex@0.0.1"})
        assert missing.status_code == 501 and "not installed" in missing.text, "a server installs nothing on a request"


def test_codex_config_is_toml_codex_reads_and_the_proxy_stays_its_provider():
    """What ``--harness-config`` merges into Codex's config.toml comes out as TOML reads it back
    (quotes, newlines, non-ASCII, nested tables), and no setting moves Codex off the proxy."""
    tomllib = pytest.importorskip("tomllib")
    from patchgym.rollouts.harnesses.codex import PROVIDER, default_config, provider, toml_text

    extra = {"developer_instructions": 'say "done"\nthen stop ✓ 😀', "features": {"x": True},
             "profiles": {"a b": {"model": "m", "list": [1, "two", {"k": False}]}}}
    settings = {**default_config(), **extra, "model_providers": {PROVIDER: provider()}}
    assert tomllib.loads(toml_text(settings)) == settings
    moved = harness_from_spec("codex", config={"model_provider": "openai",
                                               "model_providers": {PROVIDER: {"base_url": "http://elsewhere"}}})
    assert moved.settings["model_provider"] == PROVIDER and moved.settings["model_providers"][PROVIDER] == provider()
