"""Outcome labels (grading.labels): each label from a real grading, one vocabulary in every
report; tests that cannot start are never tampering."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from patchgym import Verifier, load_tasks
from patchgym.grading import labels
from patchgym.grading.labels import Outcome
from patchgym.grading.verifier import InstanceReport
from patchgym.making.validation import validate_task
from tests.conftest import FIXTURES, calc_task_row, git

BROKEN = FIXTURES / "broken_start"


def _variant(calc_repo, tmp_path_factory, name: str, *, agent_patch_line: str | None = None):
    """The calc task on a commit that adds ``broken_start/<name>`` over the calc base; with
    ``agent_patch_line``, also the gold fix plus that line at the top of ``calc/__init__.py``."""
    repo, info = calc_repo
    dest = tmp_path_factory.mktemp(f"variant-{name}") / "calc"
    subprocess.run(["git", "clone", "-q", str(repo), str(dest)], check=True)
    git(dest, "checkout", "-q", "-b", "variant", info["base"])
    shutil.copytree(BROKEN / name, dest, dirs_exist_ok=True)
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", f"variant {name}")
    base = git(dest, "rev-parse", "HEAD").strip()
    row = calc_task_row(dest, {**info, "base": base}, instance_id=f"fixture__calc-{name}")
    path = dest.parent / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n")
    task = load_tasks(path)[0]
    if agent_patch_line is None:
        return task, None
    subprocess.run(["git", "apply"], cwd=dest, input=info["patch"], text=True, check=True)
    module = dest / "calc" / "__init__.py"
    module.write_text(agent_patch_line + "\n" + module.read_text())
    patch = git(dest, "diff")
    git(dest, "checkout", "-q", "--", ".")
    return task, patch


@pytest.fixture(scope="module")
def verifier():
    return Verifier()


def test_a_conftest_importing_a_missing_module_could_not_start_not_tampering(calc_repo, tmp_path_factory,
                                                                            verifier):
    """marshmallow's case: its conftest imports simplejson, which the environment lacks (pytest
    exits 4 and writes no junit report)."""
    task, _ = _variant(calc_repo, tmp_path_factory, "missing_dependency")
    report = verifier.verify(task, task.patch)
    assert report.test_exit_code == 4
    assert not report.tampering_detected, report.tampering_reason
    assert report.outcome is Outcome.TESTS_COULD_NOT_START
    assert report.outcome_detail == "ModuleNotFoundError: No module named 'simplejson'"
    assert not report.resolved and report.reward == 0.0 and not report.infrastructure_failure
    assert report.swebench_dict()["outcome"] == "tests_could_not_start"
    # At the base commit it is the environment's problem, and validation says so.
    validation = validate_task(task, verifier, runs=1)
    assert not validation.ok
    assert validation.problems == ["environment problem: the tests cannot start at the base commit: "
                                   "ModuleNotFoundError: No module named 'simplejson'"]


def test_an_agent_patch_that_breaks_its_own_import_is_the_agents_failure(calc_repo, tmp_path_factory, verifier):
    """A pytest-plugin-style repository (its conftest loads its package's plugin): a patch that
    breaks the package's import stops pytest before any test; scored 0, never masked."""
    task, patch = _variant(calc_repo, tmp_path_factory, "plugin",
                           agent_patch_line="from calc.helpers import fast_sum  # noqa")
    gold = verifier.verify(task, task.patch)
    assert gold.resolved and gold.outcome is Outcome.RESOLVED
    report = verifier.verify(task, patch)
    assert report.patch_successfully_applied and not report.tampering_detected
    assert report.outcome is Outcome.TESTS_COULD_NOT_START
    assert report.test_exit_code == 3  # pytest raised: its internal-error status
    assert report.outcome_detail == "ModuleNotFoundError: No module named 'calc.helpers'"  # the root cause
    assert report.reward == 0.0 and not report.resolved and not report.infrastructure_failure
    assert labels.MASKED.isdisjoint({report.outcome})


def test_labels_of_ordinary_gradings(verifier, calc_task):
    assert verifier.verify(calc_task, calc_task.patch).outcome is Outcome.RESOLVED
    empty = verifier.verify(calc_task, "", run_empty=True)
    assert empty.outcome is Outcome.UNRESOLVED
    none = verifier.verify(calc_task, None)
    assert none.outcome is Outcome.AGENT_FAILURE and none.outcome_detail == "the patch is empty"
    garbage = verifier.verify(calc_task, "this is not a diff")
    assert garbage.outcome is Outcome.AGENT_FAILURE and "not a patch" in garbage.outcome_detail
    stale = ("diff --git a/calc/__init__.py b/calc/__init__.py\n--- a/calc/__init__.py\n+++ b/calc/__init__.py\n"
             "@@ -1,2 +1,2 @@\n-no such line\n+x\n context\n")
    report = verifier.verify(calc_task, stale)
    assert report.outcome is Outcome.PATCH_DID_NOT_APPLY and not report.infrastructure_failure


def test_a_hanging_test_run_is_a_timeout(calc_task):
    task = calc_task.model_copy(update={"test_spec": calc_task.test_spec.model_copy(update={"timeout": 5})})
    hang = ("diff --git a/calc/__init__.py b/calc/__init__.py\n--- a/calc/__init__.py\n+++ b/calc/__init__.py\n"
            "@@ -1,2 +1,4 @@\n \"\"\"Small numeric helpers.\"\"\"\n+import time\n+time.sleep(600)\n \n")
    report = Verifier().verify(task, hang)
    assert report.outcome is Outcome.TEST_TIMEOUT and report.reward == 0.0


def test_forged_results_are_tampering(verifier, calc_task):
    forge = ("diff --git a/calc/__init__.py b/calc/__init__.py\n--- a/calc/__init__.py\n+++ b/calc/__init__.py\n"
             "@@ -1,2 +1,4 @@\n \"\"\"Small numeric helpers.\"\"\"\n+import os\n+os._exit(0)\n \n")
    report = verifier.verify(calc_task, forge)
    assert report.tampering_detected and report.outcome is Outcome.TAMPERING
    assert report.outcome_detail == report.tampering_reason


def test_build_and_infrastructure_failures_are_told_apart(calc_task):
    from patchgym.sandboxes import EnvironmentBuildError, SandboxError

    def build_fails(task):
        raise EnvironmentBuildError("pip install failed")

    def backend_fails(task):
        raise SandboxError("the container died")

    built = Verifier(build_fails).verify(calc_task, calc_task.patch)
    assert built.outcome is Outcome.ENVIRONMENT_BUILD_FAILURE and "pip install failed" in built.outcome_detail
    crashed = Verifier(backend_fails).verify(calc_task, calc_task.patch)
    assert crashed.outcome is Outcome.INFRASTRUCTURE_FAILURE
    assert {built.outcome, crashed.outcome} == labels.MASKED


def test_settle_is_idempotent_and_reads_reports_built_elsewhere():
    start = InstanceReport(instance_id="x", infrastructure_failure=True,
                           infrastructure_failure_reason="EnvironmentBuildError: no wheel for foo")
    assert labels.settle(start).outcome is Outcome.ENVIRONMENT_BUILD_FAILURE
    assert labels.settle(start).outcome is Outcome.ENVIRONMENT_BUILD_FAILURE
    stored = InstanceReport.model_validate(json.loads(json.dumps(start.swebench_dict())))
    assert stored.outcome is Outcome.ENVIRONMENT_BUILD_FAILURE


@pytest.mark.parametrize(("output", "first"), [
    ("ImportError while loading conftest '/w/tests/conftest.py'.\ntests/conftest.py:1: in <module>\n"
     "    import simplejson\nE   ModuleNotFoundError: No module named 'simplejson'\n",
     "ModuleNotFoundError: No module named 'simplejson'"),
    ("ERROR: usage: python -m pytest [options] [file_or_dir] [file_or_dir] [...]\n"
     "python -m pytest: error: unrecognized arguments: --frobnicate\n", "unrecognized arguments: --frobnicate"),
    ("ERROR: file or directory not found: tests/test_gone.py\n", "file or directory not found: tests/test_gone.py"),
    ("Traceback (most recent call last):\n  File \"runtests.py\", line 3\nImportError: cannot import name 'x'\n",
     "ImportError: cannot import name 'x'"),
    ("nothing to see\n", None),
])
def test_first_error_line(output, first):
    assert labels.first_error_line(output) == first


def test_could_not_start_only_when_no_test_ran():
    out = "E   ModuleNotFoundError: No module named 'x'\n"
    assert labels.could_not_start(4, False, out) == "ModuleNotFoundError: No module named 'x'"
    assert labels.could_not_start(2, True, out) is None  # interrupted after tests ran
    assert labels.could_not_start(1, False, out) is None  # tests failed: they started
    assert labels.could_not_start(5, False, "") == "pytest exited with status 5 before running any test"


def test_every_label_is_in_the_docs_table():
    table = (Path(__file__).parent.parent / "docs" / "swebench.md").read_text()
    for outcome in Outcome:
        assert f"| `{outcome.value}` |" in table


def test_a_collection_error_could_not_start(verifier, calc_task):
    """The agent's patch breaks the module the hidden tests import: a collection error (pytest
    exits 4 here: the requested node ids found no collectors; 2 when whole files are run), no
    test ran."""
    broken = ("diff --git a/calc/__init__.py b/calc/__init__.py\n--- a/calc/__init__.py\n+++ b/calc/__init__.py\n"
              "@@ -1,2 +1,3 @@\n \"\"\"Small numeric helpers.\"\"\"\n+import missing_helpers_module\n \n")
    report = verifier.verify(calc_task, broken)
    assert report.test_exit_code in (2, 4) and not report.tampering_detected, report.tampering_reason
    assert report.outcome is Outcome.TESTS_COULD_NOT_START
    assert report.outcome_detail == "ModuleNotFoundError: No module named 'missing_helpers_module'"
    assert report.reward == 0.0 and not report.infrastructure_failure


def test_the_same_label_in_repo_env_info_and_the_eval_run_report(calc_tasks_file, calc_task, verifier, tmp_path):
    import gymnasium as gym

    import patchgym.gym_envs  # noqa: F401  (registers the environments)
    from patchgym.grading.evaluation import evaluate
    from patchgym.tasks.catalog import load_task_set
    from patchgym.tasks.predictions import Prediction

    env = gym.make("patchgym/RepoEnv-v0", tasks=str(calc_tasks_file), max_steps=5)
    try:
        env.reset()
        *_, info = env.step({"name": "submit", "arguments": {}})
    finally:
        env.close()
    assert info["outcome"] == "unresolved" and info["report"]["outcome"] == "unresolved"
    predictions = {calc_task.instance_id: Prediction(instance_id=calc_task.instance_id, model_patch=calc_task.patch,
                                                     model_name_or_path="gold")}
    summary = evaluate(load_task_set(calc_tasks_file), predictions, tmp_path / "run", verifier=verifier)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert summary.outcome_ids == report["outcome_ids"] == {"resolved": [calc_task.instance_id]}
