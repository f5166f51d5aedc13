"""What every HTTP protocol of the server shares: the task set, the sessions, the verifier, auth and
metrics. The native API (:mod:`patchgym.server.app`), the NeMo Gym routes
(:mod:`patchgym.server.nemo_gym.routes`) and the OpenEnv routes (:mod:`patchgym.server.openenv`) are thin
translations over one :class:`EnvService`, so a limit, a deadline or a metric holds whichever
protocol a client speaks. Their handlers find it on ``app.state`` (:mod:`patchgym.server.deps`).
"""

import collections
import hashlib
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
from fastapi import HTTPException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from patchgym.grading.cost import EpisodeCost, Prices
from patchgym.grading.verifier import InstanceReport, Verifier
from patchgym.gym_envs.repo_env import RepoEnv
from patchgym.rollouts.harnesses.base import Harness
from patchgym.rollouts.harnesses.episode import run_harness_episode
from patchgym.rollouts.loop import Episode, run_episode
from patchgym.rollouts.model import ChatModel, ModelConfig
from patchgym.sandboxes import SandboxError, reap_stale
from patchgym.server.grading_pool import DEFAULT_CPU_SHARE, GradingPool
from patchgym.server.sessions import (
    CLOSED_BY_CLIENT,
    CLOSED_BY_FAILURE,
    CLOSED_GRADED,
    CapacityError,
    OperationTimeout,
    Session,
    SessionManager,
)
from patchgym.tasks.backends import sandbox_factory
from patchgym.tasks.catalog import TaskSet

log = logging.getLogger(__name__)
SUBMIT = {"name": "submit", "arguments": {}}


class EpisodeOver(RuntimeError):
    """A step on a session whose episode has ended."""


class Metrics:
    """The server's Prometheus registry (one per app, so several apps can live in one process)."""

    def __init__(self, manager: SessionManager, queue_depth: Any, prices: Prices | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge("patchgym_sessions_active", "Sessions open.", registry=r).set_function(lambda: len(manager))
        Gauge("patchgym_sessions_max", "Session capacity.", registry=r).set(manager.max_sessions)
        Gauge("patchgym_queue_depth", "Requests waiting for a worker thread.",
              registry=r).set_function(queue_depth)
        Gauge("patchgym_sessions_waiting", "Session opens queued for a free slot (clients that do not retry).",
              registry=r).set_function(lambda: manager.waiting)
        self.session_wait = Histogram("patchgym_session_wait_seconds",
                                      "How long queued session opens waited for a slot.",
                                      buckets=(0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800), registry=r)
        manager.waited_seconds = self.session_wait.observe
        self.sessions_closed = Counter("patchgym_sessions_closed_total", "Sessions closed, by why (server.sessions: "
                                       "client, graded, idle, failure, shutdown).", ["protocol", "reason"], registry=r)
        manager.closed_by = lambda session, reason: self.sessions_closed.labels(session.protocol, reason).inc()
        self.sessions_created = Counter("patchgym_sessions_created_total", "Sessions created.", ["protocol"],
                                        registry=r)
        self.steps = Counter("patchgym_steps_total", "Environment steps taken.", ["protocol"], registry=r)
        self.step_latency = Histogram("patchgym_step_latency_seconds", "Latency of environment steps.",
                                      buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
                                               300, 900),
                                      registry=r)
        self.verifications = Counter("patchgym_verifications_total", "Stateless verifications.", registry=r)
        self.errors = Counter("patchgym_errors_total", "Requests answered with an error, by kind.", ["kind"],
                              registry=r)
        # What finished episodes cost (grading.cost): sessions' terminal steps, rollouts and
        # stateless verifications. Means are the totals over patchgym_episodes_costed_total.
        prices = prices or Prices()
        Gauge("patchgym_price_core_hour_usd", "Dollars per core-hour the cost figures use.", registry=r).set(
            prices.core_hour)
        Gauge("patchgym_price_gb_hour_usd", "Dollars per GB-hour (GiB) of memory the cost figures use.",
              registry=r).set(prices.gb_hour)
        self.episodes_costed = Counter("patchgym_episodes_costed_total", "Finished episodes whose cost was measured "
                                       "(source: session, rollout or verify).", ["source"], registry=r)
        self.episodes_unmeasured = Counter("patchgym_episodes_unmeasured_total",
                                           "Finished episodes whose backend could not measure their cost.",
                                           ["source"], registry=r)
        self.episode_cpu = Counter("patchgym_episode_cpu_seconds_total",
                                   "CPU seconds of finished episodes, by part: harness (the environment's own), "
                                   "agent (its tool calls) and tests (the test runs).", ["part"], registry=r)
        self.episode_wall = Counter("patchgym_episode_wall_seconds_total", "Wall seconds of finished episodes.",
                                    registry=r)
        self.episode_usd = Counter("patchgym_episode_cost_usd_total",
                                   "Dollars finished episodes cost at the configured prices.", registry=r)
        cpu_buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
        self.episode_env_cpu = Histogram("patchgym_episode_env_cpu_seconds",
                                         "CPU seconds per episode apart from its tests (harness + agent).",
                                         buckets=cpu_buckets, registry=r)
        self.episode_test_cpu = Histogram("patchgym_episode_test_cpu_seconds", "CPU seconds per episode of its tests.",
                                          buckets=cpu_buckets, registry=r)
        self.episode_peak_memory = Histogram(
            "patchgym_episode_peak_memory_bytes", "Peak memory of an episode's sandboxes.",
            buckets=tuple(m << 20 for m in (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)), registry=r)

    def observe_cost(self, cost: EpisodeCost | dict[str, Any] | None, source: str) -> None:
        """Count a finished episode's cost (nothing for an episode that never reached one)."""
        if cost is None:
            return
        c = cost if isinstance(cost, EpisodeCost) else EpisodeCost.from_dict(cost)
        if c.usd_per_1k_episodes is None:
            self.episodes_unmeasured.labels(source).inc()
            return
        self.episodes_costed.labels(source).inc()
        for part, value in (("harness", c.harness_cpu_seconds), ("agent", c.agent_cpu_seconds),
                            ("tests", c.test_cpu_seconds)):
            self.episode_cpu.labels(part).inc(value or 0.0)
        self.episode_wall.inc(c.wall_seconds)
        self.episode_usd.inc(c.usd_per_1k_episodes / 1000)
        self.episode_env_cpu.observe(c.env_cpu_seconds or 0.0)
        self.episode_test_cpu.observe(c.test_cpu_seconds or 0.0)
        self.episode_peak_memory.observe(c.peak_memory_bytes or 0)


class EnvService:
    """Sessions of ``RepoEnv`` plus a stateless verifier, behind deadlines and a capacity bound.

    Every blocking call runs in a worker thread (never on the event loop) under
    ``operation_timeout``. ``env_options`` go to every ``RepoEnv``. ``seed_wait``: how long a
    session open from a client that does not retry (NeMo Gym) waits for a free slot.
    ``rollout_idle_ttl``: the idle TTL of such sessions, short, so a rollout its agent abandoned
    does not hold a slot for long. ``env_options["grading_workers"]`` (N > 0) grades in N worker
    processes with a CPU share of their own (``grading_cpu_share``, :mod:`.grading_pool`), off the
    serving path; 0, in this process's threads. ``env_options["prices"]`` (a :class:`Prices`) prices every
    episode's cost, in its report and in the metrics. ``model_endpoints``: the model API roots a
    client's rollout may make the server call (none: it calls none).

    Fair share: each token may hold ``max_sessions_per_token`` sessions and run as many stateless
    verifications at once (default: an equal share of ``max_sessions`` per token, all of it with
    one token or none); past either, :class:`CapacityError` (429) for that token alone.
    """

    def __init__(self, task_set: TaskSet, *, backend: str, env_options: dict[str, Any], max_sessions: int,
                 idle_ttl: float, operation_timeout: float, tokens: Sequence[str], seed_wait: float = 600.0,
                 rollout_idle_ttl: float = 300.0, model_endpoints: Sequence[str] = (),
                 max_sessions_per_token: int | None = None) -> None:
        self.task_set = task_set
        self.backend = backend
        self.env_options = dict(env_options)
        self.env_options.pop("tasks", None)
        self.env_options.pop("backend", None)
        grading_workers = int(self.env_options.pop("grading_workers", 0) or 0)
        grading_cpu_share = int(self.env_options.pop("grading_cpu_share", 0) or DEFAULT_CPU_SHARE)
        factory = sandbox_factory(backend, **self.env_options.get("sandbox_options", None) or {})
        self.prices = self.env_options.get("prices") or Prices()
        partial_credit = bool(self.env_options.get("partial_credit", False))
        tampering_reward = float(self.env_options.get("tampering_reward", 0.0))
        self.verifier = Verifier(factory, partial_credit=partial_credit, prices=self.prices,
                                 tampering_reward=tampering_reward)
        # Who grades submits, rollouts and /verify: worker processes with a CPU share of their own
        # (grading_workers > 0), or this process's threads.
        self.grader: Verifier | GradingPool = self.verifier
        if grading_workers > 0:
            self.grader = GradingPool(grading_workers, backend=backend, partial_credit=partial_credit,
                                      sandbox_options=self.env_options.get("sandbox_options") or {},
                                      prices=self.prices, cpu_share=grading_cpu_share,
                                      tampering_reward=tampering_reward)
        checked = RepoEnv(task_set, backend=backend, **self.env_options)  # a bad option fails here, not per session
        self.tools: list[dict[str, Any]] = checked.tools
        checked.close()
        if any(not t for t in tokens):
            raise ValueError("an empty token would accept anyone")
        self.tokens = list(tokens)
        self.operation_timeout = operation_timeout
        self.seed_wait = seed_wait
        self.rollout_idle_ttl = rollout_idle_ttl
        self.model_endpoints = tuple(model_endpoints)
        self.manager = SessionManager(max_sessions=max_sessions, idle_ttl=idle_ttl, operation_timeout=operation_timeout,
                                      max_per_owner=max_sessions_per_token or fair_share(max_sessions, len(tokens)))
        self.metrics = Metrics(self.manager, self.queue_depth, self.prices)
        self._verify_slots: anyio.CapacityLimiter | None = None
        self._verifying: collections.Counter[str | None] = collections.Counter()  # verifications running, by owner

    def queue_depth(self) -> int:
        """Operations and verifications waiting for a worker thread."""
        limiters = [lim for lim in (self.manager.limiter_if_started, self._verify_slots) if lim is not None]
        return sum(lim.statistics().tasks_waiting for lim in limiters)

    # -- auth -----------------------------------------------------------------------------

    def authenticate(self, token: str | None) -> str | None:
        """The caller's identity: a digest of its token (None when the server has no tokens).
        Raises 401 for a missing or wrong token."""
        if not self.tokens:
            return None
        given = (token or "").encode()
        if not token or not any(secrets.compare_digest(given, t.encode()) for t in self.tokens):
            self.metrics.errors.labels("unauthorized").inc()
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        return hashlib.sha256(given).hexdigest()

    def limits_of(self, owner: str | None) -> dict[str, int]:
        """What ``owner`` may hold at once and holds now (``/state`` shows it to its token)."""
        return {"max_sessions": self.manager.max_per_owner, "sessions": self.manager.held(owner),
                "max_verifications": self.manager.max_per_owner, "verifications": self._verifying[owner],
                "server_max_sessions": self.manager.max_sessions, "server_sessions": len(self.manager)}

    # -- sessions -------------------------------------------------------------------------

    async def open_session(self, owner: str | None, *, task_id: str | None = None, seed: int | None = None,
                           protocol: str = "native", session_id: str | None = None, wait: float = 0.0,
                           idle_ttl: float | None = None, **overrides: Any) -> tuple[Session, str, dict[str, Any]]:
        """Open a session on a task (``task_id`` or one drawn with ``seed``); its first observation
        and info. ``overrides`` replace env options for this session (``max_steps``, ``time_limit``);
        ``wait`` and ``idle_ttl`` go to :meth:`SessionManager.create`."""
        if task_id is not None:
            self.task_set.get(task_id)  # UnknownTaskError -> 404, before any slot or sandbox is taken
        options = dict(self.env_options)
        options.update({k: v for k, v in overrides.items() if v is not None})

        def start(session: Session) -> tuple[str, dict[str, Any]]:
            env = session.env = RepoEnv(self.task_set, backend=self.backend, **options)
            env.verifier = self.grader
            obs, info = env.reset(seed=seed, options=_reset_options(task_id))
            session.instance_id = info.get("instance_id")
            return obs, info

        session, (obs, info) = await self.manager.create(owner, start, session_id=session_id, wait=wait,
                                                         idle_ttl=idle_ttl, protocol=protocol)
        self.metrics.sessions_created.labels(protocol).inc()
        return session, obs, info

    async def step(self, session: Session, action: Any,
                   protocol: str = "native") -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One tool call; :class:`EpisodeOver` after the episode ended."""

        def run() -> tuple[str, float, bool, bool, dict[str, Any]]:
            if session.done or session.env is None:
                raise EpisodeOver("the episode is over: reset the session before stepping again")
            result = session.env.step(action)
            session.steps += 1
            session.done = bool(result[2] or result[3])
            return result

        started = time.monotonic()
        result = await self._operate(session, run)
        self.metrics.steps.labels(protocol).inc()
        self.metrics.step_latency.observe(time.monotonic() - started)
        if result[2] or result[3]:
            self.metrics.observe_cost(result[4].get("cost"), "session")
        return result

    async def reset(self, session: Session, *, task_id: str | None = None,
                    seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """A new episode in the session (a fresh sandbox)."""
        if task_id is not None:
            self.task_set.get(task_id)

        def run() -> tuple[str, dict[str, Any]]:
            assert session.env is not None
            obs, info = session.env.reset(seed=seed, options=_reset_options(task_id))
            session.instance_id = info.get("instance_id")
            session.steps, session.done = 0, False
            return obs, info

        return await self._operate(session, run)

    async def close(self, session: Session, reason: str = CLOSED_BY_CLIENT) -> None:
        await self.manager.close(session, reason)

    async def shutdown(self) -> None:
        """Close every session, then the grading workers (the sandboxes they grade in, their
        cgroups). Here, not at exit: uvicorn ends a SIGTERMed server by that signal again, and exit
        handlers do not run then."""
        await self.manager.close_all()
        if isinstance(self.grader, GradingPool):
            await anyio.to_thread.run_sync(self.grader.close)

    async def _operate(self, session: Session, fn: Any) -> Any:
        try:
            return await self.manager.operate(session, fn)
        except SandboxError:
            await self.manager.close(session, CLOSED_BY_FAILURE)  # its sandbox is in an unknown state
            raise

    async def reap_leftovers(self) -> dict[str, int]:
        """Remove what dead processes (a killed server, say) left: local sandboxes and cgroups,
        and for the docker backend patchgym's containers of dead owners. Never a live process's."""

        def reap() -> dict[str, int]:
            removed = {"local": reap_stale(), "docker": 0}
            if self.backend == "docker":
                from patchgym.sandboxes.docker import gc_containers

                removed["docker"] = len(gc_containers())
            return removed

        try:
            with anyio.fail_after(120):
                removed = await anyio.to_thread.run_sync(reap, abandon_on_cancel=True)
        except (TimeoutError, SandboxError) as exc:  # a server that cannot reap can still serve
            log.warning("reaping leftovers failed: %s", exc)
            return {}
        if any(removed.values()):
            log.info("removed leftovers of dead processes: %s", removed)
        return removed

    # -- whole rollouts -------------------------------------------------------------------

    async def rollout(self, owner: str | None, task_id: str, model: ModelConfig, *, max_turns: int,
                      tool_mode: str, protocol: str = "native", **overrides: Any) -> Episode:
        """A whole episode of ``model`` on ``task_id`` (:func:`patchgym.rollouts.loop.run_episode`) in
        a session of its own: the same capacity bound (:class:`CapacityError`) and deadline
        (:class:`OperationTimeout`) as any session; closed at the end whatever happened."""
        self.task_set.get(task_id)  # UnknownTaskError -> 404 before a slot is taken
        options = dict(self.env_options)
        options.update({k: v for k, v in overrides.items() if v is not None})

        def start(session: Session) -> None:
            session.env = RepoEnv(self.task_set, backend=self.backend, **options)
            session.env.verifier = self.grader
            session.instance_id = task_id

        session, _ = await self.manager.create(owner, start, protocol=protocol)
        self.metrics.sessions_created.labels(protocol).inc()
        chat = ChatModel(model)
        # No model turn starts in the last fifth of the deadline: that is left for grading, so the
        # episode ends graded rather than abandoned (an abandoned thread would go on calling the model).
        deadline = time.monotonic() + 0.8 * self.operation_timeout
        try:
            episode = await self._operate(session, lambda: run_episode(session.env, chat, task_id, max_turns=max_turns,
                                                                       tool_mode=tool_mode, deadline=deadline))
            self.metrics.observe_cost(episode.cost, "rollout")
            return episode
        finally:
            chat.close()
            await self.manager.close(session, CLOSED_GRADED)

    async def harness_rollout(self, owner: str | None, task_id: str, model: ModelConfig, harness: Harness, *,
                              max_turns: int, record_tokens: str = "auto", protocol: str = "native",
                              **overrides: Any) -> Episode:
        """A whole episode of ``harness`` on ``task_id`` (:func:`patchgym.rollouts.harnesses.episode.
        run_harness_episode`), its model calls through the recording proxy: the same capacity bound,
        deadline and closing as :meth:`rollout`."""
        self.task_set.get(task_id)
        options = dict(self.env_options)
        options.update({k: v for k, v in overrides.items() if v is not None})

        def start(session: Session) -> None:
            session.instance_id = task_id

        session, _ = await self.manager.create(owner, start, protocol=protocol)
        self.metrics.sessions_created.labels(protocol).inc()

        def make_env(agent_sandbox_options: dict[str, Any] | None) -> RepoEnv:
            # on the session, so that closing it (deadline, shutdown) frees the sandbox too
            session.env = RepoEnv(self.task_set, backend=self.backend, agent_sandbox_options=agent_sandbox_options,
                                  **options)
            return session.env

        deadline = time.monotonic() + self.operation_timeout
        try:
            episode = await self._operate(session, lambda: run_harness_episode(
                make_env, self.task_set, harness, model, task_id, max_turns=max_turns,
                time_limit=options.get("time_limit"), record_tokens=record_tokens, deadline=deadline))
            self.metrics.observe_cost(episode.cost, "rollout")
            return episode
        finally:
            await self.manager.close(session, CLOSED_GRADED)

    # -- stateless ------------------------------------------------------------------------

    async def verify(self, owner: str | None, instance_id: str, patch: str) -> InstanceReport:
        """Grade ``patch`` for a task in a fresh sandbox; at most ``max_sessions`` at once, and
        ``owner``'s share of them (:class:`CapacityError` past it)."""
        task = self.task_set.get(instance_id)
        if self._verifying[owner] >= self.manager.max_per_owner:
            raise CapacityError(f"this token has all of its {self.manager.max_per_owner} verifications running")
        if self._verify_slots is None:  # needs a running event loop
            self._verify_slots = anyio.CapacityLimiter(self.manager.max_sessions)
        self._verifying[owner] += 1
        try:
            with anyio.fail_after(self.operation_timeout):
                report = await anyio.to_thread.run_sync(
                    lambda: self.grader.verify(task, patch, run_empty=True),
                    abandon_on_cancel=True, limiter=self._verify_slots)
        except TimeoutError:
            raise OperationTimeout(f"verification ran past its {self.operation_timeout:g}s deadline") from None
        finally:
            self._verifying[owner] -= 1
            if self._verifying[owner] <= 0:
                del self._verifying[owner]
        self.metrics.verifications.inc()
        self.metrics.observe_cost(report.cost, "verify")
        return report


def fair_share(max_sessions: int, tokens: int) -> int:
    """Each token's default share of ``max_sessions``: equal parts among several tokens (at least
    one each), all of them for one token or none."""
    return max(1, max_sessions // tokens) if tokens > 1 else max_sessions


def _reset_options(task_id: str | None) -> dict[str, Any] | None:
    return {"task_id": task_id} if task_id is not None else None
