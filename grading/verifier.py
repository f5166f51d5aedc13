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

from pydantic import BaseModel, Field, PrivateAttr

from patchgym.grading.cost import CostMeter, EpisodeCost, Prices
from patchgym.grading.labels import Outcome, settle
from patchgym.grading.outcome import grade
from patchgym.grading.patch_apply import apply_patch
from patchgym.grading.patches import FilePatch, PatchError, filter_agent_patch, parse_patch, read_agent_patch
from patchgym.grading.runners import changed_test_files
from patchgym.grading.testrun import HarnessFiles, place_harness_files, probe, run_tests
from patchgym.sandboxes import EnvironmentBuildError, Sandbox, SandboxClosedError, SandboxError
from patchgym.sandboxes.base import usage_of
from patchgym.sandboxes.phases import phase
from patchgym.tasks.backends import SandboxFactory, make_sandbox
from patchgym.tasks.model import Task

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
    tampering_detected: bool = Field(False, description="the test results show signs of forgery (reward: the "
                                                        "tampering_reward setting, 0 by default)")
    tampering_reason: str | None = None
    protections_missing: list[str] = Field(
        default_factory=list, description="protections of the grading runtime this run went without, and why "
        "(no audit hook under Python < 3.8; results read from a runner's output)")
    missing_tests: list[str] = Field(default_factory=list)
    outcome: Outcome | None = Field(None, description="how the grading ended, one label of "
                                                      "grading.labels (the same everywhere)")
    outcome_detail: str | None = Field(None, description="why: the first error line, the reason")
    duration_seconds: float = 0.0
    placement: dict[str, Any] | None = Field(
        None, description="where the grading sandbox ran (ray backend: node, warm-up, first on its node)")
    test_output: str = Field("", exclude=True, description="the test run's log (written apart from the report)")
    error: str | None = None
    cost: EpisodeCost | None = Field(None, description="what grading cost: wall time, harness and test CPU, "
                                                       "peak memory, dollars (grading.cost)")

    # The step that raised after the agent's patch was applied (None: nothing did); the verifier
    # settles it (agent's failure or infrastructure) against the pristine base.
    _failed_after_patch: str | None = PrivateAttr(None)

    def swebench_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Verifier:
    """Grades patches for tasks in fresh sandboxes made by ``factory``."""

    def __init__(self, factory: SandboxFactory | None = None, *, partial_credit: bool = False,
                 prices: Prices | None = None, tampering_reward: float = 0.0) -> None:
        self.factory = factory or (lambda task: make_sandbox(task))
        self.partial_credit = partial_credit
        # The reward of a grading that found tampering: below 0 it gives forging a price, so that a
        # forger's expected reward is below an honest failure's 0 (docs/grading.md).
        self.tampering_reward = tampering_reward
        self.prices = prices or Prices()

    def verify(self, task: Task, patch: str | None, *, model_name: str | None = None,
               run_empty: bool = False) -> InstanceReport:
        """Grade ``patch`` for ``task``. ``run_empty`` runs the tests even for an empty patch."""
        meter = CostMeter()
        with meter.charging():
            try:
                report = self._verify(task, patch, meter, model_name=model_name, run_empty=run_empty)
            except Exception as exc:  # a harness bug, or one this patch found: the pristine base decides
                report = self.settle_crash(task, patch, exc, model_name=model_name)
        report.cost = meter.result(self.prices)
        return settle(report)

    def settle_crash(self, task: Task, patch: str | None, exc: Exception, *,
                     model_name: str | None = None) -> InstanceReport:
        """Grading ``patch`` raised ``exc``: the agent's failure (reward 0, the exception in
        ``error``) unless grading no patch at all, on the pristine base, raises too. Only that
        proves the fault independent of the agent, and only then is it masked."""
        log.warning("%s: grading raised %s: %s", task.instance_id, type(exc).__name__, exc, exc_info=exc)
        report = InstanceReport(instance_id=task.instance_id, model_name_or_path=model_name,
                                patch_is_None=patch is None, patch_exists=bool(patch and patch.strip()),
                                error=f"grading failed on this patch: {type(exc).__name__}: {str(exc)[:1000]}",
                                outcome=Outcome.AGENT_FAILURE)
        try:
            self._verify(task, None, CostMeter(), model_name=model_name, run_empty=True)
        except Exception as base:
            report.infrastructure_failure = True
            report.infrastructure_failure_reason = (f"harness error: {type(exc).__name__}: {str(exc)[:1000]}; on the "
                                                    f"pristine base too: {type(base).__name__}: {str(base)[:1000]}")
        report.tests_status = grade(task.FAIL_TO_PASS, task.PASS_TO_PASS, {}).tests_status
        return settle(report)

    def _verify(self, task: Task, patch: str | None, meter: CostMeter, *, model_name: str | None,
                run_empty: bool) -> InstanceReport:
        start = time.monotonic()
        report = InstanceReport(instance_id=task.instance_id, model_name_or_path=model_name)
        report.patch_is_None = patch is None
        report.patch_exists = bool(patch and patch.strip())
        if not report.patch_exists and not run_empty:
            report.tests_status = grade(task.FAIL_TO_PASS, task.PASS_TO_PASS, {}).tests_status
            return report
        files: list[FilePatch] = []  # the agent's patch, parsed here once for the whole grading
        if report.patch_exists:
            try:
                files = read_agent_patch(patch or "")
            except Exception as exc:
                # Nothing to apply (or nothing it is safe to read), whatever the reader raised: the
                # agent's failure, said without paying for a sandbox.
                reason = str(exc) if isinstance(exc, PatchError) else f"{type(exc).__name__}: {str(exc)[:500]}"
                report.error = f"the patch cannot be parsed: {reason}"
                report.outcome = Outcome.AGENT_FAILURE
                report.tests_status = grade(task.FAIL_TO_PASS, task.PASS_TO_PASS, {}).tests_status
                return report
        sandbox: Sandbox | None = None
        try:
            with phase(f"{task.instance_id}: sandbox start"):  # said in a log when it takes long
                sandbox = self.factory(task)
            placement = getattr(sandbox, "placement", None)
            report.placement = dict(placement) if placement else None
            report = _grade(sandbox, task, files, report, meter)
            if report._failed_after_patch is not None:
                self._settle_failure(task, report)
            if report.tampering_detected:
                log.warning("%s: tampering detected: %s", task.instance_id, report.tampering_reason)
        except SandboxError as exc:
            report.infrastructure_failure = True
            report.infrastructure_failure_reason = f"{type(exc).__name__}: {exc}"
            report.outcome = (Outcome.ENVIRONMENT_BUILD_FAILURE if isinstance(exc, EnvironmentBuildError)
                              else Outcome.INFRASTRUCTURE_FAILURE)
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

    def _settle_failure(self, task: Task, report: InstanceReport) -> None:
        """A step failed after the agent's patch was applied: the agent's failure (reward 0, the
        reason in ``error``) unless the same step fails on the pristine base, in a fresh sandbox
        (the test patch applied; for the test run, the same tests run): only that proves the cause
        independent of the agent."""
        step = report._failed_after_patch
        try:
            if step == "running the tests":
                files = changed_test_files(task.test_patch) if task.test_spec.format != "pytest" else ()
                run = probe(task, [task.test_patch], task.FAIL_TO_PASS + task.PASS_TO_PASS, self.factory,
                            files=files)
                base_failure = "the test patch does not apply" if run.applied == [False] else None
            else:
                base_failure = self._test_patch_fails_on_base(task)
        except Exception as exc:  # the same harness step broke without the agent's patch
            base_failure = f"{type(exc).__name__}: {str(exc)[:1000]}"
        if base_failure is None:
            log.warning("%s: the agent's failure: %s", task.instance_id, report.error)
            return
        report.infrastructure_failure = True
        report.infrastructure_failure_reason = f"{report.error}; on the pristine base too: {base_failure}"
        log.warning("%s: infrastructure failure (%s fails on the pristine base too): %s", task.instance_id,
                    step, base_failure)

    def _test_patch_fails_on_base(self, task: Task) -> str | None:
        """Why the task's test patch does not apply to the pristine base in a fresh sandbox, or None."""
        if not task.test_patch.strip():
            return None
        sandbox = self.factory(task)
        try:
            if apply_patch(sandbox, parse_patch(task.test_patch), fuzzy=False) is None:
                return "the task's test patch does not apply (the task is broken)"
            return None
        finally:
            try:
                sandbox.close()
            except SandboxError:
                pass

    def _reward(self, report: InstanceReport, task: Task) -> float:
        if report.tampering_detected and not report.infrastructure_failure:
            return self.tampering_reward
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
    def _grade_in(sandbox: Sandbox, task: Task, files: list[FilePatch], report: InstanceReport,
                  meter: CostMeter) -> None:
        """Grade the agent's parsed patch (``files``, from :func:`.patches.read_agent_patch`) in
        ``sandbox``; the test patch is parsed once here too, for the paths it protects, its staged
        copy and its application."""
        test_files = parse_patch(task.test_patch) if task.test_patch.strip() else []
        protected = {path for section in test_files for path in section.paths}
        filtered = None
        if files:
            try:
                filtered = filter_agent_patch(files, protected, allow_compiled=task.test_spec.allow_compiled_files)
            except Exception as exc:  # the filter broke on the agent's sections: still never masked
                log.exception("%s: the patch filter failed", task.instance_id)
                report.error = f"the patch cannot be parsed: {type(exc).__name__}: {str(exc)[:500]}"
                report.outcome = Outcome.AGENT_FAILURE
                return
            report.ignored_paths = filtered.dropped
        # The harness's own files go in before anything of the agent's (see HarnessFiles).
        harness = place_harness_files(sandbox, test_files)
        step = "applying the patch"
        try:
            if filtered is not None and filtered.files:
                method = apply_patch(sandbox, filtered.files)
                if method is None:
                    report.error = "the patch does not apply to the base commit"
                    report.outcome = Outcome.PATCH_DID_NOT_APPLY
                    return
                report.apply_method = method
            report.patch_successfully_applied = True
            step = "applying the test patch"
            # An empty test patch (synthesized tasks: the hidden tests are the existing ones) applies nothing.
            if harness.test_patch and apply_patch(sandbox, test_files, fuzzy=False,
                                                  staged=harness.test_patch) is None:
                # The agent's change stands in its way, unless it does not apply to the pristine base
                # either (the task is broken): Verifier._settle_failure looks.
                report.patch_successfully_applied = False
                report.error = "the task's test patch does not apply over the patch (it changes what the tests need)"
                report.outcome = Outcome.AGENT_FAILURE
                report._failed_after_patch = step
                return
            step = "running the tests"
            Verifier._run_tests(sandbox, task, report, meter, harness)
        except SandboxClosedError:  # closed by the harness itself (shutting down)
            raise
        except Exception as exc:
            # From the agent's patch on, whatever breaks is the agent's doing until the pristine base
            # shows otherwise (Verifier._settle_failure, where the sandbox factory is).
            report.resolved = False
            report.error = f"{step} failed after the patch: {type(exc).__name__}: {str(exc)[:2000]}"
            report._failed_after_patch = step
            report.outcome = Outcome.AGENT_FAILURE
            log.info("%s: %s", task.instance_id, report.error)

    @staticmethod
    def _run_tests(sandbox: Sandbox, task: Task, report: InstanceReport, meter: CostMeter,
                   harness: HarnessFiles | None = None) -> None:
        files = changed_test_files(task.test_patch) if task.test_spec.format != "pytest" else ()
        with phase(f"{task.instance_id}: tests ({len(task.FAIL_TO_PASS) + len(task.PASS_TO_PASS)})"):
            run = run_tests(sandbox, task.test_spec, task.FAIL_TO_PASS + task.PASS_TO_PASS, files=files,
                            harness=harness, known_passing=task.PASS_TO_PASS)
        meter.add_tests(run.cpu_seconds)
        report.test_output = run.output
        report.test_exit_code = run.exit_code
        report.test_timed_out = run.timed_out
        if run.error:
            report.error = run.error
        if run.could_not_start:  # the agent's failure here; at the base commit validation says so
            report.outcome, report.outcome_detail = Outcome.TESTS_COULD_NOT_START, run.could_not_start
        g = grade(task.FAIL_TO_PASS, task.PASS_TO_PASS, run.statuses, run.undeclared_xfail, run.undeclared_skip)
        report.tests_status = g.tests_status
        report.missing_tests = g.missing
        report.results_consistent = run.consistent
        report.protections_missing = run.protections_missing
        if run.tampering:
            report.tampering_detected, report.tampering_reason = True, run.tampering
        report.resolved = (g.resolved and report.results_consistent and not run.timed_out
                           and not report.tampering_detected)
        if g.resolved and not report.results_consistent and not report.tampering_detected:
            report.error = f"test results contradict the runner's exit code {run.exit_code}"


def _grade(sandbox: Sandbox, task: Task, files: list[FilePatch], report: InstanceReport,
           meter: CostMeter) -> InstanceReport:
    """Grade in ``sandbox``: here, or where the sandbox offers ``run_near`` (the ray backend), on its
    node in one call, so that the dozen commands and files of a grading make no round trip each and
    the harness's CPU is spent beside the sandbox. The node's meter joins this one."""
    run_near = getattr(sandbox, "run_near", None)
    if not callable(run_near):
        Verifier._grade_in(sandbox, task, files, report, meter)
        return report
    report, node_meter = run_near(_grade_on_node, task, files, report,
                                  timeout=task.test_spec.timeout + GRADING_MARGIN)
    meter.absorb(node_meter)
    return report


def _grade_on_node(sandbox: Sandbox, task: Task, files: list[FilePatch],
                   report: InstanceReport) -> tuple[InstanceReport, CostMeter]:
    """:meth:`Verifier._grade_in` where the sandbox is (called by the sandbox's host, see :func:`_grade`)."""
    meter = CostMeter()
    with meter.charging():
        Verifier._grade_in(sandbox, task, files, report, meter)
    return report, meter
