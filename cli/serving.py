"""Serving the environments: ``patchgym serve`` (HTTP: the native API, NeMo Gym's and OpenEnv's
routes), ``patchgym nemo-gym init`` (the server directory NeMo Gym's launcher runs) and ``patchgym
tasks nemo-gym-dataset`` (tasks as NeMo Gym dataset rows)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from patchgym.cli.common import (
    BackendOpt,
    InstanceIdsOpt,
    PriceCoreHourOpt,
    PriceGbHourOpt,
    RayAddressOpt,
    RaySandboxOpt,
    TasksOpt,
    backend_options,
    fail,
    load_tasks,
    out,
    prices,
)


def serve(
    host: Annotated[str, typer.Option("--host", help="Address to bind (non-loopback needs --token).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8000,
    backend: BackendOpt = "local",
    tasks: TasksOpt = None,
    max_sessions: Annotated[int, typer.Option("--max-sessions", min=1, help="Sessions open at once.")] = 32,
    token: Annotated[list[str] | None, typer.Option(
        "--token", envvar="PATCHGYM_SERVER_TOKEN",
        help="Bearer token clients must send (repeat for several; env PATCHGYM_SERVER_TOKEN).")] = None,
    idle_ttl: Annotated[float, typer.Option("--idle-ttl", min=1, help="Close sessions idle this long (s).")] = 900,
    operation_timeout: Annotated[float, typer.Option(
        "--operation-timeout", min=1, help="Deadline of one reset, step or verification (s).")] = 1800,
    seed_wait: Annotated[float, typer.Option(
        "--seed-wait", min=0, help="How long a NeMo Gym /seed_session on a full server waits for a free "
                                   "session (s); its agent does not retry. The native API answers 429 at once.")] = 600,
    nemo_gym_idle_ttl: Annotated[float, typer.Option(
        "--nemo-gym-idle-ttl", min=1, help="Close NeMo Gym sessions idle this long (s): a rollout its agent "
                                           "abandoned frees its slot. Keep it above the longest model turn.")] = 300,
    max_steps: Annotated[int, typer.Option("--max-steps", min=1, help="Steps before an episode is truncated.")] = 50,
    time_limit: Annotated[float | None, typer.Option("--time-limit", min=1, help="Seconds per episode.")] = None,
    model_endpoint: Annotated[list[str] | None, typer.Option(
        "--model-endpoint", help="A model API root /v1/rollouts may call (repeat); none: it calls none.")] = None,
    command_timeout: Annotated[float, typer.Option(
        "--command-timeout", min=1, help="Deadline of one bash command (s).")] = 120,
    output_limit: Annotated[int, typer.Option(
        "--output-limit", min=256, help="Characters of command output kept per step.")] = 16_000,
    ray_address: RayAddressOpt = None,
    ray_sandbox: RaySandboxOpt = "local",
    price_core_hour: PriceCoreHourOpt = None,
    price_gb_hour: PriceGbHourOpt = None,
) -> None:
    """Serve the environments over HTTP: the native /v1 API, NeMo Gym's resources-server routes and
    OpenEnv's routes, over one set of bounded sessions."""
    import ipaddress

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not token:
        fail(f"refusing to serve on {host} without a token: anyone who can reach it could run code in "
              "its sandboxes; pass --token (or PATCHGYM_SERVER_TOKEN), or bind 127.0.0.1")
    import uvicorn

    from patchgym.server.app import create_app  # lazily: the layers below know nothing of HTTP

    env_options = {"max_steps": max_steps, "time_limit": time_limit, "command_timeout": command_timeout,
                   "output_limit": output_limit, "prices": prices(price_core_hour, price_gb_hour)}
    if backend == "ray" or ray_address:
        env_options["sandbox_options"] = backend_options(backend, ray_address=ray_address, ray_sandbox=ray_sandbox)
    try:
        api = create_app(tasks=load_tasks(tasks), backend=backend, max_sessions=max_sessions, token=token or None,
                         idle_ttl=idle_ttl, operation_timeout=operation_timeout, env_options=env_options,
                         seed_wait=seed_wait, rollout_idle_ttl=nemo_gym_idle_ttl,
                         model_endpoints=model_endpoint or ())
    except ValueError as exc:
        fail(str(exc))
    # In-flight requests get a short grace on shutdown; then the lifespan closes every sandbox.
    # Keep-alive well past clients' own idle expiry (httpx: 5 s, aiohttp: 15 s): when both sides
    # expire an idle connection at the same moment, a request sent on it fails mid-flight.
    uvicorn.run(api, host=host, port=port, log_level=os.environ.get("PATCHGYM_LOG", "info").lower(),
                timeout_graceful_shutdown=10, timeout_keep_alive=75)


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


def nemo_gym_dataset(
    output: Annotated[Path, typer.Option("--output", help="JSONL file to write.")],
    tasks: TasksOpt = None,
    instance_ids: InstanceIdsOpt = None,
    agent_name: Annotated[str | None, typer.Option(
        "--agent-name", help="NeMo Gym agent to route every row to (adds agent_ref).")] = None,
) -> None:
    """Write tasks as NeMo Gym dataset rows (prompt, tools, instance_id; never the answers), for a
    NeMo Gym agent whose resources server is `patchgym serve`."""
    from patchgym.server.nemo_gym.dataset import nemo_gym_dataset_rows  # lazily: the layers below know nothing of HTTP

    task_set = load_tasks(tasks, instance_ids)
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", encoding="utf-8") as f:
        for row in nemo_gym_dataset_rows(task_set, agent_name=agent_name):
            f.write(json.dumps(row) + "\n")
    out.print(f"wrote {len(task_set)} NeMo Gym rows to {output}")
