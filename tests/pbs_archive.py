"""A python-build-standalone-shaped archive made from a CPython this host already has, for tests:
:func:`patchgym.sandboxes.python_archives.pack_installation` of the running CPython or of pyenv's."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from patchgym.sandboxes.python_archives import PackError, pack_installation


def host_cpython() -> tuple[Path, str]:
    """The prefix and version of the CPython running the tests."""
    return Path(sys.base_prefix), platform.python_version()


def pyenv_cpython(minor: str) -> Path | None:
    """The prefix of pyenv's newest CPython ``minor`` (``"3.7"``), or None when there is none."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(root.glob(f"{minor}.*"), key=lambda p: [int(x) for x in p.name.split(".") if x.isdigit()])
    return found[-1] if found and (found[-1] / "bin" / f"python{minor}").is_file() else None


def make_archive(prefix: Path, out_dir: Path, work: Path, *, named: str | None = None) -> Path | None:
    """The archive of ``prefix`` in ``out_dir``; None when a copy of it does not run from elsewhere."""
    try:
        return pack_installation(prefix, out_dir, work=work, named=named)
    except PackError:
        return None
