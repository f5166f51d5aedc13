"""`patchgym run` as a user runs it, on every bundled task, against the scripted endpoint: the
oracle's calls resolve every task, a no-op resolves none, and a run killed halfway then restarted
ends with the report an uninterrupted run gives."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from patchgym.tasks.catalog import load_task_set
from tests.fake_openai import FakeModel, call
from tests.serving import serve

SAME = ("instance_id", "outcome", "end_reason", "reward", "steps", "turns", "tokens_in", "tokens_out")


def oracle_scripts(model: FakeModel) -> int:
    """Each bundled task's gold patch through bash, then submit, keyed by its bug report."""
    tasks = load_task_set(None)
    for task in tasks:
        model.scripts[task.problem_statement.strip()[:200]] = [
            call("bash", {"command": f"printf %s {shlex.quote(task.patch)} | git apply"}), call("submit", {})]
    return len(tasks)


def patchgym_run(url: str, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "patchgym.cli", "run", "--model", "scripted", "--base-url", url,
                             "--output", str(out), "--workers", "2", "--max-steps", "10", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finished(out: Path) -> int:
    path = out / "trajectories.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def summary(out: Path) -> tuple[dict, list[dict]]:
    report = json.loads((out / "report.json").read_text())
    instances = sorted(({k: i[k] for k in SAME} for i in report["instances"]), key=lambda i: i["instance_id"])
    head = {k: report[k] for k in ("total", "completed", "scored", "resolved", "masked", "resolved_rate", "ci95",
                                   "tokens_in", "tokens_out", "cost_usd")}
    return head, instances


@pytest.fixture(scope="module")
def endpoint():
    model = FakeModel()
    total = oracle_scripts(model)
    with serve(model.app) as url:
        yield f"{url}/v1", model, total


def test_the_oracle_resolves_every_bundled_task_and_a_killed_run_resumes_to_the_same_report(endpoint, tmp_path):
    """The uninterrupted run's report is known exactly (the endpoint's usage is scripted): every
    task resolved by submit after two tool calls in two turns, 100 + 110 tokens in, 7 + 7 out."""
    url, _, total = endpoint
    out = tmp_path / "run"
    killed = patchgym_run(url, out)
    deadline = time.monotonic() + 600
    while finished(out) < total // 2 and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(killed.pid, signal.SIGKILL)  # no chance to clean up or write anything more
    killed.communicate()
    assert 0 < finished(out) < total, "killed halfway"
    subprocess.run([sys.executable, "-m", "patchgym.cli", "sandboxes", "gc"], check=True, capture_output=True)
    again = patchgym_run(url, out)
    output, _ = again.communicate(timeout=900)
    assert again.returncode == 0, output
    head, instances = summary(out)
    assert head == {"total": total, "completed": total, "scored": total, "resolved": total, "masked": 0,
                    "resolved_rate": 1.0, "ci95": head["ci95"], "tokens_in": 210 * total, "tokens_out": 14 * total,
                    "cost_usd": 0.0}, output
    assert head["ci95"][1] == 1.0 and head["ci95"][0] > 0.8
    assert instances == [{"instance_id": i, "outcome": "resolved", "end_reason": "submitted", "reward": 1.0,
                          "steps": 2, "turns": 2, "tokens_in": 210, "tokens_out": 14}
                         for i in sorted(load_task_set(None).ids)]
    assert len((out / "predictions.jsonl").read_text().splitlines()) == total


def test_a_no_op_model_resolves_no_bundled_task(endpoint, tmp_path):
    url, model, total = endpoint
    noop = FakeModel(default=[call("submit", {})])
    with serve(noop.app) as noop_url:
        run = patchgym_run(f"{noop_url}/v1", tmp_path / "noop")
        output, _ = run.communicate(timeout=900)
    assert run.returncode == 0, output
    head, instances = summary(tmp_path / "noop")
    assert head["completed"] == total and head["resolved"] == 0 and head["masked"] == 0, output
