"""OpenEnv's env-server protocol (openenv-core 0.3) over patchgym's sessions, so clients built on
OpenEnv (its ``GenericEnvClient``; verifiers and SkyRL use it) can drive a running ``patchgym serve``.

Real episodes live on the WebSocket ``/ws``: one patchgym session per connection, opened by the
first ``reset`` and closed when the socket closes or drops, even mid-step. ``POST /reset`` and
``POST /step`` are stateless as in OpenEnv: each opens a session and closes it before answering.
Sessions, limits, deadlines, auth and metrics are :class:`patchgym.server.core.EnvService`'s, shared with
the native ``/v1`` API. Actions are patchgym tool calls, ``{"name": ..., "arguments": {...}}``;
observations are objects whose ``output`` is patchgym's text observation.

The routes are module-level handlers on :data:`router`; the service reaches them as a dependency
(:mod:`patchgym.server.deps`, which serves the WebSocket too).
"""

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Header, HTTPException, WebSocket, status
from fastapi.encoders import jsonable_encoder
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.websockets import WebSocketDisconnect, WebSocketState

from patchgym.sandboxes import SandboxError
from patchgym.server.core import EnvService, EpisodeOver
from patchgym.server.deps import Owner, Service
from patchgym.server.gate import presented_token
from patchgym.server.models import ErrorBody, TenantLimits
from patchgym.server.sessions import CapacityError, OperationTimeout, Session, SessionBusy, SessionNotFound
from patchgym.tasks.catalog import UnknownTaskError

log = logging.getLogger(__name__)
T = TypeVar("T")
PROTOCOL = "openenv"
INBOX_SIZE = 16  # messages a client may send ahead of the answers; then its socket waits
# What the stateless routes may answer besides 200 and 422 (the app's exception handlers answer them).
SESSION_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token."},
    404: {"model": ErrorBody, "description": "Unknown task."},
    429: {"model": ErrorBody, "description": "No free session."},
    503: {"model": ErrorBody, "description": "Sandbox infrastructure failure."},
    504: {"model": ErrorBody, "description": "The operation ran past its deadline."},
}


# -- bodies ---------------------------------------------------------------------------------


class _TaskChoice(BaseModel):
    # extra="forbid": a misspelt task_id must not silently draw a random task; strict: nor `"seed": true`
    model_config = ConfigDict(extra="forbid", strict=True)

    task_id: str | None = Field(None, description="Instance id of the task; default: drawn with `seed`.")
    instance_id: str | None = Field(None, description="Alias of `task_id` (SWE-bench's name).")
    seed: int | None = Field(None, ge=0, description="Seed of the session's task RNG.")

    @model_validator(mode="after")
    def _one_task(self) -> "_TaskChoice":
        if self.task_id and self.instance_id and self.task_id != self.instance_id:
            raise ValueError("task_id and instance_id name different tasks; send one")
        return self

    @property
    def task(self) -> str | None:
        return self.task_id or self.instance_id


class ResetData(_TaskChoice):
    """``/reset``'s body and the ``data`` of a ``reset`` message."""

    episode_id: str | None = Field(None, max_length=255, description="Echoed in the state; default: a fresh id.")


class StepBody(_TaskChoice):
    """``POST /step``'s body: OpenEnv's fields, plus the task to run the action on (stateless)."""

    action: dict[str, Any] = Field(description='A tool call, {"name": ..., "arguments": {...}}.')
    timeout_s: float | None = Field(None, gt=0, description="Accepted for OpenEnv; the server's own deadlines apply.")
    request_id: str | None = Field(None, max_length=255)


class StepResult(BaseModel):
    """OpenEnv's reset and step answer (also the ``data`` of an ``observation`` message)."""

    observation: dict[str, Any]
    reward: float | None = None
    done: bool = False


class EpisodeState(BaseModel):
    """OpenEnv's ``State`` (``episode_id``, ``step_count``) plus which task the episode is on."""

    episode_id: str | None = None
    step_count: int = 0
    instance_id: str | None = None
    done: bool = False


class ObservationView(BaseModel):
    """The observation object (for ``/schema``): patchgym's text plus its info, flattened."""

    model_config = ConfigDict(extra="allow")

    output: str = Field(description="The task briefing after a reset; the tool's output after a step.")
    instance_id: str | None = None
    terminated: bool = Field(False, description="The episode ended by a submit (or an infrastructure failure).")
    truncated: bool = Field(False, description="The episode ran out of steps or time.")
    tools: list[dict[str, Any]] | None = Field(None, description="After a reset: the OpenAI tool schemas.")
    step: int | None = None
    exit_code: int | None = None
    invalid_action: bool | None = Field(None, description="The call could not be carried out; the episode goes on.")
    error: str | None = None
    resolved: bool | None = Field(None, description="At the end: the hidden tests pass.")
    infrastructure_failure: bool | None = Field(None, description="Mask this episode rather than scoring it.")
    tampering: bool | None = Field(None, description="At the end: the grading found tampering (scored, not masked).")


def action_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The action's JSON schema, one variant per tool, built from the tool schemas a model is
    given, so it can never disagree with them."""
    variants = [{
        "type": "object",
        "title": t["function"]["name"],
        "description": t["function"].get("description", ""),
        "properties": {"name": {"const": t["function"]["name"]}, "arguments": t["function"]["parameters"]},
        "required": ["name"],
    } for t in tools]
    return {
        "title": "ToolCall",
        "description": "One tool call; `arguments` may also be a JSON string (as in OpenAI tool calls).",
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [t["function"]["name"] for t in tools]},
                       "arguments": {"type": ["object", "string"]}},
        "required": ["name"],
        "oneOf": variants,
    }


def observation(text: str, info: dict[str, Any], instance_id: str | None, *, terminated: bool = False,
                truncated: bool = False, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Flatten patchgym's ``(text, info)`` into one JSON-safe object: OpenEnv's observation is a
    dict, and a trainer needs ``resolved`` and ``infrastructure_failure`` beside the text."""
    obs = {**info, "output": text, "instance_id": instance_id, "terminated": terminated, "truncated": truncated}
    if tools is not None:
        obs["tools"] = tools
    return jsonable_encoder(obs)


# -- errors ---------------------------------------------------------------------------------


class NoEpisode(RuntimeError):
    """A step or state on a connection that has no live session (never reset, or closed since)."""


class ClientGone(Exception):
    """The WebSocket client went away while an operation ran."""


def error_message(exc: Exception) -> tuple[str, str, str]:
    """``(OpenEnv error code, metrics kind, message)`` for a failure answering a ``/ws`` message:
    the same failures the native API answers with a status, told apart by OpenEnv's codes."""
    if isinstance(exc, CapacityError):
        return "CAPACITY_REACHED", "capacity", f"{exc}; retry later"
    if isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'data'}: {e['msg']}" for e in exc.errors())
        return "VALIDATION_ERROR", "validation", f"invalid message: {problems}"
    if isinstance(exc, UnknownTaskError):
        return "VALIDATION_ERROR", "task_not_found", f"unknown task: {exc}"
    if isinstance(exc, NoEpisode):
        return "SESSION_ERROR", "no_episode", str(exc)
    if isinstance(exc, EpisodeOver):
        return "SESSION_ERROR", "episode_over", str(exc)
    if isinstance(exc, SessionNotFound):
        return "SESSION_ERROR", "session_not_found", "the session was closed (idle too long, or by the server); " \
                                                     "send a reset to start a new one"
    if isinstance(exc, SessionBusy):
        return "EXECUTION_ERROR", "busy", "another operation is running on this session"
    if isinstance(exc, OperationTimeout):
        return "EXECUTION_ERROR", "timeout", f"{exc}; send a reset to start a new one"
    if isinstance(exc, SandboxError):
        return "EXECUTION_ERROR", "infrastructure", (f"sandbox infrastructure failure ({type(exc).__name__}: {exc}); "
                                                     "the session was closed, send a reset to start a new one")
    log.error("openenv message failed", exc_info=exc)
    return "EXECUTION_ERROR", "internal", f"internal server error ({type(exc).__name__})"


_closing: set["asyncio.Task[None]"] = set()  # closes that outlive a cancelled caller must not be collected


async def close_shielded(service: EnvService, session: Session) -> None:
    """Close a session even when the caller is being cancelled (a dropped client, a shutdown):
    a close cut short would leave the sandbox running with its slot already given back."""
    task = asyncio.ensure_future(service.close(session))
    _closing.add(task)
    task.add_done_callback(_closing.discard)
    await asyncio.shield(task)


async def unless_gone(operation: Awaitable[T], gone: asyncio.Event) -> T:
    """Run ``operation``, cancelling it when ``gone`` is set: a client that drops mid-step must
    free its session now, not when a long command or test run finishes."""
    op = asyncio.ensure_future(operation)
    watcher = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait({op, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        op.cancel()
        raise
    finally:
        watcher.cancel()
    if op.done():
        return op.result()
    op.cancel()
    await asyncio.wait({op})  # let it unwind (a session being created is discarded there)
    raise ClientGone


# -- one WebSocket connection ---------------------------------------------------------------


class Connection:
    """One ``/ws`` client: its owner and its session, opened by the first reset (a connection
    that never resets holds no slot and no sandbox)."""

    def __init__(self, service: EnvService, owner: str | None) -> None:
        self.service = service
        self.owner = owner
        self.session: Session | None = None
        self.episode_id: str | None = None

    def live_session(self) -> Session | None:
        """The session, unless it was closed under us (idle reaper, deadline, sandbox failure)."""
        return self.session if self.session is not None and not self.session.closing else None

    async def reset(self, data: ResetData) -> dict[str, Any]:
        session = self.live_session()
        if session is None:
            self.session = None
            session, text, info = await self.service.open_session(self.owner, task_id=data.task, seed=data.seed,
                                                                  protocol=PROTOCOL)
            self.session = session
        else:
            text, info = await self.service.reset(session, task_id=data.task, seed=data.seed)
        self.episode_id = data.episode_id or uuid.uuid4().hex
        obs = observation(text, info, session.instance_id, tools=self.service.tools)
        return StepResult(observation=obs, reward=None, done=False).model_dump()

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        session = self.live_session()
        if session is None:
            raise NoEpisode("no episode on this connection: send a reset first" if self.session is None else
                            "the session was closed (idle too long, a deadline or a sandbox failure); "
                            "send a reset to start a new one")
        text, reward, terminated, truncated, info = await self.service.step(session, action, protocol=PROTOCOL)
        obs = observation(text, info, session.instance_id, terminated=terminated, truncated=truncated)
        return StepResult(observation=obs, reward=reward, done=terminated or truncated).model_dump()

    def state(self) -> dict[str, Any]:
        session = self.live_session()
        if session is None:
            return EpisodeState().model_dump()
        return EpisodeState(episode_id=self.episode_id, step_count=session.steps, instance_id=session.instance_id,
                            done=session.done).model_dump()

    async def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await close_shielded(self.service, session)


def error_reply(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


async def answer(conn: Connection, text: str) -> dict[str, Any] | None:
    """The reply to one client message; None for ``close``. Every failure is an error message:
    a client's mistake never ends its connection."""
    try:
        message = json.loads(text)
    except json.JSONDecodeError as exc:
        conn.service.metrics.errors.labels("validation").inc()
        return error_reply("INVALID_JSON", f"invalid JSON: {exc}")
    if not isinstance(message, dict) or set(message) - {"type", "data"}:
        conn.service.metrics.errors.labels("validation").inc()
        return error_reply("VALIDATION_ERROR", 'a message is an object {"type": ..., "data": {...}}')
    kind, data = message.get("type"), message.get("data")
    try:
        if kind == "reset":
            reset = ResetData.model_validate({} if data is None else data)
            return {"type": "observation", "data": await conn.reset(reset)}
        if kind == "step":
            if not isinstance(data, dict):
                conn.service.metrics.errors.labels("validation").inc()
                return error_reply("VALIDATION_ERROR", 'a step\'s data is a tool call, {"name": ..., "arguments": ...}')
            return {"type": "observation", "data": await conn.step(data)}
        if kind == "state":
            return {"type": "state", "data": conn.state()}
        if kind == "close":
            return None
        conn.service.metrics.errors.labels("validation").inc()
        return error_reply("UNKNOWN_TYPE", f"unknown message type {kind!r}; the types are reset, step, state, close")
    except Exception as exc:
        code, metric, text = error_message(exc)
        conn.service.metrics.errors.labels(metric).inc()
        extra: dict[str, Any] = {}
        if isinstance(exc, CapacityError):
            manager = conn.service.manager
            extra = {"active_sessions": len(manager), "max_sessions": manager.max_sessions}
        return error_reply(code, text, **extra)


async def read_messages(websocket: WebSocket, inbox: "asyncio.Queue[str | None]", gone: asyncio.Event) -> None:
    """Read the socket all along (not only between answers), so a disconnect is seen mid-step."""
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            raw = message.get("text")
            if raw is None:
                raw = (message.get("bytes") or b"").decode("utf-8", errors="replace")
            await inbox.put(raw)
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        gone.set()
        try:
            inbox.put_nowait(None)
        except asyncio.QueueFull:  # the loop sees `gone` instead
            pass


async def serve_connection(websocket: WebSocket, conn: Connection) -> None:
    """Answer messages in order until ``close`` or a disconnect; the session is closed either way."""
    inbox: asyncio.Queue[str | None] = asyncio.Queue(maxsize=INBOX_SIZE)
    gone = asyncio.Event()
    reader = asyncio.create_task(read_messages(websocket, inbox, gone))
    try:
        while not gone.is_set() or not inbox.empty():
            text = await inbox.get()
            if text is None:
                break
            reply = await unless_gone(answer(conn, text), gone)
            if reply is None:
                break
            await websocket.send_text(json.dumps(reply))
    except (ClientGone, WebSocketDisconnect):
        pass
    except RuntimeError as exc:  # sending on a socket that closed meanwhile
        log.debug("openenv connection ended: %s", exc)
    finally:
        reader.cancel()
        await conn.close()
        await asyncio.wait({reader})
        if websocket.application_state == WebSocketState.CONNECTED:
            try:
                await websocket.close()
            except (RuntimeError, WebSocketDisconnect):  # the client closed first
                pass


# -- the router -----------------------------------------------------------------------------

router = APIRouter(tags=["openenv"])  # ``/ws`` (sessions), stateless ``/reset`` and ``/step``, and the rest


@router.websocket("/ws")
async def ws(websocket: WebSocket, service: Service) -> None:
    """One environment per connection (OpenEnv's reset/step/state/close messages). Auth is the
    server's bearer token, checked before accepting (a refusal is close code 1008)."""
    try:
        owner = service.authenticate(presented_token(websocket.headers.get("authorization")))
    except HTTPException:
        await websocket.close(code=status.WS_1008_POLICY_VIOLATION, reason="missing or wrong bearer token")
        return
    await websocket.accept()
    await serve_connection(websocket, Connection(service, owner))


@router.post("/reset", response_model=StepResult, responses=SESSION_ERRORS)
async def reset(service: Service, who: Owner, body: Annotated[ResetData | None, Body()] = None) -> StepResult:
    """Stateless: a fresh session's first observation; the session is closed before answering."""
    body = body or ResetData()
    session, text, info = await service.open_session(who, task_id=body.task, seed=body.seed, protocol=PROTOCOL)
    try:
        return StepResult(observation=observation(text, info, session.instance_id, tools=service.tools))
    finally:
        await close_shielded(service, session)


@router.post("/step", response_model=StepResult, responses=SESSION_ERRORS)
async def step(body: StepBody, service: Service, who: Owner) -> StepResult:
    """Stateless: the action on a fresh episode of the task (``task_id`` or drawn with ``seed``),
    whose session is closed before answering. Real episodes need ``/ws``."""
    session, _, _ = await service.open_session(who, task_id=body.task, seed=body.seed, protocol=PROTOCOL)
    try:
        text, reward, terminated, truncated, info = await service.step(session, body.action, protocol=PROTOCOL)
    finally:
        await close_shielded(service, session)
    obs = observation(text, info, session.instance_id, terminated=terminated, truncated=truncated)
    return StepResult(observation=obs, reward=reward, done=terminated or truncated)


class StateView(EpisodeState):
    """``GET /state``: OpenEnv's default state, and the asking token's limits."""

    limits: TenantLimits | None = Field(None, description="What the token that asks may hold, and holds (absent "
                                                          "without a token on a server that has tokens).")


@router.get("/state", response_model=StateView, responses={401: SESSION_ERRORS[401]})
async def state(service: Service, authorization: Annotated[str | None, Header()] = None) -> StateView:
    """Stateless HTTP has no episode: the default state (a session's state is a ``/ws`` message),
    with the limits of the token sent, if any (answered without one: it is public)."""
    token = presented_token(authorization)
    if service.tokens and token is None:
        return StateView()
    return StateView(limits=TenantLimits(**service.limits_of(service.authenticate(token))))


@router.get("/schema")
async def schema(service: Service) -> dict[str, Any]:
    """JSON schemas of the action (a tool call), the observation and the state."""
    return {"action": action_schema(service.tools), "observation": ObservationView.model_json_schema(),
            "state": EpisodeState.model_json_schema()}


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "healthy"}
