"""mini-swe-agent (PyPI ``mini-swe-agent``, the harness of SWE-bench's bash-only leaderboard) on
patchgym's tasks and sandboxes, sandbox as tool:

- :class:`PatchgymEnvironment`: a mini-swe-agent environment class over a patchgym sandbox (its
  ``Environment`` protocol: ``execute``, ``get_template_vars``, ``serialize``). Given a sandbox, it
  runs commands in it; given an ``instance_id`` (as from a mini-swe-agent config's
  ``environment_class: patchgym.rollouts.harnesses.mini_swe_agent.PatchgymEnvironment``), it opens
  the task's sandbox itself.
- :class:`MiniSweAgent`: ``patchgym run --harness mini-swe-agent``: mini-swe-agent's own
  ``DefaultAgent`` with its own SWE-bench config (``config/benchmarks/swebench.yaml`` of the
  installed release, so results compare with its published ones), its model pointed at the proxy.

What patchgym changes in that config, and why: the environment (this class, at the sandbox's
workdir; ``BASH_ENV``, which sources a conda ``.bashrc`` of SWE-bench's images, is left out);
``step_limit`` = the run's ``--max-turns`` (the proxy refuses calls past it anyway);
``wall_time_limit_seconds`` from the episode's deadline; cost tracking off (the proxy counts
tokens); model errors not retried by the harness (the proxy has retried them already).

Tested against :data:`TESTED_VERSION`; another installed release runs with a warning, and the run
records the version that ran.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from importlib import metadata
from typing import Any

from patchgym.rollouts.harnesses.base import SANDBOX_AS_TOOL, HarnessContext, HarnessResult
from patchgym.sandboxes import Sandbox

log = logging.getLogger(__name__)
TESTED_VERSION = "2.4.6"
CONFIG = "benchmarks/swebench.yaml"
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
INSTALL_HINT = f"pip install 'mini-swe-agent=={TESTED_VERSION}' (or patchgym[harnesses])"


class EpisodeStopped(Exception):
    """The episode ended from outside (the proxy refused further calls, or the deadline passed)."""


def _quiet_imports() -> None:
    """mini-swe-agent prints a banner on import, and litellm fetches a price list from the network
    on import unless told to use its own copy: neither, in a sandboxed run."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    import litellm

    litellm.suppress_debug_info = True  # no "Provider List" banner when it cannot price a model


def installed_version() -> str:
    """The installed mini-swe-agent's version; :class:`RuntimeError` saying how to install it when absent."""
    try:
        return metadata.version("mini-swe-agent")
    except metadata.PackageNotFoundError:
        raise RuntimeError(f"mini-swe-agent is not installed: {INSTALL_HINT}") from None


class PatchgymEnvironment:
    """mini-swe-agent's ``Environment`` over a patchgym :class:`~patchgym.sandboxes.base.Sandbox`.

    ``sandbox``: run in this one (it stays the caller's); else ``instance_id`` (with ``tasks``, a
    task file or None for the bundled catalog, and ``backend``) opens the task's sandbox, closed by
    :meth:`close`. Other keywords are mini-swe-agent's environment settings: ``cwd``, ``env``,
    ``timeout``. ``stopped`` and ``deadline`` (``time.monotonic()``) end the agent's run from outside.
    """

    def __init__(self, *, sandbox: Sandbox | None = None, instance_id: str | None = None, tasks: Any = None,
                 backend: str = "local", cwd: str = "", env: dict[str, str] | None = None, timeout: int = 60,
                 output_limit: int = 100_000, stopped: Any = None, deadline: float | None = None,
                 **ignored: Any) -> None:
        self._owned = sandbox is None
        if sandbox is None:
            if instance_id is None:
                raise ValueError("PatchgymEnvironment needs a sandbox or an instance_id")
            from patchgym.tasks.backends import make_sandbox
            from patchgym.tasks.catalog import load_task_set

            sandbox = make_sandbox(load_task_set(tasks).get(instance_id), backend)
        self.sandbox = sandbox
        self.config = {"cwd": cwd or sandbox.workdir, "env": dict(env or {}), "timeout": int(timeout),
                       "output_limit": output_limit, "instance_id": instance_id, "backend": backend}
        self._stopped = stopped or (lambda: None)
        self._deadline = deadline
        self.steps = 0

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run ``action["command"]`` with bash in the sandbox: mini-swe-agent's output dict; raises its
        ``Submitted`` when the output starts with its submit marker (as its own environments do)."""
        reason = self._stopped()
        if reason is None and self._deadline is not None and time.monotonic() >= self._deadline:
            reason = "the episode's time is up"
        if reason is not None:
            raise EpisodeStopped(reason)
        command = action.get("command", "")
        limit = timeout or self.config["timeout"]
        if self._deadline is not None:
            limit = max(1, min(limit, self._deadline - time.monotonic()))
        self.steps += 1
        result = self.sandbox.exec(command, timeout=limit, cwd=cwd or self.config["cwd"], env=self.config["env"],
                                   output_limit=self.config["output_limit"])
        output: dict[str, Any] = {"output": result.output, "returncode": result.exit_code, "exception_info": ""}
        if result.timed_out:
            output["returncode"] = -1
            output["exception_info"] = f"An error occurred while executing the command: it timed out after {limit}s"
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            from minisweagent.exceptions import Submitted

            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config, "workdir": self.sandbox.workdir, **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"environment": {k: v for k, v in self.config.items()},
                                    "environment_type": f"{type(self).__module__}.{type(self).__name__}"}}}

    def close(self) -> None:
        """Close the sandbox this environment opened (a sandbox it was given stays open)."""
        if self._owned:
            self.sandbox.close()


def default_config() -> dict[str, Any]:
    """mini-swe-agent's own SWE-bench config, from the installed release."""
    _quiet_imports()
    import yaml
    from minisweagent.config import builtin_config_dir

    return yaml.safe_load((builtin_config_dir / CONFIG).read_text(encoding="utf-8"))


class MiniSweAgent:
    """``--harness mini-swe-agent``: its ``DefaultAgent`` with its SWE-bench config (or ``config``,
    a dict in the same shape, merged over it) in patchgym's process."""

    name = "mini-swe-agent"
    pattern = SANDBOX_AS_TOOL

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        _quiet_imports()
        self.version = installed_version()
        if self.version != TESTED_VERSION:
            log.warning("mini-swe-agent %s is installed; patchgym is tested with %s", self.version, TESTED_VERSION)
        from minisweagent.utils.serialize import recursive_merge

        self.config = recursive_merge(default_config(), config or {})

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "pattern": self.pattern, "config": CONFIG}

    def run(self, context: HarnessContext) -> HarnessResult:
        _quiet_imports()
        from minisweagent.agents.default import DefaultAgent

        config = copy.deepcopy(self.config)
        agent_config = {**config.get("agent", {}), "step_limit": context.max_turns, "output_path": None,
                        "wall_time_limit_seconds": max(1, int(context.deadline - time.monotonic()))}
        env_config = dict(config.get("environment", {}))
        env_vars = {k: v for k, v in (env_config.get("env") or {}).items() if k != "BASH_ENV"}
        environment = PatchgymEnvironment(sandbox=context.sandbox, env=env_vars,
                                          timeout=int(env_config.get("timeout", 60)),
                                          stopped=context.stopped, deadline=context.deadline)
        model = _proxy_model(config.get("model", {}), context)
        agent = DefaultAgent(model, environment, **agent_config)
        try:
            info = agent.run(task=context.problem_statement)
        except EpisodeStopped as exc:
            return HarnessResult(status="stopped", detail=str(exc), steps=environment.steps)
        except Exception as exc:  # the harness broke: graded as it stands, never raised out of the episode
            reason = context.stopped()
            if reason is not None:  # the proxy refused the call that raised: stopped, not crashed
                return HarnessResult(status="stopped", detail=reason, steps=environment.steps)
            return HarnessResult(status="crashed", detail=f"{type(exc).__name__}: {exc}"[:2000],
                                 steps=environment.steps)
        exit_status = str(info.get("exit_status") or "")
        # its own limits, set from the episode's: the deadline, and --max-turns as its step limit
        status = {"TimeExceeded": "timed_out", "LimitsExceeded": "out_of_turns"}.get(exit_status, "finished")
        return HarnessResult(status=status, exit_status=exit_status, steps=environment.steps)


def _proxy_model(model_config: dict[str, Any], context: HarnessContext) -> Any:
    """mini-swe-agent's litellm model, talking to the proxy, without retries of its own."""
    from minisweagent.models.litellm_model import LitellmModel

    class ProxiedLitellmModel(LitellmModel):
        abort_exceptions = [Exception]  # the proxy retried already; what reaches here is final

    kwargs = {**(model_config.get("model_kwargs") or {}), "api_base": context.base_url, "api_key": "patchgym-proxy"}
    settings = {k: v for k, v in model_config.items() if k not in ("model_name", "model_kwargs", "model_class")}
    return ProxiedLitellmModel(model_name=f"openai/{context.model}", model_kwargs=kwargs,
                               cost_tracking="ignore_errors", **settings)
