"""Docker images for sandboxes, in three content-addressed layers: base, environment, instance.

``patchgym/base:<release>``
    A Debian root filesystem made with ``debootstrap`` (minbase plus Python, venv, git, patch,
    procps and CA certificates) and imported with ``docker import``. No image registry is needed:
    only a Debian mirror, which is what air-gapped clusters usually have (an internal mirror or
    an apt proxy). This is the first-class offline path::

        patchgym images bootstrap --release bookworm [--mirror http://apt.internal/debian]

    The mirror defaults to the host's own apt mirror for Debian (``/etc/apt/sources.list.d/*.sources``
    or ``/etc/apt/sources.list``), else ``http://deb.debian.org/debian``. The host's CA certificates
    (``/usr/local/share/ca-certificates``, and every bundle named by ``SSL_CERT_FILE``,
    ``REQUESTS_CA_BUNDLE``, ``PIP_CERT`` or ``CURL_CA_BUNDLE``) and its pip configuration
    (``/etc/pip.conf``, ``/etc/xdg/pip/``) are copied in, so that pip inside the image reaches the
    same index, through the same TLS interception, as pip on the host. The Python version is that of
    the release (bullseye 3.9, bookworm 3.11, trixie 3.13) and is recorded in the image's
    ``org.patchgym.python`` label.

``patchgym/env:<hash>``
    The base plus a venv at ``/opt/venv`` with an :class:`~sandboxes.environments.EnvironmentSpec`'s
    ``pre_install`` steps and ``packages`` (pip, from the host's index: every ``PIP_*`` and proxy
    variable of the host is passed in). Keyed by the base image id and the spec, so every task that
    shares a spec shares the image. The venv's Python is the release's python3, or, where no release
    has a fitting one, a CPython uv installs under ``/opt/python`` from ``$PATCHGYM_PYTHON_ARCHIVES``
    or ``$UV_PYTHON_INSTALL_MIRROR`` (:func:`python_source`; the key then holds which).

``patchgym/instance:<hash>``
    The environment plus the repository at ``base_commit`` in ``/testbed`` — a pristine checkout with
    no later history (:func:`patchgym.sandboxes.repos.pristine_checkout`) — after the spec's ``install`` steps.
    The same tree is hard-linked (no extra bytes) at ``/var/lib/patchgym/testbed``, root's only: a
    sandbox's /testbed is a bounded tmpfs, empty at start, which the command server fills from it.
    Its size and file count are recorded in labels, to size that tmpfs.

Environment and instance images are built in a container named for the build
(:mod:`.build_mutex`): the name is an engine-wide mutex, so every process on the engine, whatever its
``PATCHGYM_HOME``, builds an image once, and a dead builder's container is taken over. Only the
base image (debootstrap on this host) is built under a host file lock (in
``$PATCHGYM_DOCKER_LOCKS``, default ``/tmp/patchgym-docker-<uid>``). Build containers
carry ``org.patchgym.kind=build`` and are always removed, by the engine too when their builder is
killed (they are tied to it as sandboxes are, :func:`.connection.attach`); every image carries
``org.patchgym.managed=1`` and its kind, and :func:`prune_images` never touches anything else.
``progress`` callbacks are called only for work actually done (a cached image reports nothing).

One file (about 1000 lines): the three layers are one chain, each image keyed by the one below it
(base id -> environment key -> instance key), built under the same mutex, build container, labels
and clean-up rules; :func:`prune_images` and :func:`list_images` read the labels every builder
writes. Split by layer, a reader would have to follow the keys and labels across files.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from patchgym.sandboxes import python_archives
from patchgym.sandboxes.base import EnvironmentBuildError, EnvironmentSpec, SandboxError
from patchgym.sandboxes.build_errors import step_failed
from patchgym.sandboxes.bytecode import PREFIX_ENV, compiler_source
from patchgym.sandboxes.docker.build_mutex import build_name, claim, owner_labels
from patchgym.sandboxes.docker.client import (
    DEFAULT_RELEASE,
    KIND_LABEL,
    MANAGED_LABEL,
    OWNER_LABEL,
    TESTBED_BYTES_LABEL,
    TESTBED_FILES_LABEL,
    docker_client,
    engine_client,
    owner_id,
    remove_container,
)
from patchgym.sandboxes.docker.connection import attach
from patchgym.sandboxes.docker.retire import retirements
from patchgym.sandboxes.installer import uv_executable
from patchgym.sandboxes.lifetime import run_checked
from patchgym.sandboxes.locks import file_lock
from patchgym.sandboxes.paths import cache_dir
from patchgym.sandboxes.phases import log as phase_log
from patchgym.sandboxes.reaper import owned_name
from patchgym.sandboxes.repos import _source_id, pristine_checkout

log = logging.getLogger(__name__)

Progress = Callable[[str], None] | None

BASE_REPO = "patchgym/base"
ENV_REPO = "patchgym/env"
INSTANCE_REPO = "patchgym/instance"
PYTHON_LABEL = "org.patchgym.python"  # the base image's python3 version
RELEASES = ("bullseye", "bookworm", "trixie")
# The python3 each known release ships: what choosing a release for a spec goes by before its base
# image exists (once it does, the image's own label is read instead).
RELEASE_PYTHON = {"bullseye": "3.9.2", "bookworm": "3.11.2", "trixie": "3.13.5"}
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# A C compiler and the interpreter's headers, as in SWE-bench's base images (build-essential): old
# pins often have no wheel for the Python they run on (Django's test requirements build pywatchman).
BASE_PACKAGES = ("python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "git", "patch", "ca-certificates",
                 "procps", "diffutils")
PACKAGES_LABEL = "org.patchgym.base-packages"  # what a base image was bootstrapped with
MIRROR_LABEL = "org.patchgym.mirror"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VENV = "/opt/venv"
PYTHON_ROOT = "/opt/python"  # uv-installed interpreters (from archives) in environment images
PYTHON_STAGE = "/tmp/patchgym-python"  # uv, the archive and its listing, during that build only
PYTHON_SOURCE_LABEL = "org.patchgym.python-source"  # the archive or mirror an environment's Python came from
WORKDIR = "/testbed"
PRISTINE_DIR = "/var/lib/patchgym/testbed"  # the command server's pristine tree (see agent.py)
INSTANCE_LAYOUT = 4  # part of the instance key: images older than the pristine tree (2), bytecode (3),
# the bytecode prefix (4) are rebuilt
BYTECODE_PREFIX = "/opt/patchgym-bytecode"  # the graded runs' pycache prefix (sandboxes.bytecode), root's
STANDARD_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CA_BUNDLE_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE")
PIP_CONFIG_FILES = ("/etc/pip.conf",)
PIP_CONFIG_DIRS = ("/etc/xdg/pip",)
HOST_CA_DIR = "/usr/local/share/ca-certificates"
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
DEBOOTSTRAP_TIMEOUT = 3600.0
DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")
BUILD_TIMEOUT = 3600.0
REMOVE_WAIT = 30.0  # seconds a finished build waits for its container to be gone
# Debian's venvs come with the pip of their release (20.3 on bullseye): it installs a project with a
# pyproject.toml in editable mode through ``setup.py develop`` in an isolated build, which today's
# setuptools turns into a nested ``pip install`` that cannot see pip (every pytest 4.x-8.x checkout
# failed so). pip 21.3+ installs it with PEP 660; pip 25.1 dropped the ``setup.py develop`` fallback
# for backends without PEP 660 (pylint 2.15 pins setuptools~=62.6 in its build requirements).
VENV_PIP = "pip>=21.3,<25"


def _lock_path(name: str) -> Path:
    """A lock shared by every process using this engine, whatever its ``PATCHGYM_HOME``: images are
    global to the engine, so builds must be serialized across caches too."""
    default = Path(tempfile.gettempdir()) / f"patchgym-docker-{os.getuid()}"
    root = Path(os.environ.get("PATCHGYM_DOCKER_LOCKS") or default)
    return root / f"{name}.lock"


def _report(progress: Progress, message: str) -> None:
    """A build step said: to ``progress`` (the images commands show it), else as a phase line
    (an image built on the way to a sandbox, :mod:`patchgym.sandboxes.phases`)."""
    (log if progress is not None else phase_log).info("%s", message)
    if progress is not None:
        progress(message)


def _client():
    return docker_client()


@lru_cache(maxsize=1)
def _build_client():
    """A client whose socket timeout outlasts a silent build step (a long compile, a slow download).

    :func:`docker_client` checks that the engine is reachable; this one shares its environment.
    """
    docker_client()
    return engine_client(BUILD_TIMEOUT + 120)


def _image(ref: str):
    """The image ``ref`` or None."""
    import docker.errors

    try:
        return _client().images.get(ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        raise SandboxError(f"cannot inspect image {ref}: {exc}") from None


def _digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------------
# base image


def host_mirror(default: str = DEFAULT_MIRROR, *, apt_dir: Path = Path("/etc/apt")) -> str:
    """The host's apt mirror for the main Debian archive (not security, not updates), else ``default``."""
    candidates: list[str] = []
    sources_d = apt_dir / "sources.list.d"
    for path in sorted(sources_d.glob("*.sources")) if sources_d.is_dir() else []:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
                continue
            suites = fields.get("suites", "").split()
            if suites and all("-" in s or "/" in s for s in suites):
                continue  # only security / updates / backports suites
            candidates += fields.get("uris", "").split()
    lists = [apt_dir / "sources.list"]
    lists += sorted(sources_d.glob("*.list")) if sources_d.is_dir() else []
    for path in lists:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb" and "-" not in words[2]:
                candidates.append(words[1])
    for uri in candidates:
        if uri.startswith(("http://", "https://", "file:/")) and "security" not in uri:
            return uri.rstrip("/")
    return default


def _run_logged(argv: list[str], log_file: Path, *, timeout: float, what: str,
                stdin=subprocess.DEVNULL, env: dict[str, str] | None = None) -> None:
    with log_file.open("ab") as fh:
        fh.write(f"$ {' '.join(argv)}\n".encode())
        fh.flush()
        since = fh.tell()
        try:
            # debootstrap, apt and their children die with this process (issue 22).
            proc = run_checked(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=stdin, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise EnvironmentBuildError(f"{what} timed out after {timeout:.0f}s (log: {log_file})") from None
        except OSError as exc:
            raise EnvironmentBuildError(f"{what} could not start ({exc})") from None
    if proc.returncode != 0:
        raise EnvironmentBuildError(step_failed(what, " ".join(argv), log_file, exit_code=proc.returncode,
                                                since=since))


def _install_into(root: Path, path: str, source: Path, log_file: Path) -> None:
    """Copy the host file ``source`` to ``path`` inside ``root``.

    Done through ``chroot`` so that symlinks in the target resolve inside the root filesystem, never
    on the host; an existing file or symlink at ``path`` is replaced.
    """
    script = 'mkdir -p "$(dirname "$1")" && rm -f "$1" && cat > "$1" && chmod 0644 "$1"'
    with source.open("rb") as fh:
        _run_logged(["chroot", str(root), "/bin/sh", "-c", script, "sh", path], log_file, timeout=60,
                    what=f"copying {source} into the image", stdin=fh)


def _exists_in(root: Path, path: str) -> bool:
    return subprocess.run(["chroot", str(root), "/usr/bin/test", "-e", path],
                          stdin=subprocess.DEVNULL, capture_output=True).returncode == 0


def _host_files(directory: str) -> list[Path]:
    top = Path(directory)
    if not top.is_dir():
        return []
    return sorted(p for p in top.rglob("*") if p.is_file())


def _copy_host_trust(root: Path, log_file: Path, progress: Progress) -> None:
    """The host's CA certificates and pip configuration, into ``root``."""
    local_cas = _host_files(HOST_CA_DIR)
    if local_cas:
        _report(progress, f"adding {len(local_cas)} local CA certificate(s) from {HOST_CA_DIR}")
        for cert in local_cas:
            _install_into(root, f"{HOST_CA_DIR}/{cert.relative_to(HOST_CA_DIR)}", cert, log_file)
        _run_logged(["chroot", str(root), "update-ca-certificates"], log_file, timeout=300,
                    what="update-ca-certificates in the image")
    bundles: list[str] = []
    for var in CA_BUNDLE_VARS:
        value = os.environ.get(var, "").strip()
        if value and os.path.isabs(value) and os.path.isfile(value) and value not in bundles:
            bundles.append(value)
    for bundle in bundles:
        normalized = os.path.normpath(bundle)
        if normalized == STANDARD_BUNDLE:
            # The host's bundle is the system one plus the host's own CAs: a superset of the image's.
            _report(progress, f"using the host's CA bundle {bundle}")
            _install_into(root, STANDARD_BUNDLE, Path(bundle), log_file)
        elif not _exists_in(root, normalized):
            _report(progress, f"adding the host's CA bundle {bundle}")
            _install_into(root, normalized, Path(bundle), log_file)
    pip_files = [Path(p) for p in PIP_CONFIG_FILES if Path(p).is_file()]
    for directory in PIP_CONFIG_DIRS:
        pip_files += _host_files(directory)
    if pip_files:
        _report(progress, f"copying the host's pip configuration ({', '.join(map(str, pip_files))})")
        for path in pip_files:
            _install_into(root, str(path), path, log_file)


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()).rstrip("/") + "/"
    found = []
    try:
        with open("/proc/self/mounts") as fh:
            for line in fh:
                point = line.split()[1].encode().decode("unicode_escape")
                if point.startswith(prefix):
                    found.append(point)
    except OSError:
        pass
    return sorted(found, key=len, reverse=True)


def _remove_rootfs(path: Path) -> None:
    """Remove a build root filesystem, first unmounting anything debootstrap left mounted in it."""
    if not path.exists():
        return
    for point in _mounts_under(path):
        subprocess.run(["umount", "-l", point], capture_output=True, stdin=subprocess.DEVNULL)
    left = _mounts_under(path)
    if left:
        log.error("not removing %s: still mounted: %s", path, ", ".join(left))
        return
    shutil.rmtree(path, ignore_errors=True)


def _clean_rootfs(root: Path) -> None:
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/archives/partial/*", "var/cache/apt/*.bin",
                    "var/lib/apt/lists/*", "var/log/*.log", "var/log/apt/*", "tmp/*", "var/tmp/*"):
        for p in root.glob(pattern):
            if p.name == "lock":
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    (root / "etc" / "hostname").write_text("patchgym\n")
    (root / "etc" / "resolv.conf").unlink(missing_ok=True)  # docker mounts its own


def _tar_chunks(root: Path, chunk: int = 1 << 20) -> Iterator[bytes]:
    """A tar of ``root`` (numeric owners, modes, links, device nodes kept), streamed in chunks.

    The contents of ``/dev``, ``/proc`` and ``/sys`` are left out: the engine provides them.
    """
    read_fd, write_fd = os.pipe()
    errors: list[BaseException] = []
    skip = {"dev", "proc", "sys"}

    def writer() -> None:
        try:
            with os.fdopen(write_fd, "wb") as sink, \
                    tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for dirpath, dirnames, filenames in os.walk(root):
                    rel = os.path.relpath(dirpath, root)
                    arc_dir = "" if rel == "." else rel
                    if arc_dir:
                        tar.add(dirpath, arcname=arc_dir, recursive=False)
                    if arc_dir in skip:
                        dirnames[:] = []
                        continue
                    links = sorted(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))
                    for name in sorted(filenames) + links:  # symlinks to directories are entries, not walked
                        tar.add(os.path.join(dirpath, name), arcname=os.path.join(arc_dir, name), recursive=False)
                    dirnames[:] = sorted(d for d in dirnames if d not in links)
        except BaseException as exc:  # surfaced to the reader
            errors.append(exc)

    thread = threading.Thread(target=writer, name="rootfs-tar", daemon=True)
    thread.start()
    with os.fdopen(read_fd, "rb") as source:
        while True:
            data = source.read(chunk)
            if not data:
                break
            yield data
    thread.join()
    if errors:
        raise SandboxError(f"cannot archive the root filesystem {root}: {errors[0]}")


def _python_version_in(root: Path) -> str:
    proc = subprocess.run(["chroot", str(root), "python3", "-c", "import sys; print(sys.version.split()[0])"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    if proc.returncode != 0:
        raise EnvironmentBuildError(f"python3 does not run in the new root filesystem: {proc.stderr.strip()}")
    return proc.stdout.strip()


def debootstrap_argv(release: str, root: Path, mirror: str) -> list[str]:
    """debootstrap's command line for a base image. Ubuntu's releases (debootstrap's ``gutsy``
    script) keep python3-venv in ``universe``; their archive is verified with the host's
    ubuntu-keyring, as Debian's is with debian-archive-keyring (debootstrap's defaults)."""
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}"]
    if os.path.basename(os.path.realpath(DEBOOTSTRAP_SCRIPTS / release)) == "gutsy":
        argv.append("--components=main,universe")
    return [*argv, release, str(root), mirror]


def base_tag(release: str = DEFAULT_RELEASE) -> str:
    return f"{BASE_REPO}:{release}"


def bootstrap_base(release: str = DEFAULT_RELEASE, *, mirror: str | None = None, force: bool = False,
                   progress: Progress = None) -> str:
    """Build ``patchgym/base:<release>`` from a Debian mirror with debootstrap; return its tag.

    Skipped when the image exists, unless ``force``. Needs root (debootstrap, chroot) and a Debian
    mirror — no image registry.
    """
    tag = base_tag(release)
    if not force and _image(tag) is not None:
        return tag
    if not re.fullmatch(r"[a-z][a-z0-9.-]*", release):
        raise EnvironmentBuildError(f"invalid Debian release name {release!r}")
    if os.geteuid() != 0:
        raise EnvironmentBuildError("building the base image needs root (debootstrap and chroot)")
    if shutil.which("debootstrap") is None:
        raise EnvironmentBuildError("debootstrap is not installed (apt-get install debootstrap)")
    if not (DEBOOTSTRAP_SCRIPTS / release).exists():
        raise EnvironmentBuildError(f"unknown release {release!r}: debootstrap has no script for it in "
                                    f"{DEBOOTSTRAP_SCRIPTS} (known to patchgym: {', '.join(RELEASES)})")
    builds = cache_dir("builds")
    with file_lock(_lock_path(f"base-{release}")):
        if not force and _image(tag) is not None:
            return tag
        mirror = (mirror or host_mirror()).rstrip("/")
        started = time.monotonic()
        work = builds / owned_name(f"base-{release}-{uuid.uuid4().hex[:8]}")
        root = work / "rootfs"
        log_file = builds / f"base-{release}.log"
        log_file.write_text("")
        try:
            root.mkdir(parents=True)
            _report(progress, f"debootstrap {release} from {mirror} (minbase + {', '.join(BASE_PACKAGES)})")
            _run_logged(debootstrap_argv(release, root, mirror), log_file, timeout=DEBOOTSTRAP_TIMEOUT,
                        what=f"debootstrap of {release} from {mirror}")
            _copy_host_trust(root, log_file, progress)
            _report(progress, "cleaning apt caches")
            _clean_rootfs(root)
            python = _python_version_in(root)
            _report(progress, f"importing the root filesystem as {tag} (python {python})")
            labels = {MANAGED_LABEL: "1", KIND_LABEL: "base", PYTHON_LABEL: python,
                      "org.patchgym.release": release, PACKAGES_LABEL: ",".join(BASE_PACKAGES), MIRROR_LABEL: mirror}
            changes = [f"ENV PATH={SYSTEM_PATH}", "ENV LANG=C.UTF-8", 'CMD ["bash"]']
            changes += [f"LABEL {k}={v}" for k, v in labels.items()]
            try:
                _build_client().api.import_image_from_stream(_tar_chunks(root), repository=BASE_REPO, tag=release,
                                                             changes=changes)
            except SandboxError:
                raise
            except Exception as exc:
                raise EnvironmentBuildError(f"docker import of {tag} failed: {exc}") from None
            if _image(tag) is None:
                raise EnvironmentBuildError(f"docker import reported success but {tag} does not exist")
        finally:
            _report(progress, "removing the temporary root filesystem")
            _remove_rootfs(work)
        _report(progress, f"built {tag} in {time.monotonic() - started:.0f}s")
    return tag


def _base_pythons() -> dict[str, str]:
    """release → python3 version of every base image built so far (its label)."""
    try:
        bases = _client().images.list(filters={"label": f"{KIND_LABEL}=base"})
    except Exception as exc:
        raise SandboxError(f"cannot list base images: {exc}") from None
    found: dict[str, str] = {}
    for image in bases:
        labels = image.labels or {}
        for tag in image.tags or []:
            repository, _, release = tag.rpartition(":")
            if repository == BASE_REPO and labels.get(PYTHON_LABEL):
                found[release] = labels[PYTHON_LABEL]
    return found


def release_for(spec: EnvironmentSpec, release: str | None = None) -> str:
    """The release to build ``spec`` on: ``release`` if given (checked later by
    :func:`check_python`); else the default release if its Python fits ``spec.python``; else the
    known release or bootstrapped base image with the oldest fitting Python (an era's code is
    likelier to run on the oldest interpreter that its constraint admits)."""
    from packaging.version import InvalidVersion, Version

    if release is not None:
        return release
    wanted = spec.specifier()
    pythons = {**RELEASE_PYTHON, **_base_pythons()}

    def fits(name: str) -> bool:
        try:
            return Version(pythons[name]) in wanted
        except InvalidVersion:
            return False

    if DEFAULT_RELEASE in pythons and fits(DEFAULT_RELEASE):
        return DEFAULT_RELEASE
    fitting = sorted((n for n in pythons if fits(n)), key=lambda n: Version(pythons[n]))
    if not fitting:
        have = ", ".join(f"{n} {v}" for n, v in sorted(pythons.items(), key=lambda kv: Version(kv[1])))
        raise EnvironmentBuildError(
            f"no Debian release patchgym knows provides a Python that satisfies {spec.python!r} (have: {have}); "
            "bootstrap one that does, e.g. patchgym images bootstrap --release buster "
            "--mirror http://archive.debian.org/debian for Python 3.7, or --release jammy --mirror "
            "http://archive.ubuntu.com/ubuntu for 3.10 (focal: 3.8; the host needs ubuntu-keyring), or grade "
            "with --backend local, which uses the host's interpreters (pyenv's included)")
    return fitting[0]


def ensure_base(release: str = DEFAULT_RELEASE, progress: Progress = None):
    """The base image of ``release``, bootstrapped when missing, and again (from the mirror it came
    from) when it was bootstrapped with other packages than :data:`BASE_PACKAGES`."""
    image = _image(base_tag(release))
    labels = (image.labels or {}) if image is not None else {}
    stale = image is not None and labels.get(PACKAGES_LABEL) != ",".join(BASE_PACKAGES)
    if image is None or stale:
        _report(progress, f"{base_tag(release)} is {'out of date' if stale else 'missing'}: bootstrapping it")
        bootstrap_base(release, mirror=labels.get(MIRROR_LABEL), force=stale, progress=progress)
        image = _image(base_tag(release))
        if image is None:
            raise EnvironmentBuildError(f"{base_tag(release)} is missing after bootstrap")
    return image


# --------------------------------------------------------------------------------------------------
# build containers


def _path_values(value: str) -> list[str]:
    return [w for w in re.split(r"\s+", value.strip()) if w]


def _host_path(word: str) -> str | None:
    """The local path a pip option value names, or None for URLs and plain values."""
    if word.startswith("file://"):
        return word[len("file://"):] or None
    if word.startswith("/"):
        return word
    return None


def build_environ() -> dict[str, str]:
    """The host's pip, proxy and CA variables to pass into build steps (before path filtering)."""
    env = {}
    for key, value in os.environ.items():
        if key.startswith("PIP_") or key in PROXY_VARS or key in CA_BUNDLE_VARS:
            env[key] = value
    return env


class BuildContainer:
    """A labelled, always-removed container in which build steps run one ``exec`` at a time.

    Its main process reads its stdin, attached by this process (:func:`.connection.attach`, the
    tie a sandbox container has): if this process dies, SIGKILL included, the container's stdin
    closes, the build step running in it dies, and the engine removes the container, which
    releases the build's name. Nothing was committed: an image is tagged whole or not at all."""

    def __init__(self, image: str, log_file: Path, *, purpose: str, key: str | None = None, network: bool = True,
                 volumes: dict[str, dict[str, str]] | None = None) -> None:
        """``key`` names the container for the build (:func:`.build_mutex.claim`: one builder of
        ``key`` on the engine at a time; check once it is made that the build is still needed).
        ``network=False``: no network at all; ``volumes``: Docker volumes mounted (``docker-py``'s form)."""
        import docker.errors

        self.log_file = log_file
        self.api = _build_client().api

        def create(name: str):
            try:
                container = _build_client().containers.create(
                    image, ["sh", "-c", "exec cat >/dev/null"], stdin_open=True, detach=False, auto_remove=True,
                    network_mode="bridge" if network else "none", volumes=volumes or {}, working_dir="/", name=name,
                    labels={MANAGED_LABEL: "1", KIND_LABEL: "build", **owner_labels()})
            except docker.errors.APIError:
                raise  # refused (409: another builder holds the name): nothing of ours was made
            except BaseException:
                _remove_if_ours(name)  # the engine may have made it after the request's deadline passed
                raise
            try:
                tie = attach(self.api, container.id)
            except BaseException:
                remove_container(container)  # a name held by nobody would stall every other builder
                raise
            try:
                container.start()
            except BaseException:
                remove_container(container)
                tie.close()
                raise
            return container, tie

        try:
            self.container, self._tie = (claim(build_name(key), create) if key
                                         else create(build_name(uuid.uuid4().hex[:12])))
        except docker.errors.DockerException as exc:
            raise EnvironmentBuildError(f"cannot start a build container for {purpose} from {image}: {exc}") from None
        self.env: dict[str, str] = {}
        if not key:
            self.prepare()

    def prepare(self) -> None:
        """Pass the host's build variables in (logged); call once the build is known needed."""
        try:
            self.env = self._filtered_environ()
        except BaseException:
            self.remove()
            raise

    def _filtered_environ(self) -> dict[str, str]:
        """Host pip/proxy/CA variables, without values naming host paths that the image lacks."""
        env = build_environ()
        paths = sorted({p for v in env.values() for w in _path_values(v) if (p := _host_path(w))})
        present: set[str] = set()
        if paths:
            script = 'for p; do if test -e "$p"; then printf "%s\\n" "$p"; fi; done'
            code, output = self.run_capture([script, "sh", *paths], shell_args=True)
            if code != 0:
                raise EnvironmentBuildError(f"cannot check paths in the build container: {output.strip()}")
            present = set(output.splitlines())
        kept: dict[str, str] = {}
        for key, value in env.items():
            words = _path_values(value)
            local = [w for w in words if _host_path(w)]
            if not local:
                kept[key] = value
                continue
            remaining = [w for w in words if not _host_path(w) or _host_path(w) in present]
            if remaining:
                kept[key] = " ".join(remaining)
            else:
                log.info("not passing %s=%s into the build: no such path in the image", key, value)
        with self.log_file.open("a") as fh:
            fh.write(f"# host variables passed in: {', '.join(sorted(kept)) or '-'}\n")
        return kept

    def run_capture(self, args: list[str], *, shell_args: bool = False) -> tuple[int, str]:
        argv = ["sh", "-c", *args] if shell_args else args
        exec_id = self.api.exec_create(self.container.id, argv, stdout=True, stderr=True)["Id"]
        output = self.api.exec_start(exec_id).decode(errors="replace")
        return self._exit_code(exec_id), output

    def _exit_code(self, exec_id: str) -> int:
        """The exit code of a finished exec (the engine may report it a moment after the output ends)."""
        for _ in range(100):
            info = self.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.05)
        raise EnvironmentBuildError(f"build step {exec_id[:12]} did not report an exit code")

    def run(self, argv: list[str], *, what: str, workdir: str = "/", env: dict[str, str] | None = None,
            timeout: float = BUILD_TIMEOUT) -> None:
        command = ["timeout", "-k", "10", str(int(timeout)), *argv]
        environment = {**self.env, **(env or {})}
        with self.log_file.open("ab") as fh:
            fh.write(f"$ {' '.join(argv)}   (cwd {workdir})\n".encode())
            fh.flush()
            since = fh.tell()
            try:
                exec_id = self.api.exec_create(self.container.id, command, stdout=True, stderr=True,
                                               environment=environment, workdir=workdir)["Id"]
                for chunk in self.api.exec_start(exec_id, stream=True):
                    fh.write(chunk)
                    fh.flush()
                code = self._exit_code(exec_id)
            except Exception as exc:
                raise EnvironmentBuildError(f"{what}: the Docker engine failed ({exc})\nlog: {self.log_file}") from None
        if code == 124:
            raise EnvironmentBuildError(step_failed(what, f"{' '.join(argv)} (after {timeout:.0f}s)",
                                                    self.log_file, since=since, timed_out=True))
        if code != 0:
            raise EnvironmentBuildError(step_failed(what, " ".join(argv), self.log_file, exit_code=code,
                                                    since=since))

    def put_archive(self, path: str, data) -> None:
        if not self.api.put_archive(self.container.id, path, data):
            raise EnvironmentBuildError(f"copying files into the build container at {path} failed")

    def commit(self, repository: str, tag: str, *, kind: str, changes: list[str]) -> str:
        """Commit the container's filesystem as ``repository:tag``, without pausing it.

        A pausing commit freezes the container's cgroup (cgroup v1's freezer) for the copy; on
        Debian's docker.io 20.10 a container that ended or was removed while it was being paused
        stayed in containerd's ``pausing`` state (``failed to delete process ... current process
        state: pausing``) and its removal, then the engine's other container operations, hung
        until the engine restarted. Nothing needs freezing: every build step has returned, so the
        processes it left (none should remain) are killed first, and only the main process, which
        writes nothing, is left running during the copy."""
        labels = {MANAGED_LABEL: "1", KIND_LABEL: kind, OWNER_LABEL: ""}
        all_changes = [*changes, 'CMD ["bash"]', *(f"LABEL {k}={v}" for k, v in labels.items())]
        try:
            # kill(-1) from the shell reaches every process but itself and pid 1 (the tie's cat)
            self.run_capture(["sh", "-c", "kill -KILL -1 2>/dev/null; true"])
            self.container.commit(repository=repository, tag=tag, changes=all_changes, pause=False)
        except Exception as exc:
            raise EnvironmentBuildError(f"committing {repository}:{tag} failed: {exc}") from None
        return f"{repository}:{tag}"

    def remove(self) -> None:
        """End the container (its main process ends with the tie; the engine removes it) and wait
        a bounded time until it is gone, which releases the build's name to other builders."""
        retirements.retire(self.container, self._tie)
        retirements.wait(REMOVE_WAIT, {self.container.id})

    def __enter__(self) -> BuildContainer:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def _remove_if_ours(name: str) -> None:
    """Remove the container ``name`` if this process made it (by its owner label)."""
    import docker.errors

    try:
        container = _client().containers.get(name)
    except docker.errors.NotFound:
        return
    except Exception as exc:
        log.warning("cannot look for the build container %s: %s (patchgym sandboxes gc removes it)", name, exc)
        return
    if (container.labels or {}).get(OWNER_LABEL) == owner_id():
        remove_container(container)


def _venv_environ() -> dict[str, str]:
    return {"VIRTUAL_ENV": VENV, "PATH": f"{VENV}/bin:{SYSTEM_PATH}", "PIP_NO_INPUT": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


# --------------------------------------------------------------------------------------------------
# environment and instance images


def check_python(spec: EnvironmentSpec, base, release: str) -> str:
    """The base image's python3 version; an :class:`EnvironmentBuildError` unless it fits ``spec``."""
    from packaging.version import Version

    version = (base.labels or {}).get(PYTHON_LABEL)
    if not version:
        out = _client().containers.run(base.id, ["python3", "-c", "import sys; print(sys.version.split()[0])"],
                                       remove=True, network_mode="none",
                                       labels={MANAGED_LABEL: "1", KIND_LABEL: "build"})
        version = out.decode().strip()
    if Version(version) not in spec.specifier():
        hints = ", ".join(f"{r} {v}" for r, v in RELEASE_PYTHON.items())
        raise EnvironmentBuildError(
            f"Debian {release} provides Python {version}, which does not satisfy the environment's python "
            f"{spec.python!r}; build on a release whose python3 fits ({hints}), or leave --release out to let "
            "patchgym pick one")
    return version


@dataclass(frozen=True)
class PythonSource:
    """Where an environment image's Python comes from: the Debian ``release``'s own python3, or
    one uv installs on that release, from an ``archive`` (:mod:`patchgym.sandboxes.python_archives`) or
    downloaded from a python-build-standalone ``mirror`` (``$UV_PYTHON_INSTALL_MIRROR``)."""

    release: str
    archive: python_archives.PythonArchive | None = None
    mirror: str | None = None

    def describe(self) -> str:
        """The archive's file name, the mirror's URL without credentials, or the release."""
        if self.archive is not None:
            return self.archive.path.name
        if self.mirror is not None:
            from urllib.parse import urlsplit

            url = urlsplit(self.mirror)
            return url._replace(netloc=url.hostname + (f":{url.port}" if url.port else "")).geturl()
        return f"Debian {self.release}"


def python_source(spec: EnvironmentSpec, release: str | None = None) -> PythonSource:
    """The first source in patchgym's chain that gives ``spec`` its Python: a Debian release whose
    python3 fits (``release`` if given, else :func:`release_for`'s pick), then the newest fitting
    archive of ``$PATCHGYM_PYTHON_ARCHIVES``, then ``$UV_PYTHON_INSTALL_MIRROR`` (an http(s)
    mirror of python-build-standalone's releases); the last two installed by uv on ``release``
    (default: the default release). None fits: an :class:`EnvironmentBuildError` naming the
    constraint and every place looked."""
    from packaging.version import InvalidVersion, Version

    wanted = spec.specifier()
    pythons = {**RELEASE_PYTHON, **_base_pythons()}
    if release is not None:
        version = pythons.get(release)
        try:
            fits = version is None or Version(version) in wanted
        except InvalidVersion:
            fits = True
        if fits:
            return PythonSource(release)  # an unknown release is checked once its base exists (check_python)
        debian = (f"Debian {release} provides Python {version}, which does not satisfy the environment's python "
                  f"{spec.python!r} (--release {release} was asked for)")
    else:
        try:
            return PythonSource(release_for(spec))
        except EnvironmentBuildError as exc:
            debian = str(exc).split("; bootstrap one that does")[0]
    directory = python_archives.archives_dir()
    archive = python_archives.pick_archive(wanted, python_archives.find_archives(directory)) if directory else None
    if archive is not None:
        return PythonSource(release or DEFAULT_RELEASE, archive)
    mirror = os.environ.get("UV_PYTHON_INSTALL_MIRROR", "").strip()
    if mirror.startswith(("http://", "https://")):
        return PythonSource(release or DEFAULT_RELEASE, mirror=mirror.rstrip("/"))
    mirror_said = (f"UV_PYTHON_INSTALL_MIRROR={mirror} is not an http(s) URL a build can reach" if mirror
                   else "UV_PYTHON_INSTALL_MIRROR is not set")
    raise EnvironmentBuildError(
        f"{debian}; {python_archives.describe(directory)}; {mirror_said}. Put a python-build-standalone archive of "
        f"a fitting CPython (cpython-X.Y.Z+BUILD-{python_archives.machine_arch()}-unknown-linux-gnu-install_only"
        f".tar.gz) in ${python_archives.ARCHIVES_VAR}, or bootstrap a release whose python3 fits, e.g. patchgym "
        "images bootstrap --release buster --mirror http://archive.debian.org/debian for Python 3.7, or --release "
        "jammy --mirror http://archive.ubuntu.com/ubuntu for 3.10 (focal: 3.8; the host needs ubuntu-keyring), or "
        "grade with --backend local, which uses the host's interpreters (pyenv's included)")


def environment_key(spec: EnvironmentSpec, base_id: str, source: PythonSource | None = None) -> str:
    payload = {"base": base_id, "python": spec.python, "packages": list(spec.packages),
               "pre_install": list(spec.pre_install), "pip": VENV_PIP}
    # Debian's own python3 is part of the base: keys made before other sources existed stay the same.
    if source is not None and source.archive is not None:
        payload["python_archive"] = source.archive.sha256
    elif source is not None and source.mirror is not None:
        payload["python_mirror"] = source.mirror
    return _digest(payload)


def _python_stage_tar(uv: str, archive: python_archives.PythonArchive | None) -> tempfile.SpooledTemporaryFile:
    """A tar of :data:`PYTHON_STAGE`: the host's uv binary, and ``archive`` with uv's listing of it."""
    stage = PYTHON_STAGE.lstrip("/")
    buf = tempfile.SpooledTemporaryFile(max_size=16 << 20, dir=cache_dir("builds"))
    files = [(Path(uv), "uv", 0o755)] + ([(archive.path, archive.path.name, 0o644)] if archive else [])
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for source, name, mode in files:
            info = tar.gettarinfo(str(source), arcname=f"{stage}/{name}")
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = mode
            with source.open("rb") as fh:
                tar.addfile(info, fh)
        if archive is not None:
            listing = python_archives.downloads_json([archive], lambda a: f"file://{PYTHON_STAGE}/{a.path.name}")
            data = json.dumps(listing).encode()
            info = tarfile.TarInfo(f"{stage}/downloads.json")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def _install_uv_python(box: BuildContainer, spec: EnvironmentSpec, source: PythonSource,
                       progress: Progress) -> tuple[str, str]:
    """Install ``source``'s Python with uv under :data:`PYTHON_ROOT` in ``box``; return its python3's
    path and version, checked to satisfy ``spec`` (and, from an archive, to be the version its
    name promises)."""
    import shlex

    from packaging.version import InvalidVersion, Version

    archive = source.archive
    uv = uv_executable()
    if uv is None:
        raise EnvironmentBuildError(f"installing Python from {source.describe()} needs uv on this host "
                                    "(pip install uv): its binary is copied into the build")
    request = archive.version if archive else (spec.python.strip() if spec.python.strip()[:1].isdigit()
                                               else str(spec.specifier()))
    _report(progress, f"installing Python {request} with uv from {source.describe()}")
    with _python_stage_tar(uv, archive) as data:
        box.put_archive("/", data)
    # A local file is no download (UV_PYTHON_DOWNLOADS=manual allows it, and an explicit install);
    # uv trusts the system store, where the base image has the host's CA certificates
    # (UV_SYSTEM_CERTS; UV_NATIVE_TLS for uv before 0.13, deprecated since: a warning in the log).
    uv_env = {"UV_PYTHON_DOWNLOADS": "manual", "UV_NO_PROGRESS": "1", "UV_SYSTEM_CERTS": "1", "UV_NATIVE_TLS": "1",
              "UV_CACHE_DIR": f"{PYTHON_STAGE}/cache", "UV_PYTHON_INSTALL_DIR": PYTHON_ROOT}
    # The mirror goes in the environment, not the logged command line: its URL may hold credentials.
    where = ["--python-downloads-json-url", f"{PYTHON_STAGE}/downloads.json"] if archive else []
    if source.mirror is not None:
        uv_env["UV_PYTHON_INSTALL_MIRROR"] = source.mirror
    box.run([f"{PYTHON_STAGE}/uv", "python", "install", *where, "--no-bin", request],
            what=f"installing Python {request} from {source.describe()}", env=uv_env)
    if archive is not None:
        python = f"{PYTHON_ROOT}/{archive.key}/bin/python3"
    else:
        find = (f"UV_PYTHON_INSTALL_DIR={PYTHON_ROOT} UV_PYTHON_DOWNLOADS=never {PYTHON_STAGE}/uv python find "
                f"--managed-python {shlex.quote(request)}")
        code, output = box.run_capture([find], shell_args=True)
        python = output.strip().splitlines()[-1] if code == 0 and output.strip() else f"{PYTHON_ROOT}/(not found)"
    box.run(["rm", "-rf", PYTHON_STAGE], what=f"removing {PYTHON_STAGE}")
    code, output = box.run_capture([python, "-c", "import sys, venv, ensurepip; print(sys.version.split()[0])"])
    version = output.strip().splitlines()[-1] if code == 0 and output.strip() else ""
    try:
        fits = Version(version) in spec.specifier()
        fits = fits and (archive is None or Version(version) == Version(archive.version))
    except InvalidVersion:
        fits = False
    if not fits:
        named = f" (named for Python {archive.version})" if archive else ""
        raise EnvironmentBuildError(
            f"uv installed from {source.describe()}{named} an interpreter that "
            f"{'reports ' + version if version else 'does not run: ' + output.strip()[-400:]}; the environment's "
            f"python is {spec.python!r}")
    return python, version


@contextmanager
def _build_once(tag: str, key: str, image: str, header: str, summary: str,
                progress: Progress) -> Iterator[BuildContainer | None]:
    """Build ``tag`` at most once on the engine, from ``image``.

    Yields None when the image exists (checked again once this process holds the build's
    container, the engine-wide mutex), else the build container to build it in; reports the start
    and the time taken. An image is committed whole or not at all, so it is complete once tagged."""
    if _image(tag) is not None:
        yield None
        return
    log_file = cache_dir("envs") / f"docker-{key}.log"
    box = BuildContainer(image, log_file, purpose=tag, key=key)
    with box:
        if _image(tag) is not None:
            yield None
            return
        log_file.write_text(header)
        box.prepare()
        started = time.monotonic()
        _report(progress, f"building {tag} ({summary})")
        yield box
        _report(progress, f"built {tag} in {time.monotonic() - started:.0f}s")


def environment_image(spec: EnvironmentSpec, *, release: str | None = None, progress: Progress = None) -> str:
    """The ``patchgym/env:<hash>`` image for ``spec`` (built once if missing) on ``release``, or on the
    release :func:`python_source` picks; its Python from the release or an archive. Return its tag."""
    source = python_source(spec, release)
    release, debian = source.release, source.archive is None and source.mirror is None
    base = ensure_base(release, progress)
    if debian:
        check_python(spec, base, release)
    key = environment_key(spec, base.id, source)
    tag = f"{ENV_REPO}:{key}"
    summary = (f"python {spec.python}{'' if debian else f' ({source.describe()})'}; "
               f"{', '.join(spec.packages) or 'no packages'}")
    with _build_once(tag, key, base.id, f"# {tag} from {base_tag(release)} ({base.id})\n", summary,
                     progress) as box:
        if box is None:
            return tag
        python, version = ("python3", "") if debian else _install_uv_python(box, spec, source, progress)
        _report(progress, f"creating {VENV}")
        box.run([python, "-m", "venv", VENV], what="creating the venv")
        box.run([f"{VENV}/bin/python", "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                 "--upgrade", VENV_PIP], what="upgrading pip in the venv", env=_venv_environ())
        for i, command in enumerate(spec.pre_install, 1):
            _report(progress, f"pre_install {i}/{len(spec.pre_install)}: {command}")
            box.run(["bash", "-c", command], what=f"pre_install step {command!r}", env=_venv_environ())
        if spec.packages:
            _report(progress, f"pip install {' '.join(spec.packages)}")
            box.run([f"{VENV}/bin/python", "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                     *spec.packages], what="pip install", env=_venv_environ())
        _report(progress, f"committing {tag}")
        # The base's label names Debian's python3; an environment with its own says which it runs.
        labels = [] if debian else [f"LABEL {PYTHON_LABEL}={version}",
                                    f"LABEL {PYTHON_SOURCE_LABEL}={source.describe()}"]
        box.commit(ENV_REPO, key, kind="env",
                   changes=[f"ENV VIRTUAL_ENV={VENV}", f"ENV PATH={VENV}/bin:{SYSTEM_PATH}", *labels])
    return tag


def _checkout_tar(checkout: Path, arcname: str) -> tempfile.SpooledTemporaryFile:
    """A tar of ``checkout`` as ``arcname`` (modes and symlinks kept, owned by root)."""

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    buf = tempfile.SpooledTemporaryFile(max_size=64 << 20, dir=cache_dir("builds"))
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(str(checkout), arcname=arcname, recursive=True, filter=owned_by_root)
    buf.seek(0)
    return buf


def instance_key(env_id: str, repo: str, base_commit: str, spec: EnvironmentSpec) -> str:
    return _digest({"env": env_id, "repo": _source_id(repo), "base_commit": base_commit,
                    "install": list(spec.install), "layout": INSTANCE_LAYOUT})


def instance_image(repo: str, base_commit: str, spec: EnvironmentSpec, *, release: str | None = None,
                   progress: Progress = None) -> str:
    """The ``patchgym/instance:<hash>`` image: ``repo`` at ``base_commit`` in ``/testbed`` over the
    environment image of ``spec``, after ``spec.install``; built once if missing. Return its tag."""
    env_tag = environment_image(spec, release=release, progress=progress)
    env = _image(env_tag)
    if env is None:  # pragma: no cover - removed concurrently
        raise EnvironmentBuildError(f"{env_tag} disappeared")
    key = instance_key(env.id, repo, base_commit, spec)
    tag = f"{INSTANCE_REPO}:{key}"
    header = f"# {tag} from {env_tag}: {repo} at {base_commit}\n"
    with _build_once(tag, key, env.id, header, f"{Path(repo).name} at {base_commit[:12]}", progress) as box:
        if box is None:
            return tag
        checkout = pristine_checkout(repo, base_commit)
        _report(progress, f"copying the checkout into {WORKDIR}")
        box.run(["rm", "-rf", WORKDIR], what=f"clearing {WORKDIR}")
        with _checkout_tar(checkout, WORKDIR.lstrip("/")) as data:
            box.put_archive("/", data)
        for i, command in enumerate(spec.install, 1):
            _report(progress, f"install {i}/{len(spec.install)}: {command}")
            box.run(["bash", "-c", command], what=f"install step {command!r}", workdir=WORKDIR,
                    env=_venv_environ())
        # Every grading starts from a fresh copy of this tree, and patchgym's pytest runs with -B:
        # without bytecode here, each grading compiled the repository again (0.3 s for seaborn, more
        # for sympy) where a developer's venv reuses it. Files a patch changes get a newer mtime,
        # so Python recompiles those; files that do not compile (test data) are left as they are.
        _report(progress, "compiling the repository's bytecode")
        box.run(["sh", "-c", f"{VENV}/bin/python -m compileall -q -j 0 {WORKDIR} >/dev/null 2>&1; true"],
                what="compiling bytecode", workdir=WORKDIR)
        # Graded runs read no bytecode from the tree: their pycache prefix is this directory of
        # checked-hash pycs (the stdlib, the venv, /testbed), outside /testbed and root's, while
        # commands run as uid 1000 (sandboxes.bytecode). Built under a temporary name, then renamed;
        # without it (a failure here) graded runs fall back to compiling from source.
        _report(progress, f"compiling the bytecode prefix {BYTECODE_PREFIX}")
        staged = f"{BYTECODE_PREFIX}.tmp"
        box.run(["sh", "-c", f'rm -rf {staged} && {VENV}/bin/python -I -c "$0" {staged} --stdlib --site {WORKDIR} '
                 f"&& mkdir -p {staged} && chmod -R a+rX,go-w {staged} && mv {staged} {BYTECODE_PREFIX} "
                 "|| echo 'no bytecode prefix: graded runs compile from source'",
                 compiler_source()], what="compiling the bytecode prefix")
        parent = posixpath.dirname(PRISTINE_DIR)
        box.run(["sh", "-c", f"mkdir -p {parent} && chmod 700 {parent} && cp -al {WORKDIR} {PRISTINE_DIR}"],
                what="linking the pristine tree")
        # Sandboxes borrow the repository's objects from the pristine tree (git alternates): what
        # their /testbed tmpfs must hold is the rest (images built before count the objects too).
        objects = f"{WORKDIR}/.git/objects"
        code, usage = box.run_capture([f"du -s -B1 --exclude={objects} {WORKDIR} | cut -f1; "
                                       f"find {WORKDIR} -path '{objects}/*' -prune -o -print | wc -l"],
                                      shell_args=True)
        testbed_bytes, testbed_files = usage.split() if code == 0 else ("", "")
        if not (testbed_bytes.isdigit() and testbed_files.isdigit()):
            raise EnvironmentBuildError(f"cannot measure {WORKDIR} in {tag}: {usage.strip()}")
        _report(progress, f"committing {tag}")
        box.commit(INSTANCE_REPO, key, kind="instance", changes=[
            f"WORKDIR {WORKDIR}", f"ENV {PREFIX_ENV}={BYTECODE_PREFIX}", f"LABEL {TESTBED_BYTES_LABEL}={testbed_bytes}",
            f"LABEL {TESTBED_FILES_LABEL}={testbed_files}"])
    return tag


# --------------------------------------------------------------------------------------------------
# listing and pruning


def _managed_images() -> list:
    try:
        images = _client().images.list(all=False, filters={"label": f"{MANAGED_LABEL}=1"})
    except Exception as exc:
        raise SandboxError(f"cannot list images: {exc}") from None
    return [i for i in images if (i.labels or {}).get(MANAGED_LABEL) == "1"]


def list_images() -> list[dict]:
    """Every image patchgym made: ``tag`` (``<none>`` when dangling), ``kind``, ``id``, ``size`` (bytes),
    ``created`` (ISO time), one row per tag."""
    rows = []
    for image in _managed_images():
        for tag in image.tags or ["<none>"]:
            rows.append({"tag": tag, "kind": image.labels.get(KIND_LABEL, ""), "id": image.id,
                         "size": image.attrs.get("Size", 0), "created": image.attrs.get("Created", "")})
    order = {"base": 0, "env": 1, "instance": 2}
    return sorted(rows, key=lambda r: (order.get(r["kind"], 3), r["tag"]))


def prune_images(kinds: Iterable[str] = ("instance", "env"), *, dry_run: bool = False) -> list[str]:
    """Remove patchgym's images of ``kinds`` that no container (running or not) uses; return their tags
    (ids for untagged ones). Instances go before environments, environments before bases."""
    import docker.errors

    wanted = set(kinds)
    client = _client()
    try:
        used = {c.attrs.get("Image") for c in client.containers.list(all=True, ignore_removed=True)}
    except Exception as exc:
        raise SandboxError(f"cannot list containers: {exc}") from None
    order = {"instance": 0, "env": 1, "base": 2}
    images = [i for i in _managed_images() if i.labels.get(KIND_LABEL) in wanted and i.id not in used]
    images.sort(key=lambda i: order.get(i.labels.get(KIND_LABEL), -1))
    removed: list[str] = []
    for image in images:
        for ref in image.tags or [image.id]:
            if not dry_run:
                try:
                    client.images.remove(ref, noprune=False)
                except docker.errors.ImageNotFound:
                    continue
                except docker.errors.APIError as exc:
                    log.warning("not removing %s: %s", ref, exc)
                    continue
            removed.append(ref)
    return removed


__all__ = [
    "BASE_REPO", "ENV_REPO", "INSTANCE_REPO", "RELEASES", "BuildContainer", "base_tag", "bootstrap_base",
    "build_environ", "environment_image", "host_mirror", "instance_image", "list_images", "prune_images",
    "python_source", "release_for",
]
