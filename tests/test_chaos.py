"""The CI subset of the chaos test (:mod:`tests.chaos`): one small task, a couple of SIGKILLs at
seeded random moments, then a completed run. It asserts what must hold wherever the kills land
(a clean report, nothing left), never how long anything took, so load changes only where the
kills land, not the verdict (shorter waits are tried until a round is killed). The full driver (18 tasks, 10 rounds, both backends) is run by hand:
see docs/crash_safety.md."""

from __future__ import annotations

import os

import pytest

from patchgym.sandboxes.lifetime import setpriv_path
from tests.chaos import chaos

pytestmark = pytest.mark.skipif(setpriv_path() is None, reason="setpriv (util-linux) is not installed")


# Longest waits before a kill, tried in turn until a round is killed: once a round finishes first,
# the command has nothing left to do and later rounds cannot be killed, and how long the first
# round takes depends on the machine. The last wait ends the command while Python still starts it.
DELAYS = (3.0, 1.0, 0.3)


def _chaos_until_killed(tmp_path, **kwargs):
    outcomes = []
    for max_delay in DELAYS:
        outcome = chaos(rounds=2, max_delay=max_delay, min_delay=max_delay / 4, seed=22,
                        work=tmp_path / f"wait-{max_delay}", workers=1, timeout=600, **kwargs)
        assert outcome.ok, outcome
        outcomes.append(outcome.rounds)
        if any("killed" in r for r in outcome.rounds):
            return
    pytest.fail(f"no round was killed: {outcomes}")


@pytest.mark.parametrize("command", ["eval", "run"])
def test_killed_local_runs_complete_clean_and_leave_nothing(command, calc_tasks_file, tmp_path):
    _chaos_until_killed(tmp_path, command=command, backend="local", tasks=calc_tasks_file)


def test_a_killed_docker_eval_completes_clean_and_leaves_nothing(docker_base, calc_tasks_file, tmp_path,
                                                                 monkeypatch):
    from patchgym.sandboxes.docker.client import docker_client

    namespace = f"chaos-{os.urandom(4).hex()}"
    monkeypatch.setenv("PATCHGYM_DOCKER_NAMESPACE", namespace)
    try:
        _chaos_until_killed(tmp_path, command="eval", backend="docker", tasks=calc_tasks_file)
    finally:  # the runtime volume (and its marker) this namespace made
        for volume in docker_client().volumes.list(filters={"name": f"patchgym-runtime-{namespace}-"}):
            volume.remove(force=True)
