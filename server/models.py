"""Request and response bodies of the HTTP API (pydantic v2), so the OpenAPI schema is complete."""

from __future__ import annotations

from typing import Any

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


class ErrorBody(BaseModel):
    detail: str
