"""Bring your own agent: harnesses (mini-swe-agent, any command-line agent) on patchgym's tasks and
sandboxes, every model call recorded by the proxy, the workspace graded as any episode's
(``docs/harnesses.md``). :func:`harness_from_spec` reads ``--harness``; :mod:`.episode` runs one."""

from __future__ import annotations

from typing import Any

from patchgym.rollouts.harnesses.base import Harness
from patchgym.rollouts.harnesses.command import PREFIX, CommandHarness

NAMED = ("mini-swe-agent",)


def harness_from_spec(spec: str, *, files: dict[str, bytes] | None = None,
                      config: dict[str, Any] | None = None) -> Harness:
    """The harness ``spec`` names: ``mini-swe-agent`` (``config`` merged over its own), or
    ``cmd: <command template>`` (``files`` go with it into the sandbox). ValueError otherwise;
    RuntimeError when a named harness is not installed."""
    text = spec.strip()
    if text == "mini-swe-agent":
        if files:
            raise ValueError("files go with a command harness ('cmd: ...'), not with mini-swe-agent")
        from patchgym.rollouts.harnesses.mini_swe_agent import MiniSweAgent

        return MiniSweAgent(config)
    if text.startswith(PREFIX):
        if config:
            raise ValueError("a command harness takes no config: its command carries its settings")
        return CommandHarness(text[len(PREFIX):], files=files)
    raise ValueError(f"unknown harness {spec!r}: one of {', '.join(NAMED)}, or 'cmd: <command>'")
