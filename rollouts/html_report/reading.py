"""Reading a run directory for its HTML report: every file but ``report.json`` may be missing or
partial (a run still going, a killed one); what could not be read becomes a note on the page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class RunReportMissing(FileNotFoundError):
    """The run directory has no ``report.json`` (not a run directory, or the run has not finished)."""


def read_json(path: Path, notes: list[str], *, required: bool = False) -> Any:
    """The JSON value in ``path``; None (and a note) when it is missing or unreadable, unless
    ``required`` (then ``RunReportMissing`` or ``ValueError`` naming the file)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        if required:
            raise RunReportMissing(f"{path}: no such file (not a run directory, or the run has not "
                                   f"written its report yet)") from None
        notes.append(f"{path.name} is missing" + (": no run parameters to show." if path.name == "run.json" else "."))
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if required:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        notes.append(f"{path.name} is not valid JSON ({exc}); ignored.")
        return None


def read_jsonl(path: Path, notes: list[str]) -> list[dict] | None:
    """The JSON objects of ``path``, one a line (None when it is missing); unreadable lines, such as
    the last line of a file still being written, are skipped and counted in a note."""
    try:
        fh = path.open(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    rows, bad = [], 0
    with fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                bad += 1
    if bad:
        notes.append(f"{path.name}: {bad} unreadable line{'s' if bad != 1 else ''} skipped.")
    return rows
