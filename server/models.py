"""Request and response bodies of the HTTP API (pydantic v2), so the OpenAPI schema is complete."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    # A misspelt field is a 422, not silently ignored; and so is a wrong type (strict: ``"seed": true``
    # or ``1.0`` is not quietly read as 1, nor ``"3"`` as 3; a JSON integer still fills a float).
    model_config = ConfigDict(extra="forbid", strict=True)


class CreateSessionRequest(_Request):
    task_id: str | None = Field(None, description="Instance id; default: drawn with the session's seeded RNG.")
    seed: int | None = Field(None, ge=0, description="Seed of the session's task RNG.")
    max_steps: int | None = Field(None, ge=1, description="Steps before the episode is truncated.")
    time_limit: float | None = Field(None, gt=0, description="Wall-clock seconds per episode.")


class CreateSessionResponse(BaseModel):
    session_id: str
    observation: str
    info: dict[str, Any]
    tools: list[dict[str, Any]] = Field(description="OpenAI tool schemas to hand to a model.")


class StepRequest(_Request):
    action: dict[str, Any] | str = Field(
        description='A tool call, {"name": ..., "arguments": {...}}, as an object or a JSON string.')


class StepResponse(BaseModel):
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class ResetRequest(_Request):
    task_id: str | None = None
    seed: int | None = Field(None, ge=0)


class ResetResponse(BaseModel):
    observation: str
    info: dict[str, Any]


class SessionStatus(BaseModel):
    session_id: str
    instance_id: str | None
    steps: int
    done: bool
    idle_seconds: float


class VerifyRequest(_Request):
    instance_id: str
    patch: str = Field(description="A unified diff against the task's base commit (may be empty).")


class VerifyResponse(BaseModel):
    reward: float
    resolved: bool
    infrastructure_failure: bool = Field(description="Mask this sample rather than scoring it.")
    outcome: str | None = Field(None, description="How the grading ended: one label of "
                                                  "grading.labels (docs/swebench.md).")
    outcome_detail: str | None = Field(None, description="Why: the first error line, the reason.")
    report: dict[str, Any] = Field(description="The SWE-bench-style instance report.")


class TaskView(BaseModel):
    """What an agent may see of a task: never the gold patch, the test patch or the test ids."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    hints_text: str
    version: str
    created_at: str


class Health(BaseModel):
    status: str
    sessions: int
    max_sessions: int


class TenantLimits(BaseModel):
    """What one token may hold at once, and holds now (``GET /state`` with the token)."""

    max_sessions: int = Field(description="Sessions this token may hold at once; past it, 429.")
    sessions: int = Field(description="Sessions this token holds (open or starting).")
    max_verifications: int = Field(description="Stateless verifications this token may run at once; past it, 429.")
    verifications: int
    server_max_sessions: int = Field(description="Sessions the server holds at most, every token's together.")
    server_sessions: int


class ErrorBody(BaseModel):
    detail: str


class ModelEndpoint(_Request):
    """The model a rollout uses: an OpenAI-compatible endpoint. The key travels here, never read
    from the server's own environment (a client must not be able to send the server's secrets to
    an endpoint of its choosing)."""

    base_url: str = Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$", max_length=2000,
                          description="API root, e.g. http://vllm:8000/v1: one of the server's --model-endpoint.")
    name: str = Field(description="The model name the endpoint serves.")
    api_key: str | None = Field(None, description="Sent as a bearer token to the endpoint; never stored.")
    timeout: float = Field(300.0, gt=0, le=3600, description="Deadline of one model call (s).")
    retries: int = Field(4, ge=0, le=10)


class Sampling(_Request):
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None


class RolloutRequest(_Request):
    """A whole episode on the server: the model's tool calls drive a session until it ends."""

    task_id: str
    model: ModelEndpoint
    sampling: Sampling = Field(default_factory=Sampling)
    max_turns: int = Field(100, ge=1, le=1000)
    max_steps: int | None = Field(None, ge=1, le=1000, description="Default: the server's --max-steps.")
    time_limit: float | None = Field(None, gt=0)
    tool_mode: Literal["auto", "native", "text"] = "auto"
    harness: str | None = Field(None, max_length=10_000, description=(
        "Drive the episode with a harness instead of patchgym's own loop: 'mini-swe-agent', or 'cmd: <command>' "
        "run inside the sandbox (docs/harnesses.md). Its model calls go through the recording proxy: the "
        "trajectory then holds every call (model_calls) and the run as one training sample (sample)."))
    record_tokens: Literal["auto", "on", "off"] = Field("auto", description=(
        "Harness episodes: ask the endpoint for token ids and log-probabilities (auto: unless it refuses)."))


class RolloutResponse(BaseModel):
    reward: float
    resolved: bool
    mask_sample: bool = Field(description="The endpoint or the environment failed: leave the sample out.")
    outcome: str = Field(description="resolved, unresolved or masked.")
    end_reason: str
    mask_reason: str | None = None
    grading_outcome: str | None = Field(None, description="How the grading ended (grading.labels); "
                                                          "None when the episode was never graded.")
    trajectory: dict[str, Any] = Field(description="The episode, in patchgym run's trajectory format (docs/run.md).")
