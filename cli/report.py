"""``patchgym report``: the self-contained HTML report of a run directory (``patchgym run`` writes
one when it finishes; this writes it again from the directory alone) or of an evaluation's output
directory (``patchgym eval``), or two of them side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from patchgym.cli.common import fail, out


def report(
    directory: Annotated[Path, typer.Argument(
        help="A directory of `patchgym run`, or the --output of `patchgym eval`.")],
    other: Annotated[Path | None, typer.Argument(
        help="A second one: the two side by side (per-task differences, a paired 95% interval for the difference "
             "in resolved rate).")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", help="The page to write (default: DIRECTORY/report.html; with two: "
                         "DIRECTORY/compare-<OTHER's name>.html).")] = None,
) -> None:
    """Write the HTML report of a run or an evaluation, or of two of them side by side."""
    from patchgym.rollouts.html_report import write_comparison, write_report

    try:
        if other is None:
            path = write_report(directory, output=output)
        else:
            path = write_comparison(directory, other, output or directory / f"compare-{other.resolve().name}.html")
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    out.print(f"wrote {path}", highlight=False)
