"""``patchgym repos``: the repositories tasks are made from (``tasks mine``, ``tasks synth``):
``add`` registers one once its environment is built and its suite mostly passes, ``list`` shows
the registered ones and the bundled libraries."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from patchgym.cli.common import BackendOpt, IsolationOpt, console, fail, out, rule, status


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
        with status(f"reading {path_or_url}…"):
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
        with status(f"checking out {sha[:12]} and building its environment (python {env.python}, "
                    f"{len(env.packages)} package(s), {len(env.install)} install step(s))…") as say:
            def build_then_run(task):
                sandbox = factory(task)
                say(f"running the whole test suite at {sha[:12]}…")
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
                rule("end of the test output")
                out.print(check.tail, markup=False, highlight=False)
                rule()
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
