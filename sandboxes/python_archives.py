"""A local directory of CPython archives in python-build-standalone's shape, for uv to install from.

Debian releases give an environment Python 3.9, 3.11 and 3.13; other versions (3.6-3.8, 3.10, 3.12)
come from python-build-standalone, which uv downloads from GitHub. Hosts without GitHub (air-gapped
clusters, this project's CI machines) point ``$PATCHGYM_PYTHON_ARCHIVES`` at a directory holding
those archives (``cpython-3.8.20+20241002-x86_64-unknown-linux-gnu-install_only.tar.gz``, as
published, in any subdirectory: a copy of the release pages' layout works as is).

uv is told about the directory with a downloads JSON of its own format
(``--python-downloads-json-url``: each archive's version, platform, file URL and sha256), written
by :func:`downloads_json`, rather than with ``--mirror file://DIR``: a mirror must keep
python-build-standalone's release-tag subdirectories and uv checks each archive against the hash it
was released with, so an archive a site built itself (a relocatable CPython, ``python/bin/python3``
at its top, as python-build-standalone's ``install_only`` archives have) could not be used. The
archives are the operator's: their hashes are taken from the files, not checked against a list.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

ARCHIVES_VAR = "PATCHGYM_PYTHON_ARCHIVES"
#: ``cpython-<version>[+<build>]-<arch>-unknown-linux-gnu-<flavour>.tar.<gz|zst>``
_NAME = re.compile(r"cpython-(?P<version>\d+\.\d+\.\d+)(?:\+(?P<build>\d+))?-(?P<arch>[a-z0-9_]+)-unknown-linux-gnu"
                   r"-(?P<flavour>install_only|install_only_stripped)\.tar\.(?:gz|zst)")
# platform.machine() -> python-build-standalone's architecture names
_ARCH = {"amd64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class PythonArchive:
    """One archive of the directory: where it is and which CPython it holds (from its name)."""

    path: Path
    version: str
    arch: str
    build: str = ""

    @property
    def key(self) -> str:
        """uv's name for the installation (its directory under ``uv python dir``)."""
        return f"cpython-{self.version}-linux-{self.arch}-gnu"

    @cached_property
    def sha256(self) -> str:
        """The file's sha256 (read once: it keys the environment image and uv checks it)."""
        digest = hashlib.sha256()
        with self.path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()


def archives_dir() -> Path | None:
    """``$PATCHGYM_PYTHON_ARCHIVES``, or None when it is not set."""
    value = os.environ.get(ARCHIVES_VAR, "").strip()
    return Path(value).expanduser() if value else None


def machine_arch() -> str:
    machine = platform.machine().lower()
    return _ARCH.get(machine, machine)


def parse_name(path: Path) -> PythonArchive | None:
    """The archive ``path`` names, or None when its name is not python-build-standalone's."""
    match = _NAME.fullmatch(path.name)
    if match is None:
        return None
    return PythonArchive(path, match["version"], match["arch"], match["build"] or "")


def find_archives(directory: Path, arch: str | None = None) -> list[PythonArchive]:
    """Every CPython archive for ``arch`` (this machine's by default) under ``directory``, oldest first."""
    arch = arch or machine_arch()
    if not directory.is_dir():
        return []
    found = [a for p in directory.rglob("cpython-*") if p.is_file() and (a := parse_name(p)) and a.arch == arch]
    # Of one version, the stripped archive of the newest build first: the one picked.
    found.sort(key=lambda a: (Version(a.version), a.build, "stripped" in a.path.name), reverse=True)
    unique: dict[str, PythonArchive] = {}
    for archive in found:
        unique.setdefault(archive.version, archive)
    return sorted(unique.values(), key=lambda a: Version(a.version))


def pick_archive(wanted: SpecifierSet, archives: list[PythonArchive]) -> PythonArchive | None:
    """The newest archive whose version satisfies ``wanted`` (as the local backend picks the newest
    fitting host interpreter), or None."""
    fitting = [a for a in archives if Version(a.version) in wanted]
    return max(fitting, key=lambda a: Version(a.version)) if fitting else None


def describe(directory: Path | None, arch: str | None = None) -> str:
    """Where patchgym looked for archives and what it found there, for error messages."""
    if directory is None:
        return f"no archive directory (${ARCHIVES_VAR} is not set)"
    if not directory.is_dir():
        return f"${ARCHIVES_VAR}={directory}: not a directory"
    versions = [a.version for a in find_archives(directory, arch)]
    return f"archives in ${ARCHIVES_VAR}={directory}: {', '.join(versions) or 'none for ' + (arch or machine_arch())}"


def downloads_json(archives: list[PythonArchive], url_of) -> dict:
    """uv's downloads JSON (``--python-downloads-json-url``) listing ``archives``; ``url_of(archive)``
    is the URL uv fetches it from (``file://`` where uv runs)."""
    out = {}
    for archive in archives:
        major, minor, patch = (int(p) for p in archive.version.split("."))
        out[archive.key] = {
            "name": "cpython", "arch": {"family": archive.arch, "variant": None}, "os": "linux", "libc": "gnu",
            "major": major, "minor": minor, "patch": patch, "prerelease": "", "url": url_of(archive),
            "sha256": archive.sha256, "variant": None, "build": archive.build or None,
        }
    return out
