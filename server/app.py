"""The HTTP API over patchgym's environments: sessions of ``RepoEnv``, a stateless verifier, the
task catalog (public view only), health and Prometheus metrics; plus the NeMo Gym and OpenEnv
protocols (:mod:`patchgym.server.nemo_gym.routes`, :mod:`patchgym.server.openenv`) over the same sessions.

Nothing below the server knows HTTP; this module only drives the environments through
:class:`patchgym.server.core.EnvService`. Blocking environment calls run in worker threads (see
:mod:`patchgym.server.sessions`), never on the event loop.

Every route handler, exception handler and the lifespan is a module-level function: the service
travels on ``app.state`` and reaches handlers as a dependency (:mod:`patchgym.server.deps`), so a
test can call one with a service of its own. :func:`create_app` only builds the service and
assembles the app: its state, :data:`EXCEPTION_HANDLERS`, and the routers (this module's
:data:`router`, OpenEnv's, then NeMo Gym's, whose catch-all must come last).
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from patchgym.grading.labels import settle
from patchgym.rollouts.harnesses import harness_from_spec
from patchgym.rollouts.model import ModelConfig
from patchgym.rollouts.run import trajectory_line
from patchgym.sandboxes import SandboxError
from patchgym.server.core import EnvService, EpisodeOver
from patchgym.server.deps import Owner, Service, service_of
from patchgym.server.gate import TokenGate
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
from patchgym.server.nemo_gym.routes import NemoGymState, nemo_gym_router
from patchgym.server.openenv import router as openenv_router
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
    max_sessions_per_token: int | None = None,
) -> FastAPI:
    """The API. ``tasks``: a TaskSet, task file or directory (None: bundled catalog). ``token``:
    one or more accepted bearer tokens (None: no auth); a session belongs to the token that made
    it. ``env_options`` go to every ``RepoEnv`` (``max_steps``, ``command_timeout``,
    ``sandbox_options``, ...). ``operation_timeout``: deadline of one environment call (a reset
    may build an environment; a submit runs the tests). ``seed_wait``: how long a NeMo Gym
    ``/seed_session`` on a full server waits for a free session (its agent does not retry; the
    native API answers 429 at once). ``rollout_idle_ttl``: idle TTL of NeMo Gym sessions.
    ``model_endpoints``: the model API roots ``/v1/rollouts`` may call (none: it calls none; the
    server would otherwise send requests wherever a client points it). ``max_sessions_per_token``:
    sessions (and stateless verifications) one token may hold at once (None: an equal share of
    ``max_sessions`` per token)."""
    task_set = tasks if isinstance(tasks, TaskSet) else load_task_set(tasks)
    tokens = [token] if isinstance(token, str) else list(token or [])
    service = EnvService(task_set, backend=backend, env_options=env_options or {}, max_sessions=max_sessions,
                         idle_ttl=idle_ttl, operation_timeout=operation_timeout, tokens=tokens,
                         seed_wait=seed_wait, rollout_idle_ttl=rollout_idle_ttl, model_endpoints=model_endpoints,
                         max_sessions_per_token=max_sessions_per_token)
    app = FastAPI(title="patchgym", version="0.1.0", lifespan=lifespan, exception_handlers=EXCEPTION_HANDLERS,
                  description="SWE-bench-style verifiable-reward environments over HTTP.")
    app.state.service = service  # what every handler reaches (patchgym.server.deps)
    app.state.manager = service.manager
    app.state.metrics = service.metrics
    app.state.task_set = task_set
    app.state.nemo_gym = NemoGymState()
    app.add_middleware(TokenGate, service=service)  # before any route reads a body: patchgym.server.gate
    app.include_router(router)
    app.include_router(openenv_router)
    app.include_router(nemo_gym_router(service))  # last: its catch-all /{tool_name} must match after every route
    return app


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Before serving, remove what a killed server left (sandboxes, cgroups, containers); while
    serving, close idle sessions; at shutdown, close every session and the grading workers."""
    service: EnvService = app.state.service
    await service.reap_leftovers()
    task = asyncio.create_task(reap_idle(service))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await service.shutdown()


async def reap_idle(service: EnvService) -> None:
    """Close idle sessions forever, often enough for the shorter of the two idle TTLs."""
    interval = min(REAP_INTERVAL_SECONDS, max(min(service.manager.idle_ttl, service.rollout_idle_ttl) / 2, 0.1))
    while True:
        await asyncio.sleep(interval)
        try:
            await service.manager.reap_idle()
        except Exception:  # the reaper must outlive any one failure
            log.exception("reaping idle sessions failed")


# -- errors: every known failure has its status; a client mistake is never a 5xx ------------


def error(service: EnvService, status: int, kind: str, detail: str,
          headers: dict[str, str] | None = None) -> JSONResponse:
    """An error answer, counted in ``patchgym_errors_total`` under ``kind``."""
    service.metrics.errors.labels(kind).inc()
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


async def session_not_found(request: Request, exc: SessionNotFound) -> JSONResponse:
    return error(service_of(request), 404, "session_not_found", str(exc))


async def task_not_found(request: Request, exc: UnknownTaskError) -> JSONResponse:
    return error(service_of(request), 404, "task_not_found", str(exc))


async def capacity_reached(request: Request, exc: CapacityError) -> JSONResponse:
    """429 with ``Retry-After``: a full server is a reason to come back, not a failure."""
    return error(service_of(request), 429, "capacity", f"{exc}; retry later",
                 {"Retry-After": str(RETRY_AFTER_SECONDS)})


async def session_busy(request: Request, exc: SessionBusy) -> JSONResponse:
    return error(service_of(request), 409, "busy",
                 "another operation is running on this session; wait for it to finish")


async def episode_over(request: Request, exc: EpisodeOver) -> JSONResponse:
    return error(service_of(request), 409, "episode_over", str(exc))


async def operation_timeout(request: Request, exc: OperationTimeout) -> JSONResponse:
    return error(service_of(request), 504, "timeout", str(exc))


async def sandbox_failure(request: Request, exc: SandboxError) -> JSONResponse:
    return error(service_of(request), 503, "infrastructure",
                 f"sandbox infrastructure failure ({type(exc).__name__}: {exc}); "
                 "the session was closed, start a new one")


async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
    """FastAPI's 422, counted."""
    service_of(request).metrics.errors.labels("validation").inc()
    return await request_validation_exception_handler(request, exc)


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    """Any other failure: logged with its traceback, answered without it."""
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error(service_of(request), 500, "internal", f"internal server error ({type(exc).__name__})")


EXCEPTION_HANDLERS: dict[int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]] = {
    SessionNotFound: session_not_found,
    UnknownTaskError: task_not_found,
    CapacityError: capacity_reached,
    SessionBusy: session_busy,
    EpisodeOver: episode_over,
    OperationTimeout: operation_timeout,
    SandboxError: sandbox_failure,
    RequestValidationError: invalid_request,
    Exception: internal_error,
}

router = APIRouter()  # the native /v1 API and the operations routes

# -- sessions -------------------------------------------------------------------------------


@router.post("/v1/sessions", response_model=CreateSessionResponse, status_code=201, tags=["sessions"],
             responses={**ERRORS, **AUTH_ERRORS, 429: {"model": ErrorBody, "description": "No free session."},
                        403: {"model": ErrorBody, "description": "A model endpoint the server may not call."}})
async def create_session(body: CreateSessionRequest, service: Service, who: Owner) -> CreateSessionResponse:
    """Open a session (a ``RepoEnv``) and reset it on a task."""
    session, obs, info = await service.open_session(who, task_id=body.task_id, seed=body.seed,
                                                    max_steps=body.max_steps, time_limit=body.time_limit)
    return CreateSessionResponse(session_id=session.id, observation=obs, info=info, tools=service.tools)


@router.post("/v1/sessions/{session_id}/step", response_model=StepResponse, tags=["sessions"],
             responses={**ERRORS, **AUTH_ERRORS,
                        409: {"model": ErrorBody, "description": "Busy, or the episode is over."}})
async def step(session_id: str, body: StepRequest, service: Service, who: Owner) -> StepResponse:
    """Take one tool call. After ``terminated`` or ``truncated``, reset before stepping again."""
    obs, reward, terminated, truncated, info = await service.step(service.manager.get(session_id, who), body.action)
    return StepResponse(observation=obs, reward=reward, terminated=terminated, truncated=truncated, info=info)


@router.post("/v1/sessions/{session_id}/reset", response_model=ResetResponse, tags=["sessions"],
             responses={**ERRORS, **AUTH_ERRORS, 409: {"model": ErrorBody, "description": "Busy."}})
async def reset(session_id: str, body: ResetRequest, service: Service, who: Owner) -> ResetResponse:
    """Start a new episode in the session (a fresh sandbox)."""
    obs, info = await service.reset(service.manager.get(session_id, who), task_id=body.task_id, seed=body.seed)
    return ResetResponse(observation=obs, info=info)


@router.get("/v1/sessions/{session_id}", response_model=SessionStatus, tags=["sessions"],
            responses={404: ERRORS[404], **AUTH_ERRORS})
async def session_status(session_id: str, service: Service, who: Owner) -> SessionStatus:
    session = service.manager.get(session_id, who)
    return SessionStatus(session_id=session.id, instance_id=session.instance_id, steps=session.steps,
                         done=session.done, idle_seconds=round(session.idle_seconds(), 3))


@router.delete("/v1/sessions/{session_id}", status_code=204, response_class=Response, tags=["sessions"],
               responses={404: ERRORS[404], **AUTH_ERRORS})
async def delete_session(session_id: str, service: Service, who: Owner) -> Response:
    """Close the session (after its running operation, if any) and free its slot."""
    await service.manager.close(service.manager.get(session_id, who))
    return Response(status_code=204)


# -- whole rollouts -------------------------------------------------------------------------


@router.post("/v1/rollouts", response_model=RolloutResponse, tags=["rollouts"],
             responses={**ERRORS, **AUTH_ERRORS, 429: {"model": ErrorBody, "description": "No free session."},
                        403: {"model": ErrorBody, "description": "A model endpoint the server may not call."},
                        501: {"model": ErrorBody, "description": "A harness this server does not have."}})
async def rollout(body: RolloutRequest, service: Service, who: Owner) -> RolloutResponse:
    """Run a whole episode: the model at ``model.base_url`` (OpenAI-compatible) calls the tools
    until it submits or a bound ends it; the trajectory and the reward come back (what NeMo Gym's
    ``/run`` and verifiers' rollouts do). A failing model endpoint masks the sample
    (``mask_sample``), never scores it 0. Only endpoints the server was started with
    (``--model-endpoint``) are called: anything else is 403. With ``harness``, that harness drives
    the episode through the recording proxy (NeMo Gym's agent-server pattern): the trajectory holds
    every model call with its token ids, and the run as one training sample."""
    if not _allowed_endpoint(body.model.base_url, service.model_endpoints):
        return error(service, 403, "forbidden_endpoint",
                     f"this server calls only the model endpoints it was started with (--model-endpoint); "
                     f"{body.model.base_url!r} is not one of them")
    sampling = body.sampling.model_dump(exclude_none=True, exclude={"temperature", "max_tokens"})
    config = ModelConfig(name=body.model.name, base_url=body.model.base_url, api_key=body.model.api_key,
                         temperature=body.sampling.temperature, max_tokens=body.sampling.max_tokens,
                         timeout=body.model.timeout, retries=body.model.retries, extra=sampling)
    if body.harness is not None:
        try:
            harness = harness_from_spec(body.harness, install=False)  # nothing is downloaded on a request
        except ValueError as exc:
            return error(service, 422, "validation", str(exc))
        except RuntimeError as exc:  # a named harness this server does not have installed
            return error(service, 501, "harness_unavailable", str(exc))
        episode = await service.harness_rollout(who, body.task_id, config, harness, max_turns=body.max_turns,
                                                record_tokens=body.record_tokens, max_steps=body.max_steps,
                                                time_limit=body.time_limit)
    else:
        episode = await service.rollout(who, body.task_id, config, max_turns=body.max_turns,
                                        tool_mode=body.tool_mode, max_steps=body.max_steps,
                                        time_limit=body.time_limit)
    trajectory = trajectory_line(episode)
    return RolloutResponse(reward=episode.reward, resolved=episode.resolved,
                           mask_sample=episode.outcome == "masked", outcome=episode.outcome,
                           end_reason=episode.end_reason, mask_reason=episode.mask_reason,
                           grading_outcome=episode.grading_outcome, trajectory=trajectory)


# -- stateless ------------------------------------------------------------------------------


@router.post("/v1/verify", response_model=VerifyResponse, tags=["verify"], responses={**ERRORS, **AUTH_ERRORS})
async def verify(body: VerifyRequest, service: Service, who: Owner) -> VerifyResponse:
    """Grade a patch for a task in a fresh sandbox (no session needed)."""
    report = await service.verify(who, body.instance_id, body.patch)
    return VerifyResponse(reward=report.reward, resolved=report.resolved,
                          infrastructure_failure=report.infrastructure_failure,
                          outcome=str(settle(report).outcome), outcome_detail=report.outcome_detail,
                          report=report.swebench_dict())


@router.get("/v1/tasks", response_model=list[TaskView], tags=["tasks"], responses={**AUTH_ERRORS})
async def list_tasks(service: Service, who: Owner) -> list[TaskView]:
    return [TaskView(**t.public_view()) for t in service.task_set]


@router.get("/v1/tasks/{instance_id}", response_model=TaskView, tags=["tasks"],
            responses={404: ERRORS[404], **AUTH_ERRORS})
async def get_task(instance_id: str, service: Service, who: Owner) -> TaskView:
    return TaskView(**service.task_set.get(instance_id).public_view())


# -- operations -----------------------------------------------------------------------------


@router.get("/healthz", response_model=Health, tags=["ops"])
async def healthz(service: Service) -> Health:
    return Health(status="ok", sessions=len(service.manager), max_sessions=service.manager.max_sessions)


@router.get("/metrics", response_class=PlainTextResponse, tags=["ops"],
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format."}})
async def metrics_text(service: Service) -> Response:
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _allowed_endpoint(base_url: str, allowed: Sequence[str]) -> bool:
    """Whether ``base_url`` is one of ``allowed`` or under one (a path below it)."""
    url = base_url.rstrip("/")
    return any(url == a.rstrip("/") or url.startswith(a.rstrip("/") + "/") for a in allowed)
