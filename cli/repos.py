"""Repositories and the tasks made from them: ``patchgym repos add|list`` registers and lists the
repositories, ``patchgym tasks mine`` and ``patchgym tasks synth`` make tasks from one (from its fix
commits, or by injecting bugs). One file: the three share the registry and the way a repository's
tests are run; :mod:`patchgym.cli.app` mounts ``mine`` and ``synth`` in the ``tasks`` group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from patchgym.cli.common import (
    DEFAULT_WORKERS,
    BackendOpt,
    IsolationOpt,
    WorkersOpt,
    console,
    fail,
    make_verifier,
    out,
    progress_bar,
)


def add(
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

    from patchgym.grading.testrun import probe
    from patchgym.making import git_source
    from patchgym.making import repo_setup as rs
    from patchgym.making.registry import RepoRecord, list_repos, save_repo
    from patchgym.sandboxes import SandboxError
    from patchgym.tasks.backends import sandbox_factory
    from patchgym.tasks.model import TaskFileError, TestSpec

    try:
        rs.validate_name(name)
        taken = next((r for r in list_repos() if r.name == name), None)
        if taken and not force:
            what = "a bundled repository" if taken.bundled else f"already registered ({taken.repo} from {taken.source})"
            fail(f"{name!r} is {what}; pass --force to register this one in its place")
        factory = sandbox_factory(backend, **({"isolation": isolation} if backend == "local" else {}))
        with console.status(f"reading {path_or_url}…"):
            source = git_source.open_source(path_or_url)
            sha = git_source.resolve_rev(source.git_dir, rev)
            with git_source.RepoFiles(source.git_dir, sha) as files:
                detection = rs.detect_setup(files, python=python, install=install, packages=package,
                                            test_cmd=test_cmd)
        record = RepoRecord(name=name, repo=repo or source.default_repo(name), source=source.source,
                            environment=detection.environment, head=sha,
                            test_spec=TestSpec(command=detection.test_spec.command, timeout=timeout))
    except (git_source.RepoSetupError, ValueError) as exc:
        fail(str(exc))
    env = record.environment
    out.print(f"[bold]{escape(name)}[/]: {escape(record.repo)} at {sha[:12]} ({escape(rev)}) from "
              f"{escape(record.source)}", highlight=False)
    for label, value in (("python", env.python), ("packages", " ".join(env.packages) or "-"),
                         ("install", " && ".join(env.install) or "-"), ("tests", record.test_spec.command)):
        out.print(f"  {label:<9}{escape(value)}", highlight=False)
    for note in (*source.notes, *detection.notes):
        out.print(f"  [dim]• {escape(note)}[/]", highlight=False)
    if not source.is_url and rev == "HEAD" and git_source.uncommitted_changes(source.git_dir):
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


def list_repos() -> None:
    """List the repositories tasks can be made from: registered ones, then the bundled libraries."""
    from patchgym.making.registry import list_repos

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
    summary_file = output.with_name(f"{output.stem}.summary.json")
    tmp = summary_file.with_name(f".{summary_file.name}.tmp")
    tmp.write_text(json.dumps(result.summary(), indent=2) + "\n")
    tmp.replace(summary_file)
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
    from patchgym.making.synth import KINDS, Listener, SynthError, SynthOptions, synthesize

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
