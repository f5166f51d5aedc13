"""``patchgym trajectories``: the episodes of ``patchgym run`` as training data (SFT or
rejection-sampling rows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from patchgym.cli.common import fail, out


def export_trajectories(
    source: Annotated[Path, typer.Argument(help="A run directory, or a trajectories.jsonl.")],
    output: Annotated[Path, typer.Option("--output", help="JSONL file to write.")],
    fmt: Annotated[str, typer.Option("--format", help="chat or openai-ft.")] = "chat",
    all_episodes: Annotated[bool, typer.Option(
        "--all", help="Unresolved episodes too (masked ones never).")] = False,
) -> None:
    """Write episodes as SFT / rejection-sampling data: resolved ones unless --all."""
    from patchgym.rollouts.export import export_trajectories

    try:
        rows = list(export_trajectories(source, fmt, include_unresolved=all_episodes))
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    out.print(f"wrote {len(rows)} episode(s) to {output}")
