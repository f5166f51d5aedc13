"""``patchgym run``: a model behind an OpenAI-compatible endpoint evaluated on tasks, episode by
episode, into a run directory an interrupted run continues in."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from patchgym.cli.common import (
    BACKENDS,
    BackendOpt,
    InstanceIdsOpt,
    PriceCoreHourOpt,
    PriceGbHourOpt,
    RayAddressOpt,
    RaySandboxOpt,
    TamperingRewardOpt,
    TasksOpt,
    backend_options,
    fail,
    load_selection,
    out,
    prices,
    progress_bar,
    reap,
)


def run(
    model: Annotated[str, typer.Option("--model", help="The model name the endpoint serves.")],
    base_url: Annotated[str, typer.Option("--base-url", help="OpenAI-compatible API root, e.g. http://host:8000/v1.")],
    output: Annotated[Path, typer.Option("--output", help="Run directory (an interrupted run continues in it).")],
    api_key_env: Annotated[str | None, typer.Option(
        "--api-key-env", help="Environment variable holding the API key (none: no Authorization header).")] = None,
    tasks: TasksOpt = None,
    instance_ids: InstanceIdsOpt = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Episodes at once.")] = 1,
    max_steps: Annotated[int, typer.Option("--max-steps", min=1, help="Tool calls per episode.")] = 50,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="Model turns per episode.")] = 100,
    time_limit: Annotated[float | None, typer.Option("--time-limit", min=1, help="Seconds per episode.")] = None,
    temperature: Annotated[float, typer.Option("--temperature", min=0)] = 0.0,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="Tokens per model turn.")] = None,
    tool_mode: Annotated[str, typer.Option(
        "--tool-mode", help="native (tools/tool_calls), text (one fenced command per turn) or auto.")] = "auto",
    model_timeout: Annotated[float, typer.Option(
        "--model-timeout", min=1, help="Deadline of one model call (s).")] = 300,
    retries: Annotated[int, typer.Option("--retries", min=0, help="Retries of a failed model call.")] = 4,
    price_in: Annotated[float, typer.Option("--price-in", min=0, help="Dollars per million input tokens.")] = 0.0,
    price_out: Annotated[float, typer.Option("--price-out", min=0, help="Dollars per million output tokens.")] = 0.0,
    backend: BackendOpt = "local",
    ray_address: RayAddressOpt = None,
    ray_sandbox: RaySandboxOpt = "local",
    price_core_hour: PriceCoreHourOpt = None,
    price_gb_hour: PriceGbHourOpt = None,
    tampering_reward: TamperingRewardOpt = 0.0,
) -> None:
    """Evaluate a model on tasks through its OpenAI-compatible endpoint: trajectories, SWE-bench
    predictions, a run report and an HTML report in the run directory."""
    from patchgym.rollouts.html_report import write_report
    from patchgym.rollouts.loop import TOOL_MODES
    from patchgym.rollouts.model import ModelConfig
    from patchgym.rollouts.run import RunDirError, RunOptions, run_model

    if tool_mode not in TOOL_MODES:
        fail(f"--tool-mode must be one of {', '.join(TOOL_MODES)}")
    if backend not in BACKENDS:
        fail(f"unknown backend {backend!r}; one of: {', '.join(BACKENDS)}")
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            fail(f"the environment variable {api_key_env} (from --api-key-env) is not set")
    _, task_set = load_selection(tasks, instance_ids)
    config = ModelConfig(name=model, base_url=base_url, api_key=api_key, temperature=temperature,
                         max_tokens=max_tokens, timeout=model_timeout, retries=retries)
    options = RunOptions(output=output, workers=workers, max_turns=max_turns, max_steps=max_steps,
                         time_limit=time_limit, tool_mode=tool_mode, backend=backend,
                         env_options={"sandbox_options": backend_options(backend, ray_address=ray_address,
                                                                         ray_sandbox=ray_sandbox),
                                      "tampering_reward": tampering_reward},
                         input_per_mtok=price_in, output_per_mtok=price_out,
                         prices=prices(price_core_hour, price_gb_hour))
    reap(docker=backend == "docker")  # what killed runs left (docs/crash_safety.md), as eval does
    with progress_bar() as progress:
        bar = progress.add_task(model, total=len(task_set), status="")

        def done(line: dict, state) -> None:
            progress.update(bar, completed=state.done, status=(
                f"resolved {state.resolved}, masked {state.masked}, tokens {state.tokens_in}/{state.tokens_out}, "
                f"${state.cost_usd:.4f}  last: {line['instance_id']} {line['outcome']} ({line['end_reason']})"))

        try:
            report = run_model(task_set, config, options, on_episode=done)
        except RunDirError as exc:
            fail(str(exc))
    html = write_report(output)
    rate = "n/a" if report["resolved_rate"] is None else f"{report['resolved_rate']:.1%}"
    ci = "" if not report["ci95"] else f" (95% CI {report['ci95'][0]:.1%}–{report['ci95'][1]:.1%})"
    out.print(f"resolved {report['resolved']}/{report['scored']} scored = {rate}{ci}; masked {report['masked']}; "
              f"tokens {report['tokens_in']} in / {report['tokens_out']} out; ${report['cost_usd']:.4f}")
    cost = report["cost"]
    if cost["usd_per_1k_episodes"] is not None:
        out.print(f"environment per episode: env CPU {cost['env_cpu_seconds_mean']:.3f}s, test CPU "
                  f"{cost['test_cpu_seconds_mean']:.3f}s; ${cost['usd_per_1k_episodes']:.4f} per 1,000 episodes")
    out.print(f"predictions: {output / 'predictions.jsonl'}  report: {output / 'report.json'}  html: {html}")
    if report["masked"]:
        out.print(f"{report['masked']} masked episode(s) (endpoint or environment failures) run again on a rerun")
