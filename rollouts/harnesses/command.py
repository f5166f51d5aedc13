"""Any command-line agent as a harness, given as a command template (``--harness 'cmd: ...'``),
started inside the task's sandbox (agent in sandbox) by the launcher of :mod:`.bridge`.

The command runs with bash at the repository root, and finds in its environment:
``OPENAI_BASE_URL`` / ``OPENAI_API_BASE`` (the proxy, through a loopback port of the sandbox's own),
``OPENAI_API_KEY`` (a placeholder: the proxy holds the real key), ``PATCHGYM_MODEL``,
``PATCHGYM_TASK_FILE`` (the bug report), ``PATCHGYM_HARNESS_DIR`` (the files given with the
harness). The template's ``{model}``, ``{task_file}``, ``{harness_dir}``, ``{workdir}`` and
``{base_url}`` are replaced with the same (shell-quoted; ``{base_url}`` as ``"$OPENAI_BASE_URL"``);
nothing else in it is touched, so shell braces stay as they are.

The agent must be runnable in the sandbox: on the local backend, what the host has under ``/usr``
(a Debian package, an ``npm install -g``, a system pip install); on both backends, a script given
with the harness (``files``) that the task's Python runs.
"""

from __future__ import annotations

import hashlib
import shlex
import time
from typing import Any

from patchgym.rollouts.harnesses.base import AGENT_IN_SANDBOX, HarnessContext, HarnessResult
from patchgym.rollouts.harnesses.bridge import FILES, LAUNCHER, SOCKET, STOP, TASK

PREFIX = "cmd:"
STOPPED_EXIT = 125  # sandbox_launcher.STOPPED_EXIT
OUTPUT_LIMIT = 200_000  # characters of the harness's own output kept (its tail goes in the record)


def fill(template: str, context: HarnessContext, where: str) -> str:
    """``template`` with its placeholders filled in for a bridge seen at ``where`` (shell-quoted)."""
    values = {"{model}": shlex.quote(context.model), "{task_file}": shlex.quote(f"{where}/{TASK}"),
              "{harness_dir}": shlex.quote(f"{where}/{FILES}"), "{workdir}": shlex.quote(context.sandbox.workdir),
              "{base_url}": '"$OPENAI_BASE_URL"'}
    for key, value in values.items():
        template = template.replace(key, value)
    return template


class CommandHarness:
    """A command template run inside the sandbox; ``files`` (name -> bytes) go with it."""

    pattern = AGENT_IN_SANDBOX

    def __init__(self, template: str, *, files: dict[str, bytes] | None = None, name: str = "cmd",
                 version: str | None = None) -> None:
        if not template.strip():
            raise ValueError("the command template is empty")
        self.template = template.strip()
        self.files = dict(files or {})
        self.name = name
        # A command has no release number: its text and its files are what a rerun must match.
        digest = hashlib.sha256(self.template.encode())
        for key in sorted(self.files):
            digest.update(key.encode() + b"\0" + self.files[key])
        self.version = version or f"sha256:{digest.hexdigest()[:16]}"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "pattern": self.pattern, "command": self.template,
                "files": sorted(self.files)}

    def command(self, context: HarnessContext, where: str) -> str:
        """The template with its placeholders filled in for a bridge seen at ``where``."""
        return fill(self.template, context, where)

    def run(self, context: HarnessContext) -> HarnessResult:
        bridge = context.bridge
        where = bridge.path_in(context.sandbox)
        env = {"OPENAI_API_KEY": "patchgym-proxy", "PATCHGYM_MODEL": context.model,
               "PATCHGYM_TASK_FILE": f"{where}/{TASK}", "PATCHGYM_HARNESS_DIR": f"{where}/{FILES}",
               "PATCHGYM_INSTANCE_ID": context.instance_id}
        launch = " ".join(shlex.quote(part) for part in (
            "python3", f"{where}/{LAUNCHER}", f"{where}/{SOCKET}", f"{where}/{STOP}", self.command(context, where)))
        timeout = max(1.0, context.deadline - time.monotonic())
        # A SandboxError (the sandbox itself failed) goes up: the episode's driver masks it.
        result = context.sandbox.exec(launch, timeout=timeout, env=env, output_limit=OUTPUT_LIMIT)
        tail = result.output[-4000:]
        if result.timed_out:
            ended = HarnessResult(status="timed_out", detail=f"the harness ran past its {timeout:.0f}s",
                                  exit_code=result.exit_code, output_tail=tail)
        elif result.exit_code == STOPPED_EXIT and (bridge.root / STOP).exists():
            ended = HarnessResult(status="stopped", detail=(bridge.root / STOP).read_text(encoding="utf-8"),
                                  exit_code=result.exit_code, output_tail=tail)
        elif result.exit_code != 0:
            ended = HarnessResult(status="crashed", detail=f"the harness exited with code {result.exit_code}",
                                  exit_code=result.exit_code, output_tail=tail)
        else:
            ended = HarnessResult(status="finished", exit_code=0, output_tail=tail)
        return self.summarize(ended, result.output)

    def sandbox_binds(self) -> dict[str, str]:
        """Host directories the harness needs in the sandbox besides the bridge, read-only (host path
        -> sandbox path): none for a command (what it runs is the sandbox's own, or its files)."""
        return {}

    def summarize(self, ended: HarnessResult, output: str) -> HarnessResult:
        """What the harness's own output says of its run: nothing a command's output is known to say."""
        return ended
