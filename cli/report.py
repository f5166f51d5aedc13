"""``patchgym report``: a run directory's self-contained HTML report, written again from what
``patchgym run`` left there (``run`` writes one when it finishes; this writes it from the directory alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from patchgym.cli.common import fail, out


def report(
    directory: Annotated[Path, typer.Argument(help="A run directory of `patchgym run`.")],
) -> None:
    """Write the run directory's self-contained HTML report (report.html)."""
    from patchgym.rollouts.html_report import write_report

    try:
        path = write_report(directory)
    except FileNotFoundError as exc:
        fail(str(exc))
    out.print(f"wrote {path}")
