"""Outcome labels: one name for how a grading ended, the same in every report patchgym writes.

Instance reports (``outcome`` and ``outcome_detail``), RepoEnv's terminal info, the server's
answers and run reports all use these names, so a dashboard counts the same thing everywhere:

* ``resolved`` / ``unresolved``: the tests ran and the verdict stands.
* ``environment_build_failure``: the task's environment could not be built (masked).
* ``infrastructure_failure``: anything else the agent provably could not cause (masked).
* ``tests_could_not_start``: the test runner ran, but no test did: a collection error, an import
  error (a ``conftest.py`` importing a missing module), a usage error. ``outcome_detail`` holds
  the first error line. After the agent's patch it is the agent's failure (reward 0, never
  masked: an agent must not learn to break the import to have a sample dropped); at the base
  commit it is an environment problem, which task validation reports as such. Never tampering.
* ``test_timeout``: the test run did not finish in time (the agent's: reward 0).
* ``tampering``: only what the integrity checks (:mod:`.integrity`) saw.
* ``patch_did_not_apply``: the agent's patch does not apply to the base commit.
* ``agent_failure``: any other failure of the agent's (an empty or unparsable patch, a patch the
  test patch cannot be applied over, a workspace that cannot be diffed).
"""

from __future__ import annotations

import enum
import re
from typing import Protocol, TypeVar

#: pytest's exit codes for a session that ran no test of its own accord: interrupted (a
#: collection error), internal error, usage error (a conftest that cannot be imported, an
#: unknown option, a path that does not exist), no tests collected.
NOT_STARTED_EXIT_CODES = (2, 3, 4, 5)
DETAIL_LIMIT = 500


class Outcome(str, enum.Enum):
    """How a grading ended (the values are what reports say)."""

    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"
    ENVIRONMENT_BUILD_FAILURE = "environment_build_failure"
    INFRASTRUCTURE_FAILURE = "infrastructure_failure"
    TESTS_COULD_NOT_START = "tests_could_not_start"
    TEST_TIMEOUT = "test_timeout"
    TAMPERING = "tampering"
    PATCH_DID_NOT_APPLY = "patch_did_not_apply"
    AGENT_FAILURE = "agent_failure"

    def __str__(self) -> str:
        return self.value


#: Outcomes a trainer leaves out rather than scoring 0: only what the agent could not cause.
MASKED = frozenset({Outcome.ENVIRONMENT_BUILD_FAILURE, Outcome.INFRASTRUCTURE_FAILURE})

_ERROR_PREFIX = re.compile(r"^E\s{1,4}(\S.*)$")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt): .*)$")
_PYTEST_ERROR = re.compile(r"^(?:ERROR|INTERNALERROR>?)[: ]\s*(\S.*)$")
_USAGE = re.compile(r"^\S.*?: error: (.+)$")


def first_error_line(output: str) -> str | None:
    """The first line of ``output`` that names the error a test run stopped at: pytest's ``E   ``
    lines (``ModuleNotFoundError: No module named 'simplejson'``), then an exception line of a
    traceback, then argparse's ``error:`` (usage errors), then pytest's ``ERROR:`` lines."""
    lines = [line.rstrip() for line in output.splitlines()]
    for pattern in (_ERROR_PREFIX, _EXCEPTION, _USAGE, _PYTEST_ERROR):
        for line in lines:
            match = pattern.match(line.strip() if pattern is _EXCEPTION else line)
            if match and match.group(1).strip():
                return match.group(1).strip()[:DETAIL_LIMIT]
    return None


def could_not_start(exit_code: int | None, ran_any: bool, output: str) -> str | None:
    """The first error line when a pytest run ended before any test ran (see
    :data:`NOT_STARTED_EXIT_CODES`), else None. A run killed or timed out is not this."""
    if exit_code not in NOT_STARTED_EXIT_CODES or ran_any:
        return None
    return first_error_line(output) or f"pytest exited with status {exit_code} before running any test"


def of_infrastructure(reason: str | None) -> Outcome:
    """The label of an infrastructure failure from its reason (``"<ExceptionType>: ..."``)."""
    if (reason or "").startswith("EnvironmentBuildError"):
        return Outcome.ENVIRONMENT_BUILD_FAILURE
    return Outcome.INFRASTRUCTURE_FAILURE


class _Graded(Protocol):
    """The fields of :class:`patchgym.grading.verifier.InstanceReport` a label is read from."""

    outcome: Outcome | None
    outcome_detail: str | None
    infrastructure_failure: bool
    infrastructure_failure_reason: str | None
    tampering_detected: bool
    tampering_reason: str | None
    test_timed_out: bool
    test_exit_code: int | None
    patch_exists: bool
    resolved: bool
    error: str | None


R = TypeVar("R", bound=_Graded)


def settle(report: R) -> R:
    """Give ``report`` its label (and return it). Checks of the whole grading come first (an
    infrastructure failure, tampering), then what the grading decided where it stopped (a patch
    that does not apply, tests that could not start), then how the tests' run ended. Idempotent:
    reports built outside the verifier (RepoEnv's own) are settled the same way."""
    if report.infrastructure_failure:
        if report.outcome not in MASKED:
            report.outcome = of_infrastructure(report.infrastructure_failure_reason)
        report.outcome_detail = report.infrastructure_failure_reason
    elif report.tampering_detected:
        report.outcome, report.outcome_detail = Outcome.TAMPERING, report.tampering_reason
    elif report.outcome is not None and report.outcome not in MASKED | {Outcome.TAMPERING}:
        report.outcome_detail = report.outcome_detail or report.error
    elif report.test_timed_out:
        report.outcome, report.outcome_detail = Outcome.TEST_TIMEOUT, report.error
    elif not report.patch_exists and report.test_exit_code is None and not report.resolved:
        report.outcome = Outcome.AGENT_FAILURE
        report.outcome_detail = report.error or "the patch is empty"
    else:
        report.outcome = Outcome.RESOLVED if report.resolved else Outcome.UNRESOLVED
        report.outcome_detail = None if report.resolved else report.error
    return report
