"""What an episode costs: CPU burnt by the tests is the tests', CPU burnt by the agent's commands is
the agent's, and neither is charged to the environment; the dollars follow the prices; and the cost
is in the instance report, the run report, the trajectory and /metrics."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from conftest import calc_task_row
from serving import serve

from patchgym import TrajectoryRecorder, Verifier, load_tasks
from patchgym.grading.cost import GIB, CostMeter, EpisodeCost, Prices, summarize
from patchgym.grading.evaluation import evaluate
from patchgym.gym_envs.repo_env import RepoEnv
from patchgym.sandboxes.base import SandboxUsage
from patchgym.tasks.backends import sandbox_factory
from patchgym.tasks.catalog import TaskSet
from patchgym.tasks.predictions import Prediction

BURN = 0.6  # CPU seconds the burning test and the burning command spend
# A hidden test that burns BURN seconds of its own process's CPU, then passes.
BURN_TEST_PATCH = f"""diff --git a/tests/test_burn.py b/tests/test_burn.py
new file mode 100644
--- /dev/null
+++ b/tests/test_burn.py
@@ -0,0 +1,7 @@
+import time
+
+
+def test_burn():
+    end = time.process_time() + {BURN}
+    while time.process_time() < end:
+        pass
"""
BURN_COMMAND = f"python3 -c 'import time\nend = time.process_time() + {BURN}\nwhile time.process_time() < end: pass'"
SWEBENCH_KEYS = {"patch_is_None", "patch_exists", "patch_successfully_applied", "resolved", "tests_status"}


@pytest.fixture(scope="module")
def burn_task(calc_repo, tmp_path_factory):
    repo, info = calc_repo
    row = calc_task_row(repo, info, instance_id="fixture__calc-burn", test_patch=info["test_patch"] + BURN_TEST_PATCH,
                        FAIL_TO_PASS=["tests/test_calc.py::test_mean_empty", "tests/test_burn.py::test_burn"])
    path = tmp_path_factory.mktemp("burn") / "burn.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return load_tasks(path)[0]


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


# -- the model, without sandboxes --------------------------------------------------------------


def test_dollars_follow_the_prices():
    cost = EpisodeCost.of(wall_seconds=3600, harness=1800.0, agent=0.0, tests=1800.0, peak_memory_bytes=2 * GIB,
                          prices=Prices(core_hour=1.0, gb_hour=0.5))
    # (0.5 + 0.5) core-hours at $1, 2 GB held for 1 hour at $0.5: $2 an episode, $2,000 per 1,000
    assert cost.env_cpu_seconds == 1800.0 and cost.usd_per_1k_episodes == pytest.approx(2000.0)
    assert cost.priced(Prices(core_hour=2.0, gb_hour=0.5)).usd_per_1k_episodes == pytest.approx(3000.0)
    assert cost.priced(Prices(core_hour=1.0, gb_hour=0.0)).usd_per_1k_episodes == pytest.approx(1000.0)
    assert cost.priced(Prices(core_hour=0.0, gb_hour=0.0)).usd_per_1k_episodes == 0.0
    unmeasured = EpisodeCost.of(wall_seconds=1, harness=0.1, agent=0.0, tests=None, peak_memory_bytes=None,
                                prices=Prices())
    assert unmeasured.usd_per_1k_episodes is None, "no dollars from a guess"
    run = summarize([cost, unmeasured], Prices(core_hour=1.0, gb_hour=0.5))
    assert run["usd_per_1k_episodes"] == pytest.approx(2000.0) and run["unmeasured_episodes"] == 1
    assert run["test_cpu_seconds_mean"] == 1800.0 and run["harness_cpu_seconds_mean"] == pytest.approx(900.05)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="price per core-hour"):
            Prices(core_hour=bad)


def test_a_nested_meter_charges_its_own_part_and_the_outer_pauses():
    outer, inner = CostMeter(), CostMeter()
    with outer.charging():
        burn(0.05)
        with inner.charging():
            burn(0.2)
        burn(0.05)
    inner_cpu = inner.result(Prices()).harness_cpu_seconds
    outer_cpu = outer.result(Prices()).harness_cpu_seconds
    assert 0.2 <= inner_cpu < 0.3
    assert 0.1 <= outer_cpu < 0.2, "the inner meter's CPU is not charged twice"


def test_a_sandbox_total_beyond_what_was_attributed_is_the_harness():
    meter = CostMeter()
    meter.add_tests(2.0)
    meter.sandbox_closed(SandboxUsage(cpu_seconds=2.25, peak_memory_bytes=100))
    meter.add_agent(1.0)
    meter.sandbox_closed(SandboxUsage(cpu_seconds=1.5, peak_memory_bytes=300))
    cost = meter.result(Prices())
    assert cost.test_cpu_seconds == 2.0 and cost.agent_cpu_seconds == 1.0
    assert 0.75 <= cost.harness_cpu_seconds < 0.8 and cost.peak_memory_bytes == 300
    meter.sandbox_closed(SandboxUsage())  # a backend that cannot measure
    assert meter.result(Prices()).harness_cpu_seconds is None


# -- measured in real sandboxes ----------------------------------------------------------------


def test_cpu_burnt_by_the_tests_is_test_cpu_not_environment_cpu(burn_task, tmp_path):
    prices = Prices(core_hour=3.6, gb_hour=0.0)  # a CPU-second is $0.001
    verifier = Verifier(sandbox_factory("local"), prices=prices)
    prediction = Prediction(instance_id=burn_task.instance_id, model_name_or_path="m", model_patch=burn_task.patch)
    summary = evaluate(TaskSet([burn_task]), {burn_task.instance_id: prediction}, tmp_path / "eval", verifier=verifier)
    assert summary.resolved_ids == [burn_task.instance_id]
    # the instance report: SWE-bench's keys as they were, the cost beside them
    written = json.loads((tmp_path / "eval" / burn_task.instance_id / "report.json").read_text())
    report = written[burn_task.instance_id]
    assert SWEBENCH_KEYS <= set(report)
    cost = report["cost"]
    if cost["test_cpu_seconds"] is None:
        pytest.skip("this host's sandboxes cannot measure CPU (no cpuacct cgroup)")
    assert cost["test_cpu_seconds"] >= BURN, cost
    assert cost["harness_cpu_seconds"] < BURN and cost["env_cpu_seconds"] == cost["harness_cpu_seconds"], cost
    assert cost["agent_cpu_seconds"] == 0.0 and cost["peak_memory_bytes"] > 0
    assert cost["usd_per_1k_episodes"] == pytest.approx(cost["test_cpu_seconds"] + cost["env_cpu_seconds"], rel=1e-3)
    # the run report
    run = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert run["resolved_ids"] == [burn_task.instance_id] and run["cost"]["episodes"] == 1
    assert run["cost"]["test_cpu_seconds_mean"] == pytest.approx(cost["test_cpu_seconds"], abs=1e-4)
    assert run["cost"]["usd_per_1k_episodes"] == pytest.approx(cost["usd_per_1k_episodes"], rel=1e-4)


def test_cpu_burnt_by_the_agent_is_agent_cpu_and_the_episode_includes_its_grading(burn_task, tmp_path):
    path = tmp_path / "trajectories.jsonl"
    env = TrajectoryRecorder(RepoEnv(TaskSet([burn_task]), max_steps=5, prices=Prices(core_hour=3.6, gb_hour=0.0)),
                             path)
    env.reset(options={"task_id": burn_task.instance_id})
    _, _, terminated, _, info = env.step({"name": "bash", "arguments": {"command": BURN_COMMAND}})
    assert not terminated and info["exit_code"] == 0 and "cost" not in info, "only the terminal step has it"
    _, reward, terminated, _, info = env.step({"name": "submit", "arguments": {}})
    env.close()
    assert terminated and reward == 0.0  # no fix: the tests ran (and burnt) all the same
    cost = info["cost"]
    if cost["agent_cpu_seconds"] is None:
        pytest.skip("this host's sandboxes cannot measure CPU (no cpuacct cgroup)")
    assert cost["agent_cpu_seconds"] >= BURN and cost["test_cpu_seconds"] >= BURN, cost
    assert cost["harness_cpu_seconds"] < BURN, cost
    assert cost["env_cpu_seconds"] == pytest.approx(cost["harness_cpu_seconds"] + cost["agent_cpu_seconds"], abs=1e-5)
    assert cost["wall_seconds"] >= info["report"]["cost"]["wall_seconds"], "the episode holds its grading"
    line = json.loads(path.read_text().splitlines()[-1])
    assert line["cost"] == cost, "the trajectory carries the episode's cost"


def test_metrics_count_what_episodes_cost(calc_tasks_file, calc_task):
    from patchgym.server.app import create_app

    app = create_app(tasks=calc_tasks_file, env_options={"prices": Prices(core_hour=7.0, gb_hour=3.0)})
    with serve(app) as url, httpx.Client(base_url=url, timeout=120) as http:
        verified = http.post("/v1/verify", json={"instance_id": calc_task.instance_id, "patch": calc_task.patch})
        assert verified.status_code == 200 and verified.json()["report"]["cost"]["price_core_hour"] == 7.0
        session = http.post("/v1/sessions", json={"task_id": calc_task.instance_id}).json()["session_id"]
        step = http.post(f"/v1/sessions/{session}/step", json={"action": {"name": "submit", "arguments": {}}}).json()
        assert step["terminated"] and step["info"]["cost"]["price_gb_hour"] == 3.0
        text = http.get("/metrics").text
    values = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(patchgym_[^ ]+) ([0-9.e+-]+)$", text, re.M)}
    assert values["patchgym_price_core_hour_usd"] == 7.0 and values["patchgym_price_gb_hour_usd"] == 3.0
    measured = step["info"]["cost"]["usd_per_1k_episodes"] is not None
    counted = values.get('patchgym_episodes_costed_total{source="verify"}', 0) + values.get(
        'patchgym_episodes_costed_total{source="session"}', 0)
    unmeasured = values.get('patchgym_episodes_unmeasured_total{source="verify"}', 0) + values.get(
        'patchgym_episodes_unmeasured_total{source="session"}', 0)
    assert (counted, unmeasured) == ((2, 0) if measured else (0, 2))
    if measured:
        assert values['patchgym_episode_cpu_seconds_total{part="tests"}'] > 0
        assert values['patchgym_episode_cpu_seconds_total{part="harness"}'] > 0
        assert values["patchgym_episode_env_cpu_seconds_count"] == 2
        assert values["patchgym_episode_cost_usd_total"] == pytest.approx(
            (verified.json()["report"]["cost"]["usd_per_1k_episodes"] + step["info"]["cost"]["usd_per_1k_episodes"])
            / 1000, rel=1e-3)
