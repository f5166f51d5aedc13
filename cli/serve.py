"""``patchgym serve``: the environments over HTTP (the native /v1 API, NeMo Gym's resources-server
routes and OpenEnv's routes) for trainers and agents in other processes or on other hosts."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from patchgym.cli.common import (
    BackendOpt,
    PriceCoreHourOpt,
    PriceGbHourOpt,
    RayAddressOpt,
    RaySandboxOpt,
    TamperingRewardOpt,
    TasksOpt,
    backend_options,
    fail,
    load_tasks,
    prices,
)


def serve(
    host: Annotated[str, typer.Option("--host", help="Address to bind (non-loopback needs --token).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8000,
    backend: BackendOpt = "local",
    tasks: TasksOpt = None,
    max_sessions: Annotated[int, typer.Option("--max-sessions", min=1, help="Sessions open at once.")] = 32,
    max_sessions_per_token: Annotated[int | None, typer.Option(
        "--max-sessions-per-token", min=1, help="Sessions (and stateless verifications) one token may hold at once; "
                                                "default: an equal share of --max-sessions per --token.")] = None,
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
    max_diff_mib: Annotated[int, typer.Option(
        "--max-diff-mib", min=1, help="Largest workspace diff a submit grades (MiB); past it the episode is the "
                                      "agent's failure, and the server never reads it.")] = 8,
    ray_address: RayAddressOpt = None,
    ray_sandbox: RaySandboxOpt = "local",
    price_core_hour: PriceCoreHourOpt = None,
    price_gb_hour: PriceGbHourOpt = None,
    grading_workers: Annotated[int | None, typer.Option(
        "--grading-workers", min=0, help="Processes that grade submits and /verify, with a CPU share of their own "
                                         "(steps stay fast while others are graded); 0: in the server's threads. "
                                         "Default: the number of cores, at least 2.")] = None,
    grading_cpu_share: Annotated[int, typer.Option(
        "--grading-cpu-share", min=2, max=65536,
        help="The grading workers' CPU weight against 1024 for the serving side, when both want the cores "
             "(cgroups: root only).")] = 1024,
    max_connections: Annotated[int, typer.Option(
        "--max-connections", min=16, help="HTTP connections open at once (lowered to what the descriptor limit "
                                          "leaves beside the sessions' own).")] = 4096,
    read_timeout: Annotated[float, typer.Option(
        "--read-timeout", min=1, help="Seconds a client has to send a whole request, from its first byte or "
                                      "from connecting; then its connection is closed.")] = 30,
    tampering_reward: TamperingRewardOpt = 0.0,
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
    from patchgym.server.app import create_app  # lazily: the layers below know nothing of HTTP
    from patchgym.server.serving import Server, server_config

    env_options = {"max_steps": max_steps, "time_limit": time_limit, "command_timeout": command_timeout,
                   "output_limit": output_limit, "prices": prices(price_core_hour, price_gb_hour),
                   "grading_workers": max(2, os.cpu_count() or 1) if grading_workers is None else grading_workers,
                   "grading_cpu_share": grading_cpu_share, "tampering_reward": tampering_reward}
    sandbox_options = {"limits": {"diff_bytes": max_diff_mib << 20}}
    if backend == "ray" or ray_address:
        sandbox_options.update(backend_options(backend, ray_address=ray_address, ray_sandbox=ray_sandbox))
    env_options["sandbox_options"] = sandbox_options
    try:
        api = create_app(tasks=load_tasks(tasks), backend=backend, max_sessions=max_sessions, token=token or None,
                         idle_ttl=idle_ttl, operation_timeout=operation_timeout, env_options=env_options,
                         seed_wait=seed_wait, rollout_idle_ttl=nemo_gym_idle_ttl,
                         model_endpoints=model_endpoint or (), max_sessions_per_token=max_sessions_per_token)
        config = server_config(api, host=host, port=port, max_connections=max_connections,
                               read_timeout=read_timeout, log_level=os.environ.get("PATCHGYM_LOG", "info").lower())
    except ValueError as exc:
        fail(str(exc))
    Server(config).run()
