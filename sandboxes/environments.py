"""Task environments: a venv per environment spec, built once, cached, shared read-only.

The spec is what SWE-bench keeps outside a task row (Python version, packages, install steps).
Its hash names the cache entry, so every task of a repository/version that shares a spec shares one
venv. Packages are installed with uv where it is installed, pip otherwise (:mod:`.installer`).
Building honours the host's pip configuration (index, find-links, constraints, CA bundle,
proxies): pip runs with the host's environment and configuration files, and uv is given the same
settings as options.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from patchgym.sandboxes import python_archives
from patchgym.sandboxes.base import EnvironmentBuildError, EnvironmentSpec
from patchgym.sandboxes.build_errors import step_failed
from patchgym.sandboxes.bytecode import PREFIX_NAME, build_prefix
from patchgym.sandboxes.installer import installer_choice, uv_executable, uv_install_argv
from patchgym.sandboxes.lifetime import run_checked
from patchgym.sandboxes.locks import file_lock
from patchgym.sandboxes.paths import cache_dir
from patchgym.sandboxes.phases import phase, stopping
from patchgym.sandboxes.reaper import owned_name, staging_path

log = logging.getLogger(__name__)

BUILD_TIMEOUT = 1800.0


@dataclass(frozen=True)
class Interpreter:
    executable: str
    version: str
    base_prefix: str
    # The interpreter's own site-packages: a venv never imports from them, and they may hold
    # anything the host installed (patchgym itself, with its task catalog), so sandboxes hide them.
    site_packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuiltEnvironment:
    """A ready venv. ``mounts`` are host paths a sandbox must expose read-only for it to run;
    ``masked`` are paths under them that it must hide; ``bytecode`` is the environment's read-only
    bytecode prefix (:mod:`patchgym.sandboxes.bytecode`; one of the mounts), None where it has none."""

    key: str
    venv: Path
    interpreter: Interpreter
    mounts: tuple[Path, ...] = field(default=())
    masked: tuple[Path, ...] = field(default=())
    bytecode: Path | None = None

    @property
    def bin_dir(self) -> Path:
        return self.venv / "bin"


def _candidate_executables() -> list[str]:
    seen: list[str] = [sys.executable]
    for minor in range(6, 16):
        found = shutil.which(f"python3.{minor}")
        if found:
            seen.append(found)
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv.is_dir():
        seen += [str(p / "bin" / "python3") for p in sorted(pyenv.iterdir())]
    for prefix in ("/usr/local/bin", "/usr/bin"):
        seen += [str(p) for p in sorted(Path(prefix).glob("python3.*")) if p.name[8:].isdigit()]
    seen += [str(p) for p in sorted(uv_python_dir().glob("cpython-3.*/bin/python3"))]
    out: list[str] = []
    for exe in seen:
        if os.access(exe, os.X_OK) and exe not in out:
            out.append(exe)
    return out


@cache
def _probe(executable: str) -> Interpreter | None:
    # Site directories of the interpreter *and* of its base installation: probing from inside a venv,
    # getsitepackages() names only the venv's, while the base's (mounted with the interpreter) may
    # hold a system-wide install of patchgym and its catalog.
    code = ("import sys,json,site,sysconfig;"
            "base={'base': sys.base_prefix, 'platbase': sys.base_exec_prefix};"
            "dirs=site.getsitepackages()+[site.getusersitepackages()]"
            "+[sysconfig.get_path(k, vars=base) for k in ('purelib', 'platlib')];"
            "print(json.dumps([sys.version.split()[0], sys.base_prefix, sorted(set(dirs))]))")
    if executable == sys.executable:
        return _probe_self()  # the same facts without two interpreter starts (~0.25 s per process)
    try:
        proc = subprocess.run([executable, "-c", code], capture_output=True, text=True, timeout=20)
        version, base_prefix, site_dirs = json.loads(proc.stdout)
        # venv must be importable (Debian splits it into python3-venv).
        check = subprocess.run([executable, "-c", "import venv, ensurepip"], capture_output=True, timeout=20)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    if check.returncode != 0:
        return None
    return Interpreter(os.path.realpath(executable), version, os.path.realpath(base_prefix),
                       tuple(os.path.realpath(d) for d in site_dirs))


def _probe_self() -> Interpreter | None:
    """:func:`_probe` of the running interpreter, read in this process."""
    import importlib.util

    if importlib.util.find_spec("venv") is None or importlib.util.find_spec("ensurepip") is None:
        return None
    return Interpreter(os.path.realpath(sys.executable), sys.version.split()[0], os.path.realpath(sys.base_prefix),
                       own_site_dirs())


def own_site_dirs() -> tuple[str, ...]:
    """Site directories of the running interpreter and of its base installation: what a sandbox
    that mounts this interpreter must hide (patchgym and its catalog may be installed there)."""
    import site
    import sysconfig

    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    dirs = site.getsitepackages() + [site.getusersitepackages()]
    dirs += [sysconfig.get_path(k, vars=base) for k in ("purelib", "platlib")]
    return tuple(os.path.realpath(d) for d in sorted(set(dirs)))


def uv_python_dir() -> Path:
    """Where uv keeps the interpreters it manages (``uv python dir``)."""
    configured = os.environ.get("UV_PYTHON_INSTALL_DIR")
    if configured:
        return Path(configured).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "uv" / "python"


@cache
def _uv_python_install(constraint: str) -> str | None:
    """Ask uv to install an interpreter for ``constraint``; None on success, else why not (asked
    once per process: offline hosts fail in seconds, and only once). With an archive directory
    (:mod:`.python_archives`), uv installs from it and nowhere else."""
    uv = uv_executable()
    if uv is None:
        return "uv is not installed"
    directory = python_archives.archives_dir()
    if directory is not None:
        return _uv_install_archive(uv, directory, constraint)
    if os.environ.get("UV_PYTHON_DOWNLOADS", "").lower() in ("never", "manual"):
        return f"UV_PYTHON_DOWNLOADS={os.environ['UV_PYTHON_DOWNLOADS']}: not downloading one with uv"
    return _run_uv_install([uv, "python", "install", constraint], constraint, os.environ)


def _uv_install_archive(uv: str, directory: Path, constraint: str) -> str | None:
    """``uv python install`` of the newest archive in ``directory`` that fits ``constraint``."""
    wanted = EnvironmentSpec(python=constraint).specifier()
    archives = python_archives.find_archives(directory)
    archive = python_archives.pick_archive(wanted, archives)
    if archive is None:
        return python_archives.describe(directory)
    listing = json.dumps(python_archives.downloads_json([archive], lambda a: a.path.resolve().as_uri()))
    target = cache_dir("python") / f"downloads-{hashlib.sha256(listing.encode()).hexdigest()[:16]}.json"
    staged = staging_path(target)
    staged.write_text(listing)
    os.replace(staged, target)
    # A local file is no download: allowed whatever UV_PYTHON_DOWNLOADS says of GitHub.
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "manual"}
    return _run_uv_install([uv, "python", "install", "--python-downloads-json-url", str(target), archive.version],
                           f"{archive.version} from {archive.path}", env)


def _run_uv_install(argv: list[str], what: str, env) -> str | None:
    try:
        proc = run_checked(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300,
                           stdin=subprocess.DEVNULL, env=dict(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"uv python install failed: {exc}"
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        return f"uv python install {what!r} failed: {lines[-1] if lines else proc.returncode}"
    return None


def _fitting(wanted: SpecifierSet) -> list[Interpreter]:
    out = []
    for exe in _candidate_executables():
        interp = _probe(exe)
        if interp and Version(interp.version) in wanted:
            out.append(interp)
    return out


def find_interpreter(spec: EnvironmentSpec) -> Interpreter:
    """The interpreter for ``spec``: this one if it fits, else the newest fitting one on the host
    (uv's managed interpreters included), else one uv installs: from ``$PATCHGYM_PYTHON_ARCHIVES``
    when that is set, else downloaded where the host can reach python-build-standalone."""
    wanted = spec.specifier()
    here = _probe(sys.executable)
    if here is not None and Version(here.version) in wanted:
        return here  # preferred whenever it fits: no need to start every other interpreter to ask
    fitting = _fitting(wanted)
    why_not = None
    if not fitting and (installer_choice() != "pip" or python_archives.archives_dir() is not None):
        why_not = _uv_python_install(spec.python.strip() if spec.python.strip()[:1].isdigit() else str(wanted))
        # Probed again: an archive whose name lies about its version installs an interpreter that
        # does not fit, and is not taken.
        fitting = _fitting(wanted) if why_not is None else []
        if not fitting and why_not is None:
            why_not = "uv installed an interpreter that does not satisfy it either (an archive misnamed?)"
    if not fitting:
        archives = python_archives.describe(python_archives.archives_dir())
        raise EnvironmentBuildError(
            f"no Python interpreter on this host satisfies {spec.python!r} "
            f"(looked at {', '.join(_candidate_executables())}; {archives}"
            + (f"; {why_not}" if why_not and why_not != archives else "") + "); install one (pyenv, a python3.X "
            f"package), put a python-build-standalone archive of it in ${python_archives.ARCHIVES_VAR}, or use "
            "the docker backend, which picks a Debian release whose Python fits"
        )
    return max(fitting, key=lambda i: Version(i.version))


def environment_key(spec: EnvironmentSpec, interpreter: Interpreter, checkout_id: str | None) -> str:
    payload = {"spec": asdict(spec), "python": interpreter.version, "exe": interpreter.executable}
    if spec.install:
        payload["checkout"] = checkout_id  # install steps read the repository
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    return digest[:16]


def ensure_environment(
    spec: EnvironmentSpec,
    *,
    checkout: Path | None = None,
    checkout_id: str | None = None,
    run_install=None,
    checkout_as: str | None = None,
) -> BuiltEnvironment:
    """Return the cached venv for ``spec``, building it first if needed (once, under a lock).

    ``run_install(command, built, log_file)`` runs one ``install`` step against ``checkout``; the
    sandbox backend supplies it so that the step sees the repository where tests will see it.
    ``checkout_as`` is the path the repository is imported from in a sandbox (``/testbed``): the
    checkout is compiled into the environment's bytecode prefix as if it sat there (an environment
    built before prefixes existed gets one the first time it is used).
    """
    interpreter = find_interpreter(spec)
    key = environment_key(spec, interpreter, checkout_id)
    root = cache_dir("envs") / key
    masked = tuple(Path(d) for d in interpreter.site_packages)

    def built_at(venv: Path) -> BuiltEnvironment:
        prefix = venv.parent / PREFIX_NAME
        if not prefix.is_dir():
            return BuiltEnvironment(key, venv, interpreter, (Path(interpreter.base_prefix), venv), masked)
        return BuiltEnvironment(key, venv, interpreter, (Path(interpreter.base_prefix), venv, prefix), masked,
                                bytecode=prefix)

    def compile_prefix(venv: Path) -> None:
        """Build the prefix (under the entry's lock): once; a failed try (its log is there) is not
        repeated by every sandbox, and what a killed try left is removed."""
        log_file = venv.parent / "bytecode.log"
        for stale in venv.parent.glob(f".{PREFIX_NAME}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if log_file.exists() and not (venv.parent / PREFIX_NAME).is_dir():
            return
        roots = ["--stdlib", "--site"]
        if checkout is not None and checkout_as:
            roots.append(f"{checkout}={checkout_as}")
        build_prefix(str(venv / "bin" / "python"), venv.parent / PREFIX_NAME, roots, log_file)

    venv = ready_venv(root)
    if venv is not None and (venv.parent / PREFIX_NAME).is_dir():
        return built_at(venv)
    with file_lock(root.with_suffix(".lock")) as lock_fd:
        venv = ready_venv(root)
        if venv is not None:
            if venv.parent != root:  # the layout before attempts has no room of its own for a prefix
                compile_prefix(venv)
            return built_at(venv)
        # Holding the lock proves every earlier builder gone: its processes inherit the lock's
        # descriptor, so an orphan still writing into its attempt keeps the lock held.
        remove_attempts(root)
        attempt = root / f"{ATTEMPT_PREFIX}{owned_name(os.urandom(4).hex())}"
        attempt.mkdir(parents=True)
        built = built_at(attempt / "venv")
        log_file = attempt / "build.log"
        started = time.monotonic()
        log.info("building environment %s (python %s)", key, interpreter.version)
        fds = (lock_fd,)
        count = 2 + bool(spec.packages) + len(spec.pre_install) + len(spec.install)  # venv, ..., bytecode
        steps = iter(range(1, count + 1))

        def step(what: str) -> AbstractContextManager[None]:
            if stopping():  # Ctrl-C: no further step (the attempt is left for the next builder to remove)
                raise EnvironmentBuildError(f"environment {key} was not built: interrupted before {_one_line(what)}")
            return phase(f"building environment {key[:12]} (python {interpreter.version}): step {next(steps)}/"
                         f"{count}: {_one_line(what)}", announce=True)

        try:
            with step("venv"):
                run_logged([interpreter.executable, "-m", "venv", str(built.venv)], log_file, cwd=attempt,
                           pass_fds=fds)
            env = venv_environ(built.venv)
            for command in spec.pre_install:
                with step(command):
                    run_logged(["bash", "-c", command], log_file, cwd=checkout or attempt, env=env, pass_fds=fds)
            installer = None
            if spec.packages:
                with step(f"install {' '.join(spec.packages)}"):
                    installer = install_packages(built.venv, spec.packages, log_file, cwd=attempt, env=env,
                                                 pass_fds=fds)
            for command in spec.install:
                if checkout is None:
                    raise EnvironmentBuildError("install steps need a repository checkout")
                with step(command):
                    if run_install is not None:
                        run_install(command, built, log_file)
                    else:
                        run_logged(["bash", "-c", command], log_file, cwd=checkout, env=env, pass_fds=fds)
        except EnvironmentBuildError:
            raise
        except Exception as exc:  # pragma: no cover - unexpected OS errors
            raise EnvironmentBuildError(f"environment {key} failed to build: {exc}") from exc
        with step("bytecode"):
            compile_prefix(built.venv)  # before ready.json: a complete entry has its prefix, or failed to
        # Complete only now: ready.json names the attempt, written whole by a rename.
        record = {"attempt": attempt.name, "spec": asdict(spec), "python": interpreter.version,
                  "installer": installer, "seconds": round(time.monotonic() - started, 2)}
        staged = attempt / "ready.json.tmp"
        staged.write_text(json.dumps(record))
        os.rename(staged, root / "ready.json")
        log.info("environment %s built in %.1fs", key, time.monotonic() - started)
    return built_at(built.venv)


ATTEMPT_PREFIX = "attempt-"


def _one_line(command: str, limit: int = 100) -> str:
    """A build step as it reads in one progress line: its first line, cut."""
    lines = command.strip().splitlines() or [""]
    text = lines[0] + (" …" if len(lines) > 1 else "")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def ready_venv(root: Path) -> Path | None:
    """The venv of the complete build of the entry ``root``, or None while there is none.

    A venv cannot be moved once made (its scripts name its path), so each build is an *attempt*
    directory of its own, and ``ready.json`` (renamed into place last) names the one that finished.
    Entries made before attempts existed have their venv at ``root/venv``."""
    try:
        record = json.loads((root / "ready.json").read_text())
    except (OSError, ValueError):
        return None
    attempt = record.get("attempt") if isinstance(record, dict) else None
    venv = root / attempt / "venv" if attempt else root / "venv"
    return venv if venv.is_dir() else None


def remove_attempts(root: Path) -> int:
    """Remove what unfinished builds of the entry ``root`` left, keeping the complete one (the
    caller holds its lock, so their builders are gone); return how many. Best effort: whatever
    cannot be removed stays, unused, for ``sandboxes gc``; a new attempt never shares a
    directory with an old one."""
    if not root.is_dir():
        return 0
    venv = ready_venv(root)
    keep = {"ready.json"}
    if venv is not None:  # the complete attempt, or an entry of the layout before attempts
        keep |= {venv.relative_to(root).parts[0]} | ({"build.log"} if venv == root / "venv" else set())
    removed = 0
    for child in root.iterdir():
        if child.name in keep:
            continue
        removed += 1
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    return removed


def reap_attempts() -> int:
    """Remove the attempts of environment builds that are over, whatever their home's other
    processes do: an entry is swept only while its lock is free (no builder, and no orphan of one
    holding the lock it inherited); return how many were removed."""
    import fcntl

    removed = 0
    for root in cache_dir("envs").iterdir():
        if not root.is_dir():
            continue
        fd = os.open(root.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being built
            removed += remove_attempts(root)
        finally:
            os.close(fd)
    return removed


def install_packages(venv: Path, packages: tuple[str, ...], log_file: Path, *, cwd: Path,
                     env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> str:
    """pip-install ``packages`` into ``venv``, with uv when it is there (:mod:`patchgym.sandboxes.installer`),
    falling back to pip if uv fails; return the installer that succeeded."""
    python = str(venv / "bin" / "python")
    choice = installer_choice()
    uv = uv_executable() if choice != "pip" else None
    if choice == "uv" and uv is None:
        raise EnvironmentBuildError("PATCHGYM_INSTALLER=uv, but uv is not installed (pip install uv)")
    if uv is not None:
        argv, uv_env = uv_install_argv(uv, python, packages, env)
        try:
            run_logged(argv, log_file, cwd=cwd, env=uv_env, pass_fds=pass_fds)
            return "uv"
        except EnvironmentBuildError:
            if choice == "uv":
                raise
            with log_file.open("a") as fh:
                fh.write("# uv failed: installing the same packages with pip\n")
    run_logged([python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *packages],
               log_file, cwd=cwd, env=env, pass_fds=pass_fds)
    return "pip"


def venv_environ(venv: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    env["PIP_NO_INPUT"] = "1"
    return env


def run_logged(argv: list[str], log_file: Path, *, cwd: Path, env: dict[str, str] | None = None,
               pass_fds: tuple[int, ...] = ()) -> None:
    """Run one build step into ``log_file``; it and everything it starts die with this process
    (:func:`~sandboxes.lifetime.run_checked`), and inherit ``pass_fds`` (the entry's lock)."""
    with log_file.open("ab") as fh:
        fh.write(f"$ {' '.join(argv)}\n".encode())
        fh.flush()
        since = fh.tell()
        try:
            proc = run_checked(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               cwd=cwd, env=env, timeout=BUILD_TIMEOUT, pass_fds=pass_fds)
        except subprocess.TimeoutExpired:
            raise EnvironmentBuildError(step_failed("environment step", " ".join(argv), log_file, since=since,
                                                    timed_out=True)) from None
    if proc.returncode != 0:
        raise EnvironmentBuildError(step_failed("environment step", " ".join(argv), log_file,
                                                exit_code=proc.returncode, since=since))
