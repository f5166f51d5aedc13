"""What the scripted endpoint (tests/fake_openai.py) says to each harness, for the tests and
bench/harnesses.py: a shell command in the harness's own tool (mini-swe-agent's and the test
agent's ``bash``, Codex CLI's ``exec_command``, patchgym's own ``bash``), and how each one ends
(mini-swe-agent's submit command, Codex's answer without a tool call, patchgym's ``submit``)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from tests.fake_openai import FakeModel, Turn, call

AGENT = Path(__file__).with_name("harness_agent.py")
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
HARNESSES = ("mini-swe-agent", "cmd", "codex")


def make_harness(name: str, **kw: Any) -> Any:
    """The harness a test names: ``cmd`` is the stdlib agent of tests/harness_agent.py in the sandbox."""
    from patchgym.rollouts.harnesses import harness_from_spec

    if name == "cmd":
        return harness_from_spec("cmd: python3 {harness_dir}/agent.py", files={"agent.py": AGENT.read_bytes()}, **kw)
    return harness_from_spec(name, **kw)


def shell(harness: str, command: str) -> Turn:
    """The model's call of ``harness``'s shell tool."""
    return call("exec_command", {"cmd": command}) if harness == "codex" else call("bash", {"command": command})


def done(harness: str) -> Turn:
    """The model's last turn, as ``harness`` takes it to end the episode."""
    if harness == "codex":
        return Turn(text="The fix is in place.")
    return call("submit", {}) if harness == "patchgym" else shell(harness, SUBMIT)


def commands(harness: str, *lines: str) -> list[Turn]:
    """Each command through the harness's shell, then its end."""
    return [*(shell(harness, line) for line in lines), done(harness)]


def oracle(harness: str, patch: str) -> list[Turn]:
    """The gold patch through the harness's shell, then its end."""
    return commands(harness, f"printf %s {shlex.quote(patch)} | git apply")


def script_tasks(model: FakeModel, tasks: Any, harness: str, *, fix: Any = True) -> None:
    """Each task's script, keyed by its bug report: the oracle where ``fix`` says so (a bool, or a
    set of instance ids), else the harness's end alone (no-op)."""
    for task in tasks:
        fixing = fix if isinstance(fix, bool) else task.instance_id in fix
        script = oracle(harness, task.patch) if fixing else [done(harness)]
        model.scripts[task.problem_statement.strip()[:200]] = script
