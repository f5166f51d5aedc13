"""Where patchgym keeps its caches and live workspaces on this host."""

from __future__ import annotations

import os
from pathlib import Path


def patchgym_home() -> Path:
    """Root of every cache (``$PATCHGYM_HOME``, else ``$XDG_CACHE_HOME/patchgym``)."""
    env = os.environ.get("PATCHGYM_HOME")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(xdg) / "patchgym").resolve()


def cache_dir(kind: str) -> Path:
    path = patchgym_home() / kind
    path.mkdir(parents=True, exist_ok=True)
    return path
