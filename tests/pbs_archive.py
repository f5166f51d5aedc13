"""A python-build-standalone-shaped archive made from a CPython this host already has, for tests.

python-build-standalone cannot be downloaded here (it is on GitHub), so the tests of
``$PATCHGYM_PYTHON_ARCHIVES`` pack an installed CPython the way its ``install_only`` archives are
packed: the installation under ``python/`` (``python/bin/python3`` at the top). CPython finds its
standard library relative to its executable, so a copy runs from anywhere, except that a
``--enable-shared`` build (pyenv's, this project's CI's) names its ``lib/`` by absolute path in the
executable's RUNPATH: that string is overwritten, in place, with the shorter ``$ORIGIN/../lib``
that python-build-standalone's own executables carry. The copy is checked to run (with ``venv``,
``ensurepip`` and ``ssl``) from a directory of its own before it is packed; None when it does not.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

SKIPPED = {"test", "idlelib", "tkinter", "turtledemo", "lib2to3", "__pycache__"}
ORIGIN_LIB = b"$ORIGIN/../lib"


def _ignore(directory: str, names: list[str]) -> set[str]:
    skipped = {n for n in names if n in SKIPPED or n.endswith(".a")}  # static libpython: 40 MB unused
    if os.path.basename(directory) == "site-packages":
        skipped |= set(names)  # the host's packages (patchgym among them) stay out
    return skipped


def _relocate_runpath(executable: Path, prefix: Path) -> None:
    data = executable.read_bytes()
    for root in {str(prefix), os.path.realpath(prefix)}:
        old = f"{root}/lib".encode() + b"\0"
        if old in data and len(old) > len(ORIGIN_LIB):
            data = data.replace(old, ORIGIN_LIB + b"\0" * (len(old) - len(ORIGIN_LIB)))
    executable.write_bytes(data)


def host_cpython() -> tuple[Path, str]:
    """The prefix and version of the CPython running the tests."""
    return Path(sys.base_prefix), platform.python_version()


def make_archive(prefix: Path, version: str, out_dir: Path, work: Path, *, named: str | None = None) -> Path | None:
    """``out_dir/cpython-<named or version>+20260101-<arch>-unknown-linux-gnu-install_only.tar.gz`` of
    the CPython installed at ``prefix``; None when a copy of it does not run from elsewhere."""
    minor = ".".join(version.split(".")[:2])
    if os.path.realpath(prefix) in ("/", "/usr", "/usr/local") or not (prefix / "lib" / f"python{minor}" / "os.py").is_file():
        return None  # a system interpreter shares its prefix with everything else: not copied
    staged = work / "python"
    shutil.copytree(prefix, staged, symlinks=True, ignore=_ignore)
    executable = staged / "bin" / f"python{minor}"
    if not executable.is_file() or executable.is_symlink():
        return None
    _relocate_runpath(executable, prefix)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([str(executable), "-c", "import sys, venv, ensurepip, ssl; print(sys.prefix)"],
                          capture_output=True, text=True, env=env, timeout=60)
    if proc.returncode != 0 or Path(proc.stdout.strip()).resolve() != staged.resolve():
        return None
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / f"cpython-{named or version}+20260101-{arch}-unknown-linux-gnu-install_only.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        tar.add(str(staged), arcname="python")
    return archive
