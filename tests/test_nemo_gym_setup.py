"""`patchgym nemo-gym init`: the server directory NeMo Gym's `ng_run` runs patchgym from, and its
entry point started the way `ng_run` starts one (its config in the environment, SIGINT to stop).
The real `ng_run` against it: tests/test_nemo_gym_real.py (opt-in)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.server.app import create_app
from patchgym.server.nemo_gym.setup import LICENSES
from tests.serving import free_port, serve, wait_healthy
from tests.test_server import TASK


def init(tmp_path: Path, *args: str) -> tuple[dict, Path]:
    result = CliRunner().invoke(app, ["nemo-gym", "init", str(tmp_path), *args])
    assert result.exit_code == 0, result.output
    directory = tmp_path / "resources_servers" / "patchgym"
    return yaml.safe_load((directory / "configs" / "patchgym.yaml").read_text()), directory


def launch(directory: Path, config: dict, log: Path) -> subprocess.Popen:
    """app.py as ng_run starts it: in the server's directory, the merged config in its environment."""
    env = {**os.environ, "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config),
           "NEMO_GYM_CONFIG_PATH": "patchgym_resources_server", "PATCHGYM_LOG": "warning"}
    return subprocess.Popen([sys.executable, "app.py"], cwd=directory, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def test_init_writes_what_ng_run_requires(calc_tasks_file, tmp_path):
    config, directory = init(tmp_path, "--tasks", str(calc_tasks_file), "--max-sessions", "3")
    server = config["patchgym_resources_server"]["resources_servers"]["patchgym"]
    assert server["entrypoint"] == "app.py" and server["domain"] == "coding"  # both required by ng_run 0.4.0
    assert server["serve_args"] == ["--backend", "local", "--max-sessions", "3", "--tasks", str(calc_tasks_file)]
    assert server["patchgym_command"][0] == sys.executable and "external" not in server
    agent = config["patchgym_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["resources_server"] == {"type": "resources_servers", "name": "patchgym_resources_server"}
    (dataset,) = agent["datasets"]
    assert dataset["type"] == "train" and dataset["license"] in LICENSES  # a train set needs a license
    rows = [json.loads(line) for line in (tmp_path / dataset["jsonl_fpath"]).read_text().splitlines()]
    assert [r["instance_id"] for r in rows] == [TASK] and rows[0]["agent_ref"]["name"] == "patchgym_agent"
    assert (directory / "requirements.txt").exists()  # ng_run builds the server's venv from it
    assert "patch" not in rows[0] and "FAIL_TO_PASS" not in json.dumps(rows[0])
    # NeMo Gym 0.7.0's environment server in front of the agent: typed sessions, each closed by it
    env = config["patchgym_environment_server"]["environment_servers"]["single_agent_turn_legacy"]
    assert env["agent_server"] == {"type": "responses_api_agents", "name": "patchgym_agent"}
    assert env["resources_server"] == agent["resources_server"] and env["resources_tool_transports"] == ["direct_http"]


def test_init_for_nemo_gym_04_writes_no_environment_server(tmp_path):
    """0.4.0 starts every entry of a config, and has no environment_servers to start."""
    result = CliRunner().invoke(app, ["nemo-gym", "init", str(tmp_path), "--nemo-gym-version", "0.4"])
    assert result.exit_code == 0, result.output
    assert "mkdir -p results" in result.output and "gym eval run --no-serve" in result.output
    config = yaml.safe_load((tmp_path / "resources_servers/patchgym/configs/patchgym.yaml").read_text())
    assert set(config) == {"patchgym_resources_server", "patchgym_agent"}


@pytest.mark.parametrize("args, message", [(["--license", "WTFPL"], "accepts no dataset license"),
                                           (["--external"], "needs its --port"),
                                           (["--nemo-gym-version", "0.5"], "no config for NeMo Gym 0.5")])
def test_init_refuses_what_ng_run_would_reject(tmp_path, args, message):
    result = CliRunner().invoke(app, ["nemo-gym", "init", str(tmp_path), *args])
    assert result.exit_code != 0 and message in result.output


def test_the_entry_point_runs_patchgym_serve_and_stops_on_sigint(calc_tasks_file, tmp_path):
    config, directory = init(tmp_path, "--tasks", str(calc_tasks_file))
    port = free_port()
    entry = config["patchgym_resources_server"]["resources_servers"]["patchgym"]
    entry.update(host="127.0.0.1", port=port)  # what ng_run fills in
    log = tmp_path / "app.log"
    process = launch(directory, config, log)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", lambda: process.poll() is None, timeout=60, why=log.read_text)
        seeded = httpx.post(f"http://127.0.0.1:{port}/seed_session", json={"instance_id": TASK}, timeout=120)
        assert seeded.status_code == 200 and seeded.json() == {"instance_id": TASK}
        process.send_signal(signal.SIGINT)  # ng_run's shutdown
        assert process.wait(timeout=60) is not None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert "patchgym: " in log.read_text()


def test_an_external_entry_point_lives_as_long_as_the_server(calc_tasks_file, tmp_path):
    log = tmp_path / "app.log"
    with serve(create_app(tasks=calc_tasks_file)) as url:
        config, directory = init(tmp_path, "--external", "--port", url.rsplit(":", 1)[1])
        config["patchgym_resources_server"]["resources_servers"]["patchgym"]["gone_after"] = 1
        process = launch(directory, config, log)
        time.sleep(3)
        assert process.poll() is None, log.read_text()
    try:
        assert process.wait(timeout=30) == 1, "it must exit once the server is gone"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert "has not answered" in log.read_text()
