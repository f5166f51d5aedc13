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


# One ``gym eval run`` per release carries every scripted case, more rows than --max-sessions at once
# (each case was its own run: ~20 s of launcher and model start per run and release).
MARKERS = ["oracle", "noop", "unknown_then_oracle", "oracle", "noop"]
assert len(MARKERS) > MAX_SESSIONS


@pytest.fixture(scope="module")
def rollouts(stack) -> ng.Collection:
    c = stack.collect(MARKERS, parallel=len(MARKERS))
    assert c.returncode == 0 and len(c.rows) == len(MARKERS) and not c.failures, explain(stack, c)
    return c


def _row(c: ng.Collection, marker: str) -> dict:
    return next(row for row in c.rows if ng.marker_of(row) == marker)


def _calls(row: dict) -> list[str]:
    return [o["name"] for o in row["response"]["output"] if o.get("type") == "function_call"]


def test_oracle_tool_calls_reward_one(stack, rollouts):
    assert rollouts.rewards()["oracle"] == [1.0] * MARKERS.count("oracle"), explain(stack, rollouts)
    row = _row(rollouts, "oracle")
    assert row["resolved"] is True and row["instance_id"] == ng.DEFAULT_INSTANCE
    assert row["mask_sample"] is False and row["failure_kind"] is None
    assert _calls(row) == ["bash", "bash", "submit"]


def test_no_op_submit_reward_zero(stack, rollouts):
    assert rollouts.rewards()["noop"] == [0.0] * MARKERS.count("noop"), explain(stack, rollouts)
    row = _row(rollouts, "noop")
    assert row["resolved"] is False and row["mask_sample"] is False


def test_the_aggregate_is_written_in_nemo_gyms_shape(rollouts):
    """What NeMo Gym wrote from patchgym's /aggregate_metrics (key_metrics: the mean/* entries of
    agent_metrics): the mean reward of the rows."""
    mean = sum(1.0 for m in MARKERS if m != "noop") / len(MARKERS)
    assert rollouts.metrics and rollouts.metrics[0]["key_metrics"].get("mean/reward") == pytest.approx(mean), \
        rollouts.metrics


def test_unknown_tool_then_oracle_reward_one(stack, rollouts):
    assert rollouts.rewards()["unknown_then_oracle"] == [1.0], explain(stack, rollouts)
    out = _row(rollouts, "unknown_then_oracle")["response"]["output"]
    assert _calls(_row(rollouts, "unknown_then_oracle")) == ["no_such_tool", "bash", "bash", "submit"]
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
    assert created >= len(MARKERS), metrics
    assert metrics["patchgym_sessions_active"] == 0.0, metrics
    expected = "client" if stack.release is NEMO_GYM_07 else "graded"
    assert closed == {**dict.fromkeys(closed, 0.0), expected: created}, (created, closed)
