"""A plain ``pip install`` (no extras) serves every protocol the README names: the wheel goes into
a fresh venv (``plain_venv``, conftest.py), its ``patchgym serve`` runs, and openenv-core's
GenericEnvClient (from the test environment) drives an episode over ``/ws`` while NeMo Gym's and the native routes answer too.
Runtime dependencies that only the test extra brought in (websockets, once) fail here."""

from __future__ import annotations

import os
import signal
import subprocess

import httpx
from conftest import pip_into

from tests.serving import free_port, wait_healthy
from tests.test_openenv import generic_client_class
from tests.test_server import TASK, apply_via_bash


def test_a_plain_install_serves_openenv_over_websockets(plain_venv, calc_tasks_file, calc_task, tmp_path):
    listed = subprocess.run(pip_into(plain_venv, "list", "--format=freeze"), capture_output=True, text=True,
                            check=True).stdout
    assert "pytest==" not in listed and "openenv" not in listed, "the venv must hold no test extra"
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([str(plain_venv / "bin" / "patchgym"), "serve", "--port", str(port), "--tasks",
                               str(calc_tasks_file), "--max-sessions", "2"], stdout=log, stderr=subprocess.STDOUT,
                              cwd=tmp_path, start_new_session=True, env={**os.environ, "PATCHGYM_LOG": "warning"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, lambda: server.poll() is None, timeout=60, why=(tmp_path / "serve.log").read_text)
        GenericEnvClient = generic_client_class()
        with GenericEnvClient(base_url=url, message_timeout_s=300).sync() as env:
            obs = env.reset(task_id=TASK).observation
            assert obs["instance_id"] == TASK and calc_task.problem_statement in obs["output"]
            env.step(apply_via_bash(calc_task.patch))
            result = env.step({"name": "submit", "arguments": {}})
            assert result.done and result.reward == 1.0
        with httpx.Client(base_url=url, timeout=120) as http:  # the other protocols of the same install
            assert http.post("/seed_session", json={"instance_id": TASK}).status_code == 200
            assert http.get("/v1/tasks").json()[0]["instance_id"] == TASK
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
