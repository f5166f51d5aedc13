"""`patchgym run`: a model behind an OpenAI-compatible endpoint (tests/fake_openai.py, over real
HTTP) drives RepoEnv; the run directory holds trajectories, SWE-bench predictions and a report;
a failing endpoint masks the episode and a rerun runs it again; exports give training data."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.rollouts.export import export_trajectories
from patchgym.rollouts.model import ChatModel, ModelConfig, ModelError
from patchgym.rollouts.run import RunDirError, RunOptions, run_model
from patchgym.rollouts.stats import wilson
from patchgym.tasks.catalog import load_task_set
from tests.fake_openai import FakeModel, Turn, call, scripted_endpoint
from tests.serving import serve
from tests.test_run_html import CHROMIUM, load_pages, need_chromium
from tests.test_server import TASK

SECOND = "fixture__calc-2"  # the same bug under a second id, for runs of two tasks


def oracle(patch: str) -> list[Turn]:
    return [call("bash", {"command": f"printf %s {shlex.quote(patch)} | git apply"}), call("submit", {})]


@pytest.fixture(scope="module")
def two_tasks(calc_tasks_file, tmp_path_factory) -> Path:
    row = json.loads(calc_tasks_file.read_text().splitlines()[0])
    path = tmp_path_factory.mktemp("two") / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "instance_id": SECOND}) + "\n")
    return path


@pytest.fixture
def fake():
    with scripted_endpoint() as model:
        yield model


def config(fake: FakeModel, **kw) -> ModelConfig:
    return ModelConfig(name="scripted", base_url=fake.url, backoff=0.01, **{"timeout": 30, "retries": 2, **kw})


def run(fake, tasks, tmp_path, ids=None, *, options=None, **kw) -> dict:
    task_set = load_task_set(tasks).select(ids)
    return run_model(task_set, config(fake, **kw), options or RunOptions(output=tmp_path / "run", max_steps=10))


def lines(out: Path) -> dict[str, dict]:
    return {json.loads(x)["instance_id"]: json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()}


def test_oracle_resolves_and_the_run_directory_is_complete(fake, calc_tasks_file, calc_task, tmp_path):
    fake.default = oracle(calc_task.patch)
    options = RunOptions(output=tmp_path / "run", max_steps=10, input_per_mtok=2.0, output_per_mtok=10.0)
    report = run_model(load_task_set(calc_tasks_file), config(fake), options)
    assert report["resolved"] == 1 and report["resolved_rate"] == 1.0 and report["masked"] == 0
    assert report["ci95"] == [round(x, 4) for x in wilson(1, 1)] and report["ci95"][0] < 1.0
    # tokens from the endpoint's usage, cost at the prices given
    assert report["tokens_in"] == 100 + 110 and report["tokens_out"] == 14
    assert report["cost_usd"] == pytest.approx((210 * 2.0 + 14 * 10.0) / 1e6)
    (inst,) = report["instances"]
    assert inst["outcome"] == "resolved" and inst["end_reason"] == "submitted" and inst["steps"] == 2
    out = tmp_path / "run"
    (pred,) = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert pred["instance_id"] == TASK and pred["model_name_or_path"] == "scripted"
    assert "raise ValueError" in pred["model_patch"]
    line = lines(out)[TASK]
    roles = [m["role"] for m in line["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert line["messages"][2]["tool_calls"][0]["function"]["name"] == "bash"
    assert line["report"][TASK]["resolved"] is True and {t["function"]["name"] for t in line["tools"]} >= {"submit"}
    # the environment's cost: in the line, in the instance row, summed up in the report
    assert line["cost"]["wall_seconds"] > 0 and line["cost"]["price_core_hour"] == options.prices.core_hour
    assert inst["cost"] == line["cost"] and report["cost"]["episodes"] == 1
    assert report["cost"]["env_cpu_seconds_mean"] == pytest.approx(line["cost"]["env_cpu_seconds"], abs=1e-4)
    assert json.loads((out / "run.json").read_text())["params"]["model"] == "scripted"
    # the predictions grade the same with patchgym eval
    result = CliRunner().invoke(app, ["eval", "--predictions", str(out / "predictions.jsonl"), "--tasks",
                                      str(calc_tasks_file), "--output", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "eval" / "report.json").read_text())["resolved_instances"] == 1


def test_no_op_and_malformed_calls(fake, two_tasks, calc_task, tmp_path):
    fake.scripts = {}
    fake.default = [call("submit", {})]
    report = run(fake, two_tasks, tmp_path, [TASK])
    assert report["resolved"] == 0 and report["instances"][0]["end_reason"] == "submitted"
    assert report["instances"][0]["outcome"] == "unresolved" and report["masked"] == 0
    # arguments that are not JSON, an unknown tool, then the fix: the model is told, the episode goes on
    fake.default = [call("bash", "{not json"), call("python", {"code": "1"}), *oracle(calc_task.patch)]
    report = run(fake, two_tasks, tmp_path / "b", [TASK])
    assert report["resolved"] == 1
    # both refused calls counted, per episode and in all; the row names the task's repository
    assert report["instances"][0]["invalid_calls"] == 2 == report["invalid_calls_total"]
    assert report["instances"][0]["format_errors"] == 0 and report["instances"][0]["repo"] == "fixture/calc"
    tool_outputs = [m["content"] for m in lines(tmp_path / "b" / "run")[TASK]["messages"] if m["role"] == "tool"]
    assert "JSON" in tool_outputs[0] and "unknown tool 'python'" in tool_outputs[1]


def test_an_endpoint_that_errors_then_recovers_is_retried(fake, calc_tasks_file, calc_task, tmp_path):
    first, second = oracle(calc_task.patch)
    first.failures, first.status, first.retry_after = 2, 503, 0
    fake.default = [first, second]
    report = run(fake, calc_tasks_file, tmp_path)
    assert report["resolved"] == 1 and len(fake.requests) == 4  # two failures, then two turns


def test_a_model_that_times_out_is_masked_and_a_rerun_runs_it_again(fake, calc_tasks_file, calc_task, tmp_path):
    first, second = oracle(calc_task.patch)
    first.failures, first.delay = 2, 3.0
    fake.default = [first, second]
    report = run(fake, calc_tasks_file, tmp_path, timeout=1, retries=1)
    (inst,) = report["instances"]
    assert inst["outcome"] == "masked" and inst["end_reason"] == "model_error" and "within 1s" in inst["mask_reason"]
    assert report["masked"] == 1 and report["scored"] == 0 and report["resolved_rate"] is None
    out = tmp_path / "run"
    assert (out / "predictions.jsonl").read_text() == "", "a masked episode is no prediction"
    report = run(fake, calc_tasks_file, tmp_path, timeout=1, retries=1)  # the endpoint behaves now
    assert report["resolved"] == 1 and report["masked"] == 0 and report["completed"] == 1


def test_an_interrupted_run_continues_where_it_stopped(fake, two_tasks, calc_task, tmp_path):
    fake.default = oracle(calc_task.patch)
    run(fake, two_tasks, tmp_path, [TASK])
    asked = len(fake.requests)
    report = run(fake, two_tasks, tmp_path)  # both: only the second runs
    assert report["completed"] == 2 and report["resolved"] == 2 and len(fake.requests) == asked + 2
    assert {json.loads(x)["instance_id"] for x in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()} \
        == {TASK, SECOND}
    with pytest.raises(RunDirError, match="other settings"):
        run(fake, two_tasks, tmp_path, temperature=0.7)


def test_text_fallback_for_a_model_without_tool_calling(fake, calc_tasks_file, calc_task, tmp_path):
    fake.refuse_tools = True
    patch_cmd = f"printf %s {shlex.quote(calc_task.patch)} | git apply"
    fake.default = [Turn(text="Let me look.\n```bash\nls calc\n```"), Turn(text="No block here."),
                    Turn(text=f"```bash\n{patch_cmd}\n```"), Turn(text="```bash\nsubmit\n```")]
    report = run(fake, calc_tasks_file, tmp_path)  # --tool-mode auto: refused tools, went on in text
    assert report["resolved"] == 1 and report["instances"][0]["steps"] == 3
    assert report["instances"][0]["format_errors"] == 1 == report["format_errors_total"]  # "No block here."
    line = lines(tmp_path / "run")[TASK]
    assert line["tool_mode"] == "text" and "fenced shell block" in line["messages"][0]["content"]
    assert "__init__.py" in line["messages"][3]["content"]  # ls's output came back as a user message
    fake.refuse_tools, fake.default = True, oracle(calc_task.patch)
    strict = RunOptions(output=tmp_path / "strict", tool_mode="native")
    report = run(fake, calc_tasks_file, tmp_path, options=strict)
    assert report["masked"] == 1 and "tool-mode text" in report["instances"][0]["mask_reason"]


def test_context_overflow_ends_the_episode_and_grades_it(fake, calc_tasks_file, calc_task, tmp_path):
    first, _ = oracle(calc_task.patch)
    overflow = Turn(failures=99, status=400, error="This model's maximum context length is 8192 tokens")
    fake.default = [first, overflow]
    report = run(fake, calc_tasks_file, tmp_path)
    (inst,) = report["instances"]
    assert inst["end_reason"] == "context_overflow" and inst["outcome"] == "resolved", "graded as it stood"
    assert len(fake.requests) == 2, "an overflow is not retried"


def test_a_model_that_stops_calling_tools_is_graded_as_is(fake, calc_tasks_file, tmp_path):
    fake.default = [Turn(text="I think it is fine.")] * 5
    report = run(fake, calc_tasks_file, tmp_path)
    assert report["instances"][0]["end_reason"] == "no_tool_call" and report["instances"][0]["turns"] == 3


def test_a_bad_key_or_unknown_model_is_a_model_error_not_a_retry(fake, calc_tasks_file, tmp_path):
    fake.default = [Turn(failures=9, status=401, error="bad key")]
    model = ChatModel(config(fake))
    with pytest.raises(ModelError, match="401"):
        model.complete([{"role": "user", "content": "hi"}], None)
    assert model.calls == 1


def closed_port() -> int:
    import socket

    with socket.socket() as sock:  # bound, never listening: connections to it are refused
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli_run(base_url: str, out: Path, tasks: Path, *extra: str, model: str = "scripted"):
    import time

    started = time.monotonic()
    result = CliRunner().invoke(app, ["run", "--model", model, "--base-url", base_url, "--output", str(out),
                                      "--tasks", str(tasks), "--retries", "4", *extra])
    return result, time.monotonic() - started


def test_a_dead_or_mistyped_endpoint_ends_the_run_at_once(fake, calc_tasks_file, tmp_path, monkeypatch):
    """Before: each task spent ~10 s on 5 attempts, ended masked, and the command exited 0; the
    cause (no scheme: httpx's UnsupportedProtocol) was only inside trajectories.jsonl."""
    cases = {"closed port": (f"http://127.0.0.1:{closed_port()}/v1", "cannot reach"),
             "no scheme": ("127.0.0.1:18431", "is not an http:// or https:// URL"),
             "not a URL": ("http://[::1", "not a URL")}
    for name, (url, message) in cases.items():
        result, seconds = cli_run(url, tmp_path / name, calc_tasks_file)
        assert result.exit_code == 2, (name, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], (name, result.output)
        assert seconds < 5, (name, seconds)
        assert not (tmp_path / name / "trajectories.jsonl").exists(), "no episode started"
    fake.models, fake.key = ["scripted"], "sk-right"
    monkeypatch.setenv("KEY", "sk-wrong")
    result, _ = cli_run(fake.url, tmp_path / "key", calc_tasks_file, "--api-key-env", "KEY")
    assert result.exit_code == 2 and "refused the API key (401)" in result.output, result.output
    monkeypatch.setenv("KEY", "sk-right")
    result, _ = cli_run(fake.url, tmp_path / "model", calc_tasks_file, "--api-key-env", "KEY", model="nope")
    assert result.exit_code == 2 and "does not serve the model 'nope' (it serves scripted)" in result.output, \
        result.output
    result, _ = cli_run(fake.url.removesuffix("/v1"), tmp_path / "root", calc_tasks_file, "--api-key-env", "KEY")
    assert result.exit_code == 2 and "answered 404 (is --base-url the API root" in result.output, result.output
    # one chat completion in all, a token's worth: for a model /models does not list (a proxy may serve more)
    assert [(r["model"], r["max_tokens"]) for r in fake.requests] == [("nope", 1)]


def test_an_endpoint_without_a_model_list_is_checked_with_one_token(fake, calc_tasks_file, calc_task, tmp_path):
    fake.default = oracle(calc_task.patch)
    result, _ = cli_run(fake.url, tmp_path / "ok", calc_tasks_file)
    assert result.exit_code == 0 and "resolved 1/1" in result.output, result.output
    assert fake.requests[0]["max_tokens"] == 1 and len(fake.requests) == 3  # the probe, then the episode
    assert "no price given" in result.output and "$0.0000" not in result.output


def test_a_run_whose_episodes_all_fail_the_same_way_stops(fake, calc_tasks_file, tmp_path):
    """The endpoint lists the model but every completion fails: after the first episodes, all
    masked for the same model error, the run stops with one line and exit status 1."""
    row = json.loads(calc_tasks_file.read_text().splitlines()[0])
    tasks = tmp_path / "six.jsonl"
    tasks.write_text("".join(json.dumps({**row, "instance_id": f"c-{i}"}) + "\n" for i in range(6)))
    fake.models = ["scripted"]
    fake.default = [Turn(failures=999, status=503, error="overloaded")]
    result, _ = cli_run(fake.url, tmp_path / "run", tasks, "--retries", "0")
    assert result.exit_code == 1, result.output
    assert "error: stopped: the first 3 episodes were all masked for the same model error: the model " \
           "answered 503" in " ".join(result.output.split())
    assert len(lines(tmp_path / "run")) == 3 and (tmp_path / "run" / "report.html").exists()
    # too few episodes to stop early, and none scored: still not a success
    result, _ = cli_run(fake.url, tmp_path / "one", calc_tasks_file, "--retries", "0")
    assert result.exit_code == 1, result.output
    assert "error: no episode could be scored: all 1 masked (first: the model answered 503" in \
        " ".join(result.output.split())


def test_endpoint_down_needs_the_same_model_error_from_the_start():
    from patchgym.rollouts.run import endpoint_down

    def masked(reason, end="model_error"):
        return {"outcome": "masked", "end_reason": end, "mask_reason": reason}

    refused = masked("cannot reach the model at http://h:1/v1: ConnectError: [Errno 111] refused (after 5 attempts)")
    assert endpoint_down([refused] * 3, 3) == refused["mask_reason"]
    assert endpoint_down([refused] * 2, 3) is None
    assert endpoint_down([masked("the model answered 503: {id: 1}"), masked("the model answered 503: {id: 2}")], 2)
    assert endpoint_down([refused, masked("the model answered 503: x"), refused], 3) is None
    assert endpoint_down([refused, {"outcome": "unresolved", "end_reason": "submitted"}, refused], 3) is None
    assert endpoint_down([refused, masked("sandbox broke", "environment_error"), refused], 3) is None


def test_exports_keep_resolved_episodes_only_unless_asked(fake, two_tasks, calc_task, tmp_path):
    fake.scripts = {}
    fake.default = oracle(calc_task.patch)
    run(fake, two_tasks, tmp_path, [TASK])
    out = tmp_path / "run"
    with (out / "trajectories.jsonl").open("a") as fh:  # an unresolved and a masked episode
        fh.write(json.dumps({**lines(out)[TASK], "instance_id": "u", "outcome": "unresolved", "resolved": False}) + "\n")
        fh.write(json.dumps({**lines(out)[TASK], "instance_id": "m", "outcome": "masked"}) + "\n")
    chat = list(export_trajectories(out, "chat"))
    assert [r["instance_id"] for r in chat] == [TASK] and chat[0]["messages"][0]["role"] == "system"
    assert {r["instance_id"] for r in export_trajectories(out, "chat", include_unresolved=True)} == {TASK, "u"}
    (ft,) = export_trajectories(out, "openai-ft")
    assert set(ft) == {"messages", "tools", "parallel_tool_calls"} and ft["parallel_tool_calls"] is False
    result = CliRunner().invoke(app, ["trajectories", "export", str(out), "--format", "openai-ft", "--output",
                                      str(tmp_path / "ft.jsonl")])
    assert result.exit_code == 0 and len((tmp_path / "ft.jsonl").read_text().splitlines()) == 1
    bad = CliRunner().invoke(app, ["trajectories", "export", str(out), "--format", "xml", "--output",
                                   str(tmp_path / "x.jsonl")])
    assert bad.exit_code == 2 and "unknown format" in bad.output


def test_the_command_line_runs_a_model_and_writes_the_html_report(fake, calc_tasks_file, calc_task, tmp_path,
                                                                   monkeypatch):
    fake.default = oracle(calc_task.patch)
    monkeypatch.setenv("SCRIPTED_KEY", "sk-test")
    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["run", "--model", "scripted", "--base-url", fake.url, "--output", str(out),
                                      "--tasks", str(calc_tasks_file), "--api-key-env", "SCRIPTED_KEY",
                                      "--price-in", "1", "--price-out", "1"])
    assert result.exit_code == 0, result.output
    assert "resolved 1/1" in result.output and (out / "report.html").exists()
    report = json.loads((out / "report.json").read_text())
    if CHROMIUM.exists() or os.environ.get("PATCHGYM_REQUIRE_CHROMIUM") == "1":  # a real run's page, in the browser
        need_chromium()
        dom, text, console = load_pages({"real": (out / "report.html").as_uri()}, tmp_path)["real"]
        assert console == [] and 'data-report-ready="1"' in text
        assert f'data-value="{report["resolved_rate"]}"' in text and TASK in text
    assert "sk-test" not in (out / "run.json").read_text() + (out / "trajectories.jsonl").read_text()
    missing = CliRunner().invoke(app, ["run", "--model", "m", "--base-url", fake.url, "--output", str(out),
                                       "--api-key-env", "NO_SUCH_VARIABLE_SET"])
    assert missing.exit_code == 2 and "NO_SUCH_VARIABLE_SET" in missing.output


def test_the_server_runs_whole_rollouts(fake, calc_tasks_file, calc_task):
    import httpx

    from patchgym.server.app import create_app

    fake.default = oracle(calc_task.patch)
    app = create_app(tasks=calc_tasks_file, max_sessions=1, model_endpoints=[fake.url])
    body = {"task_id": TASK, "model": {"base_url": fake.url, "name": "scripted", "api_key": "sk-x", "retries": 0},
            "sampling": {"temperature": 0.5, "seed": 7}, "max_turns": 10}
    with serve(app) as url, httpx.Client(base_url=url, timeout=120) as http:
        r = http.post("/v1/rollouts", json=body)
        assert r.status_code == 200, r.text
        v = r.json()
        assert v["reward"] == 1.0 and v["resolved"] and not v["mask_sample"] and v["end_reason"] == "submitted"
        assert [m["role"] for m in v["trajectory"]["messages"]][:3] == ["system", "user", "assistant"]
        sent = fake.requests[-1]
        assert sent["temperature"] == 0.5 and sent["seed"] == 7 and sent["model"] == "scripted"
        assert http.get("/healthz").json()["sessions"] == 0, "the rollout's session is closed"
        # a failing endpoint: masked, not 0
        fake.default = [Turn(failures=9, status=503)]
        v = http.post("/v1/rollouts", json=body).json()
        assert v["mask_sample"] is True and v["outcome"] == "masked" and v["reward"] == 0.0
        # only the endpoints the server was started with
        other = {**body, "model": {**body["model"], "base_url": "http://169.254.169.254/latest"}}
        r = http.post("/v1/rollouts", json=other)
        assert r.status_code == 403 and "--model-endpoint" in r.json()["detail"]
        assert http.post("/v1/rollouts", json={**body, "task_id": "nope"}).status_code == 404
        assert http.post("/v1/rollouts", json={**body, "model": {**body["model"], "base_url": "file:///etc"}}
                         ).status_code == 422


def test_two_workers_run_two_tasks_at_once(fake, two_tasks, calc_task, tmp_path):
    fake.default = oracle(calc_task.patch)
    report = run(fake, two_tasks, tmp_path, options=RunOptions(output=tmp_path / "run", workers=2, max_steps=10))
    assert report["resolved"] == 2 and report["cost"]["episodes"] == 2
    if report["cost"]["unmeasured_episodes"] == 0:  # measured per episode, whatever the number of workers
        assert all(i["cost"]["test_cpu_seconds"] > 0 for i in report["instances"])


def test_a_line_cut_short_by_a_kill_does_not_swallow_the_next(fake, two_tasks, calc_task, tmp_path):
    fake.default = oracle(calc_task.patch)
    out = tmp_path / "run"
    out.mkdir()
    (out / "trajectories.jsonl").write_text('{"instance_id": "fixture__calc-1", "outco')  # killed mid-write
    report = run(fake, two_tasks, tmp_path)
    assert report["completed"] == 2 and report["resolved"] == 2


def test_running_out_of_steps_is_graded_and_says_so(fake, calc_tasks_file, calc_task, tmp_path):
    fake.default = [call("bash", {"command": "true"})] * 5
    report = run(fake, calc_tasks_file, tmp_path, options=RunOptions(output=tmp_path / "run", max_steps=3))
    (inst,) = report["instances"]
    assert inst["end_reason"] == "max_steps" and inst["steps"] == 3 and inst["outcome"] == "unresolved"


def test_no_turn_starts_after_the_deadline(fake, calc_tasks_file, calc_task):
    import time

    from patchgym.gym_envs.repo_env import RepoEnv
    from patchgym.rollouts.loop import run_episode

    fake.default = [call("bash", {"command": "sleep 0.2"})] * 1000  # far more than fits before the deadline
    env = RepoEnv(calc_tasks_file, max_steps=1000)
    try:
        episode = run_episode(env, ChatModel(config(fake)), TASK, max_turns=1000, deadline=time.monotonic() + 6)
    finally:
        env.close()
    assert episode.end_reason == "time_limit" and episode.outcome == "unresolved" and episode.turns < 1000


def test_the_paired_interval_of_two_runs():
    """Newcombe's interval for paired proportions (his method 10) on his example's counts, and its
    edges: identical runs, one run resolving everything the other does not, no pairs."""
    from patchgym.rollouts.stats import paired_difference

    a = [True] * 12 + [True] * 9 + [False] * 2 + [False] * 21
    b = [True] * 12 + [False] * 9 + [True] * 2 + [False] * 21
    p = paired_difference(a, b)
    assert (p.n, p.both, p.only_a, p.only_b, p.neither) == (44, 12, 9, 2, 21)
    assert p.difference == pytest.approx(7 / 44) and p.ci95 == pytest.approx((0.0182, 0.2892), abs=1e-4)
    same = paired_difference(a, a)
    assert same.difference == 0 and same.ci95[0] < 0 < same.ci95[1]
    assert same.ci95[1] - same.ci95[0] < p.ci95[1] - p.ci95[0], "no discordant pair: a narrow interval"
    all_a = paired_difference([True] * 20, [False] * 20)
    assert all_a.difference == 1 and 0.7 < all_a.ci95[0] < 1 and all_a.ci95[1] == 1
    assert paired_difference([], []).ci95 == (-1.0, 1.0)
    with pytest.raises(ValueError):
        paired_difference([True], [])
