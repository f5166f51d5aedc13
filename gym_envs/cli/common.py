"""What every ``patchgym`` command shares: the consoles, errors, and loading a task selection."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from gym_envs.grading.cost import Prices

if TYPE_CHECKING:
    from tasks.catalog import TaskSet

#: The sandbox backends, for help texts: spelt here so that the command line (--help included) does
#: not import the sandboxes and the task model to describe itself. tests/test_cli.py holds it equal
#: to tasks.backends.BACKENDS, the list that counts.
BACKENDS = ("local", "docker", "ray")

console = Console(stderr=True)  # progress, warnings and errors
out = Console()  # results

TasksOpt = Annotated[Path | None, typer.Option("--tasks", help="Task file or directory (default: bundled catalog).")]


PriceCoreHourOpt = Annotated[float, typer.Option(
    "--price-core-hour", min=0, help="Dollars per core-hour of CPU, for each episode's cost (default: AWS Fargate's).")]
PriceGbHourOpt = Annotated[float, typer.Option(
    "--price-gb-hour", min=0, help="Dollars per GB-hour of memory, for each episode's cost (default: AWS Fargate's).")]


def prices(core_hour: float, gb_hour: float) -> Prices:
    """The prices the --price-* flags give (an impossible one is the user's error)."""
    try:
        return Prices(core_hour=core_hour, gb_hour=gb_hour)
    except ValueError as exc:
        fail(str(exc))


RayAddressOpt = Annotated[str | None, typer.Option(
    "--ray-address", help="--backend ray: the Ray cluster (host:port or ray://...) whose nodes host the sandboxes "
                          "(default: $RAY_ADDRESS, else a private one-node cluster on this host).")]
RaySandboxOpt = Annotated[str, typer.Option(
    "--ray-sandbox", help="--backend ray: the sandbox each node runs, local or docker.")]


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
    from sandboxes.ray_cluster import RayUnavailableError, ensure_connected, require_capacity

    if ray_sandbox not in ("local", "docker"):
        fail(f"--ray-sandbox must be local or docker, not {ray_sandbox!r}")
    try:
        ensure_connected(ray_address)
        slots, nodes = require_capacity()
    except RayUnavailableError as exc:
        fail(str(exc))
    console.print(f"ray: {slots:g} sandbox slot(s) on {nodes} node(s)", highlight=False)
    return {"inner": ray_sandbox, **({"isolation": isolation} if ray_sandbox == "local" else {})}


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a red ``error:`` line and exit (2: the user's input was wrong). ``message`` is plain
    text: brackets in it (test ids, pip extras) are printed, not read as rich markup."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def load_selection(tasks: Path | None, ids: list[str] | None) -> tuple[TaskSet, TaskSet]:
    """The whole task set and the selected part of it (``ids`` repeated or comma-separated)."""
    from tasks.catalog import UnknownTaskError, load_task_set
    from tasks.model import TaskFileError

    try:
        task_set = load_task_set(tasks)
        wanted = [i for chunk in ids or [] for i in chunk.replace(",", " ").split()]
        return task_set, task_set.select(wanted or None)
    except (TaskFileError, UnknownTaskError) as exc:
        fail(str(exc))
