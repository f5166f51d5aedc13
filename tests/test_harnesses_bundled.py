"""Harnesses on bundled tasks through ``patchgym run``'s code (rollouts/run.py), on each backend: the
scripted endpoint's oracle resolves every task through mini-swe-agent and through a command-line
agent in the sandbox, its no-op resolves none, and every call's token ids are recorded. A few tasks
here (one per repository); ``bench/harnesses.py`` runs all 18 the same way."""

from __future__ import annotations

import shlex

import pytest

from patchgym.rollouts.harnesses import harness_from_spec
from patchgym.rollouts.model import ModelConfig
from patchgym.rollouts.run import RunOptions, run_model
from patchgym.tasks.catalog import load_task_set
from tests.fake_openai import FakeModel, call, scripted_endpoint
from tests.test_harnesses import AGENT, SUBMIT


@pytest.fixture(scope="module")
def endpoint():
    with scripted_endpoint() as model:
        yield model

pytestmark = pytest.mark.slow
FEW = ("patchgym__dotenvkit-1", "patchgym__semverkit-2", "patchgym__textable-3")


def scripts(model: FakeModel, *, fix: bool) -> None:
    """Each bundled task's gold patch through bash (or nothing), then mini-swe-agent's submit,
    keyed by its bug report."""
    for task in load_task_set(None):
        apply = [call("bash", {"command": f"printf %s {shlex.quote(task.patch)} | git apply"})] if fix else []
        model.scripts[task.problem_statement.strip()[:200]] = [*apply, call("bash", {"command": SUBMIT})]


@pytest.mark.parametrize("spec", ["mini-swe-agent", "cmd"])
def test_oracle_resolves_and_noop_resolves_none(endpoint, backend, spec, tmp_path):
    harness = harness_from_spec(spec) if spec != "cmd" else harness_from_spec(
        "cmd: python3 {harness_dir}/agent.py", files={"agent.py": AGENT.read_bytes()})
    tasks = load_task_set(None).select(list(FEW))
    config = ModelConfig(name="scripted", base_url=endpoint.url, backoff=0.01, timeout=60, retries=1)
    for fix, expected in ((True, len(FEW)), (False, 0)):
        scripts(endpoint, fix=fix)
        report = run_model(tasks, config, RunOptions(output=tmp_path / str(fix), workers=2, backend=backend,
                                                     harness=harness, time_limit=300))
        assert report["resolved"] == expected and report["masked"] == 0 and report["scored"] == len(FEW), report
        assert report["params"]["harness"]["name"] == harness.name
        lines = (tmp_path / str(fix) / "trajectories.jsonl").read_text()
        assert '"token_ids": [' in lines and '"contiguous": true' in lines
