"""Git operations on an agent-controlled workspace, run *inside* the sandbox.

Git in an agent-controlled repository can run agent-chosen programs (hooks, fsmonitor, external
diff drivers, filters), so it never runs on the host: these helpers only use the sandbox protocol
and work with every backend.
"""

from __future__ import annotations

from .base import Sandbox, SandboxError

SAFE_GIT = ("git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c diff.external= "
            "-c core.pager=cat")
DIFF_LIMIT = 256 << 20


def workspace_diff(sandbox: Sandbox) -> str:
    """The workspace's change against the base commit, new files included.

    A throwaway index is used so the agent's own index (what it staged) is left alone.
    """
    script = (
        'export GIT_INDEX_FILE="$(mktemp -u)"; trap \'rm -f "$GIT_INDEX_FILE"\' EXIT; '
        f'out="$({SAFE_GIT} add -A . 2>&1)" || {{ echo "$out" | tail -20; exit 1; }}; '
        f"{SAFE_GIT} diff --cached --binary --no-color --no-ext-diff {sandbox.base_commit}"
    )
    result = sandbox.exec(script, timeout=300, output_limit=DIFF_LIMIT)
    if not result.ok or result.truncated:
        reason = "it is too large" if result.truncated else result.output[-2000:]
        raise SandboxError(f"could not compute the workspace diff: {reason}")
    return result.output
