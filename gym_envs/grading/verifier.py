"""The reward: grade a patch for a task the way SWE-bench does, hardened against gaming.

1. A fresh sandbox at ``base_commit`` (never the agent's own, so nothing it left running matters).
2. The agent's diff, minus every change to tests, test configuration and files the test patch
   touches, applied with ``git apply`` (falling back to ``patch --fuzz``).
3. The test patch applied; exactly FAIL_TO_PASS + PASS_TO_PASS run, outcomes read from junit XML
   written to a path the agent cannot predict (Django's and SymPy's runners: from their verbose
   output, see :mod:`.runners`), and cross-checked with the runner's exit code.
4. A report in SWE-bench's fields, with infrastructure failures (environment build, sandbox crash)
   kept apart from the agent's, so a trainer can mask them instead of scoring them 0, and what the
   grading cost (``cost``: :mod:`.cost`, the tests' CPU apart from the harness's).

A test run that times out is the agent's failure (reward 0), not infrastructure: otherwise a
policy could learn to hang whenever it is unsure and have the sample masked.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pydantic import BaseModel, Field

from gym_envs.grading.cost import CostMeter, EpisodeCost, Prices
from gym_envs.grading.outcome import grade
from gym_envs.grading.patch_apply import GIT_APPLY, PATCH_FILE, apply_patch
from gym_envs.grading.patches import PatchError, filter_agent_patch, split_diff, touched_paths
from gym_envs.grading.runners import changed_test_files
from gym_envs.grading.testrun import run_tests
from sandboxes import Sandbox, SandboxError
from sandboxes.base import usage_of
from tasks.backends import SandboxFactory, make_sandbox
from tasks.model import Task

log = logging.getLogger(__name__)
#: What a grading may take beyond its test run's own timeout (applying patches, copying files).
GRADING_MARGIN = 600.0


class InstanceReport(BaseModel):
    """One instance's grade: SWE-bench's per-instance report fields plus what patchgym adds."""

    instance_id: str
    model_name_or_path: str | None = None
    patch_is_None: bool = False
    patch_exists: bool = False
    patch_successfully_applied: bool = False
    resolved: bool = False
    tests_status: dict[str, dict[str, list[str]]] = Field(default_factory=dict)
    # patchgym additions
    reward: float = 0.0
    infrastructure_failure: bool = False
    infrastructure_failure_reason: str | None = None
    ignored_paths: list[str] = Field(default_factory=list, description="agent changes dropped before grading")
    apply_method: str | None = None
    test_exit_code: int | None = None
    test_timed_out: bool = False
    results_consistent: bool = True
    tampering_detected: bool = Field(False, description="the test results show signs of forgery (reward 0)")
    tampering_reason: str | None = None
    missing_tests: list[str] = Field(default_factory=list)
    duration_seconds: float = 0.0
    placement: dict[str, Any] | None = Field(
        None, description="where the grading sandbox ran (ray backend: node, warm-up, first on its node)")
    test_output: str = Field("", exclude=True, description="the test run's log (written apart from the report)")
    error: str | None = None
    cost: EpisodeCost | None = Field(None, description="what grading cost: wall time, harness and test CPU, "
                                                       "peak memory, dollars (gym_envs.grading.cost)")

    def swebench_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Verifier:
    """Grades patches for tasks in fresh sandboxes made by ``factory``."""

    def __init__(self, factory: SandboxFactory | None = None, *, partial_credit: bool = False,
                 prices: Prices | None = None) -> None:
        self.factory = factory or (lambda task: make_sandbox(task))
        self.partial_credit = partial_credit
        self.prices = prices or Prices()

    def verify(self, task: Task, patch: str | None, *, model_name: str | None = None,
               run_empty: bool = False) -> InstanceReport:
        """Grade ``patch`` for ``task``. ``run_empty`` runs the tests even for an empty patch."""
        meter = CostMeter()
        with meter.charging():
            report = self._verify(task, patch, meter, model_name=model_name, run_empty=run_empty)
        report.cost = meter.result(self.prices)
        return report

    def _verify(self, task: Task, patch: str | None, meter: CostMeter, *, model_name: str | None,
                run_empty: bool) -> InstanceReport:
        start = time.monotonic()
        report = InstanceReport(instance_id=task.instance_id, model_name_or_path=model_name)
        report.patch_is_None = patch is None
        report.patch_exists = bool(patch and patch.strip())
        if not report.patch_exists and not run_empty:
            report.tests_status = grade(task.FAIL_TO_PASS, task.PASS_TO_PASS, {}).tests_status
            return report
        if report.patch_exists and not split_diff(patch or ""):
            # Nothing to apply: say so without paying for a sandbox.
            report.error = "the patch is not a unified diff"
            report.tests_status = grade(task.FAIL_TO_PASS, task.PASS_TO_PASS, {}).tests_status
            return report
        sandbox: Sandbox | None = None
        try:
            sandbox = self.factory(task)
            placement = getattr(sandbox, "placement", None)
            report.placement = dict(placement) if placement else None
            report = _grade(sandbox, task, patch or "", report, meter)
            if report.tampering_detected:
                log.warning("%s: tampering detected: %s", task.instance_id, report.tampering_reason)
        except SandboxError as exc:
            report.infrastructure_failure = True
            report.infrastructure_failure_reason = f"{type(exc).__name__}: {exc}"
            report.resolved = False
            log.warning("%s: infrastructure failure: %s", task.instance_id, exc)
        finally:
            if sandbox is not None:
                meter.sandbox_closed(usage_of(sandbox))
                try:
                    sandbox.close()
                except Exception as exc:  # a close failure must not hide the grade
                    log.warning("%s: sandbox close failed: %s", task.instance_id, exc)
            report.duration_seconds = round(time.monotonic() - start, 3)
        report.reward = self._reward(report, task)
        return report

    def _reward(self, report: InstanceReport, task: Task) -> float:
        if report.resolved:
            return 1.0
        if not self.partial_credit or not report.patch_successfully_applied:
            return 0.0
        status = report.tests_status
        if status.get("PASS_TO_PASS", {}).get("failure"):
            return 0.0
        passed = len(status.get("FAIL_TO_PASS", {}).get("success", []))
        return passed / len(task.FAIL_TO_PASS)

    @staticmethod
    def _grade_in(sandbox: Sandbox, task: Task, patch: str, report: InstanceReport, meter: CostMeter) -> None:
        protected = touched_paths(task.test_patch)
        if patch.strip():
            try:
                filtered = filter_agent_patch(patch, protected)
            except PatchError as exc:  # the agent's failure, never infrastructure
                report.error = f"the patch cannot be parsed: {exc}"
                return
            report.ignored_paths = filtered.dropped
            if filtered.text:
                method = apply_patch(sandbox, filtered.text)
                if method is None:
                    report.error = "the patch does not apply to the base commit"
                    return
                report.apply_method = method
        report.patch_successfully_applied = True
        # An empty test patch (synthesized tasks: the hidden tests are the existing ones) applies nothing.
        if task.test_patch.strip() and apply_patch(sandbox, task.test_patch, fuzzy=False) is None:
            if not _applies_to_base(sandbox, task.test_patch):
                raise SandboxError("the task's test patch does not apply (the task is broken)")
            # It applies to the base commit, so the agent's change is what stands in its way.
            report.patch_successfully_applied = False
            report.error = "the task's test patch does not apply over the patch (it changes what the tests need)"
            return
        Verifier._run_tests(sandbox, task, report, meter)

    @staticmethod
    def _run_tests(sandbox: Sandbox, task: Task, report: InstanceReport, meter: CostMeter) -> None:
        files = changed_test_files(task.test_patch) if task.test_spec.format != "pytest" else ()
        run = run_tests(sandbox, task.test_spec, task.FAIL_TO_PASS + task.PASS_TO_PASS, files=files)
        meter.add_tests(run.cpu_seconds)
        report.test_output = run.output
        report.test_exit_code = run.exit_code
        report.test_timed_out = run.timed_out
        if run.error:
            report.error = run.error
        g = grade(task.FAIL_TO_PASS, task.PASS_TO_PASS, run.statuses, run.undeclared_xfail, run.undeclared_skip)
        report.tests_status = g.tests_status
        report.missing_tests = g.missing
        report.results_consistent = run.consistent
        if run.tampering:
            report.tampering_detected, report.tampering_reason = True, run.tampering
        report.resolved = (g.resolved and report.results_consistent and not run.timed_out
                           and not report.tampering_detected)
        if g.resolved and not report.results_consistent and not report.tampering_detected:
            report.error = f"test results contradict the runner's exit code {run.exit_code}"


def _grade(sandbox: Sandbox, task: Task, patch: str, report: InstanceReport, meter: CostMeter) -> InstanceReport:
    """Grade in ``sandbox``: here, or where the sandbox offers ``run_near`` (the ray backend), on its
    node in one call, so that the dozen commands and files of a grading make no round trip each and
    the harness's CPU is spent beside the sandbox. The node's meter joins this one."""
    run_near = getattr(sandbox, "run_near", None)
    if not callable(run_near):
        Verifier._grade_in(sandbox, task, patch, report, meter)
        return report
    report, node_meter = run_near(_grade_on_node, task, patch, report,
                                  timeout=task.test_spec.timeout + GRADING_MARGIN)
    meter.absorb(node_meter)
    return report


def _grade_on_node(sandbox: Sandbox, task: Task, patch: str,
                   report: InstanceReport) -> tuple[InstanceReport, CostMeter]:
    """:meth:`Verifier._grade_in` where the sandbox is (called by the sandbox's host, see :func:`_grade`)."""
    meter = CostMeter()
    with meter.charging():
        Verifier._grade_in(sandbox, task, patch, report, meter)
    return report, meter


def _applies_to_base(sandbox: Sandbox, patch: str) -> bool:
    """Whether ``patch`` applies to the base commit: the index, which ``git apply`` of the
    agent's patch left untouched (the work tree has the agent's change)."""
    sandbox.write_file(PATCH_FILE, patch if patch.endswith("\n") else patch + "\n")
    result = sandbox.exec(f"{GIT_APPLY} --cached --check {PATCH_FILE}; s=$?; rm -f {PATCH_FILE}; exit $s",
                          timeout=120)
    return result.ok
