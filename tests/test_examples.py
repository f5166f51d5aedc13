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


def test_oracle_agent_refuses_remote_mode_for_now():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "oracle_agent.py"), "--url", "http://127.0.0.1:1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not available yet" in proc.stderr
