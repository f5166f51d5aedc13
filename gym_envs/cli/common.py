"""What every ``patchgym`` command shares: the consoles, errors, and loading a task selection."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from tasks.catalog import TaskSet, UnknownTaskError, load_task_set
from tasks.model import TaskFileError

console = Console(stderr=True)  # progress, warnings and errors
out = Console()  # results

TasksOpt = Annotated[Path | None, typer.Option("--tasks", help="Task file or directory (default: bundled catalog).")]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a red ``error:`` line and exit (2: the user's input was wrong)."""
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def load_selection(tasks: Path | None, ids: list[str] | None) -> tuple[TaskSet, TaskSet]:
    """The whole task set and the selected part of it (``ids`` repeated or comma-separated)."""
    try:
        task_set = load_task_set(tasks)
        wanted = [i for chunk in ids or [] for i in chunk.replace(",", " ").split()]
        return task_set, task_set.select(wanted or None)
    except (TaskFileError, UnknownTaskError) as exc:
        fail(str(exc))
