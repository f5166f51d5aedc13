"""The ``patchgym`` command line."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gym_envs.cli.common import (
    BACKENDS,
    PriceCoreHourOpt,
    PriceGbHourOpt,
    RayAddressOpt,
    RaySandboxOpt,
    TasksOpt,
    backend_options,
    console,
    fail,
    load_selection,
    out,
    prices,
)
from gym_envs.cli.images import images_app
from gym_envs.cli.runs import register as register_run_commands
from gym_envs.grading.cost import DEFAULT_PRICE_CORE_HOUR, DEFAULT_PRICE_GB_HOUR, Prices

# The layers a command drives are imported in its body: every command (and --help) used to import
# all of them before doing anything.
if TYPE_CHECKING:
    from gym_envs.grading.verifier import InstanceReport, Verifier
    from gym_envs.making.validation import TaskValidation
    from tasks.catalog import TaskSet

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="SWE-bench-style verifiable-reward environments.")
tasks_app = typer.Typer(no_args_is_help=True, help="Browse and validate task sets.")
app.add_typer(tasks_app, name="tasks")
sandboxes_app = typer.Typer(no_args_is_help=True, help="Sandboxes left behind by crashed processes.")
app.add_typer(sandboxes_app, name="sandboxes")
app.add_typer(images_app, name="images")
nemo_gym_app = typer.Typer(no_args_is_help=True, help="Run patchgym as a NeMo Gym resources server.")
app.add_typer(nemo_gym_app, name="nemo-gym")
BackendOpt = Annotated[str, typer.Option("--backend", help=f"Sandbox backend: {', '.join(BACKENDS)}.")]
IsolationOpt = Annotated[str, typer.Option("--isolation", help="Local backend: auto, bwrap or none.")]
DEFAULT_WORKERS = max(1, os.cpu_count() or 1)
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, help="Instances graded at once.")]


def _load(tasks: Path | None, ids: list[str] | None = None) -> TaskSet:
    return load_selection(tasks, ids)[1]


def _verifier(backend: str, isolation: str, ray_address: str | None = None, ray_sandbox: str = "local",
              price: Prices | None = None) -> Verifier:
    from gym_envs.grading.verifier import Verifier
    from tasks.backends import sandbox_factory

    options = backend_options(backend, isolation, ray_address, ray_sandbox)
    if "docker" in (backend, options.get("inner")) and "PATCHGYM_DOCKER_POOL" not in os.environ:
        # Grading alone asks for each image about once, and a container started ahead competes with
        # the tests for the cores: no warm pool unless asked for (bench/README.md, docker_pool.py).
        options["pool_size"] = 0
    try:
        verifier = Verifier(sandbox_factory(backend, **options), prices=price)
    except ValueError as exc:
        fail(str(exc))
        raise
    _reap(docker=backend == "docker")
    return verifier


def _reap(*, docker: bool, every_owner: bool = False) -> dict[str, int]:
    """Remove what dead processes left: local sandboxes and cgroups, and patchgym's containers
    (with ``every_owner``, also those of live processes and of other hosts sharing the engine)."""
    from sandboxes import SandboxError, reap_stale

    removed = {"local": reap_stale(), "docker": 0}
    if docker:
        from sandboxes.docker import gc_containers

        try:
            removed["docker"] = len(gc_containers(include_live_owners=every_owner, other_hosts=every_owner))
        except SandboxError as exc:
            fail(str(exc))
    return removed


@sandboxes_app.command("gc")
def sandboxes_gc(
    docker: Annotated[bool, typer.Option("--docker/--no-docker", help="Also remove patchgym's containers.")] = True,
    every_owner: Annotated[bool, typer.Option(
        "--all", help="Every patchgym container: also those of live processes and of other hosts.")] = False,
) -> None:
    """Remove sandboxes, cgroups and containers whose owning process is gone (never anything
    without patchgym's label). Containers owned by other hosts sharing the Docker engine are left
    alone unless --all: this host cannot tell whether their owners still run."""
    from sandboxes.docker import docker_available

    removed = _reap(docker=docker and docker_available(), every_owner=every_owner)
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


@nemo_gym_app.command("init")
def nemo_gym_init(
    directory: Annotated[Path, typer.Argument(help="Where ng_run will run: resources_servers/patchgym/ goes here.")],
    tasks: TasksOpt = None,
    instance_ids: Annotated[list[str] | None, typer.Option(
        "--instance-ids", help="Dataset rows for these ids only (repeat, or comma-separate).")] = None,
    agent_name: Annotated[str, typer.Option("--agent-name", help="Name of the simple_agent entry.")] = "patchgym_agent",
    model_server: Annotated[str, typer.Option(
        "--model-server", help="Name of the responses_api_models entry the agent uses.")] = "policy_model",
    external: Annotated[bool, typer.Option(
        "--external", help="patchgym serve already runs at --host/--port: ng_run only checks on it.")] = False,
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
) -> None:
    """Write a NeMo Gym server directory for patchgym (entry point, dataset, config) that `ng_run`
    accepts as it is; then run `ng_run` from DIRECTORY with the config it prints."""
    from server.nemo_gym_setup import ServerDirOptions, write_server_dir  # lazily: gym_envs knows nothing of HTTP

    task_set = _load(tasks, instance_ids)
    serve_args = ["--backend", backend, "--max-sessions", str(max_sessions)]
    if tasks is not None:
        serve_args += ["--tasks", str(Path(tasks).resolve())]
    options = ServerDirOptions(agent_name=agent_name, model_server=model_server, host=host, port=port,
                               external=external, serve_args=serve_args + list(serve_arg or []),
                               license=license_name, max_steps=max_steps)
    try:
        config = write_server_dir(directory, task_set, options)
    except ValueError as exc:
        fail(str(exc))
    out.print(f"wrote {directory / config} and {len(task_set)} dataset row(s); then, in {directory}:")
    out.print(f'  ng_run "+config_paths=[{config},<your model server config>]"', markup=False, highlight=False)


def _validate_with_progress(task_set: TaskSet, verifier: Verifier, *, runs: int, workers: int,
                            failed_word: str) -> list[TaskValidation]:
    """``validate_tasks`` behind a progress bar counting the tasks that failed so far."""
    from gym_envs.making.validation import validate_tasks

    with _progress() as progress:
        bar = progress.add_task("validating", total=len(task_set), status="")
        bad = 0

        def done(r: TaskValidation) -> None:
            nonlocal bad
            bad += 0 if r.ok else 1
            progress.update(bar, advance=1, status=f"{bad} {failed_word}")

        return validate_tasks(task_set, verifier, runs=runs, workers=workers, on_done=done)


@tasks_app.command("validate")
def tasks_validate(
    instance_ids: Annotated[list[str] | None, typer.Argument(help="Ids to validate (default: all).")] = None,
    tasks: TasksOpt = None,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Gold runs per task (they must agree).")] = 2,
    workers: WorkersOpt = DEFAULT_WORKERS,
    backend: BackendOpt = "local",
    isolation: IsolationOpt = "auto",
    ray_address: RayAddressOpt = None,
    ray_sandbox: RaySandboxOpt = "local",
) -> None:
    """Check tasks: gold resolves, no change does not, repeated runs agree (flaky ones flagged)."""
    task_set = _load(tasks, instance_ids)
    verifier = _verifier(backend, isolation, ray_address, ray_sandbox)
    results = _validate_with_progress(task_set, verifier, runs=runs, workers=workers, failed_word="problem(s)")
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
    ray_address: RayAddressOpt = None,
    ray_sandbox: RaySandboxOpt = "local",
    price_core_hour: PriceCoreHourOpt = DEFAULT_PRICE_CORE_HOUR,
    price_gb_hour: PriceGbHourOpt = DEFAULT_PRICE_GB_HOUR,
) -> None:
    """Grade predictions and write SWE-bench-style reports, with what each instance's grading cost."""
    from gym_envs.grading.evaluation import evaluate
    from tasks.model import TaskFileError
    from tasks.predictions import EMPTY, GOLD, load_predictions

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
    verifier = _verifier(backend, isolation, ray_address, ray_sandbox, prices(price_core_hour, price_gb_hour))
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
    cost = report["cost"]
    if cost and cost["usd_per_1k_episodes"] is not None:
        out.print(f"per instance: env CPU {cost['env_cpu_seconds_mean']:.3f}s, "
                  f"test CPU {cost['test_cpu_seconds_mean']:.3f}s, "
                  f"peak memory {(cost['peak_memory_bytes_max'] or 0) / 2**20:.0f} MiB at most; "
                  f"${cost['usd_per_1k_episodes']:.4f} per 1,000 instances", highlight=False)
    for instance_id in report["error_ids"]:
        out.print(f"[red]error[/] {instance_id}: see {output / instance_id / 'report.json'}")
    out.print(f"report: {output / 'report.json'}")


@tasks_app.command("mine")
def tasks_mine(
    repo: Annotated[str, typer.Option("--repo", help="Repository to mine (registered or bundled).")],
    output: Annotated[Path, typer.Option("--output", help="JSONL file the kept tasks are written to.")],
    since: Annotated[str | None, typer.Option("--since", help="Only commits after this revision.")] = None,
    max_candidates: Annotated[int | None, typer.Option(
        "--max", min=1, help="Stop after this many candidate commits (oldest first).")] = None,
    issue_text: Annotated[Path | None, typer.Option(
        "--issue-text", help="Problem statements: .json {commit: text}, .jsonl {commit, text} rows, or one text "
                             "file for a single commit (default: the commit message).")] = None,
    p2p_all: Annotated[bool, typer.Option(
        "--p2p-all", help="PASS_TO_PASS from the whole suite, not only the test files the commit touches.")] = False,
    validate: Annotated[bool, typer.Option(
        "--validate/--no-validate", help="Validate mined tasks; only valid ones are written.")] = True,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Gold runs per task when validating.")] = 2,
    workers: WorkersOpt = DEFAULT_WORKERS,
    backend: BackendOpt = "local",
    isolation: IsolationOpt = "auto",
) -> None:
    """Make tasks from a repository's history: each commit that changes source and tests, with
    FAIL_TO_PASS/PASS_TO_PASS from running the tests before and after it (rules: gym_envs/making/mining.py)."""
    from gym_envs.making.mining import Dropped, MiningError, load_issue_texts, mine
    from gym_envs.making.registry import UnknownRepoError, get_repo
    from tasks.model import save_tasks

    try:
        record = get_repo(repo)
        texts = load_issue_texts(issue_text) if issue_text else None
    except (UnknownRepoError, MiningError) as exc:
        fail(str(exc))
    verifier = _verifier(backend, isolation)
    console.print(f"reading the history of {record.name} ({record.source})", highlight=False)
    with _progress() as progress:
        bars: dict[str, object] = {}
        counts: dict[str, list[int]] = {}

        def stage(name: str, total: int) -> None:
            bars[name] = progress.add_task(name, total=total, status="")
            counts[name] = [0, 0]

        def item(name: str, outcome) -> None:
            ok = not isinstance(outcome, Dropped) and getattr(outcome, "ok", True)
            counts[name][0 if ok else 1] += 1
            progress.update(bars[name], advance=1, status=f"{counts[name][0]} kept, {counts[name][1]} dropped")

        try:
            result = mine(record, since=since, max_candidates=max_candidates, issue_texts=texts, workers=workers,
                          factory=verifier.factory, verifier=verifier, validate_runs=runs if validate else 0,
                          p2p_all=p2p_all, on_stage=stage, on_item=item)
        except MiningError as exc:
            fail(str(exc))
    output.parent.mkdir(parents=True, exist_ok=True)
    save_tasks(result.tasks, output)
    table = Table(title=f"candidate commits of {record.name}")
    for col in ("commit", "subject", "outcome", "F2P", "P2P", "detail"):
        table.add_column(col, overflow="fold")
    for candidate in result.candidates:
        outcome = result.outcomes[candidate.sha]
        if isinstance(outcome, Dropped):
            table.add_row(candidate.short_sha, candidate.subject[:60], f"[red]{outcome.reason.value}[/]", "-", "-",
                          outcome.detail[:200].replace("[", "\\["))
        else:
            table.add_row(candidate.short_sha, candidate.subject[:60], f"[green]{outcome.instance_id}[/]",
                          str(len(outcome.FAIL_TO_PASS)), str(len(outcome.PASS_TO_PASS)), "")
    if result.candidates:
        out.print(table)
    summary = Table(title=f"mining {record.name} ({result.seconds:.1f}s)")
    summary.add_column("")
    summary.add_column("commits", justify="right")
    summary.add_row("scanned", str(result.scanned))
    summary.add_row("candidates", str(len(result.candidates)))
    summary.add_row("kept", str(len(result.tasks)))
    for reason, n in result.drop_counts().items():
        summary.add_row(f"dropped: {reason.value}", str(n))
    out.print(summary)
    out.print(f"wrote {len(result.tasks)} task(s) to {output}" + ("" if validate else " (not validated)"))


repos_app = typer.Typer(no_args_is_help=True, help="Repositories tasks are made from: register one, list them.")
app.add_typer(repos_app, name="repos")


@repos_app.command("add")
def repos_add(
    path_or_url: Annotated[str, typer.Argument(help="A local git repository (path) or a git URL.")],
    name: Annotated[str, typer.Option("--name", help="Short name to register it under.")],
    install: Annotated[list[str] | None, typer.Option(
        "--install", help="Install step run in the checkout (repeat; replaces the detected ones).")] = None,
    package: Annotated[list[str] | None, typer.Option(
        "--package", help="pip requirement added to the detected packages (repeat).")] = None,
    test_cmd: Annotated[str | None, typer.Option(
        "--test-cmd", help="pytest-compatible test command (test ids are appended).")] = None,
    python: Annotated[str | None, typer.Option(
        "--python", help="Python version, e.g. 3.11 (default: from requires-python).")] = None,
    rev: Annotated[str, typer.Option("--rev", help="Commit to detect and check at.")] = "HEAD",
    repo: Annotated[str | None, typer.Option(
        "--repo", help="'owner/name' for task rows (default: the URL's, or local/NAME).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds the test suite may take.")] = 900,
    min_pass: Annotated[float, typer.Option(
        "--min-pass", min=0.0, max=1.0, help="Share of the tests that must pass at REV.")] = 0.8,
    force: Annotated[bool, typer.Option(
        "--force", help="Register even if the check fails or NAME is taken.")] = False,
    backend: BackendOpt = "local",
    isolation: IsolationOpt = "auto",
) -> None:
    """Register a repository: detect its environment and test command at REV (options override what
    is detected), check that its suite collects and mostly passes there, and save it."""
    import time

    from rich.markup import escape

    from gym_envs.grading.testrun import probe
    from gym_envs.making import repo_setup as rs
    from gym_envs.making.registry import RepoRecord, list_repos, save_repo
    from sandboxes import SandboxError
    from tasks.backends import sandbox_factory
    from tasks.model import TaskFileError, TestSpec

    try:
        rs.validate_name(name)
        taken = next((r for r in list_repos() if r.name == name), None)
        if taken and not force:
            what = "a bundled repository" if taken.bundled else f"already registered ({taken.repo} from {taken.source})"
            fail(f"{name!r} is {what}; pass --force to register this one in its place")
        factory = sandbox_factory(backend, **({"isolation": isolation} if backend == "local" else {}))
        with console.status(f"reading {path_or_url}…"):
            source = rs.open_source(path_or_url)
            sha = rs.resolve_rev(source.git_dir, rev)
            detection = rs.detect_setup(rs.RepoFiles(source.git_dir, sha), python=python, install=install,
                                     packages=package, test_cmd=test_cmd)
        record = RepoRecord(name=name, repo=repo or source.default_repo(name), source=source.source,
                            environment=detection.environment, head=sha,
                            test_spec=TestSpec(command=detection.test_spec.command, timeout=timeout))
    except (rs.RepoSetupError, ValueError) as exc:
        fail(str(exc))
    env = record.environment
    out.print(f"[bold]{escape(name)}[/]: {escape(record.repo)} at {sha[:12]} ({escape(rev)}) from "
              f"{escape(record.source)}", highlight=False)
    for label, value in (("python", env.python), ("packages", " ".join(env.packages) or "-"),
                         ("install", " && ".join(env.install) or "-"), ("tests", record.test_spec.command)):
        out.print(f"  {label:<9}{escape(value)}", highlight=False)
    for note in (*source.notes, *detection.notes):
        out.print(f"  [dim]• {escape(note)}[/]", highlight=False)
    if not source.is_url and rev == "HEAD" and rs.uncommitted_changes(source.git_dir):
        console.print(f"[yellow]warning:[/] {escape(source.source)} has uncommitted changes; they are not part "
                      f"of {sha[:12]}, which is what gets checked and registered", highlight=False)

    started = time.monotonic()
    try:
        with console.status(f"checking out {sha[:12]} and building its environment (python {env.python}, "
                            f"{len(env.packages)} package(s), {len(env.install)} install step(s))…") as status:
            def build_then_run(task):
                sandbox = factory(task)
                status.update(f"running the whole test suite at {sha[:12]}…")
                return sandbox

            run = probe(record.probe_task(sha), factory=build_then_run)
    except (SandboxError, TaskFileError) as exc:
        console.print(f"[bold red]the environment could not be built[/] (an infrastructure failure, not a test "
                      f"result):\n{escape(str(exc)[-3000:])}", highlight=False)
        if not force:
            fail("not registered: fix the environment with --install, --package or --python (or --force)", code=1)
        console.print("[yellow]warning:[/] registering anyway (--force); its suite was not checked")
    else:
        check = rs.check_suite(run, min_pass)
        rate = "" if check.pass_rate is None else f", {check.pass_rate:.0%} pass"
        out.print(f"suite at {sha[:12]}: {check.counts}{rate} ({time.monotonic() - started:.1f}s)", highlight=False)
        if check.failing:
            out.print(f"failing tests (first {min(10, len(check.failing))} of {len(check.failing)}):")
            for test in check.failing[:10]:
                reason = check.reasons.get(test)
                out.print(f"  {escape(test)}" + (f"  [dim]— {escape(reason[:150])}[/]" if reason else ""),
                          highlight=False)
        if not check.ok:
            if not check.collected or not check.passed:
                out.rule("end of the test output")
                out.print(check.tail, markup=False, highlight=False)
                out.rule()
            if not force:
                hint = ("point --test-cmd at the tests or fix the environment (--install/--package/--python)"
                        if not check.collected else "fix the environment (--install/--package/--python), lower "
                        "--min-pass")
                fail(f"not registered: {check.problem} at {sha[:12]}; {hint}, or pass --force", code=1)
            console.print(f"[yellow]warning:[/] registering anyway (--force): {escape(check.problem or '')}")
    path = save_repo(record)
    out.print(f"registered {escape(name)} ({escape(record.repo)}) at {sha[:12]} → {path}", highlight=False)


@repos_app.command("list")
def repos_list() -> None:
    """List the repositories tasks can be made from: registered ones, then the bundled libraries."""
    from gym_envs.making.registry import list_repos

    try:
        records = list_repos()
    except ValueError as exc:
        fail(f"cannot read the repository registry: {exc}")
    table = Table(title=f"{len(records)} repositories")
    for col in ("name", "repo", "source", "python", "test command", "head", "bundled"):
        table.add_column(col, overflow="fold", no_wrap=col in ("python", "head", "bundled"))
    for r in records:
        table.add_row(r.name, r.repo, r.source, r.environment.python, r.test_spec.command,
                      (r.head or "-")[:12], "yes" if r.bundled else "no")
    out.print(table)


@tasks_app.command("import-swebench")
def tasks_import_swebench(
    file: Annotated[str, typer.Argument(
        metavar="ROWS", help="SWE-bench rows: a JSON array, a JSONL or parquet file, or a Hugging Face dataset "
        "(owner/name[:split], or its directory; needs the datasets library).")],
    repos: Annotated[str, typer.Option(
        "--repos", help="Directory of clones, mirrors or bundles (owner__name or name, bare, .git or .bundle), "
        "or a clone URL: https://github.com, or a template with {repo}, {owner}, {name} (cloned once, cached).")],
    output: Annotated[Path, typer.Option("--output", help="Task file to write (.jsonl, or .json for an array).")],
    specs: Annotated[Path | None, typer.Option(
        "--specs", help='Install configs by repository and version (JSON: {"owner/name": {"<version>": {...}}}).',
    )] = None,
    validate: Annotated[bool, typer.Option(
        "--validate/--no-validate", help="Run the gold and empty patches; write only the tasks that pass.")] = True,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Gold runs per task when validating.")] = 2,
    selection: Annotated[str, typer.Option(
        "--selection", help="pytest rows: run the whole test files that hold the listed tests, as SWE-bench "
        "did (files), or just the listed tests (ids: faster where test files are large; a test that needs an "
        "earlier one of its file fails).")] = "files",
    workers: WorkersOpt = DEFAULT_WORKERS,
    backend: BackendOpt = "local",
    isolation: IsolationOpt = "auto",
) -> None:
    """Import SWE-bench rows as a task file: each row's repository found in --repos, its environment
    from its install_config, else --specs, else patchgym's built-in specs of SWE-bench's repositories, else
    defaults (with a warning)."""
    from rich.markup import escape

    from tasks.catalog import TaskSet
    from tasks.model import TaskFileError
    from tasks.swebench_io import export_row, import_swebench, missing_commits, write_rows

    if selection not in ("files", "ids"):
        fail(f"--selection: expected 'files' or 'ids', got {selection!r}", code=2)
    try:
        result = import_swebench(file, repos=repos, output=output, specs_path=specs,
                                 selection="ids" if selection == "ids" else "files")
    except TaskFileError as exc:
        fail(str(exc))
    for message in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)
    dropped = [(d.instance_id or d.where, d.reason) for d in result.dropped]
    commits = missing_commits(result.tasks)
    kept = result.tasks
    if not validate:
        for instance_id, reason in commits.items():
            console.print(f"[yellow]warning:[/] {escape(instance_id)}: {escape(reason)}", highlight=False)
    else:
        dropped += list(commits.items())
        kept = [t for t in kept if t.instance_id not in commits]
        if kept:
            verifier = _verifier(backend, isolation)
            results = _validate_with_progress(TaskSet(kept, str(output)), verifier, runs=runs, workers=workers,
                                              failed_word="dropped")
            problems = {r.instance_id: "; ".join(r.problems) for r in results if not r.ok}
            dropped += list(problems.items())
            kept = [t for t in kept if t.instance_id not in problems]
    if dropped:
        table = Table(title=f"{len(dropped)} rows dropped")
        table.add_column("row", overflow="fold")
        table.add_column("reason", overflow="fold")
        for where, reason in dropped:
            table.add_row(escape(where), escape(reason))
        out.print(table)
    sources: dict[str, int] = {}
    for t in kept:
        source = result.environment_source.get(t.instance_id, "row")
        sources[source] = sources.get(source, 0) + 1
    if not kept:
        fail(f"no task to write: {len(dropped)} rows dropped", code=1)
    write_rows([export_row(t, tests_encoding="source", output_dir=output.resolve().parent) for t in kept], output)
    how = ", ".join(f"{n} from {s}" for s, n in sources.items())
    out.print(f"wrote {len(kept)} tasks to {escape(str(output))} ({len(dropped)} dropped; environments: {how})"
              + ("" if validate else " without validation"), highlight=False)


@tasks_app.command("export")
def tasks_export(
    output: Annotated[Path, typer.Option("--output", help="File to write (.jsonl, or .json for an array).")],
    tasks: TasksOpt = None,
    instance_ids: Annotated[list[str] | None,
                            typer.Option("--instance-ids", help="Only these ids (repeat, or comma-separate).")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="jsonl or json (default: by the file's suffix).")] = None,
    swebench_only: Annotated[bool, typer.Option(
        "--swebench-only", help="Only the rows' own fields: no environment, test_spec or repo_path.")] = False,
    tests_encoding: Annotated[str, typer.Option(
        "--tests-encoding", help="FAIL_TO_PASS/PASS_TO_PASS as json strings (as published), list, or source "
        "(as in the task file).")] = "json",
) -> None:
    """Write tasks as SWE-bench rows (an imported file exported with --swebench-only gives back the
    rows it was imported from)."""
    from tasks.swebench_io import export_rows, row_format, write_rows

    if tests_encoding not in ("json", "list", "source"):
        fail(f"unknown --tests-encoding {tests_encoding!r}; use json, list or source")
    try:
        fmt = row_format(output, fmt)
    except ValueError as exc:
        fail(str(exc))
    task_set = _load(tasks, instance_ids)
    rows = export_rows(task_set, swebench_only=swebench_only, tests_encoding=tests_encoding,
                       output_dir=output.resolve().parent)
    write_rows(rows, output, fmt)
    out.print(f"wrote {len(rows)} SWE-bench rows to {output}", highlight=False)


@tasks_app.command("synth")
def tasks_synth(
    repo: Annotated[str, typer.Option("--repo", help="Repository to inject bugs into (registered or bundled).")],
    n: Annotated[int, typer.Option("--n", min=1, help="Tasks wanted: mutants are tried until this many break tests.")],
    output: Annotated[Path, typer.Option("--output", help="JSONL file for the tasks (their commits go in "
                                                          "<stem>.bundle beside it).")],
    seed: Annotated[int, typer.Option("--seed", help="Same seed, same tasks.")] = 0,
    kinds: Annotated[list[str] | None, typer.Option(
        "--kinds",
        help="Mutation kinds (repeat, or comma-separate; default: all). See gym_envs/making/synth/mutations.py.")
    ] = None,
    rev: Annotated[str | None, typer.Option("--rev", help="Revision to inject bugs into (default: HEAD).")] = None,
    validate: Annotated[bool, typer.Option(
        "--validate/--no-validate", help="Validate the tasks; only valid ones are written.")] = True,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Gold runs per task when validating.")] = 2,
    max_failing: Annotated[float, typer.Option(
        "--max-failing", min=0.0, max=1.0, help="Drop bugs breaking more than this fraction of the passing tests.")
    ] = 1.0,
    rewrite_url: Annotated[str | None, typer.Option(
        "--rewrite-url", help="OpenAI-compatible base URL (…/v1) to rewrite problem statements with.")] = None,
    rewrite_model: Annotated[str | None, typer.Option("--rewrite-model", help="Model for --rewrite-url.")] = None,
    rewrite_api_key: Annotated[str | None, typer.Option(
        "--rewrite-api-key", envvar="PATCHGYM_REWRITE_API_KEY", help="Key for --rewrite-url.")] = None,
    workers: WorkersOpt = DEFAULT_WORKERS,
    backend: BackendOpt = "local",
    isolation: IsolationOpt = "auto",
) -> None:
    """Make tasks by injecting bugs (SWE-smith style): small AST mutations of functions the tests reach,
    kept when they break tests, then validated (pipeline: gym_envs/making/synth/generate.py)."""
    from gym_envs.making.registry import UnknownRepoError, get_repo
    from gym_envs.making.synth import KINDS, Listener, SynthError, SynthOptions, synthesize

    wanted = [k for chunk in kinds or [] for k in chunk.replace(",", " ").split()] or list(KINDS)
    unknown = [k for k in wanted if k not in KINDS]
    if unknown:
        fail(f"unknown mutation kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    if bool(rewrite_url) != bool(rewrite_model):
        fail("--rewrite-url and --rewrite-model go together")
    try:
        record = get_repo(repo)
    except UnknownRepoError as exc:
        fail(str(exc))
    options = SynthOptions(n=n, seed=seed, kinds=tuple(wanted), rev=rev, workers=workers, validate=validate,
                           runs=runs, max_failing_fraction=max_failing, rewrite_url=rewrite_url,
                           rewrite_model=rewrite_model, rewrite_api_key=rewrite_api_key)
    verifier = _verifier(backend, isolation)
    with _progress() as progress:

        class Bars(Listener):
            bar = None

            def stage(self, name: str, total: int | None) -> None:
                self.bar = progress.add_task(name, total=total, status="")

            def step(self, status: str, advance: int = 1) -> None:
                progress.update(self.bar, advance=advance, status=status)

        try:
            report = synthesize(record, output, options, verifier=verifier, factory=verifier.factory, listener=Bars())
        except SynthError as exc:
            fail(str(exc))
    checks = {r.instance_id: r for r in report.validations}
    table = Table(title=f"synthesized tasks of {record.name} at {report.rev[:12]}")
    for col in ("instance_id", "kind", "function", "F2P", "P2P", "validation"):
        table.add_column(col, overflow="fold")
    for task in report.candidates:
        meta = (task.model_extra or {}).get("synth", {})
        check = checks.get(task.instance_id)
        verdict = ("-" if check is None else "[green]ok[/]" if check.ok
                   else "[red]" + "; ".join(check.problems).replace("[", "\\[") + "[/]")
        table.add_row(task.instance_id, meta.get("kind", ""), f"{meta.get('path')}:{meta.get('function')}",
                      str(len(task.FAIL_TO_PASS)), str(len(task.PASS_TO_PASS)), verdict)
    if report.candidates:
        out.print(table)
    summary = Table(title=f"yield per mutation kind ({report.functions} functions, {report.sites} sites, "
                          f"seed {seed})")
    for col in ("kind", "tried", "broke tests", "kept" + (" (validated)" if validate else "")):
        summary.add_column(col, justify="right" if col != "kind" else "left")
    totals = [0, 0, 0]
    for kind, counts in report.by_kind().items():
        summary.add_row(kind, *map(str, counts))
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
    summary.add_row("[bold]total", *map(str, totals))
    out.print(summary)
    dropped = report.dropped()
    if dropped:
        out.print("mutants dropped: " + "; ".join(f"{reason} {n}" for reason, n in dropped.most_common()),
                  highlight=False)
    written, seconds = len(report.tasks), report.seconds
    if validate and written:
        out.print(f"validated {written}/{len(report.candidates)}; per validated task: "
                  f"{seconds.get('validation', 0.0) / written:.1f}s validating, "
                  f"{seconds['total'] / written:.1f}s in all ({seconds['total']:.1f}s total)")
    out.print(f"wrote {written} task(s) to {report.output}" + (f" (commits: {report.bundle})" if report.bundle else "")
              + ("" if validate else " (not validated)"))
    if not written:
        raise typer.Exit(1)


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
    price_core_hour: PriceCoreHourOpt = DEFAULT_PRICE_CORE_HOUR,
    price_gb_hour: PriceGbHourOpt = DEFAULT_PRICE_GB_HOUR,
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
                   "output_limit": output_limit, "prices": prices(price_core_hour, price_gb_hour)}
    if backend == "ray" or ray_address:
        env_options["sandbox_options"] = backend_options(backend, ray_address=ray_address, ray_sandbox=ray_sandbox)
    try:
        api = create_app(tasks=_load(tasks), backend=backend, max_sessions=max_sessions, token=token or None,
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


register_run_commands(app)


def main() -> None:
    from rich.logging import RichHandler

    logging.basicConfig(level=os.environ.get("PATCHGYM_LOG", "WARNING").upper(), format="%(message)s",
                        handlers=[RichHandler(console=console, show_path=False)])
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
