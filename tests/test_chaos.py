"""The CI subset of the chaos test (:mod:`tests.chaos`): one small task, a couple of SIGKILLs at
seeded random moments, then a completed run. It asserts what must hold wherever the kills land
(a clean report, nothing left), never how long anything took, so load changes only where the
kills land, not the verdict. The full driver (18 tasks, 10 rounds, both backends) is run by hand:
see docs/crash_safety.md."""

from __future__ import annotations

import os

import pytest

from sandboxes.lifetime import setpriv_path
from tests.chaos import chaos

pytestmark = pytest.mark.skipif(setpriv_path() is None, reason="setpriv (util-linux) is not installed")


@pytest.mark.parametrize("command", ["eval", "run"])
def test_killed_local_runs_complete_clean_and_leave_nothing(command, calc_tasks_file, tmp_path):
    outcome = chaos(command=command, backend="local", rounds=2, max_delay=8.0, min_delay=1.0, seed=22,
                    work=tmp_path, tasks=calc_tasks_file, workers=1, timeout=600)
    assert outcome.ok, outcome
    assert any("killed" in r for r in outcome.rounds), outcome.rounds


def test_a_killed_docker_eval_completes_clean_and_leaves_nothing(docker_base, calc_tasks_file, tmp_path,
                                                                 monkeypatch):
    from sandboxes.docker.client import docker_client

    namespace = f"chaos-{os.urandom(4).hex()}"
    monkeypatch.setenv("PATCHGYM_DOCKER_NAMESPACE", namespace)
    try:
        outcome = chaos(command="eval", backend="docker", rounds=2, max_delay=3.0, min_delay=0.5, seed=22,
                        work=tmp_path, tasks=calc_tasks_file, workers=1, timeout=600)
    finally:  # the runtime volume (and its marker) this namespace made
        for volume in docker_client().volumes.list(filters={"name": f"patchgym-runtime-{namespace}-"}):
            volume.remove(force=True)
    assert outcome.ok, outcome
    assert any("killed" in r for r in outcome.rounds), outcome.rounds
