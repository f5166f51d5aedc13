"""Installing an environment's packages: uv where it is installed, pip otherwise.

uv resolves and installs the same requirements several times faster than pip, and its cache is
shared by every environment built on the host. It does not read pip's configuration, and hosts
here often have one that matters (an internal index, ``find-links`` directories of wheels, a
constraints file, a CA bundle for TLS interception). So the host's *effective* pip settings, as
``pip config list`` reports them (files and ``PIP_*`` variables merged, variables winning), are
turned into uv's options, and uv is told to pick the best match across every index as pip does
(uv otherwise stops at the first index that has a package). Where uv is missing, where
``PATCHGYM_INSTALLER=pip`` says so, or where uv fails, pip runs as before: a build never fails
because of uv.

Only ``packages`` go through uv. The venv itself is made by ``python -m venv`` (its bundled pip
and setuptools are what an era's ``setup.py`` and a spec's own ``pip install`` steps expect), and
``install`` steps run as written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import cache

INSTALLERS = ("auto", "uv", "pip")
# pip option → uv pip install option (the same meaning; uv accepts a list option repeated).
_LIST_OPTIONS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links",
                 "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}


def installer_choice() -> str:
    """``$PATCHGYM_INSTALLER``: ``auto`` (uv when installed), ``uv`` (required) or ``pip``."""
    choice = os.environ.get("PATCHGYM_INSTALLER", "auto").strip().lower() or "auto"
    if choice not in INSTALLERS:
        raise ValueError(f"PATCHGYM_INSTALLER={choice!r}: choose one of {', '.join(INSTALLERS)}")
    return choice


@cache
def uv_executable() -> str | None:
    """The uv binary: the ``uv`` Python package's own, else one on ``PATH``."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def pip_settings(env: dict[str, str] | None = None) -> dict[str, str]:
    """The host's effective pip settings (``global``/``install`` sections and ``PIP_*`` variables),
    keyed by option name; variables win over files, as in pip."""
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)
    files: dict[str, str] = {}
    variables: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        name, sep, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if not sep or section not in ("global", "install", ":env:"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        (variables if section == ":env:" else files)[key] = value
    return {**files, **variables}


def uv_options(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """``uv pip install`` options and environment variables with the meaning of pip's ``settings``."""
    options = ["--index-strategy", "unsafe-best-match"]
    environ: dict[str, str] = {}
    if settings.get("index-url"):
        options += ["--index-url", settings["index-url"]]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    for key, flag in _LIST_OPTIONS.items():
        for value in settings.get(key, "").split():
            options += [flag, value]
    if settings.get("cert"):
        environ["SSL_CERT_FILE"] = settings["cert"]
    if settings.get("client-cert"):
        environ["SSL_CLIENT_CERT"] = settings["client-cert"]
    timeout = settings.get("default-timeout") or settings.get("timeout")
    if timeout:
        environ["UV_HTTP_TIMEOUT"] = timeout
    return options, environ


def uv_install_argv(uv: str, python: str, packages: list[str] | tuple[str, ...],
                    env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that install ``packages`` into the venv of ``python`` with uv,
    under the host's pip settings."""
    options, extra = uv_options(pip_settings(env))
    # Interpreters are never downloaded: the venv's own is the one to install for.
    environ = {**env, **extra, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}
    # Bytecode as pip writes it: graded test runs read installed modules' caches but write none
    # (``-B``), so without it every grading compiled the installed packages it imports from source,
    # under the repository's warning filters (grading/pytest_runtime/bootstrap.py).
    return [uv, "pip", "install", "--python", python, "--compile-bytecode", *options, *packages], environ
