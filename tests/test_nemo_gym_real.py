"""End to end with the real NeMo Gym, 0.4.0 and 0.7.0: its launcher (``gym env start``: head server,
Ray, ``simple_agent``, ``openai_model``, and in 0.7.0 the environment server
``single_agent_turn_legacy``) and ``gym eval run --no-serve`` against ``patchgym serve
--max-sessions 2`` as the resources server, with a scripted model (see tests/nemo_gym_real.py for
how it is set up, tests/nemo_gym_root.py for the Debian roots, a loopback-only network namespace).

Opt-in: ``PATCHGYM_NEMO_GYM=1 python -m pytest tests/test_nemo_gym_real.py`` (root, debootstrap, ip,
chroot, unshare, bwrap; ``-k 0.7.0`` for one release). A cold run builds the roots from PyPI and the
Debian mirror (0.4.0 ~3 min, 0.7.0 ~8 min, 3.2 GB); a warm one takes ~1 min per release.
``PATCHGYM_NEMO_GYM_TREE=DIR`` runs another patchgym tree's server. The rewards asserted are those
of the rollout rows NeMo Gym writes; the closes those of patchgym's ``/metrics``.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests import nemo_gym_real as ng
from tests.nemo_gym_root import NEMO_GYM_04, NEMO_GYM_07

pytestmark = [
    pytest.mark.skipif(os.environ.get("PATCHGYM_NEMO_GYM") != "1",
                       reason="the real NeMo Gym end-to-end test runs only with PATCHGYM_NEMO_GYM=1"),
    pytest.mark.skipif(bool(ng.missing_requirements()),
                       reason=f"needs {', '.join(ng.missing_requirements()) or 'nothing'}"),
]

PARALLEL_ROWS = 5  # case (d): more rollouts than --max-sessions, all at once
MAX_SESSIONS = 2


@pytest.fixture(scope="module", params=[NEMO_GYM_04, NEMO_GYM_07], ids=lambda r: r.version)
def stack(request):
    with ng.Stack(release=request.param, max_sessions=MAX_SESSIONS, progress=print) as s:
        namespace, root = s.ns.name, str(s.run_dir)
        yield s
    # nothing of the run is left: its namespace (so its processes: all were killed first), its mounts
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert namespace not in namespaces, namespaces
    with open("/proc/self/mounts") as fh:
        assert not [line for line in fh if root in line]


def explain(stack: ng.Stack, c: ng.Collection) -> str:
    failures = [{k: f.get(k) for k in ("_ng_failure_class", "_ng_failure_message", "error", "reward") if k in f}
                for f in c.failures]
    return (f"gym eval run exit {c.returncode} in {c.seconds:.0f}s, rows {len(c.rows)}, failures {failures}\n"
            f"--- gym eval run ---\n{c.log[-5000:]}\n{stack.logs()}")


def test_init_config_validates_without_a_warning(stack):
    """`gym env validate` on what `patchgym nemo-gym init` wrote, with the model's config beside it."""
    code, out = stack.run_in_root("validate", ["gym", "env", "validate", *[f"--config={p}" for p in ng.CONFIG_PATHS]])
    assert code == 0 and "Config is valid" in out, out
    assert "DEPRECATED" not in out and "Warning" not in out and "WARNING" not in out, out


def test_oracle_tool_calls_reward_one(stack):
    c = stack.collect(["oracle"], parallel=1)
    assert c.rewards() == {"oracle": [1.0]}, explain(stack, c)
    row = c.rows[0]
    assert row["resolved"] is True and row["instance_id"] == ng.DEFAULT_INSTANCE
    assert row["mask_sample"] is False and row["failure_kind"] is None
    calls = [o["name"] for o in row["response"]["output"] if o.get("type") == "function_call"]
    assert calls == ["bash", "bash", "submit"]
    # the aggregate NeMo Gym wrote from patchgym's /aggregate_metrics, in NeMo Gym's own shape
    # (key_metrics: the mean/* entries of agent_metrics)
    assert c.metrics and c.metrics[0]["key_metrics"].get("mean/reward") == 1.0, c.metrics


def test_no_op_submit_reward_zero(stack):
    c = stack.collect(["noop"], parallel=1)
    assert c.rewards() == {"noop": [0.0]}, explain(stack, c)
    assert c.rows[0]["resolved"] is False and c.rows[0]["mask_sample"] is False


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


def test_nemo_gyms_session_contract_check_passes(stack):
    """NeMo Gym 0.7.0's check_resources_session_contract, through the running server's routes."""
    if stack.release is NEMO_GYM_04:
        pytest.skip("NeMo Gym 0.4.0 has no session contract (nor check_resources_session_contract)")
    code, out = stack.check_session_contract()
    assert code == 0 and "check_resources_session_contract: passed" in out, out


def test_every_episode_was_closed_by_its_caller(stack):
    """Last of the module: no session of the run was left to the idle TTL. With 0.7.0 every one was
    closed by its environment server's /close_session; 0.4.0 never sends one, so /verify closes."""
    metrics = stack.patchgym_metrics()

    def count(name: str, **labels: str) -> float:
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return metrics.get(f"{name}{{{inner}}}", 0.0)

    created = count("patchgym_sessions_created_total", protocol="nemo_gym")
    closed = {reason: count("patchgym_sessions_closed_total", protocol="nemo_gym", reason=reason)
              for reason in ("client", "graded", "idle", "failure")}
    assert created >= 3 + PARALLEL_ROWS, metrics  # oracle, no-op, unknown tool, the parallel batch
    assert metrics["patchgym_sessions_active"] == 0.0, metrics
    expected = "client" if stack.release is NEMO_GYM_07 else "graded"
    assert closed == {**dict.fromkeys(closed, 0.0), expected: created}, (created, closed)
