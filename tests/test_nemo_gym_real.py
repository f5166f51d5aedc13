"""End to end with the real NeMo Gym 0.4.0: its ``ng_run`` (head server, Ray, ``simple_agent``,
``openai_model``) and ``ng_collect_rollouts`` against ``patchgym serve --max-sessions 2`` as the
resources server, with a scripted model (see tests/nemo_gym_real.py for how it is set up: a Debian
trixie root for Python 3.13, a loopback-only network namespace).

Opt-in: ``PATCHGYM_NEMO_GYM=1 python -m pytest tests/test_nemo_gym_real.py`` (root, debootstrap, ip,
chroot, unshare, bwrap; the first run builds the root from PyPI and the Debian mirror, ~3 min;
a warm run takes ~1 min). ``PATCHGYM_NEMO_GYM_TREE=DIR`` runs another patchgym tree's server.
The rewards asserted are those of the rollout rows NeMo Gym writes.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests import nemo_gym_real as ng

pytestmark = [
    pytest.mark.skipif(os.environ.get("PATCHGYM_NEMO_GYM") != "1",
                       reason="the real NeMo Gym end-to-end test runs only with PATCHGYM_NEMO_GYM=1"),
    pytest.mark.skipif(bool(ng.missing_requirements()),
                       reason=f"needs {', '.join(ng.missing_requirements()) or 'nothing'}"),
]

PARALLEL_ROWS = 5  # case (d): more rollouts than --max-sessions, all at once
MAX_SESSIONS = 2


@pytest.fixture(scope="module")
def stack():
    with ng.Stack(max_sessions=MAX_SESSIONS, progress=print) as s:
        namespace, root = s.ns.name, str(s.root)
        yield s
    # nothing of the run is left: its namespace (so its processes: all were killed first), its mounts
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert namespace not in namespaces, namespaces
    with open("/proc/self/mounts") as fh:
        assert not [line for line in fh if root in line]


def explain(stack: ng.Stack, c: ng.Collection) -> str:
    failures = [{k: f.get(k) for k in ("_ng_failure_class", "error", "reward") if k in f} for f in c.failures]
    return (f"ng_collect_rollouts exit {c.returncode} in {c.seconds:.0f}s, rows {len(c.rows)}, failures {failures}\n"
            f"--- ng_collect_rollouts ---\n{c.log[-5000:]}\n{stack.logs()}")


def test_oracle_tool_calls_reward_one(stack):
    c = stack.collect(["oracle"], parallel=1)
    assert c.rewards() == {"oracle": [1.0]}, explain(stack, c)
    row = c.rows[0]
    assert row["resolved"] is True and row["instance_id"] == ng.DEFAULT_INSTANCE
    calls = [o["name"] for o in row["response"]["output"] if o.get("type") == "function_call"]
    assert calls == ["bash", "bash", "submit"]
    # the aggregate NeMo Gym wrote from patchgym's /aggregate_metrics, in NeMo Gym's own shape
    # (key_metrics: the mean/* entries of agent_metrics)
    assert c.metrics and c.metrics[0]["agent_ref"]["name"] == ng.AGENT_NAME, c.metrics
    assert c.metrics[0]["key_metrics"].get("mean/reward") == 1.0, c.metrics


def test_no_op_submit_reward_zero(stack):
    c = stack.collect(["noop"], parallel=1)
    assert c.rewards() == {"noop": [0.0]}, explain(stack, c)
    assert c.rows[0]["resolved"] is False


def test_more_rollouts_than_sessions_every_row_written(stack):
    markers = ["oracle", "noop"] * (PARALLEL_ROWS // 2) + ["oracle"] * (PARALLEL_ROWS % 2)
    c = stack.collect(markers, parallel=PARALLEL_ROWS)
    assert c.returncode == 0 and len(c.rows) == PARALLEL_ROWS and not c.failures, explain(stack, c)
    rewards = c.rewards()
    assert rewards["oracle"] == [1.0] * markers.count("oracle"), explain(stack, c)
    assert rewards["noop"] == [0.0] * markers.count("noop"), explain(stack, c)
    mean = markers.count("oracle") / len(markers)
    assert c.metrics and c.metrics[0]["key_metrics"].get("mean/reward") == pytest.approx(mean), c.metrics


def test_unknown_tool_then_oracle_reward_one(stack):
    c = stack.collect(["unknown_then_oracle"], parallel=1)
    assert c.rewards() == {"unknown_then_oracle": [1.0]}, explain(stack, c)
    out = c.rows[0]["response"]["output"]
    calls = [o["name"] for o in out if o.get("type") == "function_call"]
    assert calls == ["no_such_tool", "bash", "bash", "submit"]
    # the unknown tool's answer reached the model as a tool output, and the session went on
    first = next(o for o in out if o.get("type") == "function_call_output")
    assert first["output"].strip(), out
