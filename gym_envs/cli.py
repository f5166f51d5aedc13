"""The ``patchgym`` command line."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sandboxes import SandboxError, reap_stale

from .backends import BACKENDS, sandbox_factory
from .catalog import TaskSet
from .cli_common import TasksOpt, console, fail, load_selection, out
from .evaluation import evaluate
from .images_cli import images_app
from .predictions import EMPTY, GOLD, load_predictions
from .task import TaskFileError
from .validation import validate_tasks
from .verifier import InstanceReport, Verifier

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="SWE-bench-style verifiable-reward environments.")
tasks_app = typer.Typer(no_args_is_help=True, help="Browse and validate task sets.")
app.add_typer(tasks_app, name="tasks")
sandboxes_app = typer.Typer(no_args_is_help=True, help="Sandboxes left behind by crashed processes.")
app.add_typer(sandboxes_app, name="sandboxes")
app.add_typer(images_app, name="images")
BackendOpt = Annotated[str, typer.Option("--backend", help=f"Sandbox backend: {', '.join(BACKENDS)}.")]
IsolationOpt = Annotated[str, typer.Option("--isolation", help="Local backend: auto, bwrap or none.")]
DEFAULT_WORKERS = max(1, os.cpu_count() or 1)
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, help="Instances graded at once.")]


def _load(tasks: Path | None, ids: list[str] | None = None) -> TaskSet:
    return load_selection(tasks, ids)[1]


def _verifier(backend: str, isolation: str) -> Verifier:
    options = {"isolation": isolation} if backend == "local" else {}
    try:
        verifier = Verifier(sandbox_factory(backend, **options))
    except ValueError as exc:
        fail(str(exc))
        raise
    _reap(docker=backend == "docker")
    return verifier


def _reap(*, docker: bool, everything: bool = False) -> dict[str, int]:
    """Remove what dead processes left: local sandboxes and cgroups, and patchgym's containers."""
    removed = {"local": reap_stale(), "docker": 0}
    if docker:
        from sandboxes.docker import gc_containers

        try:
            removed["docker"] = len(gc_containers(include_live_owners=everything))
        except SandboxError as exc:
            fail(str(exc))
    return removed


@sandboxes_app.command("gc")
def sandboxes_gc(
    docker: Annotated[bool, typer.Option("--docker/--no-docker", help="Also remove patchgym's containers.")] = True,
    everything: Annotated[bool, typer.Option("--all", help="Containers of live processes too.")] = False,
) -> None:
    """Remove sandboxes, cgroups and containers whose owning process is gone (never anything
    without patchgym's label)."""
    from sandboxes.docker import docker_available

    removed = _reap(docker=docker and docker_available(), everything=everything)
    out.print(f"removed {removed['local']} local leftovers and {removed['docker']} containers")


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console)


@tasks_app.command("list")
def tasks_list(tasks: TasksOpt = None) -> None:
    """List the tasks of a task set."""
    task_set = _load(tasks)
    table = Table(title=f"{len(task_set)} tasks ({task_set.origin})")
    for col in ("instance_id", "repo", "version", "FAIL_TO_PASS", "PASS_TO_PASS", "title"):
        table.add_column(col, overflow="fold")
    for t in task_set:
        title = t.problem_statement.strip().splitlines()[0] if t.problem_statement.strip() else ""
        table.add_row(t.instance_id, t.repo, t.version, str(len(t.FAIL_TO_PASS)), str(len(t.PASS_TO_PASS)), title[:70])
    out.print(table)


@tasks_app.command("show")
def tasks_show(instance_id: str, tasks: TasksOpt = None,
               as_json: Annotated[bool, typer.Option("--json", help="Print the whole row as JSON.")] = False) -> None:
    """Show one task: its bug report, environment and tests."""
    task = _load(tasks, [instance_id]).get(instance_id)
    if as_json:
        out.print_json(json.dumps(task.to_row()))
        return
    out.rule(f"[bold]{task.instance_id}")
    out.print(f"repo: {task.repo}   base_commit: {task.base_commit}   version: {task.version}   "
              f"created_at: {task.created_at}")
    out.print(f"environment: python {task.environment.python}; packages: {', '.join(task.environment.packages) or '-'}")
    out.print(f"test command: {task.test_spec.command}")
    out.print(f"FAIL_TO_PASS ({len(task.FAIL_TO_PASS)}): " + ", ".join(task.FAIL_TO_PASS))
    out.print(f"PASS_TO_PASS: {len(task.PASS_TO_PASS)} tests")
    out.rule("problem statement")
    out.print(task.problem_statement, markup=False, highlight=False)


@tasks_app.command("nemo-gym-dataset")
def tasks_nemo_gym_dataset(
    output: Annotated[Path, typer.Option("--output", help="JSONL file to write.")],
    tasks: TasksOpt = None,
    instance_ids: Annotated[list[str] | None,
                            typer.Option("--instance-ids", help="Only these ids (repeat, or comma-separate).")] = None,
    agent_name: Annotated[str | None, typer.Option(
        "--agent-name", help="NeMo Gym agent to route every row to (adds agent_ref).")] = None,
) -> None:
    """Write tasks as NeMo Gym dataset rows (prompt, tools, instance_id; never the answers), for a
    NeMo Gym agent whose resources server is `patchgym serve`."""
    from server.nemo_gym import nemo_gym_dataset_rows  # lazily: gym_envs knows nothing of HTTP

    task_set = _load(tasks, instance_ids)
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", encoding="utf-8") as f:
        for row in nemo_gym_dataset_rows(task_set, agent_name=agent_name):
            f.write(json.dumps(row) + "\n")
    out.print(f"wrote {len(task_set)} NeMo Gym rows to {output}")


@tasks_app.command("validate")
def tasks_validate(
    instance_ids: Annotated[list[str] | None, typer.Argument(help="Ids to validate (default: all).")] = None,
    tasks: TasksOpt = None,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Gold runs per task (they must agree).")] = 2,
    workers: WorkersOpt = DEFAULT_WORKERS,
    backend: BackendOpt = "local",
    isolation: IsolationOpt = "auto",
) -> None:
    """Check tasks: gold resolves, no change does not, repeated runs agree (flaky ones flagged)."""
    task_set = _load(tasks, instance_ids)
    verifier = _verifier(backend, isolation)
    with _progress() as progress:
        bar = progress.add_task("validating", total=len(task_set), status="")
        bad = 0

        def done(r) -> None:
            nonlocal bad
            bad += 0 if r.ok else 1
            progress.update(bar, advance=1, status=f"{bad} problem(s)")

        results = validate_tasks(task_set, verifier, runs=runs, workers=workers, on_done=done)
    table = Table(title="task validation")
    for col in ("instance_id", "gold", "empty", "flaky", "seconds", "verdict"):
        table.add_column(col, overflow="fold")
    for r in results:
        gold = "/".join("✓" if g else "✗" for g in r.gold_resolved) or "-"
        empty = "-" if r.empty_resolved is None else ("resolved ✗" if r.empty_resolved else "unresolved ✓")
        verdict = "[green]ok[/]" if r.ok else "[red]" + "; ".join(r.problems).replace("[", "\\[") + "[/]"
        table.add_row(r.instance_id, gold, empty, "yes" if r.flaky else "no", f"{r.seconds:.1f}", verdict)
    out.print(table)
    failed = [r for r in results if not r.ok]
    flaky = sum(r.flaky for r in results)
    out.print(f"{len(results) - len(failed)}/{len(results)} tasks valid" + (f", {flaky} flaky" if flaky else ""))
    if failed:
        raise typer.Exit(1)


@app.command("eval")
def eval_cmd(
    predictions: Annotated[str, typer.Option("--predictions", help="Predictions JSONL, or 'gold' / 'empty'.")],
    tasks: TasksOpt = None,
    instance_ids: Annotated[list[str] | None,
                            typer.Option("--instance-ids", help="Only these ids (repeat, or comma-separate).")] = None,
    workers: WorkersOpt = DEFAULT_WORKERS,
    backend: BackendOpt = "local",
    isolation: IsolationOpt = "auto",
    output: Annotated[Path | None,
                      typer.Option("--output", help="Report directory (default: patchgym-runs/<predictions>).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Re-grade instances that already have a report.")] = False,
) -> None:
    """Grade predictions and write SWE-bench-style reports."""
    everything, task_set = load_selection(tasks, instance_ids)
    try:
        # Checked against the whole task set: a predictions file may cover more than the selection.
        preds = load_predictions(predictions, everything)
    except TaskFileError as exc:
        fail(str(exc))
    preds = {i: p for i, p in preds.items() if i in task_set}
    if not preds:
        fail("no predictions for the selected instances")
    name = predictions if predictions in (GOLD, EMPTY) else Path(predictions).stem
    output = output or Path("patchgym-runs") / name
    verifier = _verifier(backend, isolation)
    counts = {"resolved": 0, "unresolved": 0, "empty": 0, "error": 0}
    with _progress() as progress:
        bar = progress.add_task("evaluating", total=len(preds), status="")

        def done(report: InstanceReport, resumed: bool) -> None:
            key = ("error" if report.infrastructure_failure else "resolved" if report.resolved
                   else "unresolved" if report.patch_exists else "empty")
            counts[key] += 1
            progress.update(bar, advance=1, status=" ".join(f"{k} {v}" for k, v in counts.items()))

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
    for instance_id in report["error_ids"]:
        out.print(f"[red]error[/] {instance_id}: see {output / instance_id / 'report.json'}")
    out.print(f"report: {output / 'report.json'}")


@app.command("serve")
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
    max_steps: Annotated[int, typer.Option("--max-steps", min=1, help="Steps before an episode is truncated.")] = 50,
    time_limit: Annotated[float | None, typer.Option("--time-limit", min=1, help="Seconds per episode.")] = None,
    command_timeout: Annotated[float, typer.Option(
        "--command-timeout", min=1, help="Deadline of one bash command (s).")] = 120,
    output_limit: Annotated[int, typer.Option(
        "--output-limit", min=256, help="Characters of command output kept per step.")] = 16_000,
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

    from server.app import create_app  # lazily: gym_envs knows nothing of HTTP

    env_options = {"max_steps": max_steps, "time_limit": time_limit, "command_timeout": command_timeout,
                   "output_limit": output_limit}
    try:
        api = create_app(tasks=_load(tasks), backend=backend, max_sessions=max_sessions, token=token or None,
                         idle_ttl=idle_ttl, operation_timeout=operation_timeout, env_options=env_options)
    except ValueError as exc:
        fail(str(exc))
    # In-flight requests get a short grace on shutdown; then the lifespan closes every sandbox.
    # Keep-alive well past clients' own idle expiry (httpx: 5 s, aiohttp: 15 s): when both sides
    # expire an idle connection at the same moment, a request sent on it fails mid-flight.
    uvicorn.run(api, host=host, port=port, log_level=os.environ.get("PATCHGYM_LOG", "info").lower(),
                timeout_graceful_shutdown=10, timeout_keep_alive=75)


def main() -> None:
    logging.basicConfig(level=os.environ.get("PATCHGYM_LOG", "WARNING").upper(), format="%(message)s",
                        handlers=[RichHandler(console=console, show_path=False)])
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
