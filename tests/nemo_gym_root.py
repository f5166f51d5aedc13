"""The root filesystems the real NeMo Gym runs in, one per release (see tests/nemo_gym_real.py).

NeMo Gym needs a newer Python than the host's 3.11: 0.4.0 wants >= 3.12, 0.7.0 >= 3.13.14. Neither
pyenv nor uv may download an interpreter here (only PyPI and Debian's archive are reachable), so
each release runs in a Debian root made with ``debootstrap --variant=minbase`` the way the image
tooling makes its base (:mod:`patchgym.sandboxes.docker.images`: same mirror, same host CA bundle and pip
configuration): 0.4.0 on trixie (python3, 3.13.5), 0.7.0 on forky (its python3.13, 3.13.15 on
2026-12-05; trixie's 3.13.5 is below what 0.7.0 declares). ``nemo-gym`` goes into a venv at
``/opt/nemo``, and the uv venvs NeMo Gym's launcher wants for each server directory are pre-built
at ``/opt/ng-venvs`` with NeMo Gym's own ``setup_env_command``; a run passes
``+uv_venv_dir=/opt/ng-venvs +skip_venv_if_present=true`` and ``UV_PYTHON_DOWNLOADS=never``, so it
installs nothing and needs no network. A root is cached under ``cache_dir("nemo-gym")`` keyed by
what went into it, built once under a file lock, under a temporary name renamed into place.

Command line::

    python -m tests.nemo_gym_root build [--release 0.4.0|0.7.0]   # build (or find) a root, print its path
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

UV_VERSION = "0.13.9"
NEMO_VENV = "/opt/nemo"
SERVER_VENVS = "/opt/ng-venvs"  # the launcher's uv_venv_dir: <type>/<name>/.venv below it
RUN_TMP = "/tmp"  # a per-run host directory is mounted here in every chrooted command
RESOURCES_DIR = "resources_servers/patchgym"
# The requirements.txt of the resources server: its app.py needs only the standard library (NeMo Gym
# itself is always installed into a server venv). Part of the root's key: its venv is pre-built.
RESOURCES_REQUIREMENTS = "# patchgym's app.py needs only the standard library\n"
BASE_SERVER_DIRS = ("responses_api_agents/simple_agent", "responses_api_models/openai_model")

Progress = Callable[[str], None] | None

# Captured at import, before tests/conftest.py points PATCHGYM_HOME at a per-session temp dir: a
# root (~3 GB, minutes to build) must outlive a test session.
_IMPORT_HOME = os.environ.get("PATCHGYM_HOME")


@dataclass(frozen=True)
class Release:
    """One NeMo Gym release and the Debian root it runs in."""

    version: str
    debian: str  # the suite debootstrap makes
    python: str  # the interpreter NeMo Gym's venv is made with
    packages: tuple[str, ...]  # what debootstrap includes
    server_dirs: tuple[str, ...]  # NeMo Gym's server directories whose venvs are pre-built
    debootstrap_script: str | None = None  # for a suite the host's debootstrap has no script of its own

    @property
    def short(self) -> str:
        return ".".join(self.version.split(".")[:2])


def _base_packages() -> tuple[str, ...]:
    from patchgym.sandboxes.docker.images import BASE_PACKAGES

    return tuple(dict.fromkeys((*BASE_PACKAGES, "python3-pip", "bash")))


NEMO_GYM_04 = Release("0.4.0", "trixie", "python3", (), BASE_SERVER_DIRS)
# forky's default python3 is 3.14; 0.7.0 is run on its python3.13, as NeMo Gym's docs ask.
NEMO_GYM_07 = Release(
    "0.7.0", "forky", "python3.13",
    ("python3.13", "python3.13-venv", "python3.13-dev", "gcc", "libc6-dev", "git", "patch", "ca-certificates",
     "procps", "diffutils", "bash"),
    (*BASE_SERVER_DIRS, "environment_servers/single_agent_turn_legacy"), debootstrap_script="sid")
RELEASES = {r.version: r for r in (NEMO_GYM_04, NEMO_GYM_07)}


def _say(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)


def cache_root() -> Path:
    """Where built roots are kept: ``$PATCHGYM_NEMO_GYM_CACHE``, else ``cache_dir("nemo-gym")`` of the
    ``PATCHGYM_HOME`` this process started with."""
    explicit = os.environ.get("PATCHGYM_NEMO_GYM_CACHE")
    if explicit:
        path = Path(explicit)
        path.mkdir(parents=True, exist_ok=True)
        return path
    from patchgym.sandboxes import paths

    saved = os.environ.get("PATCHGYM_HOME")
    try:
        if _IMPORT_HOME is None:
            os.environ.pop("PATCHGYM_HOME", None)
        else:
            os.environ["PATCHGYM_HOME"] = _IMPORT_HOME
        return paths.cache_dir("nemo-gym")
    finally:
        if saved is None:
            os.environ.pop("PATCHGYM_HOME", None)
        else:
            os.environ["PATCHGYM_HOME"] = saved


def missing_requirements() -> list[str]:
    """What this host lacks to run the real NeMo Gym (empty when it has all)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    for tool in ("debootstrap", "ip", "chroot", "unshare", "bwrap"):
        if shutil.which(tool) is None:
            missing.append(tool)
    return missing


# Run inside the root by the build: NeMo Gym's own venv setup for each server directory, with the
# config values its launcher computes itself (ray and openai pinned to the parent's, python_version).
PREBUILD = r'''
import os, subprocess, sys
from pathlib import Path
from platform import python_version
from omegaconf import OmegaConf
from openai import __version__ as openai_version
from ray import __version__ as ray_version
import nemo_gym
from nemo_gym.cli.setup_command import setup_env_command

venv_dir, cache, *dirs = sys.argv[1:]
cfg = OmegaConf.create({
    "head_server_deps": [f"ray[default]=={ray_version}", f"openai=={openai_version}"],
    "uv_venv_dir": venv_dir, "python_version": python_version(), "skip_venv_if_present": False,
    "uv_cache_dir": cache})
for d in dirs:
    path = Path(d) if Path(d).is_absolute() else nemo_gym.PARENT_DIR / d
    command = setup_env_command(path, cfg, path.name)
    print("+", command, flush=True)
    subprocess.run(command, shell=True, executable="/bin/bash", check=True, env={**os.environ, "UV_CACHE_DIR": cache})
    venv = Path(venv_dir, *path.parts[-2:], ".venv")
    assert (venv / "bin" / "python").exists() and (venv / "bin" / "activate").exists(), venv
'''


def root_packages(release: Release = NEMO_GYM_04) -> tuple[str, ...]:
    return release.packages or _base_packages()


def root_key(release: Release = NEMO_GYM_04) -> dict:
    """What a root is made of (its cache key). 0.4.0's is the key its roots had before 0.7.0 came."""
    from patchgym.sandboxes.docker.images import host_mirror

    key = {"layout": 1, "release": release.debian, "packages": list(root_packages(release)),
           "mirror": host_mirror(), "nemo_gym": release.version, "uv": UV_VERSION,
           "servers": list(release.server_dirs), "resources_requirements": RESOURCES_REQUIREMENTS,
           "prebuild": PREBUILD}
    if release is not NEMO_GYM_04:
        key |= {"python": release.python, "debootstrap_script": release.debootstrap_script}
    return key


def root_path(release: Release = NEMO_GYM_04) -> Path:
    from patchgym.sandboxes.docker.images import _digest

    return cache_root() / f"root-{release.debian}-{_digest(root_key(release))}"


def _host_environ_for(root: Path) -> dict[str, str]:
    """The host's pip, proxy and CA variables, less those naming a host path the root lacks."""
    from patchgym.sandboxes.docker.images import _host_path, _path_values, build_environ

    env = {}
    for key, value in build_environ().items():
        paths = [p for p in map(_host_path, _path_values(value)) if p]
        if all((root / p.lstrip("/")).exists() for p in paths):
            env[key] = value
    return env


def chroot_argv(root: Path, argv: list[str], *, run_dir: Path | None = None, env: dict[str, str] | None = None,
                cwd: str = "/") -> list[str]:
    """``argv`` run in ``root`` through chroot, in a private mount namespace with /proc, /dev, /sys
    (and ``run_dir`` on /tmp) mounted: the mounts end with the namespace, whatever happens."""
    r = shlex.quote(str(root))
    mounts = [f"mount -t proc proc {r}/proc", f"mount --rbind /dev {r}/dev", f"mount --rbind /sys {r}/sys"]
    if run_dir is not None:
        mounts.append(f"mount --bind {shlex.quote(str(run_dir))} {r}{RUN_TMP}")
    base_env = {"PATH": f"{NEMO_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": f"{RUN_TMP}/home" if run_dir is not None else "/root", "LANG": "C.UTF-8",
                "UV_PYTHON_DOWNLOADS": "never"}  # uv must take the root's Python, never fetch one
    env_words = [f"{k}={v}" for k, v in {**base_env, **(env or {})}.items()]
    inner = " && ".join(mounts) + f" && exec chroot {r} /usr/bin/env -i " + " ".join(map(shlex.quote, env_words))
    inner += f" /bin/sh -c 'cd \"$0\" && exec \"$@\"' {shlex.quote(cwd)} " + " ".join(map(shlex.quote, argv))
    return ["unshare", "--mount", "--propagation", "private", "--fork", "--", "/bin/sh", "-c", inner]


def _debootstrap_argv(release: Release, root: Path, mirror: str) -> list[str]:
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(root_packages(release))}", release.debian,
            str(root), mirror]
    if release.debootstrap_script:
        from patchgym.sandboxes.docker.images import DEBOOTSTRAP_SCRIPTS

        argv.append(str(DEBOOTSTRAP_SCRIPTS / release.debootstrap_script))
    return argv


def _build(release: Release, root: Path, log_file: Path, progress: Progress) -> None:
    from patchgym.sandboxes.docker.images import (
        DEBOOTSTRAP_TIMEOUT,
        _clean_rootfs,
        _copy_host_trust,
        _run_logged,
        host_mirror,
    )

    mirror = host_mirror()
    _say(progress, f"debootstrap {release.debian} from {mirror} (minbase + {', '.join(root_packages(release))})")
    _run_logged(_debootstrap_argv(release, root, mirror), log_file, timeout=DEBOOTSTRAP_TIMEOUT,
                what=f"debootstrap of {release.debian}")
    _copy_host_trust(root, log_file, progress)
    if Path("/etc/resolv.conf").is_file():  # for pip and uv at build time only (removed below)
        shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
    env = _host_environ_for(root)
    build_dir = root / "opt" / "ng-build"
    (build_dir / RESOURCES_DIR).mkdir(parents=True)
    (build_dir / RESOURCES_DIR / "requirements.txt").write_text(RESOURCES_REQUIREMENTS)
    (build_dir / "prebuild.py").write_text(PREBUILD)
    _say(progress, f"installing uv=={UV_VERSION} and nemo-gym=={release.version} into {NEMO_VENV}")
    _run_logged(chroot_argv(root, ["/bin/sh", "-c",
                                   f"{release.python} -m venv {NEMO_VENV} && {NEMO_VENV}/bin/pip install --no-input "
                                   f"uv=={UV_VERSION} nemo-gym=={release.version}"], env=env),
                log_file, timeout=3600, what="pip install nemo-gym in the root")
    _say(progress, f"pre-building the launcher's server venvs in {SERVER_VENVS}")
    _run_logged(chroot_argv(root, [f"{NEMO_VENV}/bin/python", "/opt/ng-build/prebuild.py", SERVER_VENVS,
                                   "/opt/ng-build/uv-cache", f"/opt/ng-build/{RESOURCES_DIR}", *release.server_dirs],
                            env=env),
                log_file, timeout=3600, what="pre-building NeMo Gym's server venvs")
    shutil.rmtree(build_dir / "uv-cache", ignore_errors=True)  # the venvs keep their hard links
    _clean_rootfs(root)  # also drops resolv.conf: nothing resolves names at run time
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "pg-root.json").write_text(json.dumps(root_key(release), indent=2) + "\n")


def ensure_root(progress: Progress = None, release: Release = NEMO_GYM_04) -> Path:
    """The cached root filesystem of ``release``, built first if missing (under a lock: once across processes)."""
    from patchgym.sandboxes.docker.images import _remove_rootfs
    from patchgym.sandboxes.locks import file_lock

    root = root_path(release)
    if (root / "pg-root.json").is_file():
        return root
    missing = missing_requirements()
    if missing:
        raise RuntimeError(f"building the NeMo Gym root needs: {', '.join(missing)}")
    with file_lock(root.with_name(root.name + ".lock")):
        if (root / "pg-root.json").is_file():
            return root
        started = time.monotonic()
        work = root.with_name(f"{root.name}.build-{uuid.uuid4().hex[:8]}")
        log_file = root.with_name(root.name + ".log")
        log_file.write_text("")
        try:
            (work / "rootfs").mkdir(parents=True)
            _build(release, work / "rootfs", log_file, progress)
            if root.exists():  # a half-made leftover without pg-root.json
                _remove_rootfs(root)
            (work / "rootfs").rename(root)
        finally:
            _remove_rootfs(work)
        _say(progress, f"built {root} in {time.monotonic() - started:.0f}s (log: {log_file})")
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.nemo_gym_root")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build (or find) the cached NeMo Gym root; print its path")
    build.add_argument("--release", choices=sorted(RELEASES), default=NEMO_GYM_04.version)
    args = parser.parse_args(argv)
    print(ensure_root(lambda m: print(m, file=sys.stderr, flush=True), RELEASES[args.release]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
