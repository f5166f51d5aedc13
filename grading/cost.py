"""What an episode costs the machine, and in dollars: the numbers every report carries.

An *episode* is one graded prediction (``patchgym eval``, ``/v1/verify``, ``PatchEnv``), or one
``RepoEnv`` episode from ``reset()`` to its terminal step, its grading included (``patchgym run``,
server sessions and rollouts). Its CPU time (user + system) is split three ways, so that what the
environment costs is never mixed up with what the repository's tests or the agent cost:

* ``test_cpu_seconds``: the test-run command(s) the verifier runs, their whole process tree
  (:attr:`~grading.testrun.TestRun.cpu_seconds`). The task's own price: no harness can
  make it cheaper.
* ``agent_cpu_seconds``: the sandbox's CPU while it carried out the agent's tool calls (``bash``
  commands and ``str_replace_editor`` operations): what the policy chose to spend. 0 when a
  prediction is graded.
* ``harness_cpu_seconds``: everything else. The harness's own CPU on the threads that ran the
  episode (:func:`time.thread_time` while its calls run; a verifier inside an episode is charged
  once), and every other CPU second of the episode's sandboxes: starting them (the init process),
  applying patches, copying the test runtime in, reading results back.

``env_cpu_seconds`` = harness + agent: the episode's CPU apart from its tests. ``peak_memory_bytes``
is the most memory any one of the episode's sandboxes held at once (its memory cgroup: processes and
the files they wrote to its tmpfs). ``wall_seconds`` runs from the episode's start to its grade (a
``RepoEnv`` episode's includes the agent's thinking, while its sandbox is held).

``usd_per_1k_episodes`` = 1000 × ((env + test CPU) / 3600 × price per core-hour + peak GiB × wall /
3600 × price per GB-hour): memory is charged at its peak for the whole episode, an upper bound.
The default prices are AWS Fargate's on-demand Linux/x86 prices in us-east-1 (per vCPU-hour and per
GB-hour, GB = 2**30 bytes), set with ``--price-core-hour`` / ``--price-gb-hour``.

Not charged: the harness process's start-up and memory (shared by every episode it runs), host
helper processes (``git`` computing a workspace diff), the model (``patchgym run``'s token
``cost_usd``). A field whose parts a backend cannot measure (no ``usage()`` on its sandboxes, no
``ExecResult.cpu_seconds``) is None, and so are the dollars: never a guess.

Stdlib only, so the command line can show the default prices without importing the grader.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from patchgym.sandboxes.base import SandboxUsage

DEFAULT_PRICE_CORE_HOUR = 0.04048  # dollars per vCPU-hour (AWS Fargate, Linux/x86, us-east-1, on demand)
DEFAULT_PRICE_GB_HOUR = 0.004445  # dollars per GB-hour of memory (the same)
GIB = 1 << 30


@dataclass(frozen=True)
class Prices:
    """Dollars per core-hour of CPU and per GB-hour (GiB) of memory."""

    core_hour: float = DEFAULT_PRICE_CORE_HOUR
    gb_hour: float = DEFAULT_PRICE_GB_HOUR

    def __post_init__(self) -> None:
        for name in ("core_hour", "gb_hour"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"price per {name.replace('_', '-')} must be a finite number >= 0, not {value!r}")


@dataclass(frozen=True)
class EpisodeCost:
    """One episode's cost (definitions: this module's docstring). None: not measured."""

    wall_seconds: float
    harness_cpu_seconds: float | None
    agent_cpu_seconds: float | None
    test_cpu_seconds: float | None
    env_cpu_seconds: float | None
    peak_memory_bytes: int | None
    price_core_hour: float
    price_gb_hour: float
    usd_per_1k_episodes: float | None

    @classmethod
    def of(cls, *, wall_seconds: float, harness: float | None, agent: float | None, tests: float | None,
           peak_memory_bytes: int | None, prices: Prices) -> EpisodeCost:
        env = _plus(harness, agent)
        usd = None
        if env is not None and tests is not None and peak_memory_bytes is not None:
            usd = ((env + tests) / 3600 * prices.core_hour
                   + peak_memory_bytes / GIB * wall_seconds / 3600 * prices.gb_hour)
        return cls(wall_seconds=round(wall_seconds, 4), harness_cpu_seconds=_round(harness),
                   agent_cpu_seconds=_round(agent), test_cpu_seconds=_round(tests), env_cpu_seconds=_round(env),
                   peak_memory_bytes=peak_memory_bytes, price_core_hour=prices.core_hour,
                   price_gb_hour=prices.gb_hour, usd_per_1k_episodes=None if usd is None else round(usd * 1000, 6))

    def priced(self, prices: Prices) -> EpisodeCost:
        """The same measurements at other prices."""
        return EpisodeCost.of(wall_seconds=self.wall_seconds, harness=self.harness_cpu_seconds,
                              agent=self.agent_cpu_seconds, tests=self.test_cpu_seconds,
                              peak_memory_bytes=self.peak_memory_bytes, prices=prices)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeCost:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})


_frames = threading.local()  # per thread: the meters charging it, innermost last, with their start


class CostMeter:
    """Adds up one episode's cost while it runs.

    ``charging()`` brackets the harness's work on the calling thread; the sandbox's CPU arrives per
    tool call (``add_agent``), per test run (``add_tests``) and, when a sandbox closes, as its total
    (``sandbox_closed``), of which whatever was not the agent's or the tests' is the harness's.
    One episode is driven by one thread at a time (any thread: a server steps it from a pool).
    """

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._thread_cpu = 0.0
        self._sandbox_cpu: float | None = 0.0  # the sandboxes' CPU that was neither agent nor tests
        self._agent: float | None = 0.0
        self._tests: float | None = 0.0
        self._peak: int | None = 0
        self._attributed: float | None = 0.0  # agent + tests since the last sandbox closed

    @contextmanager
    def charging(self) -> Iterator[None]:
        """Charge this thread's CPU inside the block to the harness. Nested meters (a verifier
        inside an episode's step) charge their own part; the outer one pauses meanwhile."""
        stack = _frames.__dict__.setdefault("stack", [])
        now = time.thread_time()
        if stack:
            outer = stack[-1]
            outer[0]._thread_cpu += now - outer[1]
        frame = [self, now]
        stack.append(frame)
        try:
            yield
        finally:
            now = time.thread_time()
            stack.pop()
            self._thread_cpu += now - frame[1]
            if stack:
                stack[-1][1] = now

    def add_agent(self, cpu_seconds: float | None) -> None:
        self._agent = _plus(self._agent, cpu_seconds)
        self._attributed = _plus(self._attributed, cpu_seconds)

    def add_tests(self, cpu_seconds: float | None) -> None:
        self._tests = _plus(self._tests, cpu_seconds)
        self._attributed = _plus(self._attributed, cpu_seconds)

    def sandbox_closed(self, usage: SandboxUsage) -> None:
        """A sandbox's whole usage, read just before it closed: the part not already charged to
        the agent or the tests is the harness's."""
        rest = None if usage.cpu_seconds is None or self._attributed is None else \
            max(0.0, usage.cpu_seconds - self._attributed)
        self._sandbox_cpu = _plus(self._sandbox_cpu, rest)
        self._peak = None if self._peak is None or usage.peak_memory_bytes is None else \
            max(self._peak, usage.peak_memory_bytes)
        self._attributed = 0.0

    def absorb(self, other: CostMeter) -> None:
        """A meter that charged part of this episode on another machine (a grading run on the node
        that holds the sandbox, see ``Verifier``): its harness CPU there and the tests' and agent's
        CPU it saw count here. Its sandbox was not closed there: this meter reads it when it closes."""
        self._thread_cpu += other._thread_cpu
        self.add_agent(other._agent)
        self.add_tests(other._tests)

    def include(self, part: EpisodeCost | None) -> None:
        """A cost measured inside this episode by a meter of its own (the grading of a RepoEnv
        episode): its CPU and peak memory count, its wall time is already inside this one's."""
        if part is None:
            self._sandbox_cpu = self._peak = None
            return
        self._sandbox_cpu = _plus(self._sandbox_cpu, part.harness_cpu_seconds)
        self._agent = _plus(self._agent, part.agent_cpu_seconds)
        self._tests = _plus(self._tests, part.test_cpu_seconds)
        self._peak = None if self._peak is None or part.peak_memory_bytes is None else \
            max(self._peak, part.peak_memory_bytes)

    def result(self, prices: Prices) -> EpisodeCost:
        return EpisodeCost.of(wall_seconds=time.monotonic() - self.started,
                              harness=_plus(self._thread_cpu, self._sandbox_cpu), agent=self._agent,
                              tests=self._tests, peak_memory_bytes=self._peak, prices=prices)


def summarize(costs: Iterable[EpisodeCost], prices: Prices) -> dict[str, Any]:
    """The cost part of a run report: per-episode means over the episodes where a figure was
    measured, CPU totals, the largest peak, and dollars at ``prices`` (each episode repriced, so a
    resumed run's earlier episodes count at this run's prices)."""
    costs = [c.priced(prices) for c in costs]
    out: dict[str, Any] = {"episodes": len(costs), "price_core_hour": prices.core_hour,
                           "price_gb_hour": prices.gb_hour}
    for key in ("wall_seconds", "harness_cpu_seconds", "agent_cpu_seconds", "test_cpu_seconds", "env_cpu_seconds"):
        values = [getattr(c, key) for c in costs if getattr(c, key) is not None]
        out[f"{key}_mean"] = round(sum(values) / len(values), 4) if values else None
        out[f"{key}_total"] = round(sum(values), 4) if values else None
    peaks = [c.peak_memory_bytes for c in costs if c.peak_memory_bytes is not None]
    out["peak_memory_bytes_max"] = max(peaks) if peaks else None
    dollars = [c.usd_per_1k_episodes for c in costs if c.usd_per_1k_episodes is not None]
    out["usd_per_1k_episodes"] = round(sum(dollars) / len(dollars), 6) if dollars else None
    out["usd_total"] = round(sum(dollars) / 1000, 9) if dollars else None
    out["unmeasured_episodes"] = len(costs) - len(dollars)
    return out


def _plus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
