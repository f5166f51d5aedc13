"""The examples run as documented."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_oracle_agent_resolves_every_bundled_task_through_the_editor():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "oracle_agent.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, env=os.environ.copy())
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    total = len([line for line in lines if line.startswith("patchgym__")])
    assert total >= 15 and lines[-1] == f"resolved {total}/{total}"


def test_oracle_agent_resolves_every_served_task_through_remote_env(calc_tasks_file):
    """``--url`` runs the same oracle over HTTP (patchgym/Remote-v0). The server's output limit is
    tiny here, so whole-file reads come back cut and the oracle must read in chunks."""
    from patchgym.server.app import create_app
    from tests.serving import serve

    oracle = [sys.executable, str(ROOT / "examples" / "oracle_agent.py"), "--tasks", str(calc_tasks_file)]
    app = create_app(tasks=calc_tasks_file, token="s3cret", env_options={"output_limit": 256})
    with serve(app) as url:
        proc = subprocess.run([*oracle, "--url", url, "--token", "s3cret"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env=os.environ.copy())
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        lines = proc.stdout.strip().splitlines()
        assert lines[0].startswith("fixture__calc-1: resolved (reward 1,") and lines[-1] == "resolved 1/1"
        assert len(app.state.manager) == 0  # RemoteEnv.close deleted its session
        refused = subprocess.run([*oracle, "--url", url, "--token", "s3cret", "--instance-ids", "nope"], cwd=ROOT,
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "does not serve nope" in refused.stderr
        unauthorized = subprocess.run([*oracle, "--url", url], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert unauthorized.returncode == 2 and "401" in unauthorized.stderr
