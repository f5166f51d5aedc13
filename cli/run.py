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
    console,
    fail,
    load_selection,
    out,
    prices,
    progress_bar,
    reap,
    say_on_interrupt,
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
    harness: Annotated[str | None, typer.Option(
        "--harness", help="Drive the episodes with a harness instead of patchgym's own loop: mini-swe-agent, codex, or "
                          "'cmd: <command>' run inside the sandbox (docs/harnesses.md).")] = None,
    harness_files: Annotated[list[Path] | None, typer.Option(
        "--harness-file", exists=True, dir_okay=False, help="A file the command harness finds in $PATCHGYM_HARNESS_DIR "
                                                             "(repeatable).")] = None,
    harness_config: Annotated[Path | None, typer.Option(
        "--harness-config", exists=True, dir_okay=False,
        help="YAML merged over mini-swe-agent's own SWE-bench config.")] = None,
    record_tokens: Annotated[str, typer.Option(
        "--record-tokens", help="Harness runs: ask the endpoint for token ids and log-probabilities "
                                "(auto: unless it refuses the fields; on; off).")] = "auto",
    tampering_reward: TamperingRewardOpt = 0.0,
) -> None:
    """Evaluate a model on tasks through its OpenAI-compatible endpoint: trajectories, SWE-bench
    predictions, a run report and an HTML report in the run directory."""
    from patchgym.rollouts.html_report import write_report
    from patchgym.rollouts.loop import TOOL_MODES
    from patchgym.rollouts.model import EndpointUnusable, ModelConfig, check_endpoint
    from patchgym.rollouts.run import EndpointDown, RunDirError, RunOptions, run_model

    if tool_mode not in TOOL_MODES:
        fail(f"--tool-mode must be one of {', '.join(TOOL_MODES)}")
    if backend not in BACKENDS:
        fail(f"unknown backend {backend!r}; one of: {', '.join(BACKENDS)}")
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            fail(f"the environment variable {api_key_env} (from --api-key-env) is not set")
    chosen_harness = _harness(harness, harness_files, harness_config, record_tokens)
    _, task_set = load_selection(tasks, instance_ids)
    config = ModelConfig(name=model, base_url=base_url, api_key=api_key, temperature=temperature,
                         max_tokens=max_tokens, timeout=model_timeout, retries=retries)
    try:  # a wrong URL, a closed port, a bad key or an unknown model: now, not an hour of masked episodes later
        warning = check_endpoint(config)
    except EndpointUnusable as exc:
        fail(str(exc))
    if warning:
        console.print(f"warning: {warning}", markup=False, highlight=False)
    options = RunOptions(output=output, workers=workers, max_turns=max_turns, max_steps=max_steps,
                         time_limit=time_limit, tool_mode=tool_mode, backend=backend,
                         env_options={"sandbox_options": backend_options(backend, ray_address=ray_address,
                                                                         ray_sandbox=ray_sandbox),
                                      "tampering_reward": tampering_reward},
                         input_per_mtok=price_in, output_per_mtok=price_out,
                         prices=prices(price_core_hour, price_gb_hour), harness=chosen_harness,
                         record_tokens=record_tokens)
    reap(docker=backend == "docker")  # what killed runs left (docs/crash_safety.md), as eval does
    priced = bool(price_in or price_out)
    say_on_interrupt(f"finishing the episodes under way; rerun the same command to resume (finished episodes "
                     f"are kept in {output})")
    stopped = None
    with progress_bar() as progress:
        bar = progress.add_task(model if chosen_harness is None else f"{model} via {chosen_harness.name}",
                                total=len(task_set), status="")

        def done(line: dict, state) -> None:
            spent = f", ${state.cost_usd:.4f}" if priced else ""
            progress.update(bar, completed=state.done, resumed=state.resumed, status=(
                f"resolved {state.resolved}, masked {state.masked}, tokens {state.tokens_in}/{state.tokens_out}"
                f"{spent}  last: {line['instance_id']} {line['outcome']} ({line['end_reason']})"))

        try:
            report = run_model(task_set, config, options, on_episode=done)
        except RunDirError as exc:
            fail(str(exc))
        except EndpointDown as exc:
            stopped = str(exc)
    html = write_report(output)
    if stopped:
        fail(f"{stopped}; fix the endpoint and rerun the same command to go on (partial report: {html})", code=1)
    rate = "n/a" if report["resolved_rate"] is None else f"{report['resolved_rate']:.1%}"
    ci = "" if not report["ci95"] else f" (95% CI {report['ci95'][0]:.1%}–{report['ci95'][1]:.1%})"
    spent = f"${report['cost_usd']:.4f}" if priced else "no price given (--price-in/--price-out)"
    out.print(f"resolved {report['resolved']}/{report['scored']} scored = {rate}{ci}; masked {report['masked']}; "
              f"tokens {report['tokens_in']} in / {report['tokens_out']} out; {spent}", highlight=False)
    cost = report["cost"]
    if cost["usd_per_1k_episodes"] is not None:
        out.print(f"environment per episode: env CPU {cost['env_cpu_seconds_mean']:.3f}s, test CPU "
                  f"{cost['test_cpu_seconds_mean']:.3f}s; ${cost['usd_per_1k_episodes']:.4f} per 1,000 episodes")
    if chosen_harness is not None:
        out.print(f"harness: {chosen_harness.name} {chosen_harness.version} ({chosen_harness.pattern}); "
                  f"every model call in trajectories.jsonl (model_calls, sample)")
    out.print(f"predictions: {output / 'predictions.jsonl'}  report: {output / 'report.json'}  html: {html}")
    if report["masked"]:
        out.print(f"{report['masked']} masked episode(s) (endpoint or environment failures) run again on a rerun")
    if report["completed"] and not report["scored"]:
        first = next((i["mask_reason"] for i in report["instances"] if i.get("mask_reason")), None)
        fail(f"no episode could be scored: all {report['masked']} masked" + (f" (first: {first[:300]})" if first
                                                                              else ""), code=1)


def _harness(spec: str | None, files: list[Path] | None, config: Path | None, record_tokens: str):
    """The harness ``--harness`` names (None: patchgym's own loop), or the error exit saying why not."""
    from patchgym.rollouts.proxy import RECORD_TOKENS

    if record_tokens not in RECORD_TOKENS:
        fail(f"--record-tokens must be one of {', '.join(RECORD_TOKENS)}")
    if spec is None:
        if files or config:
            fail("--harness-file and --harness-config go with --harness")
        return None
    from patchgym.rollouts.harnesses import harness_from_spec

    settings = None
    if config is not None:
        import yaml

        settings = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        if not isinstance(settings, dict):
            fail(f"{config} does not hold a mapping")
    try:
        return harness_from_spec(spec, files={f.name: f.read_bytes() for f in files or []}, config=settings)
    except (ValueError, RuntimeError) as exc:
        fail(str(exc))
