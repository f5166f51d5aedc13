"""Task validation: the gold patch resolves, no change does not, and repeated runs agree.

The empty patch is really run (not skipped as in evaluation): a task whose tests pass with no
change at all gives reward for nothing (R2E-Gym #27), and a FAIL_TO_PASS test that already passes,
or a PASS_TO_PASS test that fails at the base commit, is a broken task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from patchgym.grading.labels import Outcome
from patchgym.grading.parallel import run_parallel
from patchgym.grading.verifier import InstanceReport, Verifier
from patchgym.tasks.catalog import TaskSet
from patchgym.tasks.model import Task


@dataclass
class TaskValidation:
    instance_id: str
    gold_resolved: list[bool] = field(default_factory=list)
    empty_resolved: bool | None = None
    flaky: bool = False
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def _outcomes(report: InstanceReport) -> dict[str, list[str]]:
    return {k: sorted(v.get("success", [])) for k, v in report.tests_status.items()}


def validate_task(task: Task, verifier: Verifier, runs: int = 2) -> TaskValidation:
    """Run the gold patch ``runs`` times and the empty patch once; collect every problem found."""
    result = TaskValidation(task.instance_id)
    if not task.patch:
        result.problems.append("no gold patch")
        return result
    gold = [verifier.verify(task, task.patch) for _ in range(max(1, runs))]
    empty = verifier.verify(task, "", run_empty=True)
    result.seconds = sum(r.duration_seconds for r in gold) + empty.duration_seconds
    for r in [*gold, empty]:
        if r.infrastructure_failure:
            result.problems.append(f"infrastructure failure: {r.infrastructure_failure_reason}")
            return result
    if empty.outcome is Outcome.TESTS_COULD_NOT_START:
        # Nothing of an agent's is in this run: the environment lacks what the tests need.
        result.problems.append(f"environment problem: the tests cannot start at the base commit: "
                               f"{empty.outcome_detail}")
        return result
    result.gold_resolved = [r.resolved for r in gold]
    result.empty_resolved = empty.resolved
    if len({repr(_outcomes(r)) for r in gold}) > 1:
        result.flaky = True
        result.problems.append("flaky: gold runs disagree")
    if not all(result.gold_resolved):
        failing = sorted({t for r in gold for k in ("FAIL_TO_PASS", "PASS_TO_PASS")
                          for t in r.tests_status.get(k, {}).get("failure", [])})
        result.problems.append(f"gold patch does not resolve (failing: {', '.join(failing[:5]) or 'none'}"
                               f"{'; ' + (gold[0].outcome_detail or gold[0].error) if gold[0].error else ''})")
    if empty.resolved:
        result.problems.append("resolved with no change at all")
    for label, r in [*(("gold", g) for g in gold), ("the base", empty)]:
        # A conflicting twin (grading.twins) must fail on the base and on the gold tree, a canary as
        # declared: else an honest fix would be called tampering.
        if r.tampering_detected:
            result.problems.append(f"tampering found on {label}: {r.tampering_reason}")
            break
    f2p_passing = empty.tests_status.get("FAIL_TO_PASS", {}).get("success", [])
    if f2p_passing:
        result.problems.append(f"FAIL_TO_PASS tests pass without the fix: {', '.join(f2p_passing[:5])}")
    p2p_failing = empty.tests_status.get("PASS_TO_PASS", {}).get("failure", [])
    if p2p_failing:
        result.problems.append(f"PASS_TO_PASS tests fail at the base commit: {', '.join(p2p_failing[:5])}")
    return result


def validate_tasks(tasks: TaskSet, verifier: Verifier, *, runs: int = 2, workers: int = 1,
                   on_done: Callable[[TaskValidation], None] | None = None) -> list[TaskValidation]:
    """Validate every task (in parallel); results in task-set order."""
    results: dict[str, TaskValidation] = {}

    def finished(r: TaskValidation) -> None:
        results[r.instance_id] = r
        if on_done:
            on_done(r)

    run_parallel(lambda t: validate_task(t, verifier, runs), tasks, workers, finished)
    return [results[i] for i in tasks.ids]
