"""``patchgym nemo-gym``: patchgym as a NeMo Gym resources server: ``init`` writes the server
directory (entry point, dataset, config) NeMo Gym's launcher starts it from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from patchgym.cli.common import BackendOpt, TasksOpt, fail, load_tasks, out


def nemo_gym_init(
    directory: Annotated[Path, typer.Argument(
        help="Where NeMo Gym will start: resources_servers/patchgym/ goes here.")],
    tasks: TasksOpt = None,
    instance_ids: Annotated[list[str] | None, typer.Option(
        "--instance-ids", help="Dataset rows for these ids only (repeat, or comma-separate).")] = None,
    agent_name: Annotated[str, typer.Option("--agent-name", help="Name of the simple_agent entry.")] = "patchgym_agent",
    model_server: Annotated[str, typer.Option(
        "--model-server", help="Name of the responses_api_models entry the agent uses.")] = "policy_model",
    external: Annotated[bool, typer.Option(
        "--external", help="patchgym serve already runs at --host/--port: NeMo Gym only checks on it.")] = False,
    host: Annotated[str | None, typer.Option("--host", help="Address of the patchgym server.")] = None,
    port: Annotated[int | None, typer.Option("--port", min=1, max=65535,
                                             help="Its port (default: one NeMo Gym picks).")] = None,
    backend: BackendOpt = "local",
    max_sessions: Annotated[int, typer.Option("--max-sessions", min=1, help="Sessions open at once.")] = 32,
    serve_arg: Annotated[list[str] | None, typer.Option(
        "--serve-arg", help="One more argument for `patchgym serve` (repeat).")] = None,
    license_name: Annotated[str, typer.Option(
        "--license", help="The dataset's license (NeMo Gym requires one).")] = "TBD",
    max_steps: Annotated[int, typer.Option("--max-steps", min=1, help="simple_agent's model turns.")] = 100,
    nemo_gym_version: Annotated[str, typer.Option(
        "--nemo-gym-version", help="0.7: NeMo Gym 0.7.0 and later (an environment server runs each episode); "
                                   "0.4: NeMo Gym 0.4.0.")] = "0.7",
) -> None:
    """Write a NeMo Gym server directory for patchgym (entry point, dataset, config) that NeMo Gym
    accepts as it is; then start it from DIRECTORY with the commands it prints."""
    from patchgym.server.nemo_gym.setup import (  # lazily: the layers below know nothing of HTTP
        ServerDirOptions,
        write_server_dir,
    )

    task_set = load_tasks(tasks, instance_ids)
    serve_args = ["--backend", backend, "--max-sessions", str(max_sessions)]
    if tasks is not None:
        serve_args += ["--tasks", str(Path(tasks).resolve())]
    options = ServerDirOptions(agent_name=agent_name, model_server=model_server, host=host, port=port,
                               external=external, serve_args=serve_args + list(serve_arg or []),
                               license=license_name, max_steps=max_steps, nemo_gym_version=nemo_gym_version)
    try:
        config = write_server_dir(directory, task_set, options)
    except ValueError as exc:
        fail(str(exc))
    data = config.parent.parent / "data" / "train.jsonl"
    out.print(f"wrote {directory / config} and {len(task_set)} dataset row(s); then, in {directory}:")
    commands = [  # the same in NeMo Gym 0.4.0 and 0.7.0, whose older ng_run and ng_collect_rollouts are deprecated
        f"gym env start --config {config} --config <your model server config>",
        *(["mkdir -p results"] if nemo_gym_version == "0.4" else []),  # 0.7.0 makes it itself
        f"gym eval run --no-serve --agent {agent_name} --input {data} --output results/patchgym_rollouts.jsonl",
    ]
    for command in commands:
        out.print(f"  {command}", markup=False, highlight=False, soft_wrap=True)
