"""``patchgym tasks``: task sets browsed (``list``, ``show``), checked (``validate``), brought in and
out as SWE-bench rows (``import-swebench``, ``export``), made from a registered repository (``mine``
from its fix commits, ``synth`` by injecting bugs) and written as NeMo Gym dataset rows
(``nemo-gym-dataset``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from patchgym.cli.common import (
    DEFAULT_WORKERS,
    BackendOpt,
    InstanceIdsOpt,
    IsolationOpt,
    RayAddressOpt,
    RaySandboxOpt,
    TasksOpt,
    WorkersOpt,
    console,
    fail,
    load_tasks,
    make_verifier,
    out,
    progress_bar,
    rule,
    say_on_interrupt,
    split_ids,
    status,
)

if TYPE_CHECKING:
    from patchgym.grading.verifier import Verifier
    from patchgym.making.validation import TaskValidation
    from patchgym.tasks.catalog import TaskSet
    from patchgym.tasks.model import Task


WhereOpt = Annotated[list[str] | None, typer.Option(
    "--where", help="Keep tasks where FIELD OP VALUE holds (repeat: all must): kind, repo (= or !=, "
    "comma-separated choices), changed_lines, changed_files, broken_tests, passing_tests (= != < <= > >=); "
    "e.g. --where kind=operator,comparison --where 'broken_tests<=3'.")]
SampleOpt = Annotated[int | None, typer.Option("--sample", min=1, help="Then draw this many of them (--seed).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of --sample: the same seed draws the same tasks.")]


def _filtered(task_set: TaskSet, where: list[str] | None, sample: int | None, seed: int) -> TaskSet:
    from patchgym.tasks.catalog import filter_tasks

    try:
        return filter_tasks(task_set, where or (), sample, seed)
    except ValueError as exc:
        fail(str(exc), code=2)


def list_tasks(tasks: TasksOpt = None, where: WhereOpt = None, sample: SampleOpt = None, seed: SeedOpt = 0,
               as_json: Annotated[bool, typer.Option(
                   "--json", help="Print a JSON array: each task's id, repository, title and what --where "
                                  "filters on.")] = False) -> None:
    """List the tasks of a task set, with what a curriculum filters on (--where, --sample). Nothing
    listed (--where matched no task) is exit status 1."""
    from patchgym.tasks.catalog import difficulty

    everything = load_tasks(tasks)
    task_set = _filtered(everything, where, sample, seed)
    rows = []
    for t in task_set:
        title = t.problem_statement.strip().splitlines()[0] if t.problem_statement.strip() else ""
        rows.append({"instance_id": t.instance_id, **difficulty(t), "title": title})
    if as_json:
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
    if not rows:
        console.print(f"no task of {everything.origin} ({len(everything)}) matches "
                      + " and ".join(f"--where {w!r}" for w in where or ()) if where else "no tasks",
                      markup=False, highlight=False)
        raise typer.Exit(1)
    if as_json:
        return
    table = Table(title=f"{len(task_set)} tasks ({task_set.origin})")
    for col in ("instance_id", "repo", "kind", "lines", "FAIL_TO_PASS", "PASS_TO_PASS", "title"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(row["instance_id"], row["repo"], str(row["kind"]), str(row["changed_lines"]),
                      str(row["broken_tests"]), str(row["passing_tests"]), row["title"][:70])
    out.print(table)


def show(instance_id: str, tasks: TasksOpt = None,
               as_json: Annotated[bool, typer.Option("--json", help="Print the whole row as JSON.")] = False) -> None:
    """Show one task: its bug report, environment and tests."""
    task = load_tasks(tasks, [instance_id]).get(instance_id)
    if as_json:
        out.print_json(json.dumps(task.to_row()))
        return
    rule(task.instance_id)
    out.print(f"repo: {task.repo}   base_commit: {task.base_commit}   version: {task.version}   "
              f"created_at: {task.created_at}")
    out.print(f"environment: python {task.environment.python}; packages: {', '.join(task.environment.packages) or '-'}")
    out.print(f"test command: {task.test_spec.command}")
    out.print(f"FAIL_TO_PASS ({len(task.FAIL_TO_PASS)}): " + ", ".join(task.FAIL_TO_PASS))
    out.print(f"PASS_TO_PASS: {len(task.PASS_TO_PASS)} tests")
    rule("problem statement")
    out.print(task.problem_statement, markup=False, highlight=False)


def validate_with_progress(task_set: TaskSet, verifier: Verifier, *, runs: int, workers: int,
                            failed_word: str) -> list[TaskValidation]:
    """``validate_tasks`` behind a progress bar counting the tasks that failed so far."""
    from patchgym.making.validation import validate_tasks

    with progress_bar() as progress:
        bar = progress.add_task("validating", total=len(task_set), status="")
        bad = 0

        def done(r: TaskValidation) -> None:
            nonlocal bad
            bad += 0 if r.ok else 1
            progress.update(bar, advance=1, status=f"{bad} {failed_word}")

        return validate_tasks(task_set, verifier, runs=runs, workers=workers, on_done=done)


def validate(
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
    task_set = load_tasks(tasks, instance_ids)
    verifier = make_verifier(backend, isolation, ray_address, ray_sandbox)
    say_on_interrupt("a validation keeps no partial results: rerun the same command to start it again "
                     "(environments built so far are cached)")
    results = validate_with_progress(task_set, verifier, runs=runs, workers=workers, failed_word="problem(s)")
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


def import_swebench(
    file: Annotated[str, typer.Argument(
        metavar="ROWS", help="SWE-bench rows: a JSON array, a JSONL or parquet file, or a Hugging Face dataset "
        "(owner/name[:split], or its directory; needs the datasets library).")],
    repos: Annotated[str, typer.Option(
        "--repos", help="Directory of clones, mirrors or bundles (owner__name or name, bare, .git or .bundle), "
        "or a clone URL: https://github.com, or a template with {repo}, {owner}, {name} (cloned once, cached).")],
    output: Annotated[Path, typer.Option("--output", help="Task file to write (.jsonl, or .json for an array).")],
    specs: Annotated[Path | None, typer.Option(
        "--specs", help='Install configs by repository and version: SWE-bench\'s harness constants (the '
             'swebench/harness/constants directory or a file of it, read without running it, or JSON of its '
             'tables), or JSON {"owner/name": {"<version>": {...}}}.',
    )] = None,
    validate: Annotated[bool, typer.Option(
        "--validate/--no-validate", help="Run the gold and empty patches; write only the tasks that pass.")] = True,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Gold runs per task when validating.")] = 2,
    selection: Annotated[str, typer.Option(
        "--selection", help="pytest rows: run the whole test files that hold the listed tests, as SWE-bench "
        "did (files), or just the listed tests (ids: faster where test files are large; a test that needs an "
        "earlier one of its file fails).")] = "files",
    auto_env: Annotated[bool, typer.Option(
        "--auto-env", help="Choose every environment not given by the row or --specs from the repository's own "
        "declarations, as for a repository no spec covers, even where a built-in spec exists (to measure "
        "it).")] = False,
    auto_limit: Annotated[int, typer.Option(
        "--auto-limit", min=1, help="Recipes tried at most per row when choosing an environment automatically.")] = 6,
    auto_report: Annotated[Path | None, typer.Option(
        "--auto-report", help="Write each automatic choice (recipes tried, why each failed) as JSONL here.")] = None,
    workers: WorkersOpt = DEFAULT_WORKERS,
    backend: BackendOpt = "local",
    isolation: IsolationOpt = "auto",
) -> None:
    """Import SWE-bench rows as a task file: each row's repository found in --repos, its environment
    from its install_config, else --specs, else patchgym's built-in specs of SWE-bench's repositories, else
    one chosen from the repository's declarations (recipes tried until its tests collect; --auto-env
    skips the built-in specs too)."""
    from rich.markup import escape

    from patchgym.tasks.catalog import TaskSet
    from patchgym.tasks.model import TaskFileError
    from patchgym.tasks.swebench_io import export_row, import_swebench, missing_commits, write_rows

    if selection not in ("files", "ids"):
        fail(f"--selection: expected 'files' or 'ids', got {selection!r}", code=2)
    say_on_interrupt(f"nothing is written to {output} before the end: rerun the same command to start again "
                     f"(environments built so far are cached)")
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
    replaced = ("defaults", "builtin") if auto_env else ("defaults",)
    auto = [t for t in kept if (validate or auto_env) and t.instance_id not in commits
            and t.test_spec.format == "pytest" and result.environment_source.get(t.instance_id) in replaced]
    if auto:
        chosen, failures = _auto_environments(auto, backend, isolation, auto_limit, selection, auto_report)
        dropped += list(failures.items())
        kept = [chosen.get(t.instance_id, t) for t in kept if t.instance_id not in failures]
        result.environment_source.update({i: "auto" for i in chosen})
    if not validate:
        for instance_id, reason in commits.items():
            console.print(f"[yellow]warning:[/] {escape(instance_id)}: {escape(reason)}", highlight=False)
    else:
        dropped += list(commits.items())
        kept = [t for t in kept if t.instance_id not in commits]
        if kept:
            verifier = make_verifier(backend, isolation)
            results = validate_with_progress(TaskSet(kept, str(output)), verifier, runs=runs, workers=workers,
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


def _auto_environments(tasks: list[Task], backend: str, isolation: str, limit: int, selection: str,
                       report: Path | None) -> tuple[dict[str, Task], dict[str, str]]:
    """Each task with the environment of the first recipe whose tests collect (making.auto_env),
    or why none did; every choice is printed, and written to ``report`` when given."""
    from rich.markup import escape

    from patchgym.making.auto_env import auto_task
    from patchgym.tasks.backends import sandbox_factory

    factory = sandbox_factory(backend, **({"isolation": isolation} if backend == "local" else {}))
    chosen: dict[str, Task] = {}
    failures: dict[str, str] = {}
    lines: list[str] = []
    for n, task in enumerate(tasks, 1):
        with status(f"choosing an environment for {task.instance_id} ({n}/{len(tasks)})…"):
            choice = auto_task(task, factory, limit=limit, selection=selection)
        for attempt in choice.found.attempts if choice.found else ():
            mark = "[green]collected[/]" if attempt.ok else escape(attempt.reason)
            out.print(f"  {escape(task.instance_id)}: {escape(attempt.recipe.name)} ({attempt.seconds:.0f}s): {mark}",
                      highlight=False)
        if choice.row is not None:
            lines.append(json.dumps(choice.row))
        if choice.task is None:
            failures[task.instance_id] = choice.reason
        else:
            chosen[task.instance_id] = choice.task
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return chosen, failures


def export(
    output: Annotated[Path, typer.Option("--output", help="File to write (.jsonl, or .json for an array).")],
    tasks: TasksOpt = None,
    instance_ids: InstanceIdsOpt = None,
    fmt: Annotated[str | None, typer.Option("--format", help="jsonl or json (default: by the file's suffix).")] = None,
    swebench_only: Annotated[bool, typer.Option(
        "--swebench-only", help="Only the rows' own fields: no environment, test_spec or repo_path.")] = False,
    tests_encoding: Annotated[str, typer.Option(
        "--tests-encoding", help="FAIL_TO_PASS/PASS_TO_PASS as json strings (as published), list, or source "
        "(as in the task file).")] = "json",
    where: WhereOpt = None,
    sample: SampleOpt = None,
    seed: SeedOpt = 0,
) -> None:
    """Write tasks as SWE-bench rows (an imported file exported with --swebench-only gives back the
    rows it was imported from)."""
    from patchgym.tasks.swebench_io import export_rows, row_format, write_rows

    if tests_encoding not in ("json", "list", "source"):
        fail(f"unknown --tests-encoding {tests_encoding!r}; use json, list or source")
    try:
        fmt = row_format(output, fmt)
    except ValueError as exc:
        fail(str(exc))
    task_set = _filtered(load_tasks(tasks, instance_ids), where, sample, seed)
    rows = export_rows(task_set, swebench_only=swebench_only, tests_encoding=tests_encoding,
                       output_dir=output.resolve().parent)
    write_rows(rows, output, fmt)
    out.print(f"wrote {len(rows)} SWE-bench rows to {output}", highlight=False)


def mine(
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
    FAIL_TO_PASS/PASS_TO_PASS from running the tests before and after it (rules: making/mining.py)."""
    from patchgym.making.mining import Dropped, MiningError, load_issue_texts, mine
    from patchgym.making.registry import UnknownRepoError, get_repo

    try:
        record = get_repo(repo)
        texts = load_issue_texts(issue_text) if issue_text else None
    except (UnknownRepoError, MiningError) as exc:
        fail(str(exc))
    verifier = make_verifier(backend, isolation)
    console.print(f"reading the history of {record.name} ({record.source})", highlight=False)
    output = output.expanduser().resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    with progress_bar() as progress:
        bars: dict[str, object] = {}
        counts = [0, 0]

        def stage(name: str, total: int) -> None:
            bars[name] = progress.add_task(name, total=total, status="")

        def item(name: str, outcome) -> None:
            counts[0 if not isinstance(outcome, Dropped) else 1] += 1
            progress.update(bars[name], advance=1, status=f"{counts[0]} kept, {counts[1]} dropped")

        try:
            result = mine(record, since=since, max_candidates=max_candidates, issue_texts=texts, workers=workers,
                          factory=verifier.factory, verifier=verifier, validate_runs=runs if validate else 0,
                          p2p_all=p2p_all, on_stage=stage, on_item=item, output=output,
                          note=lambda message: console.print(message, markup=False, highlight=False))
        except MiningError as exc:
            fail(str(exc))
    summary_file = result.write_summary(output)
    table = Table(title=f"candidate commits of {record.name}")
    for col in ("commit", "subject", "outcome", "F2P", "P2P", "detail"):
        table.add_column(col, overflow="fold")
    for candidate in result.candidates:
        outcome = result.outcomes.get(candidate.sha)
        if outcome is None:
            table.add_row(candidate.short_sha, candidate.subject[:60], "not finished", "-", "-", "")
        elif isinstance(outcome, Dropped):
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
    if result.interrupted:
        summary.add_row("not finished (interrupted)", str(len(result.candidates) - len(result.outcomes)))
    out.print(summary)
    out.print(f"{output} holds {len(result.tasks)} task(s)" + ("" if validate else " (not validated)")
              + f"; counts and reasons in {summary_file.name}", highlight=False)
    if result.interrupted:
        out.print("interrupted: rerun the same command to go on where this run stopped", highlight=False)
        raise typer.Exit(130)


def synth(
    repo: Annotated[str, typer.Option("--repo", help="Repository to inject bugs into (registered or bundled).")],
    n: Annotated[int, typer.Option("--n", min=1, help="Tasks wanted: mutants are tried until this many break tests.")],
    output: Annotated[Path, typer.Option("--output", help="JSONL file for the tasks (their commits go in "
                                                          "<stem>.bundle beside it).")],
    seed: Annotated[int, typer.Option("--seed", help="Same seed, same tasks.")] = 0,
    kinds: Annotated[list[str] | None, typer.Option(
        "--kinds",
        help="Mutation kinds (repeat, or comma-separate; default: all). See making/synth/mutations.py.")
    ] = None,
    rev: Annotated[str | None, typer.Option("--rev", help="Revision to inject bugs into (default: HEAD).")] = None,
    validate: Annotated[bool, typer.Option(
        "--validate/--no-validate", help="Validate the tasks; only valid ones are written.")] = True,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Gold runs per task when validating.")] = 2,
    whole_suite: Annotated[bool, typer.Option(
        "--whole-suite", help="Check every mutant with the whole suite in a fresh sandbox, not with the tests a "
                              "traced run says reach its function in a warm one (slower; for comparison).")] = False,
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
    kept when they break tests, then validated (pipeline: making/synth/generate.py)."""
    from patchgym.making.registry import UnknownRepoError, get_repo
    from patchgym.making.synth import Listener, SynthError, SynthOptions, chosen_kinds, synthesize

    try:
        wanted = chosen_kinds(split_ids(kinds))
    except ValueError as exc:
        fail(str(exc))
    if bool(rewrite_url) != bool(rewrite_model):
        fail("--rewrite-url and --rewrite-model go together")
    try:
        record = get_repo(repo)
    except UnknownRepoError as exc:
        fail(str(exc))
    options = SynthOptions(n=n, seed=seed, kinds=wanted, rev=rev, workers=workers, validate=validate,
                           runs=runs, max_failing_fraction=max_failing, fast=not whole_suite, rewrite_url=rewrite_url,
                           rewrite_model=rewrite_model, rewrite_api_key=rewrite_api_key)
    verifier = make_verifier(backend, isolation)
    with progress_bar() as progress:

        class Bars(Listener):
            bar = None

            def stage(self, name: str, total: int | None, completed: int = 0) -> None:
                self.bar = progress.add_task(name, total=total, status="", completed=completed)

            def step(self, status: str, advance: int = 1) -> None:
                progress.update(self.bar, advance=advance, status=status)

            def note(self, message: str) -> None:
                console.print(message, markup=False, highlight=False)

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
    new = written - report.resumed
    if validate and new > 0:
        out.print(f"validated {new}/{len(report.candidates)} candidate(s) in this run; "
                  f"{seconds['total'] / new:.1f}s per validated task ({seconds['total']:.1f}s total)")
    out.print(f"{report.output} holds {written} task(s)" + (f" ({report.resumed} from an earlier run)"
                                                             if report.resumed else "")
              + (f"; commits: {report.bundle}" if report.bundle else "") + ("" if validate else " (not validated)"),
              highlight=False)
    if report.interrupted:
        out.print("interrupted: rerun the same command to go on where this run stopped", highlight=False)
        raise typer.Exit(130)
    if not written:
        raise typer.Exit(1)


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
