"""Bring your own agent: harnesses (mini-swe-agent, Codex CLI, any command-line agent) on patchgym's tasks and
sandboxes, every model call recorded by the proxy, the workspace graded as any episode's
(``docs/harnesses.md``). :func:`harness_from_spec` reads ``--harness``; :mod:`.episode` runs one."""

from __future__ import annotations

import re
from typing import Any

from patchgym.rollouts.harnesses.base import Harness
from patchgym.rollouts.harnesses.command import PREFIX, CommandHarness

NAMED = ("mini-swe-agent", "codex")


def harness_from_spec(spec: str, *, files: dict[str, bytes] | None = None, config: dict[str, Any] | None = None,
                      install: bool = True) -> Harness:
    """The harness ``spec`` names: ``mini-swe-agent`` or ``codex`` (``codex@VERSION`` for another
    release), ``config`` merged over its own; or ``cmd: <command template>`` (``files`` go with it
    into the sandbox). ValueError otherwise; RuntimeError when a named harness is not installed
    (``install``: Codex CLI is installed with npm when absent)."""
    text = spec.strip()
    name, _, version = text.partition("@") if not text.startswith(PREFIX) else (text, "", "")
    if name in NAMED and files:
        raise ValueError(f"files go with a command harness ('cmd: ...'), not with {name}")
    if text == "mini-swe-agent":
        from patchgym.rollouts.harnesses.mini_swe_agent import MiniSweAgent

        return MiniSweAgent(config)
    if name == "codex":
        from patchgym.rollouts.harnesses.codex import TESTED_VERSION, CodexHarness

        if version and not re.fullmatch(r"[0-9A-Za-z.+-]+", version):
            raise ValueError(f"not a Codex CLI version: {version!r}")
        return CodexHarness(config, version=version or TESTED_VERSION, install=install)
    if text.startswith(PREFIX):
        if config:
            raise ValueError("a command harness takes no config: its command carries its settings")
        return CommandHarness(text[len(PREFIX):], files=files)
    raise ValueError(f"unknown harness {spec!r}: one of {', '.join(NAMED)}, or 'cmd: <command>'")
