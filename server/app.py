"""The HTTP API over patchgym's environments: sessions of ``RepoEnv``, a stateless verifier, the
task catalog (public view only), health and Prometheus metrics.

``gym_envs`` knows nothing of HTTP; this module only drives its public API. Blocking environment
calls run in worker threads (see :mod:`server.sessions`), never on the event loop.
"""

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gym_envs.backends import sandbox_factory
from gym_envs.catalog import TaskSet, UnknownTaskError, load_task_set
from gym_envs.envs.repo_env import RepoEnv
from gym_envs.verifier import Verifier
from sandboxes import SandboxError

from .models import (
    CreateSessionRequest,
    CreateSessionResponse,
    ErrorBody,
    Health,
    ResetRequest,
    ResetResponse,
    SessionStatus,
    StepRequest,
    StepResponse,
    TaskView,
    VerifyRequest,
    VerifyResponse,
)
from .sessions import CapacityError, OperationTimeout, Session, SessionBusy, SessionManager, SessionNotFound

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
REAP_INTERVAL_SECONDS = 5.0
ERRORS = {
    404: {"model": ErrorBody, "description": "Unknown session or task."},
    503: {"model": ErrorBody, "description": "Sandbox infrastructure failure."},
    504: {"model": ErrorBody, "description": "The operation ran past its deadline."},
}
AUTH_ERRORS = {401: {"model": ErrorBody, "description": "Missing or wrong bearer token."}}


class EpisodeOver(RuntimeError):
    """A step on a session whose episode has ended."""


class _Metrics:
    def __init__(self, manager: SessionManager) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge("patchgym_sessions_active", "Sessions open.", registry=r).set_function(lambda: len(manager))
        Gauge("patchgym_sessions_max", "Session capacity.", registry=r).set(manager.max_sessions)
        self.sessions_created = Counter("patchgym_sessions_created_total", "Sessions created.", registry=r)
        self.steps = Counter("patchgym_steps_total", "Environment steps taken.", registry=r)
        self.step_latency = Histogram("patchgym_step_latency_seconds", "Latency of environment steps.",
                                      buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
                                      registry=r)
        self.verifications = Counter("patchgym_verifications_total", "Stateless verifications.", registry=r)
        self.errors = Counter("patchgym_errors_total", "Requests answered with an error, by kind.", ["kind"],
                              registry=r)


def create_app(
    tasks: TaskSet | str | Path | None = None,
    backend: str = "local",
    max_sessions: int = 32,
    idle_ttl: float = 900,
    token: str | Sequence[str] | None = None,
    env_options: dict[str, Any] | None = None,
    operation_timeout: float = 1800.0,
) -> FastAPI:
    """The API. ``tasks``: a TaskSet, task file or directory (None: bundled catalog). ``token``:
    one or more accepted bearer tokens (None: no auth); a session belongs to the token that made
    it. ``env_options`` go to every ``RepoEnv`` (``max_steps``, ``command_timeout``,
    ``sandbox_options``, ...). ``operation_timeout``: deadline of one environment call (a reset
    may build an environment; a submit runs the tests)."""
    task_set = tasks if isinstance(tasks, TaskSet) else load_task_set(tasks)
    env_options = dict(env_options or {})
    env_options.pop("tasks", None)
    env_options.pop("backend", None)
    factory = sandbox_factory(backend, **env_options.get("sandbox_options", None) or {})  # validates the backend
    verifier = Verifier(factory, partial_credit=bool(env_options.get("partial_credit", False)))
    RepoEnv(task_set, backend=backend, **env_options).close()  # a bad option fails here, not per session
    tokens = [token] if isinstance(token, str) else list(token or [])
    if any(not t for t in tokens):
        raise ValueError("an empty token would accept anyone")
    manager = SessionManager(max_sessions=max_sessions, idle_ttl=idle_ttl, operation_timeout=operation_timeout)
    metrics = _Metrics(manager)
    verify_slots: list[anyio.CapacityLimiter] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def reaper() -> None:
            while True:
                await asyncio.sleep(min(REAP_INTERVAL_SECONDS, max(idle_ttl / 2, 0.1)))
                try:
                    await manager.reap_idle()
                except Exception:  # the reaper must outlive any one failure
                    log.exception("reaping idle sessions failed")

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
    app.state.manager = manager
    app.state.metrics = metrics
    app.state.task_set = task_set

    bearer = HTTPBearer(auto_error=False, description="Required when the server was started with a token.")

    def owner(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str | None:
        """The caller's identity: a digest of its token (None without auth)."""
        if not tokens:
            return None
        given = creds.credentials.encode() if creds is not None else b""
        if not creds or not any(secrets.compare_digest(given, t.encode()) for t in tokens):
            metrics.errors.labels("unauthorized").inc()
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        return hashlib.sha256(given).hexdigest()

    Owner = Annotated[str | None, Depends(owner)]

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

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error(500, "internal", f"internal server error ({type(exc).__name__})")

    # -- sessions -------------------------------------------------------------------------

    def check_task(task_id: str | None) -> None:
        if task_id is not None:
            task_set.get(task_id)  # UnknownTaskError -> 404, before any slot or sandbox is taken

    async def operate(session: Session, fn: Any) -> Any:
        try:
            return await manager.operate(session, fn)
        except SandboxError:
            await manager.close(session)  # its sandbox is in an unknown state
            raise

    @app.post("/v1/sessions", response_model=CreateSessionResponse, status_code=201, tags=["sessions"],
              responses={**ERRORS, **AUTH_ERRORS, 429: {"model": ErrorBody, "description": "No free session."}})
    async def create_session(body: CreateSessionRequest, who: Owner) -> CreateSessionResponse:
        """Open a session (a ``RepoEnv``) and reset it on a task."""
        check_task(body.task_id)
        options = dict(env_options)
        if body.max_steps is not None:
            options["max_steps"] = body.max_steps
        if body.time_limit is not None:
            options["time_limit"] = body.time_limit

        def start(session: Session) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
            env = session.env = RepoEnv(task_set, backend=backend, **options)
            obs, info = env.reset(seed=body.seed, options=_reset_options(body.task_id))
            session.instance_id = info.get("instance_id")
            return obs, info, env.tools

        session, (obs, info, tools) = await manager.create(who, start)
        metrics.sessions_created.inc()
        return CreateSessionResponse(session_id=session.id, observation=obs, info=info, tools=tools)

    @app.post("/v1/sessions/{session_id}/step", response_model=StepResponse, tags=["sessions"],
              responses={**ERRORS, **AUTH_ERRORS,
                         409: {"model": ErrorBody, "description": "Busy, or the episode is over."}})
    async def step(session_id: str, body: StepRequest, who: Owner) -> StepResponse:
        """Take one tool call. After ``terminated`` or ``truncated``, reset before stepping again."""
        session = manager.get(session_id, who)

        def run() -> tuple[str, float, bool, bool, dict[str, Any]]:
            if session.done or session.env is None:
                raise EpisodeOver("the episode is over: reset the session before stepping again")
            result = session.env.step(body.action)
            session.steps += 1
            session.done = bool(result[2] or result[3])
            return result

        started = time.monotonic()
        obs, reward, terminated, truncated, info = await operate(session, run)
        metrics.steps.inc()
        metrics.step_latency.observe(time.monotonic() - started)
        return StepResponse(observation=obs, reward=reward, terminated=terminated, truncated=truncated, info=info)

    @app.post("/v1/sessions/{session_id}/reset", response_model=ResetResponse, tags=["sessions"],
              responses={**ERRORS, **AUTH_ERRORS, 409: {"model": ErrorBody, "description": "Busy."}})
    async def reset(session_id: str, body: ResetRequest, who: Owner) -> ResetResponse:
        """Start a new episode in the session (a fresh sandbox)."""
        session = manager.get(session_id, who)
        check_task(body.task_id)

        def run() -> tuple[str, dict[str, Any]]:
            assert session.env is not None
            obs, info = session.env.reset(seed=body.seed, options=_reset_options(body.task_id))
            session.instance_id = info.get("instance_id")
            session.steps, session.done = 0, False
            return obs, info

        obs, info = await operate(session, run)
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

    # -- stateless ------------------------------------------------------------------------

    @app.post("/v1/verify", response_model=VerifyResponse, tags=["verify"], responses={**ERRORS, **AUTH_ERRORS})
    async def verify(body: VerifyRequest, who: Owner) -> VerifyResponse:
        """Grade a patch for a task in a fresh sandbox (no session needed)."""
        task = task_set.get(body.instance_id)
        if not verify_slots:
            verify_slots.append(anyio.CapacityLimiter(max_sessions))
        try:
            with anyio.fail_after(operation_timeout):
                report = await anyio.to_thread.run_sync(
                    lambda: verifier.verify(task, body.patch, run_empty=True),
                    abandon_on_cancel=True, limiter=verify_slots[0])
        except TimeoutError:
            raise OperationTimeout(f"verification ran past its {operation_timeout:g}s deadline") from None
        metrics.verifications.inc()
        return VerifyResponse(reward=report.reward, resolved=report.resolved,
                              infrastructure_failure=report.infrastructure_failure, report=report.swebench_dict())

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

    return app


def _reset_options(task_id: str | None) -> dict[str, Any] | None:
    return {"task_id": task_id} if task_id is not None else None
