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
    import uvicorn

    from patchgym.server.app import create_app  # lazily: the layers below know nothing of HTTP

    env_options = {"max_steps": max_steps, "time_limit": time_limit, "command_timeout": command_timeout,
                   "output_limit": output_limit, "prices": prices(price_core_hour, price_gb_hour),
                   "tampering_reward": tampering_reward}
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
