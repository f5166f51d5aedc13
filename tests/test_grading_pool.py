"""Grading off the serving path: a server with grading workers grades submits and /verify in
worker processes with a CPU share of their own, the same grades as in-process (issue 38)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from patchgym.server.app import create_app
from patchgym.server.grading_pool import GradingPool
from tests.serving import serve
from tests.test_server import SUBMIT, TASK, apply_via_bash, create


def test_submits_and_verify_are_graded_by_workers_with_a_cpu_share_of_their_own(calc_tasks_file, calc_task):
    app = create_app(tasks=calc_tasks_file, env_options={"grading_workers": 1, "grading_cpu_share": 1000})
    pool = app.state.service.grader
    assert isinstance(pool, GradingPool)
    try:
        with serve(app) as url, httpx.Client(base_url=url, timeout=300) as http:
            sid = create(http)["session_id"]
            assert http.post(f"/v1/sessions/{sid}/step", json={"action": apply_via_bash(calc_task.patch)}).json()[
                "observation"] is not None
            done = http.post(f"/v1/sessions/{sid}/step", json={"action": SUBMIT}).json()
            assert done["terminated"] and done["reward"] == 1.0 and done["info"]["resolved"], done["info"]
            empty = http.post("/v1/verify", json={"instance_id": TASK, "patch": ""}).json()
            assert empty["resolved"] is False and not empty["infrastructure_failure"], empty
            (worker,) = [w.proc.pid for w in pool._all]
            assert worker != os.getpid()
            if pool.group is not None:  # root with a cpu controller, as in CI
                assert str(worker) in (pool.group / "cgroup.procs").read_text().split()
                shares = (pool.group / "cpu.shares")
                assert not shares.exists() or int(shares.read_text()) == 1000 * (os.cpu_count() or 1)
                assert f"patchgym-serving-{os.getpid()}" in Path("/proc/self/cgroup").read_text()
    finally:
        pool.close()
    assert pool.group is None or not pool.group.exists()
    assert f"patchgym-serving-{os.getpid()}" not in Path("/proc/self/cgroup").read_text()
