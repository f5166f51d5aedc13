"""How a NeMo Gym rollout ended, in the fields NeMo Gym's verify response carries: ``reward``,
``mask_sample`` (the infrastructure failed, not the policy: leave the sample out),
``failure_kind`` (NeMo Gym's shared vocabulary, ``nemo_gym/failure_kinds.py`` of 0.7.0, or a
``patchgym:<kind>`` of ours, namespaced as it asks) and ``failure_reason`` (the occurrence, in words).

:func:`failure_of` is the one place that reads a grade's report for them, so a richer report (an
outcome vocabulary of the verifier's own) changes this function alone.
"""

from dataclasses import dataclass
from typing import Any

from patchgym.server.sessions import OperationTimeout

# NeMo Gym's registered names (0.7.0 warns once for any other that is not namespaced).
PROVIDER_UNAVAILABLE = "provider_unavailable"  # the sandbox could not start, broke, or broke while grading
SESSION_EXPIRED = "session_expired"  # closed for idling: the workspace is gone, nothing to grade
# Ours: what NeMo Gym's vocabulary has no name for.
OPERATION_TIMEOUT = "patchgym:operation_timeout"  # an operation ran past the server's deadline (masked)
TAMPERING = "patchgym:tampering"  # the test results show signs of forgery (scored 0, not masked)
TEST_TIMEOUT = "patchgym:test_timeout"  # the hidden tests ran out of time on the patch (scored 0, not masked)


def failure_of(report: dict[str, Any] | None) -> tuple[bool, str | None, str | None]:
    """``(mask_sample, failure_kind, failure_reason)`` of a grade's report (SWE-bench's fields plus
    patchgym's). Only an infrastructure failure is masked; tampering and a test run that timed out
    are the policy's doing, scored 0 and only named, so a trainer can count them without the
    policy learning that breaking things gets a sample thrown away."""
    report = report or {}
    if report.get("infrastructure_failure"):
        return True, PROVIDER_UNAVAILABLE, report.get("infrastructure_failure_reason")
    if report.get("tampering_detected"):
        return False, TAMPERING, report.get("tampering_reason")
    if report.get("test_timed_out"):
        return False, TEST_TIMEOUT, "the hidden tests timed out on the patch"
    return False, None, None


@dataclass(frozen=True)
class Outcome:
    """How an episode ended, kept until /verify asks (a submit tool call grades once, not twice)."""

    reward: float
    resolved: bool = False
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None
    report: dict[str, Any] | None = None

    @classmethod
    def graded(cls, reward: float, report: dict[str, Any] | None) -> "Outcome":
        """From a grade: an infrastructure failure is masked with reward 0, never scored."""
        mask, kind, reason = failure_of(report)
        resolved = bool((report or {}).get("resolved")) and not mask
        return cls(reward=0.0 if mask else float(reward), resolved=resolved, mask_sample=mask, failure_kind=kind,
                   failure_reason=reason, report=report)

    @classmethod
    def infrastructure(cls, kind: str, reason: str | None) -> "Outcome":
        """A session that ended by no doing of the policy, with nothing graded."""
        return cls(reward=0.0, mask_sample=True, failure_kind=kind, failure_reason=reason)

    @classmethod
    def from_error(cls, exc: Exception) -> tuple["Outcome", int, str]:
        """A session closed by a sandbox failure or a deadline: its masked outcome, and the status and
        error kind the rest of the API answers such a failure with."""
        if isinstance(exc, OperationTimeout):
            return cls.infrastructure(OPERATION_TIMEOUT, str(exc)), 504, "timeout"
        return cls.infrastructure(PROVIDER_UNAVAILABLE, f"{type(exc).__name__}: {exc}"), 503, "infrastructure"

    def verify_fields(self) -> dict[str, Any]:
        """The fields a verify response adds to the request it echoes."""
        return {"reward": self.reward, "resolved": self.resolved, "mask_sample": self.mask_sample,
                "failure_kind": self.failure_kind, "failure_reason": self.failure_reason, "report": self.report}
