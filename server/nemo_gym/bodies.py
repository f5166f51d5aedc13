"""The bodies of NeMo Gym's resources-server routes (:mod:`patchgym.server.nemo_gym.routes`), as its agents and
environment servers send and read them: a flat dataset row or a typed ``ResourcesSeedSessionRequest``
to seed, the model's call arguments to a tool, the row plus the model's response to verify."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class NemoGymTaskIdRef(BaseModel):
    """NeMo Gym's ``TaskId`` in a typed seed: which task set, and the task in it."""

    model_config = ConfigDict(extra="allow")
    taskset: str | None = None
    task_id: str | None = None


class NemoGymSeedSessionRequest(BaseModel):
    """A dataset row (``responses_create_params`` plus its own fields), or NeMo Gym's typed
    ``ResourcesSeedSessionRequest`` (``resources_session_id``, ``episode_id``, ``task_id``, ``task_data``)."""

    model_config = ConfigDict(extra="allow")
    responses_create_params: dict[str, Any] | None = None
    instance_id: str | None = Field(None, description="The task to open; else `task_id`, else a draw.")
    task_id: str | NemoGymTaskIdRef | None = Field(None, description="A task id, or NeMo Gym's TaskId object.")
    seed: int | None = Field(None, ge=0, strict=True, description="Seed of the task draw when no task is named.")
    resources_session_id: str | None = Field(
        None, min_length=1, description="Caller-assigned id: seeding it again returns the same session.")
    episode_id: Any = None
    task_data: dict[str, Any] | None = Field(None, description="The row, in a typed seed.")


class NemoGymSeedSessionResponse(BaseModel):
    resources_session_id: str | None = None
    instance_id: str | None = Field(None, description="The task opened (untyped seeds only).")


class NemoGymToolResponse(BaseModel):
    """What the model reads back: the observation, and whether the episode is over."""

    output: str
    reward: float = Field(description="Non-zero only on the step that ended the episode.")
    done: bool


class NemoGymVerifyRequest(BaseModel):
    """NeMo Gym's verify body (the row, ``responses_create_params`` and the model's ``response``), or
    ``instance_id`` + ``patch`` without a session cookie for a stateless grade."""

    model_config = ConfigDict(extra="allow")
    responses_create_params: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    instance_id: str | None = None
    patch: str | None = Field(None, description="Graded only without a session cookie.")


class NemoGymVerifyResponse(NemoGymVerifyRequest):
    """The request echoed, plus the grade."""

    reward: float
    resolved: bool
    mask_sample: bool = Field(description="The infrastructure failed, not the policy: leave the sample out.")
    failure_kind: str | None = None
    failure_reason: str | None = None
    report: dict[str, Any] | None = Field(None, description="The SWE-bench-style instance report.")


class NemoGymCloseSessionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    resources_session_id: str | None = None
    episode_id: Any = None


class NemoGymCloseSessionResponse(BaseModel):
    resources_session_id: str | None = None


class NemoGymAggregateMetricsRequest(BaseModel):
    verify_responses: list[dict[str, Any]]


class NemoGymAggregateMetrics(BaseModel):
    group_level_metrics: list[dict[str, Any]] = Field(default_factory=list)
    agent_metrics: dict[str, Any] = Field(default_factory=dict)
    key_metrics: dict[str, Any] = Field(default_factory=dict)

