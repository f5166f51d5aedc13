"""What a failed environment build says: the failing command and its error lines first, the log by path.

A build log's tail is mostly noise: pip prints a long ``ERROR: Ignored the following versions that
require a different python version: ...`` before the two lines that matter (``Could not find a
version that satisfies the requirement X`` / ``No matching distribution found for X``); uv puts
its reason after ``×`` and ``╰─▶``. Both backends' builds (:mod:`patchgym.sandboxes.environments`,
:mod:`patchgym.sandboxes.docker.images`) describe a failed step with :func:`step_failed`, from that step's
own output only (a build log holds every step before it too).
"""

from __future__ import annotations

import re
from pathlib import Path

#: How many error lines a message shows, and how long each may be.
ERROR_LINES = 6
LINE_LIMIT = 400
_NOISE = re.compile(r"^(ERROR: Ignored the following (yanked )?versions|WARNING:|DEPRECATION:|\s*warning:|"
                    r"\[notice\]|Ignored the following versions)", re.I)
_ERROR = re.compile(r"^(\s*(×|╰─▶|error\b|fatal\b|E:)|.*\b\w*(Error|Exception)\b(:|$)|.*No matching distribution|"
                    r".*Could not (find|build|install)|.*(failed|error) with exit (code|status)|"
                    r".*[Cc]ommand .* (failed|returned non-zero))", re.I)


def error_lines(output: str, limit: int = ERROR_LINES) -> list[str]:
    """The last ``limit`` lines of ``output`` that say what went wrong, noise left out; the last
    non-empty lines when none looks like an error."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    lines = [line for line in lines if not _NOISE.match(line)]
    errors = [line for line in lines if _ERROR.match(line)]
    chosen = (errors or lines)[-limit:]
    return [line if len(line) <= LINE_LIMIT else line[:LINE_LIMIT] + " ..." for line in chosen]


def read_since(log_file: Path, offset: int) -> str:
    """The log from byte ``offset`` on (one step's output), or "" when it cannot be read."""
    try:
        with log_file.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def step_failed(what: str, command: str, log_file: Path, *, exit_code: int | None = None,
                since: int = 0, timed_out: bool = False) -> str:
    """The message of a build step that failed: ``<what> failed (exit N): <command>``, its error
    lines (from the log after byte ``since``), and the whole log's path."""
    how = "timed out" if timed_out else f"failed (exit {exit_code})"
    lines = error_lines(read_since(log_file, since))
    shown = "".join(f"  {line}\n" for line in lines)
    return f"{what} {how}: {command}\n{shown}log: {log_file}"
