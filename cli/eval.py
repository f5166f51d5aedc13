"""``patchgym eval``: predictions graded on tasks (a predictions file, or the gold or empty
patches), with SWE-bench-style reports and what each instance's grading cost."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from patchgym.cli.common import (
    DEFAULT_WORKERS,
    BackendOpt,
    InstanceIdsOpt,
    IsolationOpt,
    PriceCoreHourOpt,
    PriceGbHourOpt,
    RayAddressOpt,
    RaySandboxOpt,
    TamperingRewardOpt,
    TasksOpt,
    WorkersOpt,
    console,
    fail,
    load_selection,
    make_verifier,
    out,
    prices,
    progress_bar,
    say_on_interrupt,
)

if TYPE_CHECKING:
    from patchgym.grading.verifier import InstanceReport


def eval_predictions(
    predictions: Annotated[str, typer.Option("--predictions", help="Predictions JSONL, or 'gold' / 'empty'.")],
    tasks: TasksOpt = None,
    instance_ids: InstanceIdsOpt = None,
    workers: WorkersOpt = DEFAULT_WORKERS,
    backend: BackendOpt = "local",
    isolation: IsolationOpt = "auto",
    output: Annotated[Path | None,
                      typer.Option("--output", help="Report directory (default: patchgym-runs/<predictions>).")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Grade every instance again, replacing what --output holds (even results of other "
                        "predictions or settings, which are refused otherwise).")] = False,
    ray_address: RayAddressOpt = None,
    ray_sandbox: RaySandboxOpt = "local",
    price_core_hour: PriceCoreHourOpt = None,
    price_gb_hour: PriceGbHourOpt = None,
    tampering_reward: TamperingRewardOpt = 0.0,
) -> None:
    """Grade predictions and write SWE-bench-style reports, with what each instance's grading cost."""
    from patchgym.grading.evaluation import EvalDirError, claim_output, evaluate
    from patchgym.tasks.model import TaskFileError
    from patchgym.tasks.predictions import EMPTY, GOLD, load_predictions

    everything, task_set = load_selection(tasks, instance_ids)
    try:
        # Checked against the whole task set: a predictions file may cover more than the selection.
        preds = load_predictions(predictions, everything)
    except TaskFileError as exc:
        fail(str(exc))
    preds = {i: p for i, p in preds.items() if i in task_set}
    if not preds:
        fail("no predictions for the selected instances")
    unnamed = [i for i, p in preds.items() if "model_name_or_path" not in p.model_fields_set]
    if unnamed:
        console.print(f"warning: {len(unnamed)} prediction(s) have no model_name_or_path (SWE-bench's field), "
                      f"e.g. {unnamed[0]}: reported as 'unknown'", markup=False, highlight=False)
    name = predictions if predictions in (GOLD, EMPTY) else Path(predictions).stem
    output = output or Path("patchgym-runs") / name
    # What a resumed evaluation in --output must share with the one there (grading.evaluation.claim_output).
    settings = {"predictions": predictions if predictions in (GOLD, EMPTY) else str(Path(predictions).resolve()),
                "tasks": str(tasks.expanduser().resolve()) if tasks else everything.origin, "backend": backend,
                "tampering_reward": tampering_reward}
    verifier = make_verifier(backend, isolation, ray_address, ray_sandbox, prices(price_core_hour, price_gb_hour),
                             tampering_reward)
    try:
        claim_output(output, settings, replace=force)
    except EvalDirError as exc:
        fail(str(exc))
    counts = {"resolved": 0, "unresolved": 0, "empty": 0, "error": 0}
    say_on_interrupt(f"finishing the instances under way; rerun the same command to resume (graded instances "
                     f"are kept in {output})")
    with progress_bar() as progress:
        bar = progress.add_task("evaluating", total=len(preds), status="")
        resumed_count = 0

        def done(report: InstanceReport, resumed: bool) -> None:
            nonlocal resumed_count
            key = ("error" if report.infrastructure_failure else "resolved" if report.resolved
                   else "unresolved" if report.patch_exists else "empty")
            counts[key] += 1
            resumed_count += resumed
            progress.update(bar, advance=1, resumed=resumed_count,
                            status=" ".join(f"{k} {v}" for k, v in counts.items()))

        summary = evaluate(task_set, preds, output, verifier=verifier, workers=workers, force=force, on_done=done)
    report = summary.to_dict()
    table = Table(title=f"evaluation of {name} ({summary.seconds:.1f}s)")
    table.add_column("")
    table.add_column("instances", justify="right")
    for key in ("total", "submitted", "completed", "resolved", "unresolved", "empty_patch", "error"):
        table.add_row(key.replace("_", " "), str(report[f"{key}_instances"]))
    if summary.resumed_ids:
        table.add_row("resumed (not re-run)", str(len(summary.resumed_ids)))
    out.print(table)
    cost = report["cost"]
    if cost and cost["usd_per_1k_episodes"] is not None:
        out.print(f"per instance: env CPU {cost['env_cpu_seconds_mean']:.3f}s, "
                  f"test CPU {cost['test_cpu_seconds_mean']:.3f}s, "
                  f"peak memory {(cost['peak_memory_bytes_max'] or 0) / 2**20:.0f} MiB at most; "
                  f"${cost['usd_per_1k_episodes']:.4f} per 1,000 instances", highlight=False)
    for instance_id in report["error_ids"]:
        out.print(f"[red]error[/] {instance_id}: see {output / instance_id / 'report.json'}")
    out.print(f"report: {output / 'report.json'}")
