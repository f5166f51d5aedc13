"""Harnesses on bundled tasks through ``patchgym run``'s code (rollouts/run.py), on each backend: the
scripted endpoint's oracle resolves a task through mini-swe-agent, through a command-line agent in
the sandbox and through Codex CLI, Codex's no-op resolves none, and every call's token ids are
recorded. One test per backend, its runs side by side on three tasks of one repository at one
commit (one environment): mini-swe-agent and the command agent share a task (their scripts are
the same: ``bash`` calls, then the submit command), Codex has the other two (its oracle and its
no-op). On docker the command agent is left out: Codex covers an agent inside a docker sandbox
(the same bridge, the same launcher). ``bench/harnesses.py`` runs all 18 each way through each
harness on each backend."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from patchgym.rollouts.model import ModelConfig
from patchgym.rollouts.run import RunOptions, run_model
from patchgym.tasks.catalog import load_task_set
from tests.harness_cases import script_tasks

CHAT_ORACLE, CODEX_ORACLE, CODEX_NOOP = "patchgym__semverkit-1", "patchgym__semverkit-2", "patchgym__semverkit-3"
RUNS = {"mini-swe-agent": {CHAT_ORACLE}, "cmd": {CHAT_ORACLE}, "codex": {CODEX_ORACLE, CODEX_NOOP}}


def test_the_oracle_resolves_and_the_noop_does_not(scripted, harnesses, backend, tmp_path):
    tasks = load_task_set(None)
    script_tasks(scripted, tasks.select([CHAT_ORACLE]), "cmd")  # mini-swe-agent's script too
    script_tasks(scripted, tasks.select([CODEX_ORACLE, CODEX_NOOP]), "codex", fix={CODEX_ORACLE})
    config = ModelConfig(name="scripted", base_url=scripted.url, backoff=0.01, timeout=60, retries=1)

    def run(name: str) -> tuple[dict, dict[str, dict]]:
        out = tmp_path / name
        report = run_model(tasks.select(sorted(RUNS[name])), config, RunOptions(
            output=out, workers=2, backend=backend, harness=harnesses(name), time_limit=300))
        lines = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
        return report, {t["instance_id"]: t for t in lines}

    names = [name for name in RUNS if backend == "local" or name != "cmd"]
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        results = dict(zip(names, pool.map(run, names), strict=True))
    for name, (report, lines) in results.items():
        expected = {i: "resolved" if i != CODEX_NOOP else "unresolved" for i in RUNS[name]}
        assert {i: t["outcome"] for i, t in lines.items()} == expected, (name, [
            (t["end_reason"], t.get("mask_reason"), t["harness_result"]) for t in lines.values()])
        assert report["masked"] == 0 and report["params"]["harness"]["version"] == harnesses(name).version
        for line in lines.values():
            assert line["end_reason"] == "finished" and line["model_calls"], line["harness_result"]
            assert all(c["token_ids"] and c["prompt_token_ids"] for c in line["model_calls"]), "every call's token ids"
            assert line["sample"]["contiguous"]
    for name in names:
        line = results[name][1][CODEX_ORACLE if name == "codex" else CHAT_ORACLE]
        assert line["turns"] == 2 and line["sample"]["calls_with_tokens"] == 2, name
    mini = results["mini-swe-agent"][1][CHAT_ORACLE]  # its own SWE-bench prompt and ending, through the proxy
    assert "<pr_description>" in mini["messages"][1]["content"] and mini["messages"][-1]["role"] == "assistant"
    assert mini["harness_result"]["exit_status"] == "Submitted" and mini["steps"] == 2
    codex = results["codex"][1][CODEX_ORACLE]  # the Responses API, streamed; Codex's own account of its turn
    assert {c["api"] for c in codex["model_calls"]} == {"responses"}
    assert codex["harness_result"]["exit_status"] == "completed" and codex["steps"] == 1
