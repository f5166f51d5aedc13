"""NeMo Gym's resources-server protocol over patchgym's sessions, so a NeMo Gym agent (and NeMo RL
through it) can use a running ``patchgym serve`` as its resources server.

NeMo Gym calls, per rollout: ``POST /seed_session`` (the dataset row), ``POST /<tool>`` for each
function call the model makes (the body is the call's arguments; the response text goes back to
the model), ``POST /verify`` (the row plus the model's final response; answered with the reward).
NeMo Gym 0.7.0's environment servers seed a typed session (``resources_session_id``, ``episode_id``,
``task_id``) and end it with ``POST /close_session``, which alone closes it (a retry of the episode
comes with a new id: a fresh session); 0.4.0 sends no close, so its ``/verify`` closes the session.
Its state travels in cookies: the agent sends back
the cookies of the *latest* response, so every answer that belongs to a session sets the session
cookie again, error answers included.

The routes sit at the root, next to the native ``/v1`` API and OpenEnv's routes, over the same
:class:`~patchgym.server.core.EnvService`, so capacity, deadlines, auth and metrics hold for all of them.

The handlers are module-level functions on module-level routers (:data:`opening`,
:data:`closing`, and :data:`fallback`, the catch-all); the service and the app's
:class:`NemoGymState` (``app.state.nemo_gym``) reach them as dependencies, and the helpers take
both explicitly. Only the per-tool routes depend on the service's tools: :func:`nemo_gym_router`
assembles an app's NeMo Gym routes around them.
"""

import json
import secrets
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, TypeVar

import anyio
from fastapi import APIRouter, Body, Cookie, Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBasic, HTTPBasicCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from patchgym.sandboxes import SandboxError
from patchgym.server.core import SUBMIT, EnvService, EpisodeOver
from patchgym.server.deps import Service
from patchgym.server.models import ErrorBody
from patchgym.server.nemo_gym.bodies import (
    NemoGymAggregateMetrics,
    NemoGymAggregateMetricsRequest,
    NemoGymCloseSessionRequest,
    NemoGymCloseSessionResponse,
    NemoGymSeedSessionRequest,
    NemoGymSeedSessionResponse,
    NemoGymTaskIdRef,
    NemoGymToolResponse,
    NemoGymVerifyRequest,
    NemoGymVerifyResponse,
)
from patchgym.server.nemo_gym.metrics import aggregate
from patchgym.server.nemo_gym.outcome import OPERATION_TIMEOUT, SESSION_EXPIRED, Outcome
from patchgym.server.sessions import CLOSED_GRADED, OperationTimeout, Session, SessionBusy, SessionNotFound

COOKIE = "patchgym_session"
PROTOCOL = "nemo_gym"
# Paths a tool route must not take: NeMo Gym's own, the native API's and OpenEnv's.
RESERVED_PATHS = frozenset({
    "seed_session", "verify", "close_session", "aggregate_metrics", "v1", "healthz", "metrics", "docs", "redoc",
    "openapi.json", "reset", "step", "state", "schema", "health", "ws",
})
# How many closed resources-session ids and failed sessions are remembered (an LRU bound on memory).
REMEMBERED = 65_536
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong token."},
    404: {"model": ErrorBody, "description": "Unknown session (or another token's) or unknown task."},
}

K = TypeVar("K")
V = TypeVar("V")


# -- state --------------------------------------------------------------------------------------


class _Recent(OrderedDict[K, V], Generic[K, V]):
    """A dict that forgets its oldest entries beyond ``limit``: tombstones must not grow forever."""

    def __init__(self, limit: int = REMEMBERED) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


@dataclass
class _Seeded:
    """A caller-assigned resources session: its episode, and our session once it has started."""

    episode: str
    session_id: str | None = None
    ready: anyio.Event = field(default_factory=anyio.Event)


@dataclass
class NemoGymState:
    """What NeMo Gym's routes remember across calls, one per app (``app.state.nemo_gym``)."""

    # Weak: an outcome lives exactly as long as its session object, however the session ends.
    outcomes: weakref.WeakKeyDictionary[Session, Outcome] = field(default_factory=weakref.WeakKeyDictionary)
    failed: _Recent[str, tuple[str | None, Outcome]] = field(default_factory=_Recent)
    seeded: _Recent[tuple[str | None, str], _Seeded] = field(default_factory=_Recent)
    closed: _Recent[tuple[str | None, str], bool] = field(default_factory=_Recent)
    # Sessions of a typed seed: their caller closes them (/close_session), so /verify leaves them open.
    typed: weakref.WeakSet[Session] = field(default_factory=weakref.WeakSet)


# -- dependencies -------------------------------------------------------------------------------


async def current_state(conn: HTTPConnection) -> NemoGymState:
    """The app's :class:`NemoGymState` (async, as every dependency: no thread hop)."""
    return conn.app.state.nemo_gym


_bearer = HTTPBearer(auto_error=False, description="The server's token.")
_basic = HTTPBasic(auto_error=False, description="Any user name; the server's token as password.")


async def bearer_or_basic_owner(service: Service,
                                token: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
                                login: Annotated[HTTPBasicCredentials | None, Depends(_basic)]) -> str | None:
    """The caller's identity, from a bearer token or from HTTP Basic with the token as password.

    NeMo Gym's server client sends no Authorization header, but it builds URLs as
    ``http://{host}:{port}`` and its HTTP clients turn credentials in a URL into Basic auth: with
    ``host: "patchgym:TOKEN@10.0.0.5"`` a token-protected server works unchanged. Either form names
    the same owner, so sessions stay bound to the token however it travels.
    """
    given = token.credentials if token is not None else (login.password if login is not None else None)
    return service.authenticate(given)


State = Annotated[NemoGymState, Depends(current_state)]
Owner = Annotated[str | None, Depends(bearer_or_basic_owner)]
SessionCookie = Annotated[str | None, Cookie(alias=COOKIE, description="Set by /seed_session.")]

# -- the routers --------------------------------------------------------------------------------

# An app's NeMo Gym routes are, in a rollout's order (the order /docs lists them in): opening, the
# per-tool routes, closing; then the fallback, which matches any path and so must come last.
opening = APIRouter(tags=["nemo-gym"])  # /seed_session
closing = APIRouter(tags=["nemo-gym"])  # /verify, /close_session, /aggregate_metrics
fallback = APIRouter(tags=["nemo-gym"])  # the catch-all for tools the environment does not have


def nemo_gym_router(service: EnvService) -> APIRouter:
    """NeMo Gym's resources-server routes for ``service``'s tools: ``/seed_session``, one route per
    tool (the tools are the service's, so these are made per app), ``/verify``, ``/close_session``
    and ``/aggregate_metrics``, then the catch-all (last: it matches any path)."""
    names = [t["function"]["name"] for t in service.tools]
    clash = sorted(set(names) & RESERVED_PATHS)
    if clash:
        raise ValueError(f"tool names {clash} would shadow other routes")
    routes = APIRouter()
    routes.include_router(opening)
    for tool in service.tools:
        spec = tool["function"]
        routes.add_api_route(
            f"/{spec['name']}", tool_route(spec["name"]), methods=["POST"], response_model=NemoGymToolResponse,
            tags=["nemo-gym"], summary=f"Tool: {spec['name']}", description=spec.get("description", ""),
            responses={**ERRORS, 400: {"model": ErrorBody, "description": "No session cookie."},
                       409: {"model": ErrorBody, "description": "Another call is running on this session."},
                       503: {"model": ErrorBody, "description": "Sandbox failure; the episode is over."},
                       504: {"model": ErrorBody, "description": "Deadline passed; the episode is over."}},
            # The body is the model's call arguments, checked by the environment (which tells the model
            # what was wrong) rather than by FastAPI (a 422 would teach it nothing): schema only.
            openapi_extra={"requestBody": {"required": False, "content": {"application/json": {
                "schema": spec.get("parameters", {"type": "object"})}}}},
        )
    routes.include_router(closing)
    routes.include_router(fallback)
    return routes


# -- answers ------------------------------------------------------------------------------------


def error(service: EnvService, status: int, kind: str, detail: str, session_id: str) -> JSONResponse:
    """An error answer that keeps the session cookie: NeMo Gym's agent replaces its cookies with
    those of each tool response, so an answer without it would orphan the rest of the rollout."""
    service.metrics.errors.labels(kind).inc()
    response = JSONResponse({"detail": detail}, status_code=status)
    _set_cookie(response, session_id)
    return response


def failure(state: NemoGymState, session_id: str, owner: str | None, exc: Exception) -> tuple[Outcome, int, str]:
    """Remember an infrastructure failure that closed a session, so /verify can mask the sample."""
    outcome, status, kind = Outcome.from_error(exc)
    state.failed[session_id] = (owner, outcome)
    return outcome, status, kind


def failed_outcome(state: NemoGymState, session_id: str, owner: str | None) -> Outcome | None:
    """The failure remembered for the session, if it is the caller's."""
    entry = state.failed.get(session_id)
    return entry[1] if entry is not None and entry[0] == owner else None


def ended_outcome(service: EnvService, state: NemoGymState, session_id: str, owner: str | None) -> Outcome | None:
    """How a session that is gone ended, when it ended by no choice of the agent: a failure, or
    closed for idling (remembered as expired); None for a live or truly unknown one."""
    outcome = failed_outcome(state, session_id, owner)
    if outcome is None and service.manager.expired(session_id, owner):
        outcome = Outcome.infrastructure(SESSION_EXPIRED, "the session was closed after idling longer than "
                                                          f"{service.rollout_idle_ttl:g}s")
    return outcome


def require_cookie(service: EnvService, session_id: str | None) -> str:
    """The session a tool call belongs to; 400 (counted as ``no_session``) without one."""
    if session_id:
        return session_id
    service.metrics.errors.labels("no_session").inc()
    raise HTTPException(400, f"no patchgym session: call POST /seed_session first and send its "
                             f"{COOKIE!r} cookie with every later call of the rollout")


# -- seed ---------------------------------------------------------------------------------------


@opening.post("/seed_session", response_model=NemoGymSeedSessionResponse, response_model_exclude_none=True,
             responses={**ERRORS, 409: {"model": ErrorBody, "description": "The resources session was closed."},
                        429: {"model": ErrorBody, "description": "No free session."}})
async def seed_session(body: NemoGymSeedSessionRequest, response: Response, service: Service, state: State,
                       who: Owner) -> NemoGymSeedSessionResponse:
    """Open a session on the row's task (``instance_id`` or ``task_id``, also inside ``task_data``;
    else one drawn with ``seed``) and set its cookie. A typed seed (``resources_session_id``) is
    idempotent for the same id and episode, and refused after that id was closed."""
    task_id, seed = _task_choice(body)
    if body.resources_session_id is None:
        session, _, info = await open_rollout(service, who, task_id, seed)
        _set_cookie(response, session.id)
        return NemoGymSeedSessionResponse(instance_id=info.get("instance_id"))
    session = await seed_resources(service, state, who, body.resources_session_id, _canonical(body.episode_id),
                                   task_id, seed)
    _set_cookie(response, session.id)
    return NemoGymSeedSessionResponse(resources_session_id=body.resources_session_id)


async def open_rollout(service: EnvService, owner: str | None, task_id: str | None,
                       seed: int | None) -> tuple[Session, str, dict]:
    """A session for one rollout. NeMo Gym's agent never retries a seed, so on a full server it
    waits for a slot (up to ``seed_wait``) rather than failing; and its idle TTL is the short
    rollout one, so a rollout the agent abandoned (its model failed, say) frees the slot soon."""
    return await service.open_session(owner, task_id=task_id, seed=seed, protocol=PROTOCOL,
                                      session_id=secrets.token_hex(16), wait=service.seed_wait,
                                      idle_ttl=service.rollout_idle_ttl)


async def seed_resources(service: EnvService, state: NemoGymState, owner: str | None, resources_id: str,
                         episode: str, task_id: str | None, seed: int | None) -> Session:
    """The session of a caller-assigned id: the existing one on a repeat (waiting if it is still
    starting), a new one otherwise; never one for an id that was closed, even while it started."""
    key = (owner, resources_id)
    while True:
        if key in state.closed:
            raise HTTPException(409, f"resources session {resources_id!r} was closed; seed a new id")
        entry = state.seeded.get(key)
        if entry is None:
            break
        if entry.episode != episode:
            raise HTTPException(409, f"resources session {resources_id!r} belongs to another episode")
        if entry.session_id is None:
            await entry.ready.wait()
            continue
        try:
            return service.manager.get(entry.session_id, owner)
        except SessionNotFound:
            raise HTTPException(409, f"resources session {resources_id!r} has ended (verified, idle too "
                                     "long, or failed); seed a new id") from None
    entry = state.seeded[key] = _Seeded(episode)
    try:
        session, _, _ = await open_rollout(service, owner, task_id, seed)
    except BaseException:
        if state.seeded.get(key) is entry:  # a repeat may try again
            del state.seeded[key]
        entry.ready.set()
        raise
    entry.session_id = session.id
    state.typed.add(session)
    entry.ready.set()
    if key in state.closed:  # closed while it was starting
        await service.close(session)
        raise HTTPException(409, f"resources session {resources_id!r} was closed while it started")
    return session


# -- tools --------------------------------------------------------------------------------------


async def run_tool(service: EnvService, state: NemoGymState, name: str, request: Request, who: str | None,
                   sid: str) -> JSONResponse:
    """One tool call of the model, answered as a tool output (200) whatever the model did: a
    bad argument, an unknown tool or a call after the episode ended is explained in ``output``,
    so the rollout goes on; the cookie is set on every answer."""
    outcome = ended_outcome(service, state, sid, who)
    if outcome is not None:
        return _tool_answer(NemoGymToolResponse(output=_over_text(outcome), reward=0.0, done=True), sid)
    session = service.manager.get(sid, who)
    action = {"name": name, "arguments": await _arguments(request)}
    try:
        obs, reward, terminated, truncated, info = await service.step(session, action, protocol=PROTOCOL)
    except EpisodeOver:
        over = NemoGymToolResponse(output="The episode is over: stop calling tools.", reward=0.0, done=True)
        return _tool_answer(over, sid)
    except SessionBusy:
        return error(service, 409, "busy", "another call is running on this session; make one call at a time", sid)
    except (SandboxError, OperationTimeout) as exc:
        outcome, status, kind = failure(state, sid, who, exc)
        return error(service, status, kind, f"{outcome.failure_reason}; the episode is over", sid)
    done = terminated or truncated
    if done:
        state.outcomes[session] = Outcome.graded(reward, info.get("report"))
    return _tool_answer(NemoGymToolResponse(output=obs, reward=reward, done=done), sid)


def tool_route(name: str) -> Any:
    """The handler of the tool ``name``'s route; it closes over the name only. Named
    ``tool_<name>``: FastAPI derives the route's name and OpenAPI operation id from it."""

    async def call_tool(request: Request, service: Service, state: State, who: Owner,
                        session_id: SessionCookie = None) -> Any:
        return await run_tool(service, state, name, request, who, require_cookie(service, session_id))

    call_tool.__name__ = f"tool_{name}"
    return call_tool


# -- verify -------------------------------------------------------------------------------------


@closing.post("/verify", response_model=NemoGymVerifyResponse,
             responses={**ERRORS, 400: {"model": ErrorBody, "description": "No session and no patch."},
                        409: {"model": ErrorBody, "description": "Busy, or the cookie names another task."}})
async def verify(request: Request, response: Response, body: NemoGymVerifyRequest, service: Service, state: State,
                 who: Owner, session_id: SessionCookie = None) -> Any:
    """Grade the session's workspace (submitting it unless a submit already ended the episode)
    and answer the request with ``reward``, ``mask_sample`` (true when the infrastructure failed,
    not the policy), ``failure_kind``, ``failure_reason`` and the report. The session is closed,
    unless a typed seed opened it: its caller closes it (``/close_session``), and until then a
    repeated verify (a lost reply retried) answers the same grade. Without a cookie: grade
    ``patch`` for ``instance_id`` in a fresh sandbox.

    NeMo Gym's agent posts a model's call of a tool named ``verify`` here too, with the
    session's cookie: that body has no ``response`` (NeMo Gym's own verify always has one), and
    is answered as the unknown tool it is, so a model cannot end its own episode early."""
    if session_id is not None and body.response is None and body.responses_create_params is None:
        return await run_tool(service, state, "verify", request, who, session_id)
    if session_id is None:
        if body.instance_id is None or body.patch is None:
            service.metrics.errors.labels("no_session").inc()
            raise HTTPException(400, f"no {COOKIE!r} cookie (from POST /seed_session) to grade a session, "
                                     "and no instance_id and patch to grade statelessly")
        instance_id = body.instance_id
        try:
            report = await service.verify(who, body.instance_id, body.patch)
            outcome = Outcome.graded(report.reward, report.swebench_dict())
        except OperationTimeout as exc:
            service.metrics.errors.labels("timeout").inc()
            outcome = Outcome.infrastructure(OPERATION_TIMEOUT, str(exc))
    else:
        outcome = ended_outcome(service, state, session_id, who)
        if outcome is not None:
            instance_id = body.instance_id
        else:
            session = service.manager.get(session_id, who)
            instance_id, outcome = await grade_session(service, state, session, body)
            if session in state.typed:  # still open for its caller's /close_session
                _set_cookie(response, session_id)
    fields = {"instance_id": instance_id, **outcome.verify_fields()}
    return NemoGymVerifyResponse.model_validate({**body.model_dump(), **fields})


async def grade_session(service: EnvService, state: NemoGymState, session: Session,
                        body: NemoGymVerifyRequest) -> tuple[str | None, Outcome]:
    """The session's outcome (a submit now if the episode is still running); the session is
    closed unless a typed seed opened it."""
    if body.instance_id is not None and session.instance_id not in (None, body.instance_id):
        raise HTTPException(409, f"the session cookie is for task {session.instance_id!r}, the request for "
                                 f"{body.instance_id!r}: cookies of two rollouts were mixed up")
    outcome = state.outcomes.get(session)
    if outcome is None:
        if session.done:
            raise HTTPException(409, "the episode ended outside the NeMo Gym routes; its reward is unknown here")
        try:
            _, reward, _, _, info = await service.step(session, SUBMIT, protocol=PROTOCOL)
        except EpisodeOver:  # a submit tool call finished first
            outcome = state.outcomes.get(session)
            if outcome is None:
                raise
        except (SandboxError, OperationTimeout) as exc:  # the session is closed already
            outcome, _, kind = Outcome.from_error(exc)
            service.metrics.errors.labels(kind).inc()
            return session.instance_id, outcome
        else:
            outcome = state.outcomes[session] = Outcome.graded(reward, info.get("report"))
    if session not in state.typed:  # nothing else will close it; a typed seed's caller will
        await service.close(session, CLOSED_GRADED)
    return session.instance_id, outcome


# -- close --------------------------------------------------------------------------------------


@closing.post("/close_session", response_model=NemoGymCloseSessionResponse, response_model_exclude_none=True,
             responses={401: ERRORS[401]})
async def close_session(response: Response, service: Service, state: State, who: Owner,
                        session_id: SessionCookie = None,
                        body: Annotated[NemoGymCloseSessionRequest | None, Body()] = None,
                        ) -> NemoGymCloseSessionResponse:
    """Close the session (by ``resources_session_id``, else by cookie). Idempotent: closing an
    unknown or closed session succeeds, and a closed ``resources_session_id`` cannot be seeded again."""
    target = session_id
    rid = body.resources_session_id if body is not None else None
    if rid is not None:
        key = (who, rid)
        state.closed[key] = True
        entry = state.seeded.pop(key, None)
        target = entry.session_id if entry is not None and entry.session_id else session_id
    if target:
        try:
            await service.close(service.manager.get(target, who))
        except SessionNotFound:
            pass
        if failed_outcome(state, target, who) is not None:
            del state.failed[target]
    response.delete_cookie(COOKIE, path="/")
    return NemoGymCloseSessionResponse(resources_session_id=rid)


# -- metrics ------------------------------------------------------------------------------------


@closing.post("/aggregate_metrics", response_model=NemoGymAggregateMetrics, responses={401: ERRORS[401]})
async def aggregate_metrics(body: NemoGymAggregateMetricsRequest, who: Owner) -> NemoGymAggregateMetrics:
    """Reward and resolve rate over the verify responses NeMo Gym collected, masked samples left out."""
    return aggregate(body.verify_responses)


# -- a tool the environment does not have (last: every other route matches first) --------------


@fallback.post("/{tool_name}", include_in_schema=False)
async def unknown_tool(tool_name: str, request: Request, service: Service, state: State, who: Owner,
                       session_id: SessionCookie = None) -> JSONResponse:
    """The model called a tool that does not exist. NeMo Gym's agent posts every call to
    ``/<name>`` and feeds the answer back to the model: a bare 404 without the cookie would cost
    the rollout its session. So within a session this is a tool output saying which tools
    exist; without one it is the 404 any unknown path is."""
    if not session_id:
        raise HTTPException(404, "Not Found")
    return await run_tool(service, state, tool_name, request, who, session_id)


# -- helpers ------------------------------------------------------------------------------------


def _set_cookie(response: Response, session_id: str) -> None:
    # Not Secure: NeMo Gym talks plain HTTP, and a cookie jar would drop a Secure cookie there.
    response.set_cookie(COOKIE, session_id, path="/", httponly=True, samesite="lax")


def _tool_answer(body: NemoGymToolResponse, session_id: str) -> JSONResponse:
    response = JSONResponse(body.model_dump())
    _set_cookie(response, session_id)
    return response


def _over_text(outcome: Outcome) -> str:
    return f"The environment failed ({outcome.failure_reason}); the episode is over: stop calling tools."


async def _arguments(request: Request) -> Any:
    """The call's arguments as sent; text that is not JSON goes to the environment as it is, which
    tells the model its arguments were not valid JSON."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", errors="replace")


def _task_choice(body: NemoGymSeedSessionRequest) -> tuple[str | None, int | None]:
    """The task a seed names (the row's ``instance_id``, ``task_id``, the same inside ``task_data``,
    then a typed seed's ``TaskId``), or the seed of a draw when it names none."""
    data = body.task_data or {}
    for key in ("instance_id", "task_id"):
        for source in (body.model_dump(include={key}), data):
            value = source.get(key)
            if isinstance(value, str) and value:
                return value, None
    if isinstance(body.task_id, NemoGymTaskIdRef) and body.task_id.task_id:
        return body.task_id.task_id, None
    seed = body.seed if body.seed is not None else data.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise HTTPException(422, f"seed must be a non-negative integer, not {seed!r}")
    return None, seed


def _canonical(value: Any) -> str:
    """One spelling of an episode id, so a repeated typed seed compares equal to the first."""
    return json.dumps(value, sort_keys=True, default=str)
