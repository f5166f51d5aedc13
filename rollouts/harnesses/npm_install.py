"""Harnesses that come as npm packages (Codex CLI), installed once per version on this host and bound
read-only into the agent's sandbox, so that no sandbox needs a network, Node.js or a writable copy.

Installs live under :func:`installs_dir` (``$PATCHGYM_HARNESSES``, else ``$PATCHGYM_HOME/harnesses``),
one directory per package and version (``npm install --prefix``), built in a temporary directory
and renamed into place under a lock, so concurrent workers install it once and nobody sees half an
install. The package's install scripts are not run (``--ignore-scripts``): what an install fetches
is data until it runs inside a sandbox.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

from patchgym.sandboxes.locks import file_lock
from patchgym.sandboxes.paths import cache_dir

INSTALL_TIMEOUT = 900.0  # seconds for one npm install (Codex CLI's package is about 100 MB to download)


def installs_dir() -> Path:
    """Where harness installs live: ``$PATCHGYM_HARNESSES``, else ``$PATCHGYM_HOME/harnesses``
    (a directory shared by runs keeps one copy per version)."""
    configured = os.environ.get("PATCHGYM_HARNESSES")
    if configured:
        path = Path(configured).expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    return cache_dir("harnesses")


def npm_prefix(package: str, version: str, *, install: bool = True) -> Path:
    """The ``npm install --prefix`` directory holding ``package@version`` (its ``node_modules``),
    installed now if absent and ``install``; :class:`RuntimeError` saying why when it cannot be."""
    name = f"{package.strip('@').replace('/', '-')}-{version}"
    prefix = installs_dir() / name
    if (prefix / "node_modules").is_dir():
        return prefix
    if not install:
        raise RuntimeError(f"{package}@{version} is not installed in {installs_dir()}")
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"{package}@{version} is installed with npm, and npm is not on PATH (install Node.js)")
    with file_lock(installs_dir() / f".{name}.lock"):
        if (prefix / "node_modules").is_dir():  # another worker installed it while this one waited
            return prefix
        staging = installs_dir() / f".{name}.{uuid.uuid4().hex[:8]}"
        try:
            argv = [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--ignore-scripts",
                    "--no-package-lock", "--loglevel", "error", f"{package}@{version}"]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
                                  stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                raise RuntimeError(f"npm install {package}@{version} failed ({done.returncode}): "
                                   f"{(done.stderr or done.stdout)[-2000:]}")
            staging.rename(prefix)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"npm install {package}@{version} took more than {INSTALL_TIMEOUT:.0f}s") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return prefix
