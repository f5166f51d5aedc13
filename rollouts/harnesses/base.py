"""What a harness is to patchgym: something that, given a task's sandbox and a model endpoint (the
recording proxy's), works on the repository and ends. Two patterns (NeMo Gym's names):

- *sandbox as tool* (``pattern = "sandbox"``): the harness runs in patchgym's process and runs its
  commands through :meth:`~patchgym.sandboxes.base.Sandbox.exec` (mini-swe-agent with
  :class:`~patchgym.rollouts.harnesses.mini_swe_agent.PatchgymEnvironment`);
- *agent in sandbox* (``pattern = "in-sandbox"``): the harness is started inside the sandbox, and
  its only way out is the proxy's unix socket bound into it (:mod:`.bridge`), still no network.

Whatever it does, the episode ends with the workspace diff graded in a fresh sandbox
(:mod:`.episode`): a harness's own verdict (its exit code, its "submission") decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from patchgym.sandboxes import Sandbox

SANDBOX_AS_TOOL, AGENT_IN_SANDBOX = "sandbox", "in-sandbox"
# How a harness's run ended (HarnessResult.status), beside "finished".
STATUSES = ("finished", "crashed", "timed_out", "stopped", "out_of_turns")


@dataclass
class HarnessContext:
    """What a harness is given for one episode. ``base_url``: the proxy's OpenAI-compatible root
    as the harness reaches it (inside the sandbox: a loopback port relayed to the socket);
    ``model``: the name to ask for (the proxy overwrites it anyway); ``deadline``
    (``time.monotonic()``): when the harness must have ended; ``stopped()``: true once the episode
    is over for the proxy (budget spent, endpoint failed): the harness should end now."""

    sandbox: Sandbox
    problem_statement: str
    instance_id: str
    base_url: str
    model: str
    deadline: float
    max_turns: int
    stopped: Any = field(default=lambda: None)  # () -> str | None
    bridge: Any = None  # the episode's Bridge (agent in sandbox), else None


@dataclass
class HarnessResult:
    """How the harness's run ended: ``status`` (one of :data:`STATUSES`), what it said of itself
    (``exit_status``: its own words, e.g. mini-swe-agent's ``Submitted``), a tail of its output,
    and the commands it ran where patchgym ran them (sandbox as tool)."""

    status: str = "finished"
    exit_status: str | None = None
    detail: str = ""
    exit_code: int | None = None
    output_tail: str = ""
    steps: int | None = None


class Harness(Protocol):
    """A harness: ``name``, ``version`` (recorded with every run), ``pattern``
    (:data:`SANDBOX_AS_TOOL` or :data:`AGENT_IN_SANDBOX`) and :meth:`run`."""

    name: str
    version: str
    pattern: str

    def describe(self) -> dict[str, Any]:
        """What a run records of the harness: name, version, pattern, its settings."""
        ...

    def run(self, context: HarnessContext) -> HarnessResult:
        """Work on the task until done, stopped or past ``context.deadline``; never raise for what the
        model or the harness did (a crash is ``status="crashed"``)."""
        ...
