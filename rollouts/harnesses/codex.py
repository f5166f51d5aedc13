"""Codex CLI (npm ``@openai/codex``, OpenAI's coding agent, a harness NeMo Gym trains through), agent in
sandbox: ``patchgym run --harness codex``.

The npm package carries Codex's binary (static, musl: it runs in any Linux sandbox image). It is
installed once per version on this host (:mod:`.npm_install`) and bound read-only into the agent's
sandbox at :data:`SANDBOX_DIR`; no sandbox needs Node.js or a network. Inside, the launcher of
:mod:`.bridge` starts ``codex exec`` at the repository root with the bug report as its prompt and a
generated ``config.toml`` (in a ``CODEX_HOME`` under the sandbox's temporary directory, never the
workspace) whose one model provider is the recording proxy, through the launcher's loopback relay:

- ``wire_api = "responses"``: Codex speaks only the Responses API (``"chat"`` was removed), streamed;
  the proxy answers with the events the OpenAI API sends (:mod:`patchgym.rollouts.streaming`);
- no retries of its own (the proxy has retried), a stream idle timeout as long as the episode (the
  proxy answers once the whole upstream call is done);
- its own sandbox and approvals off (``--dangerously-bypass-approvals-and-sandbox``: patchgym's
  sandbox is the boundary, and Codex's bubblewrap/seccomp cannot nest in it), and everything that
  would reach past the proxy or depend on the host off: web search, update checks, analytics,
  history, the multi-agent and code-mode tools.

``--harness-config FILE.yaml`` merges Codex settings over that config (e.g. ``model_reasoning_effort``,
``developer_instructions``); the provider stays the proxy's. Tested with :data:`TESTED_VERSION`;
``--harness codex@VERSION`` runs another release, and the run records the version that ran.
"""

from __future__ import annotations

import copy
import json
import platform
import re
import shlex
import time
from pathlib import Path
from typing import Any

from patchgym.rollouts.harnesses.base import HarnessContext, HarnessResult
from patchgym.rollouts.harnesses.bridge import bound_path
from patchgym.rollouts.harnesses.command import CommandHarness, fill
from patchgym.rollouts.harnesses.npm_install import npm_prefix

PACKAGE = "@openai/codex"
TESTED_VERSION = "0.171.0"
SANDBOX_DIR = "/run/patchgym-harness"  # where the sandbox sees the installed package's binaries
PROVIDER = "patchgym"
# npm's platform package and the Rust target its vendor directory is named after, by machine
ARM = ("linux-arm64", "aarch64-unknown-linux-musl")
TARGETS = {"x86_64": ("linux-x64", "x86_64-unknown-linux-musl"), "aarch64": ARM, "arm64": ARM}
# Started by the launcher with bash at the repository root; {codex}: where the binaries are bound,
# {idle_ms}: the episode's time left (the other placeholders are the command harness's).
SCRIPT = ('home="${TMPDIR:-/tmp}/.patchgym-codex"; export CODEX_HOME="$home/codex-home" TMPDIR="$home/tmp"; '
          'mkdir -p "$CODEX_HOME" "$TMPDIR" && cp {harness_dir}/config.toml "$CODEX_HOME/config.toml" && '
          'PATH={codex}/codex-path:$PATH exec {codex}/bin/codex exec --json --ephemeral --skip-git-repo-check '
          '--dangerously-bypass-approvals-and-sandbox --color never -C {workdir} -m {model} '
          '-c "model_providers.patchgym.base_url=\\"$OPENAI_BASE_URL\\"" '
          '-c model_providers.patchgym.stream_idle_timeout_ms={idle_ms} - < {task_file}')


def default_config() -> dict[str, Any]:
    """The ``config.toml`` patchgym gives Codex (the proxy's address is set when it starts)."""
    return {"model_provider": PROVIDER, "approval_policy": "never", "sandbox_mode": "danger-full-access",
            "web_search": "disabled", "check_for_update_on_startup": False, "analytics": {"enabled": False},
            "history": {"persistence": "none"}, "agents": {"enabled": False}, "features": {"code_mode": False}}


def provider() -> dict[str, Any]:
    """The one model provider: the recording proxy (the key is the sandbox's placeholder)."""
    return {"name": "patchgym recording proxy", "env_key": "OPENAI_API_KEY", "wire_api": "responses",
            "request_max_retries": 0, "stream_max_retries": 0}


class CodexHarness(CommandHarness):
    """``--harness codex[@VERSION]``: Codex CLI inside the sandbox; ``config`` (Codex settings) merged
    over :func:`default_config`. ``install``: install the release with npm when absent (else
    :class:`RuntimeError`, as a server does rather than download on a request)."""

    def __init__(self, config: dict[str, Any] | None = None, *, version: str = TESTED_VERSION,
                 install: bool = True) -> None:
        self.vendor = vendor_dir(npm_prefix(PACKAGE, version, install=install), version)
        self.settings = _merged(default_config(), config or {})
        self.settings["model_providers"] = {**(self.settings.get("model_providers") or {}), PROVIDER: provider()}
        self.settings["model_provider"] = PROVIDER  # whatever the config said: the proxy is the only way out
        super().__init__(SCRIPT, files={"config.toml": toml_text(self.settings).encode()}, name="codex",
                         version=installed_version(self.vendor))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "pattern": self.pattern, "package": PACKAGE,
                "config": self.settings}

    def sandbox_binds(self) -> dict[str, str]:
        return {str(self.vendor): SANDBOX_DIR}

    def command(self, context: HarnessContext, where: str) -> str:
        idle_ms = int(max(1.0, context.deadline - time.monotonic()) * 1000)
        codex = shlex.quote(bound_path(context.sandbox, self.vendor))
        return fill(self.template.replace("{codex}", codex).replace("{idle_ms}", str(idle_ms)), context, where)

    def summarize(self, ended: HarnessResult, output: str) -> HarnessResult:
        """Codex's own account (``--json`` events): the commands it ran, and how its turn ended."""
        steps, status = 0, None
        for line in output.splitlines():
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            kind, item = event.get("type"), event.get("item") or {}
            if kind == "item.completed" and isinstance(item, dict) and item.get("type") == "command_execution":
                steps += 1
            elif kind == "turn.completed":
                status = "completed"
            elif kind in ("turn.failed", "error"):
                error = event.get("error") or {}
                status = f"failed: {error.get('message') if isinstance(error, dict) else event.get('message')}"[:500]
        ended.steps, ended.exit_status = steps, status
        return ended


def vendor_dir(prefix: Path, version: str) -> Path:
    """The directory of Codex's binaries for this machine in an npm install (``bin/codex``,
    ``codex-path/rg``); RuntimeError when the install has none for it."""
    machine = platform.machine()
    if platform.system() != "Linux" or machine not in TARGETS:
        raise RuntimeError(f"Codex CLI runs in patchgym's sandboxes on Linux x86_64 or aarch64, not {machine}")
    package, target = TARGETS[machine]
    vendor = prefix / "node_modules" / "@openai" / f"codex-{package}" / "vendor" / target
    if not (vendor / "bin" / "codex").is_file():
        raise RuntimeError(f"{PACKAGE}@{version} in {prefix} has no binary for {target}")
    return vendor


def installed_version(vendor: Path) -> str:
    """The release the binaries are (their ``codex-package.json``; never by running them on the host)."""
    return str(json.loads((vendor / "codex-package.json").read_text(encoding="utf-8"))["version"])


def toml_text(data: dict[str, Any], prefix: str = "") -> str:
    """``data`` as TOML (tables of strings, numbers, booleans, lists and inline tables: what Codex's
    config holds). Strings are written as JSON writes them without escaping non-ASCII (JSON's
    surrogate pairs are not TOML), which TOML reads the same."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for key, value in data.items():
        if isinstance(value, dict):
            name = f"{prefix}.{_key(key)}" if prefix else _key(key)
            lines += ["", f"[{name}]", toml_text(value, name)]
    return "\n".join(lines).strip("\n") + "\n"


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"a Codex setting cannot be {type(value).__name__}: {value!r}")


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
