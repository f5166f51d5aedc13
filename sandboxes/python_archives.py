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
:func:`pack_installation` (``patchgym images python-archive PREFIX``) makes one from a CPython
installed on a host (pyenv's, a ``make install`` prefix).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
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


# Left out of a packed installation: the test suite, IDLE/Tk and caches (about half its size), the
# static libpython (40 MB, never linked by a venv), and whatever the host installed in site-packages.
PACK_SKIPPED = {"test", "idlelib", "tkinter", "turtledemo", "lib2to3", "__pycache__"}
ORIGIN_LIB = b"$ORIGIN/../lib"
PACK_BUILD = "20260101"  # the build field of the names :func:`pack_installation` gives


class PackError(Exception):
    """An installation that cannot be packed, and why."""


def _pack_ignore(directory: str, names: list[str]) -> set[str]:
    skipped = {n for n in names if n in PACK_SKIPPED or n.endswith(".a")}
    if os.path.basename(directory) == "site-packages":
        skipped |= set(names)
    return skipped


def _relocate_runpath(executable: Path, prefix: Path) -> bool:
    """Overwrite, in place, ``prefix/lib`` in ``executable``'s RUNPATH with the shorter
    ``$ORIGIN/../lib`` python-build-standalone's executables carry (a ``--enable-shared`` build,
    pyenv's, finds its libpython by absolute path); whether it was there."""
    data = executable.read_bytes()
    times = executable.stat()
    found = False
    for root in {str(prefix), os.path.realpath(prefix)}:
        old = f"{root}/lib".encode() + b"\0"
        if old in data and len(old) > len(ORIGIN_LIB):
            data = data.replace(old, ORIGIN_LIB + b"\0" * (len(old) - len(ORIGIN_LIB)))
            found = True
    executable.write_bytes(data)
    os.utime(executable, ns=(times.st_atime_ns, times.st_mtime_ns))
    return found


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _installed_version(executable: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([str(executable), "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, env=env, timeout=60)
    version = proc.stdout.strip()
    if proc.returncode != 0 or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise PackError(f"{executable} does not run: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return version


def pack_installation(prefix: Path, out_dir: Path, *, work: Path | None = None, named: str | None = None) -> Path:
    """``out_dir/cpython-<version>+20260101-<arch>-unknown-linux-gnu-install_only.tar.gz`` of the
    CPython installed at ``prefix`` (``prefix/bin/python3.X``, its stdlib in ``prefix/lib``), in
    python-build-standalone's ``install_only`` shape: the installation under ``python/``, without
    its site-packages' contents. ``named`` puts another version in the name (tests of misnamed
    archives). The copy is checked to run from a directory of its own (with ``venv``,
    ``ensurepip`` and ``ssl``) before it is packed: :class:`PackError` says why not.

    It still links the shared libraries its extension modules were built against (libssl, libffi,
    sqlite...): it runs where those exist, e.g. in a Docker base image of the host's own release.
    The same installation always packs to the same bytes.
    """
    prefix = Path(prefix)
    if os.path.realpath(prefix) in ("/", "/usr", "/usr/local"):
        raise PackError(f"{prefix} is a system prefix shared with everything else: install the CPython to pack "
                        "in a prefix of its own (pyenv, ./configure --prefix=DIR)")
    candidates = sorted(prefix.glob("bin/python3.*[0-9]"))
    if not candidates:
        raise PackError(f"{prefix} holds no bin/python3.X")
    version = _installed_version(candidates[-1])
    minor = ".".join(version.split(".")[:2])
    if not (prefix / "lib" / f"python{minor}" / "os.py").is_file():
        raise PackError(f"{prefix} has no lib/python{minor}/os.py: not a CPython installation prefix")
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        staged = Path(scratch) / "python"
        shutil.copytree(prefix, staged, symlinks=True, ignore=_pack_ignore)
        executable = staged / "bin" / f"python{minor}"
        if not executable.is_file() or executable.is_symlink():
            raise PackError(f"{prefix}/bin/python{minor} is not the interpreter's executable (a symlink?)")
        _relocate_runpath(executable, prefix)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        proc = subprocess.run([str(executable), "-B", "-c", "import sys, venv, ensurepip, ssl; print(sys.prefix)"],
                              capture_output=True, text=True, env=env, timeout=60)
        if proc.returncode != 0 or Path(proc.stdout.strip()).resolve() != staged.resolve():
            raise PackError(f"a copy of {prefix} does not run from elsewhere (sys.prefix {proc.stdout.strip()!r}): "
                            f"{proc.stderr.strip()[-500:]}")
        out_dir.mkdir(parents=True, exist_ok=True)
        name = f"cpython-{named or version}+{PACK_BUILD}-{machine_arch()}-unknown-linux-gnu-install_only.tar.gz"
        archive = out_dir / name
        partial = archive.with_name(name + ".partial")  # not an archive's name until it is whole
        # The same installation packs to the same bytes (no timestamps of the packing, no host
        # owners): its sha256 keys the environment images built from it, which then stay valid.
        with open(partial, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                       compresslevel=1) as packed, \
                tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(str(staged), arcname="python", filter=_as_root)
        partial.replace(archive)
    return archive
