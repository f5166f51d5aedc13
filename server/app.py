"""The HTTP API over patchgym's environments: sessions of ``RepoEnv``, a stateless verifier, the
task catalog (public view only), health and Prometheus metrics; plus the NeMo Gym and OpenEnv
protocols (:mod:`patchgym.server.nemo_gym.routes`, :mod:`patchgym.server.openenv`) over the same sessions.

Nothing below the server knows HTTP; this module only drives the environments through
:class:`patchgym.server.core.EnvService`. Blocking environment calls run in worker threads (see
:mod:`patchgym.server.sessions`), never on the event loop.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from patchgym.grading.labels import settle
from patchgym.rollouts.model import ModelConfig
from patchgym.rollouts.run import trajectory_line
from patchgym.sandboxes import SandboxError
from patchgym.server.core import EnvService, EpisodeOver
from patchgym.server.models import (
    CreateSessionRequest,
    CreateSessionResponse,
    ErrorBody,
    Health,
    ResetRequest,
    ResetResponse,
    RolloutRequest,
    RolloutResponse,
    SessionStatus,
    StepRequest,
    StepResponse,
    TaskView,
    VerifyRequest,
    VerifyResponse,
)
from patchgym.server.nemo_gym.routes import nemo_gym_router
from patchgym.server.openenv import openenv_router
from patchgym.server.sessions import CapacityError, OperationTimeout, SessionBusy, SessionNotFound
from patchgym.tasks.catalog import TaskSet, UnknownTaskError, load_task_set

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
REAP_INTERVAL_SECONDS = 5.0
ERRORS = {
    404: {"model": ErrorBody, "description": "Unknown session or task."},
    503: {"model": ErrorBody, "description": "Sandbox infrastructure failure."},
    504: {"model": ErrorBody, "description": "The operation ran past its deadline."},
}
AUTH_ERRORS = {401: {"model": ErrorBody, "description": "Missing or wrong bearer token."}}


def create_app(
    tasks: TaskSet | str | Path | None = None,
    backend: str = "local",
    max_sessions: int = 32,
    idle_ttl: float = 900,
    token: str | Sequence[str] | None = None,
    env_options: dict[str, Any] | None = None,
    operation_timeout: float = 1800.0,
    seed_wait: float = 600.0,
    rollout_idle_ttl: float = 300.0,
    model_endpoints: Sequence[str] = (),
) -> FastAPI:
    """The API. ``tasks``: a TaskSet, task file or directory (None: bundled catalog). ``token``:
    one or more accepted bearer tokens (None: no auth); a session belongs to the token that made
    it. ``env_options`` go to every ``RepoEnv`` (``max_steps``, ``command_timeout``,
    ``sandbox_options``, ...). ``operation_timeout``: deadline of one environment call (a reset
    may build an environment; a submit runs the tests). ``seed_wait``: how long a NeMo Gym
    ``/seed_session`` on a full server waits for a free session (its agent does not retry; the
    native API answers 429 at once). ``rollout_idle_ttl``: idle TTL of NeMo Gym sessions.
    ``model_endpoints``: the model API roots ``/v1/rollouts`` may call (none: it calls none; the
    server would otherwise send requests wherever a client points it)."""
    task_set = tasks if isinstance(tasks, TaskSet) else load_task_set(tasks)
    tokens = [token] if isinstance(token, str) else list(token or [])
    service = EnvService(task_set, backend=backend, env_options=env_options or {}, max_sessions=max_sessions,
                         idle_ttl=idle_ttl, operation_timeout=operation_timeout, tokens=tokens,
                         seed_wait=seed_wait, rollout_idle_ttl=rollout_idle_ttl)
    manager, metrics = service.manager, service.metrics

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def reaper() -> None:
            while True:
                await asyncio.sleep(min(REAP_INTERVAL_SECONDS, max(min(idle_ttl, rollout_idle_ttl) / 2, 0.1)))
                try:
                    await manager.reap_idle()
                except Exception:  # the reaper must outlive any one failure
                    log.exception("reaping idle sessions failed")

        await service.reap_leftovers()  # what a killed server left: sandboxes, cgroups, containers
        task = asyncio.create_task(reaper())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await manager.close_all()

    app = FastAPI(title="patchgym", version="0.1.0", lifespan=lifespan,
                  description="SWE-bench-style verifiable-reward environments over HTTP.")
    app.state.service = service
    app.state.manager = manager
    app.state.metrics = metrics
    app.state.task_set = task_set

    Owner = Annotated[str | None, Depends(service.owner_dependency())]

    # -- errors: every known failure has its status; a client mistake is never a 5xx --------

    def error(status: int, kind: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
        metrics.errors.labels(kind).inc()
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)

    @app.exception_handler(SessionNotFound)
    async def _not_found(request: Request, exc: SessionNotFound) -> JSONResponse:
        return error(404, "session_not_found", str(exc))

    @app.exception_handler(UnknownTaskError)
    async def _unknown_task(request: Request, exc: UnknownTaskError) -> JSONResponse:
        return error(404, "task_not_found", str(exc))

    @app.exception_handler(CapacityError)
    async def _capacity(request: Request, exc: CapacityError) -> JSONResponse:
        return error(429, "capacity", f"{exc}; retry later", {"Retry-After": str(RETRY_AFTER_SECONDS)})

    @app.exception_handler(SessionBusy)
    async def _busy(request: Request, exc: SessionBusy) -> JSONResponse:
        return error(409, "busy", "another operation is running on this session; wait for it to finish")

    @app.exception_handler(EpisodeOver)
    async def _over(request: Request, exc: EpisodeOver) -> JSONResponse:
        return error(409, "episode_over", str(exc))

    @app.exception_handler(OperationTimeout)
    async def _timeout(request: Request, exc: OperationTimeout) -> JSONResponse:
        return error(504, "timeout", str(exc))

    @app.exception_handler(SandboxError)
    async def _sandbox(request: Request, exc: SandboxError) -> JSONResponse:
        return error(503, "infrastructure", f"sandbox infrastructure failure ({type(exc).__name__}: {exc}); "
                                            "the session was closed, start a new one")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.errors.labels("validation").inc()
        return await request_validation_exception_handler(request, exc)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error(500, "internal", f"internal server error ({type(exc).__name__})")

    # -- sessions -------------------------------------------------------------------------

    @app.post("/v1/sessions", response_model=CreateSessionResponse, status_code=201, tags=["sessions"],
              responses={**ERRORS, **AUTH_ERRORS, 429: {"model": ErrorBody, "description": "No free session."},
                         403: {"model": ErrorBody, "description": "A model endpoint the server may not call."}})
    async def create_session(body: CreateSessionRequest, who: Owner) -> CreateSessionResponse:
        """Open a session (a ``RepoEnv``) and reset it on a task."""
        session, obs, info = await service.open_session(who, task_id=body.task_id, seed=body.seed,
                                                        max_steps=body.max_steps, time_limit=body.time_limit)
        return CreateSessionResponse(session_id=session.id, observation=obs, info=info, tools=service.tools)

    @app.post("/v1/sessions/{session_id}/step", response_model=StepResponse, tags=["sessions"],
              responses={**ERRORS, **AUTH_ERRORS,
                         409: {"model": ErrorBody, "description": "Busy, or the episode is over."}})
    async def step(session_id: str, body: StepRequest, who: Owner) -> StepResponse:
        """Take one tool call. After ``terminated`` or ``truncated``, reset before stepping again."""
        obs, reward, terminated, truncated, info = await service.step(manager.get(session_id, who), body.action)
        return StepResponse(observation=obs, reward=reward, terminated=terminated, truncated=truncated, info=info)

    @app.post("/v1/sessions/{session_id}/reset", response_model=ResetResponse, tags=["sessions"],
              responses={**ERRORS, **AUTH_ERRORS, 409: {"model": ErrorBody, "description": "Busy."}})
    async def reset(session_id: str, body: ResetRequest, who: Owner) -> ResetResponse:
        """Start a new episode in the session (a fresh sandbox)."""
        obs, info = await service.reset(manager.get(session_id, who), task_id=body.task_id, seed=body.seed)
        return ResetResponse(observation=obs, info=info)

    @app.get("/v1/sessions/{session_id}", response_model=SessionStatus, tags=["sessions"],
             responses={404: ERRORS[404], **AUTH_ERRORS})
    async def session_status(session_id: str, who: Owner) -> SessionStatus:
        session = manager.get(session_id, who)
        return SessionStatus(session_id=session.id, instance_id=session.instance_id, steps=session.steps,
                             done=session.done, idle_seconds=round(session.idle_seconds(), 3))

    @app.delete("/v1/sessions/{session_id}", status_code=204, response_class=Response, tags=["sessions"],
                responses={404: ERRORS[404], **AUTH_ERRORS})
    async def delete_session(session_id: str, who: Owner) -> Response:
        """Close the session (after its running operation, if any) and free its slot."""
        await manager.close(manager.get(session_id, who))
        return Response(status_code=204)

    # -- whole rollouts -------------------------------------------------------------------

    @app.post("/v1/rollouts", response_model=RolloutResponse, tags=["rollouts"],
              responses={**ERRORS, **AUTH_ERRORS, 429: {"model": ErrorBody, "description": "No free session."},
                         403: {"model": ErrorBody, "description": "A model endpoint the server may not call."}})
    async def rollout(body: RolloutRequest, who: Owner) -> RolloutResponse:
        """Run a whole episode: the model at ``model.base_url`` (OpenAI-compatible) calls the tools
        until it submits or a bound ends it; the trajectory and the reward come back (what NeMo Gym's
        ``/run`` and verifiers' rollouts do). A failing model endpoint masks the sample
        (``mask_sample``), never scores it 0. Only endpoints the server was started with
        (``--model-endpoint``) are called: anything else is 403."""
        if not _allowed_endpoint(body.model.base_url, model_endpoints):
            return error(403, "forbidden_endpoint",
                         f"this server calls only the model endpoints it was started with (--model-endpoint); "
                         f"{body.model.base_url!r} is not one of them")
        sampling = body.sampling.model_dump(exclude_none=True, exclude={"temperature", "max_tokens"})
        config = ModelConfig(name=body.model.name, base_url=body.model.base_url, api_key=body.model.api_key,
                             temperature=body.sampling.temperature, max_tokens=body.sampling.max_tokens,
                             timeout=body.model.timeout, retries=body.model.retries, extra=sampling)
        episode = await service.rollout(who, body.task_id, config, max_turns=body.max_turns, tool_mode=body.tool_mode,
                                        max_steps=body.max_steps, time_limit=body.time_limit)
        trajectory = trajectory_line(episode)
        return RolloutResponse(reward=episode.reward, resolved=episode.resolved,
                               mask_sample=episode.outcome == "masked", outcome=episode.outcome,
                               end_reason=episode.end_reason, mask_reason=episode.mask_reason,
                               grading_outcome=episode.grading_outcome, trajectory=trajectory)

    # -- stateless ------------------------------------------------------------------------

    @app.post("/v1/verify", response_model=VerifyResponse, tags=["verify"], responses={**ERRORS, **AUTH_ERRORS})
    async def verify(body: VerifyRequest, who: Owner) -> VerifyResponse:
        """Grade a patch for a task in a fresh sandbox (no session needed)."""
        report = await service.verify(body.instance_id, body.patch)
        return VerifyResponse(reward=report.reward, resolved=report.resolved,
                              infrastructure_failure=report.infrastructure_failure,
                              outcome=str(settle(report).outcome), outcome_detail=report.outcome_detail,
                              report=report.swebench_dict())

    @app.get("/v1/tasks", response_model=list[TaskView], tags=["tasks"], responses={**AUTH_ERRORS})
    async def list_tasks(who: Owner) -> list[TaskView]:
        return [TaskView(**t.public_view()) for t in task_set]

    @app.get("/v1/tasks/{instance_id}", response_model=TaskView, tags=["tasks"],
             responses={404: ERRORS[404], **AUTH_ERRORS})
    async def get_task(instance_id: str, who: Owner) -> TaskView:
        return TaskView(**task_set.get(instance_id).public_view())

    # -- operations -----------------------------------------------------------------------

    @app.get("/healthz", response_model=Health, tags=["ops"])
    async def healthz() -> Health:
        return Health(status="ok", sessions=len(manager), max_sessions=max_sessions)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["ops"],
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format."}})
    async def metrics_text() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(openenv_router(service))
    app.include_router(nemo_gym_router(service))
    return app



def _allowed_endpoint(base_url: str, allowed: Sequence[str]) -> bool:
    """Whether ``base_url`` is one of ``allowed`` or under one (a path below it)."""
    url = base_url.rstrip("/")
    return any(url == a.rstrip("/") or url.startswith(a.rstrip("/") + "/") for a in allowed)
