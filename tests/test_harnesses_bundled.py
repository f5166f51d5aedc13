"""Harnesses on bundled tasks through ``patchgym run``'s code (rollouts/run.py), on each backend: the
scripted endpoint's oracle resolves a task through mini-swe-agent, through a command-line agent in
the sandbox and through Codex CLI, its no-op resolves none, and every call's token ids are recorded.
One run per harness and backend, two tasks of one repository at one commit (one environment): the
oracle on one, the no-op on the other, side by side. ``bench/harnesses.py`` runs all 18 each way."""

from __future__ import annotations

import json

import pytest

from patchgym.rollouts.model import ModelConfig
from patchgym.rollouts.run import RunOptions, run_model
from patchgym.tasks.catalog import load_task_set
from tests.harness_cases import HARNESSES, script_tasks

pytestmark = pytest.mark.slow
ORACLE, NOOP = "patchgym__semverkit-1", "patchgym__semverkit-2"  # one environment, one image


@pytest.mark.parametrize("name", HARNESSES)
def test_the_oracle_resolves_and_the_noop_does_not(scripted, harnesses, backend, name, tmp_path):
    harness = harnesses(name)
    tasks = load_task_set(None).select([ORACLE, NOOP])
    script_tasks(scripted, tasks, name, fix={ORACLE})
    config = ModelConfig(name="scripted", base_url=scripted.url, backoff=0.01, timeout=60, retries=1)
    report = run_model(tasks, config, RunOptions(output=tmp_path, workers=2, backend=backend, harness=harness,
                                                 time_limit=300))
    lines = {t["instance_id"]: t for t in map(json.loads, (tmp_path / "trajectories.jsonl").read_text().splitlines())}
    assert {i: t["outcome"] for i, t in lines.items()} == {ORACLE: "resolved", NOOP: "unresolved"}, [
        (t["end_reason"], t.get("mask_reason"), t["harness_result"]) for t in lines.values()]
    assert report["masked"] == 0 and report["params"]["harness"]["version"] == harness.version
    for line in lines.values():
        assert line["end_reason"] == "finished" and line["model_calls"], line["harness_result"]
        assert all(c["token_ids"] and c["prompt_token_ids"] for c in line["model_calls"]), "every call's token ids"
        assert line["sample"]["contiguous"]
    oracle = lines[ORACLE]
    assert oracle["turns"] == 2 and oracle["sample"]["calls_with_tokens"] == 2
    if name == "mini-swe-agent":  # its own SWE-bench prompt and ending, through the proxy
        assert "<pr_description>" in oracle["messages"][1]["content"] and oracle["messages"][-1]["role"] == "assistant"
        assert oracle["harness_result"]["exit_status"] == "Submitted" and oracle["steps"] == 2
    if name == "codex":  # the Responses API, streamed; Codex's own account of its turn
        assert {c["api"] for c in oracle["model_calls"]} == {"responses"}
        assert oracle["harness_result"]["exit_status"] == "completed" and oracle["steps"] == 1
