"""What the ray cluster tests share: finding the processes a test command left running."""

from __future__ import annotations

import os
from pathlib import Path

SLOTS_PER_NODE = 3


def processes_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (a command's unique argument)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def commands_of(pids: list[int]) -> list[str]:
    """Each pid's command line, for a failure message."""
    out = []
    for pid in pids:
        try:
            out.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            out.append(f"{pid}: gone")
    return out
