"""What every ``patchgym`` command shares: the consoles, the error exit, the option types, loading
a task selection, the grader the backend flags give, and progress that also reads well in a log.

Nothing of the layers below is imported at module level: ``patchgym --help`` and each command's
parsing stay cheap, and a command imports what it drives in its body.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from patchgym.grading.cost import Prices
    from patchgym.grading.verifier import Verifier
    from patchgym.tasks.catalog import TaskSet

#: The sandbox backends, for help texts: spelt here so that the command line (--help included) does
#: not import the sandboxes and the task model to describe itself. tests/test_cli.py holds it equal
#: to tasks.backends.BACKENDS, the list that counts.
BACKENDS = ("local", "docker", "ray")
#: The Debian releases patchgym knows Python versions of (sandboxes.docker.images.RELEASES), likewise.
DEBIAN_RELEASES = ("bullseye", "bookworm", "trixie")
DEFAULT_WORKERS = max(1, os.cpu_count() or 1)

# Where output is a log or a pipe, not a terminal: lines are never wrapped (rich's default there is 80
# columns: progress lines broken mid-word, ids split in table cells), and tables take the width they need.
PIPE_WIDTH = 1000


def _console(*, stderr: bool) -> Console:
    terminal = Console(stderr=stderr)
    return terminal if terminal.is_terminal else Console(stderr=stderr, width=PIPE_WIDTH, soft_wrap=True)


console = _console(stderr=True)  # progress, warnings and errors
out = _console(stderr=False)  # results
_interrupt_hint: list[str] = []  # what Ctrl-C says at once: how the command resumes (say_on_interrupt)

TasksOpt = Annotated[Path | None, typer.Option("--tasks", help="Task file or directory (default: bundled catalog).")]
InstanceIdsOpt = Annotated[list[str] | None,
                           typer.Option("--instance-ids", help="Only these ids (repeat, or comma-separate).")]
BackendOpt = Annotated[str, typer.Option("--backend", help=f"Sandbox backend: {', '.join(BACKENDS)}.")]
IsolationOpt = Annotated[str, typer.Option("--isolation", help="Local backend: auto, bwrap or none.")]
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, help="Instances graded at once.")]
PriceCoreHourOpt = Annotated[float | None, typer.Option(
    "--price-core-hour", min=0, help="Dollars per core-hour of CPU, for each episode's cost (default: AWS Fargate's).")]
PriceGbHourOpt = Annotated[float | None, typer.Option(
    "--price-gb-hour", min=0, help="Dollars per GB-hour of memory, for each episode's cost (default: AWS Fargate's).")]
TamperingRewardOpt = Annotated[float, typer.Option(
    "--tampering-reward", help="The reward of a grading that found tampering (reported apart, never masked); "
                               "below 0 it gives forging a price (docs/grading.md).")]
RayAddressOpt = Annotated[str | None, typer.Option(
    "--ray-address", help="--backend ray: the Ray cluster (host:port or ray://...) whose nodes host the sandboxes "
                          "(default: $RAY_ADDRESS, else a private one-node cluster on this host).")]
RaySandboxOpt = Annotated[str, typer.Option(
    "--ray-sandbox", help="--backend ray: the sandbox each node runs, local or docker.")]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a red ``error:`` line and exit (2: the user's input was wrong). ``message`` is plain
    text: brackets in it (test ids, pip extras) are printed, not read as rich markup."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def say_on_interrupt(hint: str) -> None:
    """What Ctrl-C makes this command say at once, in one line after ``interrupted:``, before the
    work under way winds down: how to resume (``rerun the same command ...``). Said by
    :func:`patchgym.cli.app.main`'s SIGINT handler."""
    _interrupt_hint[:] = [hint]


def interrupt_hint() -> str | None:
    return _interrupt_hint[0] if _interrupt_hint else None


def rule(title: str = "") -> None:
    """A horizontal rule on ``out``: across the terminal, or a short one in a log (which has no width)."""
    if out.is_terminal:
        out.rule(f"[bold]{escape(title)}" if title else "")
    else:
        out.print(f"── {title} ──" if title else "─" * 40, markup=False, highlight=False)


@contextmanager
def status(text: str) -> Iterator[Callable[[str], None]]:
    """A spinner saying ``text`` on a terminal; in a log (where a spinner draws nothing), ``text``
    as a line. Yields a function that says the next step (the spinner's text, or a line)."""
    if console.is_terminal:
        with console.status(escape(text)) as spinner:
            yield lambda step: spinner.update(escape(step))
        return
    say = functools.partial(console.print, markup=False, highlight=False)
    say(text)
    yield say


def prices(core_hour: float | None, gb_hour: float | None) -> Prices:
    """The prices the --price-* flags give (unset: the defaults; an impossible one is the user's error)."""
    from patchgym.grading.cost import Prices

    given = {k: v for k, v in (("core_hour", core_hour), ("gb_hour", gb_hour)) if v is not None}
    try:
        return Prices(**given)
    except ValueError as exc:
        fail(str(exc))


def split_ids(ids: list[str] | None) -> list[str]:
    """Values of a list option (ids, mutation kinds) given repeated, comma- or space-separated."""
    return [i for chunk in ids or [] for i in chunk.replace(",", " ").split()]


def load_selection(tasks: Path | None, ids: list[str] | None) -> tuple[TaskSet, TaskSet]:
    """The whole task set and the selected part of it (``ids`` repeated or comma-separated)."""
    from patchgym.tasks.catalog import UnknownTaskError, load_task_set
    from patchgym.tasks.model import TaskFileError

    try:
        task_set = load_task_set(tasks)
        return task_set, task_set.select(split_ids(ids) or None)
    except (TaskFileError, UnknownTaskError) as exc:
        fail(str(exc))


def load_tasks(tasks: Path | None, ids: list[str] | None = None) -> TaskSet:
    """The selected tasks alone."""
    return load_selection(tasks, ids)[1]


def backend_options(backend: str, isolation: str = "auto", ray_address: str | None = None,
                    ray_sandbox: str = "local") -> dict[str, Any]:
    """The sandbox options the command line's flags give ``backend``.

    For ``ray`` this connects to the cluster at once, so that a wrong address or a cluster without
    sandbox capacity fails before any work starts rather than on the first task.
    """
    if backend != "ray":
        if ray_address:
            fail("--ray-address needs --backend ray")
        return {"isolation": isolation} if backend == "local" else {}
    from patchgym.sandboxes.ray_cluster import RayUnavailableError, ensure_connected, require_capacity

    if ray_sandbox not in ("local", "docker"):
        fail(f"--ray-sandbox must be local or docker, not {ray_sandbox!r}")
    try:
        ray = ensure_connected(ray_address)
        slots, nodes = require_capacity()
    except RayUnavailableError as exc:
        fail(str(exc))
    console.print(f"ray: {slots:g} sandbox slot(s) on {nodes} node(s)", highlight=False)
    # The cluster this process joined (or started), named for the processes it starts (serve's grading
    # workers): without it they would look for one themselves, and fail, or join another on the host.
    joined = ray_address if ray_address and ray_address.startswith("ray://") else ray.get_runtime_context().gcs_address
    return {"inner": ray_sandbox, "address": joined, **({"isolation": isolation} if ray_sandbox == "local" else {})}


def make_verifier(backend: str, isolation: str, ray_address: str | None = None, ray_sandbox: str = "local",
             price: Prices | None = None, tampering_reward: float = 0.0) -> Verifier:
    """The grader the backend flags give, after removing what dead processes left behind."""
    from patchgym.grading.verifier import Verifier
    from patchgym.tasks.backends import sandbox_factory

    options = backend_options(backend, isolation, ray_address, ray_sandbox)
    if "docker" in (backend, options.get("inner")) and "PATCHGYM_DOCKER_POOL" not in os.environ:
        # Grading alone asks for each image about once, and a container started ahead competes with
        # the tests for the cores: no warm pool unless asked for (bench/README.md, docker_pool.py).
        options["pool_size"] = 0
    try:
        grader = Verifier(sandbox_factory(backend, **options), prices=price, tampering_reward=tampering_reward)
    except ValueError as exc:
        fail(str(exc))
    reap(docker=backend == "docker")
    return grader


def reap(*, docker: bool, every_owner: bool = False, kept: list[str] | None = None) -> dict[str, int]:
    """Remove what dead processes left: local sandboxes and cgroups, and patchgym's containers
    (with ``every_owner``, also those of live processes and of other hosts sharing the engine);
    ``kept`` receives the containers left, and why."""
    from patchgym.sandboxes import SandboxError, reap_stale

    removed = {"local": reap_stale(), "docker": 0}
    if docker:
        from patchgym.sandboxes.docker import gc_containers

        try:
            removed["docker"] = len(gc_containers(include_live_owners=every_owner, other_hosts=every_owner,
                                                      kept=kept))
        except SandboxError as exc:
            fail(str(exc))
    return removed


class LineProgress:
    """rich's ``Progress`` interface (``add_task``, ``update``, a context manager), written as plain
    lines: what long work shows when stderr is a log file or a pipe, where a live bar draws nothing.

    A line is printed when a task starts and when it advances, at most every ``interval`` seconds
    per task (and always for its last item), with the count, the rate, an estimate of the time left,
    and the status. The rate counts only this command's items: a ``resumed`` field (items done by an
    earlier run, found on disk) is left out of it. Meanwhile a watcher says the steps under way that
    take long (:mod:`patchgym.sandboxes.phases`: after ``phase_after`` seconds, then every
    ``phase_every``), so that minutes of a build or a test run are not minutes of silence."""

    def __init__(self, interval: float = 2.0, *, phase_after: float = 30.0, phase_every: float = 60.0) -> None:
        self.interval = interval
        self.phase_after, self.phase_every = phase_after, phase_every
        self.tasks: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> LineProgress:
        self._watcher = threading.Thread(target=self._watch, name="patchgym-phases", daemon=True)
        self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)

    def _watch(self) -> None:
        from patchgym.sandboxes.phases import overdue

        while not self._stop.wait(min(1.0, self.phase_after)):
            for what, age in overdue(self.phase_after, self.phase_every):
                console.print(f"  {what}: {age:.0f}s so far", markup=False, highlight=False)

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> int:
        task_id = len(self.tasks)
        now = time.monotonic()
        task = {"description": description, "total": total, "completed": 0.0, "started": now, "printed": now,
                **fields}
        task["base"] = task.pop("resumed", task["completed"])  # done before (a resumed run): not in the rate
        self.tasks[task_id] = task
        console.print(self.line(task, now), markup=False, highlight=False)  # at once: the work has started
        return task_id

    def update(self, task_id: int, *, advance: float | None = None, completed: float | None = None,
               total: float | None = None, **fields: Any) -> None:
        task = self.tasks[task_id]
        before, status = task["completed"], task.get("status")
        if total is not None:
            task["total"] = total
        if completed is not None:
            task["completed"] = completed
        if advance:
            task["completed"] += advance
        if "resumed" in fields:
            task["base"] = fields.pop("resumed")
        task.update(fields)
        now = time.monotonic()
        finished = task["total"] is not None and task["completed"] >= task["total"]
        moved = task["completed"] != before or task.get("status") != status  # a new status is news too
        if moved and (finished or now - task["printed"] >= self.interval):
            task["printed"] = now
            console.print(self.line(task, now), markup=False, highlight=False)

    @staticmethod
    def line(task: dict[str, Any], now: float) -> str:
        done, total, elapsed = task["completed"], task["total"], now - task["started"]
        count = f"{done:g}/{total:g}" if total is not None else f"{done:g}"
        new = done - task.get("base", 0.0)
        words = [task["description"], count, f"{elapsed:.0f}s"]
        if new > 0 and elapsed > 0:
            words.append(f"{new / elapsed * 60:.1f}/min")
            if total is not None and done < total:
                words.append(f"ETA {(total - done) * elapsed / new:.0f}s")
        if task.get("base"):
            words.append(f"{task['base']:g} resumed")
        status = str(task.get("status") or "")
        return "  ".join(words) + (f"  {status}" if status else "")


class _PhaseLines(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        console.print(record.getMessage(), markup=False, highlight=False)


def show_phases() -> None:
    """Show the steps :mod:`patchgym.sandboxes.phases` announces (environment and image builds,
    step by step) whatever ``PATCHGYM_LOG`` says, as plain lines on the progress console."""
    logger = logging.getLogger("patchgym.phase")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if not any(isinstance(h, _PhaseLines) for h in logger.handlers):
        logger.addHandler(_PhaseLines())


def progress_bar() -> Progress | LineProgress:
    """A live bar on a terminal, progress lines otherwise (logs, CI, ``nohup``)."""
    if not console.is_terminal:
        return LineProgress()
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console)
