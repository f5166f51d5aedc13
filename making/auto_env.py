"""An environment for a repository no spec covers: candidate recipes read from the repository's own
declarations, tried in order until one collects the tests at the base commit.

:func:`~.repo_setup.detect_setup` makes one guess; a guess that is wrong costs a task. Here the
same declarations (extras, requirement files, tox, nox and CI install lines, requires-python) give
an ordered list of :class:`Recipe` s, and :func:`choose_environment` builds each in a sandbox and
keeps the first under which pytest collects the task's test files (``--collect-only`` exit 0):
collection is what a wrong environment breaks first (an import error, a missing plugin, a Python
too new), and it costs seconds where a test run costs minutes. The report keeps every attempt with
why it failed, since a repository none of them fits is fixed by a user reading them.

Old commits break on today's releases of their dependencies (DESIGN.md: click 8.2, pytest 8, numpy
2, ...), so each declared recipe comes first *as of the commit*: its requirements resolved with uv
(``uv pip compile --exclude-newer <commit date>``, the host's pip settings applied) to the releases
that existed when the commit was made, pinned exactly; then as declared (today's releases), for
when that resolution or its build fails. As of the commit goes first because collecting is not
passing: Flask 2.3's suite collects under click 8.2 and four of its CLI tests fail there. Nothing is run on the host:
setup.py is parsed (:func:`~.repo_setup.setup_py_keywords`), noxfiles too.
"""

from __future__ import annotations

import ast
import os
import posixpath
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from git import Repo
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from patchgym.grading.declared import files_of
from patchgym.grading.pyast import parse as parse_python
from patchgym.grading.testrun import probe_task
from patchgym.making import repo_setup as rs
from patchgym.making.git_source import RepoFiles, RepoSetupError
from patchgym.sandboxes import SandboxError
from patchgym.sandboxes.installer import pip_settings, uv_executable, uv_options
from patchgym.tasks.model import EnvironmentConfig, Task, TaskFileError, TestSpec

# Interpreters tried after the one detect_setup picks, oldest last: Debian bullseye's and
# bookworm's (what the docker backend builds without a hand-bootstrapped base).
FALLBACK_PYTHONS = ("3.9", "3.11")
# First release of each CPython minor version (python.org), for the Python of a commit's time.
PYTHON_RELEASES = {"3.6": "2016-12-23", "3.7": "2018-06-27", "3.8": "2019-10-14", "3.9": "2020-10-05",
                   "3.10": "2021-10-04", "3.11": "2022-10-24", "3.12": "2023-10-02", "3.13": "2024-10-07"}
COLLECT = "python -m pytest --collect-only -q -p no:cacheprovider"
SCM_NAMES = ("setuptools_scm", "setuptools-scm", "hatch-vcs", "hatch_vcs")


@dataclass
class Recipe:
    """One candidate environment, named for the declaration it comes from."""

    name: str
    environment: EnvironmentConfig
    notes: list[str] = field(default_factory=list)
    # Pins the packages when the recipe is tried (resolving as of a date takes seconds of uv and
    # the network, spent only on recipes that are reached); replaces ``environment``.
    resolve: Callable[[], EnvironmentConfig] | None = field(default=None, repr=False, compare=False)


@dataclass
class Attempt:
    recipe: Recipe
    ok: bool
    reason: str
    seconds: float = 0.0


@dataclass
class AutoEnv:
    """The recipes tried, in order, and the first that collected (None when none did)."""

    attempts: list[Attempt] = field(default_factory=list)

    @property
    def winner(self) -> Recipe | None:
        return next((a.recipe for a in self.attempts if a.ok), None)

    def summary(self) -> str:
        parts = [f"{a.recipe.name}: {'collected' if a.ok else a.reason}" for a in self.attempts]
        return "; ".join(parts) or "no recipe"


class ResolveError(RuntimeError):
    """uv could not resolve a recipe's requirements as of a date."""


# --------------------------------------------------------------------------------------------
# Reading what the repository declares beyond detect_setup's first choice


def _extras(files: RepoFiles) -> dict[str, list[str]]:
    notes: list[str] = []
    pyproject = rs._toml(files, "pyproject.toml", notes)
    project = pyproject.get("project") if isinstance(pyproject.get("project"), dict) else {}
    if isinstance(project.get("optional-dependencies"), dict):
        return {k: rs._lines(v) for k, v in project["optional-dependencies"].items()}
    setup_cfg = rs._ini(files, "setup.cfg", notes)
    if setup_cfg is not None and setup_cfg.has_section("options.extras_require"):
        return {k: rs._lines(v) for k, v in setup_cfg.items("options.extras_require")}
    setup_py = rs.setup_py_keywords(files.read("setup.py") or "") if files.exists("setup.py") else {}
    if isinstance(setup_py.get("extras_require"), dict):
        return {str(k): rs._lines(v) for k, v in setup_py["extras_require"].items()}
    return {}


def install_requires(files: RepoFiles) -> list[str]:
    """The project's own runtime requirements, as far as they are literal (pyproject, setup.cfg,
    setup.py)."""
    notes: list[str] = []
    project = rs._toml(files, "pyproject.toml", notes).get("project")
    if isinstance(project, dict) and project.get("dependencies"):
        return rs._lines(project["dependencies"])
    setup_cfg = rs._ini(files, "setup.cfg", notes)
    if setup_cfg is not None and setup_cfg.get("options", "install_requires", fallback=""):
        return rs._lines(setup_cfg.get("options", "install_requires"))
    setup_py = rs.setup_py_keywords(files.read("setup.py") or "") if files.exists("setup.py") else {}
    return rs._lines(setup_py.get("install_requires", []))


def _uses_scm(files: RepoFiles) -> bool:
    """Whether the version comes from git tags, which a task's checkout does not have."""
    texts = [files.read(p) or "" for p in ("pyproject.toml", "setup.cfg", "setup.py")]
    return any(name in text for text in texts for name in SCM_NAMES)


def _pip_words(words: Sequence[str], files: RepoFiles, base: str, notes: list[str]) -> list[str]:
    """Requirements named by ``pip install`` arguments (``-r FILE`` followed, the project itself and
    options left out)."""
    reqs: list[str] = []
    it = iter(words)
    for word in it:
        if word in ("-r", "--requirement"):
            target = next(it, "")
            path = posixpath.normpath(posixpath.join(base, target))
            if files.exists(path):
                reqs += rs.parse_requirements(files, path, notes)
        elif word.startswith(("-r", "--requirement=")) and len(word) > 2:
            path = posixpath.normpath(posixpath.join(base, word.split("=", 1)[-1].removeprefix("-r")))
            if files.exists(path):
                reqs += rs.parse_requirements(files, path, notes)
        elif word in ("-c", "--constraint", "-e", "--editable", "-i", "--index-url"):
            next(it, None)
        elif word.startswith(("-", ".", "/", "$")) or "{" in word:
            continue
        elif rs._req_name(word):
            reqs.append(word)
    return reqs


def nox_requirements(files: RepoFiles, notes: list[str]) -> list[str]:
    """The literal arguments of a noxfile's ``session.install(...)`` calls (parsed, not run)."""
    text = files.read("noxfile.py")
    if text is None:
        return []
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError):
        return []
    words: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "install":
            words += [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return _pip_words(words, files, ".", notes)


def workflow_requirements(files: RepoFiles, notes: list[str]) -> list[str]:
    """What the CI workflows pip-install (``pip install ...`` lines of .github/workflows)."""
    reqs: list[str] = []
    for path in sorted(p for p in files.paths if p.startswith(".github/workflows/") and p.endswith((".yml", ".yaml"))):
        for line in (files.read(path) or "").splitlines():
            m = re.search(r"pip3?\s+install\s+(.*)$", line)
            if not m:
                continue
            try:
                words = shlex.split(m.group(1).split("&&")[0].split("#")[0])
            except ValueError:
                continue
            rs._extend(reqs, _pip_words(words, files, ".", notes))
    return reqs


def requirement_sources(files: RepoFiles, chosen_extra: str | None) -> list[tuple[str, str | None, list[str]]]:
    """Alternatives to detect_setup's choice: (name, extra to install, packages), each another
    declaration of what the tests need."""
    notes: list[str] = []
    sources: list[tuple[str, str | None, list[str]]] = []
    extras = _extras(files)
    for name in extras:
        if rs._normal_extra(name) in (*rs.TEST_EXTRAS, *rs.DEV_EXTRAS) and name != chosen_extra:
            sources.append((f"extra {name}", name, []))
    req_files = [p for p in (*rs.TEST_REQUIREMENTS, *rs.DEV_REQUIREMENTS) if files.exists(p)]
    req_files += sorted(p for p in files.paths if re.fullmatch(r"requirements/[^/]+\.(txt|in)", p)
                        and p not in req_files and not re.search(r"doc|lint|typing|mypy|release", p))
    if files.exists("requirements.txt"):
        req_files.append("requirements.txt")
    for path in req_files:
        reqs = rs.parse_requirements(files, path, notes)
        if reqs:
            sources.append((path, None, reqs))
    tox = rs._ini(files, "tox.ini", notes)
    if tox is not None and tox.has_option("testenv", "deps"):
        deps = [re.sub(r"^[\w,{}!-]+:\s+", "", d) for d in rs._lines(tox.get("testenv", "deps"))]
        words = [w for d in deps for w in (shlex.split(d) if d.startswith("-r") else [d])]
        reqs = _pip_words(words, files, ".", notes)
        if reqs:
            sources.append(("tox.ini [testenv] deps", None, reqs))
    for name, reqs in (("noxfile.py session.install", nox_requirements(files, notes)),
                       (".github/workflows pip install", workflow_requirements(files, notes))):
        if reqs:
            sources.append((name, None, reqs))
    return sources


# --------------------------------------------------------------------------------------------
# Resolving as of a date


# Projects whose releases of the time were deleted from PyPI, only a later one left: with the date's
# cutoff uv backtracks silently to releases that predate the dependency (atomicwrites, required by
# pytest 3.6-5.x: as of 2019 uv picked pytest 3.5.1 for marshmallow, whose grading then fails), so
# they are exempt from it.
REPUBLISHED = ("atomicwrites",)
# uv's hint when the cutoff hid every release a requirement accepts: the name and the first fitting
# release's upload time.
FILTERED = re.compile(r"`([A-Za-z0-9._-]+)` was filtered by `exclude-newer`.*?published at (\S+?)\.?(?:\s|$)", re.S)


def _stamp(date: datetime) -> str:
    return date.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


NO_WHEEL = re.compile(r"Wheels are required for `([A-Za-z0-9._-]+)`")
# How long after a Python's first release its compiled dependencies are looked for wheels for it.
WHEELS_AFTER = timedelta(days=90)


def resolve_as_of(requirements: Sequence[str], python: str, date: datetime, timeout: float = 300,
                  run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[str]:
    """``requirements`` pinned (``name==version``) to the releases uv finds published before
    ``date`` for ``python``; raises :class:`ResolveError` with uv's reason.

    Wheels only, at first: a commit older than ``python`` gets releases that had no wheel for it
    (xarray of 2019 on 3.9: numpy 1.17 and pandas 0.25, compiled for many minutes in the build, if
    they compile at all). A package with no wheel is then taken as of :data:`WHEELS_AFTER` past
    ``python``'s release (the releases that first had wheels for it), else built from its sdist as
    of ``date`` (old pure-Python projects published sdists only). A requirement none of whose
    releases before ``date`` exists any longer (or whose declared range begins later) is taken at
    the first release that fits, as uv's hint names it; :data:`REPUBLISHED` ones are exempt from
    the date from the start."""
    uv = uv_executable()
    if uv is None:
        raise ResolveError("uv is not installed")
    options, environ = uv_options(pip_settings())
    exempt = {name: _stamp(datetime.now(timezone.utc)) for name in REPUBLISHED}
    built: list[str] = []
    released = PYTHON_RELEASES.get(python)
    wheels_from = datetime.fromisoformat(released).replace(tzinfo=timezone.utc) + WHEELS_AFTER if released else None
    for _ in range(12):
        argv = [uv, "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate", "--python-version", python,
                "--exclude-newer", _stamp(date), *options, "--only-binary", ":all:",
                *(f"--exclude-newer-package={name}={when}" for name, when in exempt.items()),
                *(f"--no-binary={name}" for name in built)]
        try:
            proc = run(argv, input="\n".join(requirements) + "\n", capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, **environ, "UV_PYTHON_DOWNLOADS": "never"})
        except subprocess.TimeoutExpired:
            raise ResolveError(f"uv pip compile took over {timeout:.0f}s") from None
        if proc.returncode == 0:
            return [ln.strip() for ln in proc.stdout.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        wheel, hidden = NO_WHEEL.search(proc.stderr), FILTERED.search(proc.stderr)
        if wheel is not None and wheel.group(1) not in built:
            name = wheel.group(1)
            if wheels_from is not None and wheels_from > date and name not in exempt:
                exempt[name] = _stamp(wheels_from)
            else:
                exempt.pop(name, None)
                built.append(name)
            continue
        if hidden is None or hidden.group(1) in exempt:
            break
        try:  # a minute past its upload, which the cutoff excludes
            exempt[hidden.group(1)] = _stamp(datetime.fromisoformat(hidden.group(2)) + timedelta(minutes=1))
        except ValueError:
            break
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip() and not ln.lstrip().startswith("warning:")]
    raise ResolveError(" ".join(lines[:3])[:300] or f"uv pip compile exited {proc.returncode}")


# uv's words for a requirement none of whose releases can be had (all yanked, none published, none
# for the date or the Python), followed by the name in question.
UNAVAILABLE = re.compile(r"(?:there (?:are|is) no versions of|only the following versions of|Because|and)\s+"
                         r"([A-Za-z0-9][A-Za-z0-9._-]*)")


def resolve_leaving_out(requirements: Sequence[str], python: str, date: datetime, optional: Collection[str],
                        resolver: Callable[..., list[str]], notes: list[str], tries: int = 3) -> list[str]:
    """``resolver``'s pins, leaving out (at most ``tries`` times, each said in ``notes``) a
    requirement of ``optional`` (canonical names) that uv names as the cause of no solution.

    Development requirement files carry tooling the tests never import, and one of them with every
    release yanked (sqlfluff's ``types-pkg_resources``, replaced by types-setuptools) sinks the
    whole recipe, resolved as of any date or installed as declared. Only test and development
    requirements are ``optional``: a runtime requirement left out would make an environment that
    collects but is not the project's."""
    wanted = list(requirements)
    for _ in range(tries):
        try:
            return resolver(wanted, python, date)
        except ResolveError as exc:
            cause = next((n for n in (rs._req_name(m) for m in UNAVAILABLE.findall(str(exc))) if n in optional), None)
            if cause is None:
                raise
            wanted = [r for r in wanted if rs._req_name(r) != cause]
            notes.append(f"packages: left out {cause}, which uv could not resolve ({str(exc)[:160]})")
    return resolver(wanted, python, date)


def commit_date(files: RepoFiles) -> datetime:
    with Repo(files.git_dir) as repo:
        return repo.commit(files.commit).committed_datetime


# --------------------------------------------------------------------------------------------
# Recipes


def _python_fits(python: str, constraint: str | None) -> bool:
    if not constraint:
        return True
    try:
        return Version(f"{python}.0") in SpecifierSet(constraint) or Version(python) in SpecifierSet(constraint)
    except (InvalidSpecifier, InvalidVersion):
        return False


def _constraint(files: RepoFiles) -> str | None:
    notes: list[str] = []
    project = rs._toml(files, "pyproject.toml", notes).get("project")
    setup_cfg = rs._ini(files, "setup.cfg", notes)
    setup_py = rs.setup_py_keywords(files.read("setup.py") or "") if files.exists("setup.py") else {}
    for value in ((project or {}).get("requires-python") if isinstance(project, dict) else None,
                  setup_cfg.get("options", "python_requires", fallback=None) if setup_cfg else None,
                  setup_py.get("python_requires")):
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _merge(first: Sequence[str], rest: Sequence[str]) -> list[str]:
    """``first``, then those of ``rest`` whose project ``first`` does not name."""
    names = {rs._req_name(r) for r in first}
    return list(dict.fromkeys([*first, *(r for r in rest if rs._req_name(r) not in names)]))


def candidate_recipes(files: RepoFiles, *, version: str | None = None, pythons: Sequence[str] = FALLBACK_PYTHONS,
                      as_of: datetime | None = None, resolver: Callable[..., list[str]] | None = resolve_as_of,
                      limit: int = 8) -> list[Recipe]:
    """The recipes to try, best first, on the Python of the commit's time (:func:`era_python`):
    what :func:`~.repo_setup.detect_setup` detects resolved as of the commit (``as_of``, with
    ``resolver``; None: no such twins), then as declared; then the other declarations of test
    requirements (extras, requirement files, tox, nox, CI), each as of the commit then as declared;
    last, the first two on the others of ``pythons`` its python_requires allows. ``version`` (a
    row's ``version``) stands in for the
    git tags a project that takes its version from them (setuptools_scm) would read."""
    detection = rs.detect_setup(files)
    constraint = _constraint(files)
    base_env = detection.environment
    scm = _uses_scm(files) and version
    prefix = f"SETUPTOOLS_SCM_PRETEND_VERSION={shlex.quote(_full_version(version or ''))} " if scm else ""
    install = [prefix + step if step.startswith("python -m pip install") else step for step in base_env.install]
    extra = next((m.group(1) for s in install if (m := re.search(r"\.\[([^\]]+)\]", s))), None)
    runtime = install_requires(files)
    extra_reqs = _extras(files).get(extra, []) if extra else []
    notes = list(detection.notes) + ([f"install: SETUPTOOLS_SCM_PRETEND_VERSION from the row's version {version}"]
                                     if scm else [])
    others = [p for p in pythons if p != base_env.python and _python_fits(p, constraint)]
    era = era_python([base_env.python, *others], as_of)
    order = list(dict.fromkeys([*([era] if era else []), base_env.python, *others]))
    if era and era != base_env.python:
        notes.append(f"python {era} first: the newest of {', '.join(order)} released before the commit")
    recipes: list[Recipe] = []

    def add(name: str, python: str, packages: list[str], steps: list[str], why: list[str], dated: bool,
            extra_deps: Sequence[str] = extra_reqs) -> None:
        if not dated:
            recipes.append(Recipe(f"{name} (python {python})",
                                  EnvironmentConfig(python=python, packages=packages, install=steps), why))
        elif as_of is not None and resolver is not None:
            wanted = [*runtime, *extra_deps, *(re.sub(r"^pytest==[\d.]+$", "pytest", p) for p in packages)]
            required = {rs._req_name(r) for r in runtime} | {"pytest"}
            optional = {n for n in map(rs._req_name, [*extra_deps, *packages]) if n and n not in required}
            recipe_notes = [*why, f"packages: resolved by uv as released before {as_of.isoformat()}"]

            def resolve(wanted: list[str] = wanted, python: str = python, steps: list[str] = steps,
                        optional: set[str] = optional, recipe_notes: list[str] = recipe_notes) -> EnvironmentConfig:
                pins = resolve_leaving_out(wanted, python, as_of, optional, resolver, recipe_notes)
                return EnvironmentConfig(python=python, packages=pins, install=steps)

            recipes.append(Recipe(f"{name} as of {as_of.date()} (python {python})",
                                  EnvironmentConfig(python=python, packages=wanted, install=steps),
                                  recipe_notes, resolve))

    first = order[0]
    for dated in (True, False):  # the releases of the commit's time first: collecting is not passing
        add("declared", first, list(base_env.packages), install, notes, dated)
    editable = [prefix + "python -m pip install -e ."] if install else []
    for name, source_extra, reqs in requirement_sources(files, extra):
        steps = [prefix + f"python -m pip install -e {shlex.quote(f'.[{source_extra}]')}"] if source_extra and install \
            else editable
        packages = _merge(reqs, [p for p in base_env.packages if rs._req_name(p) in ("pytest", *_plugins(base_env))])
        if not any(rs._req_name(p) == "pytest" for p in packages):
            packages.insert(0, rs.DEFAULT_PYTEST)
        for dated in (True, False):
            add(name, first, packages, steps, [f"packages: from {name}"], dated,
                _extras(files).get(source_extra, []) if source_extra else [])
    # Every declaration on the Python of the commit's time before another Python: over 25 SWE-bench
    # rows the other Python never won, and marshmallow-1343 needed the `dev` extra, recipe 5 of 6.
    for python in order[1:]:
        for dated in (True, False):
            add("declared", python, list(base_env.packages), install, notes, dated)
    seen: set[str] = set()
    unique = []
    for recipe in recipes:
        key = f"{recipe.resolve is not None}{recipe.environment.model_dump_json()}"
        if key not in seen:
            seen.add(key)
            unique.append(recipe)
    return unique[:limit]


def era_python(pythons: Sequence[str], as_of: datetime | None) -> str | None:
    """The newest of ``pythons`` released before ``as_of`` (else the oldest): what the project was
    tested on then, or the nearest to it (a suite of 2020 collects on 3.9, not always on 3.11)."""
    if as_of is None:
        return None
    released = [p for p in pythons if p in PYTHON_RELEASES
                and PYTHON_RELEASES[p] <= as_of.astimezone(timezone.utc).date().isoformat()]
    known = [p for p in pythons if p in PYTHON_RELEASES]
    return max(released, key=Version) if released else min(known, key=Version) if known else None


def _plugins(environment: EnvironmentConfig) -> list[str]:
    return [n for n in (rs._req_name(p) for p in environment.packages) if n and n.startswith("pytest-")]


def _full_version(version: str) -> str:
    return version if version.count(".") >= 2 else f"{version}.0"


# --------------------------------------------------------------------------------------------
# Trying them


def collect(task: Task, factory: Callable[[Task], object], tests: Sequence[str], timeout: float) -> tuple[bool, str]:
    """Build ``task``'s environment and collect ``tests`` (files or ids; the suite when empty) at
    its base commit: (collected, why not)."""
    try:
        sandbox = factory(task)
    except SandboxError as exc:
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        return False, "build failed: " + " | ".join(lines[-3:])[-400:]
    try:
        args = " ".join(shlex.quote(t) for t in tests)
        result = sandbox.exec(f"{COLLECT} {args}".rstrip(), timeout=timeout)  # type: ignore[attr-defined]
        if result.timed_out:
            return False, f"collection timed out after {timeout:.0f}s"
        if result.exit_code == 0:
            return True, ""
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        interesting = [ln for ln in lines if re.search(r"Error|error:|No module|not found", ln)]
        tail = " | ".join((interesting or lines)[-2:])[-400:]
        return False, f"pytest --collect-only exit {result.exit_code}: {tail}"
    finally:
        try:
            sandbox.close()  # type: ignore[attr-defined]
        except SandboxError:
            pass


def choose_environment(task: Task, recipes: Sequence[Recipe], factory: Callable[[Task], object], *,
                       tests: Sequence[str] = (), timeout: float = 600) -> AutoEnv:
    """Try ``recipes`` in order on ``task``'s base commit; stop at the first that collects."""
    report = AutoEnv()
    for recipe in recipes:
        started = time.monotonic()
        if recipe.resolve is not None:
            try:
                recipe.environment, recipe.resolve = recipe.resolve(), None
            except ResolveError as exc:
                report.attempts.append(Attempt(recipe, False, f"not resolved: {exc}", time.monotonic() - started))
                continue
        trial = probe_task(repo=task.repo, base_commit=task.base_commit, repo_path=task.repo_path,
                           environment=recipe.environment, test_spec=task.test_spec,
                           instance_id=f"{task.instance_id}.auto")
        trial._source_file = task.source_file
        ok, reason = collect(trial, factory, tests, timeout)
        report.attempts.append(Attempt(recipe, ok, reason, time.monotonic() - started))
        if ok:
            break
    return report


def task_tests(task: Task, files: RepoFiles) -> list[str]:
    """What must collect: the task's listed test files that exist at its base commit, and for one
    its test patch adds, the nearest directory of it that exists (none when that is the top; the
    whole suite when nothing is left). sqlfluff's suite as a whole does not collect (its dbt
    plugin's ``test`` package shadows the top one) while ``test/rules/``, where the new file of
    sqlfluff-2419 goes, does."""
    found: list[str] = []
    for path in files_of([*task.FAIL_TO_PASS, *task.PASS_TO_PASS]):
        while path and not files.exists(path) and not files.has_dir(path):
            path = posixpath.dirname(path)
        if path:
            found.append(path)
    return list(dict.fromkeys(found))


def auto_environment(task: Task, factory: Callable[[Task], object], *, pythons: Sequence[str] = FALLBACK_PYTHONS,
                     limit: int = 8, timeout: float = 600) -> tuple[AutoEnv, list[Recipe]]:
    """Choose ``task``'s environment from its repository's declarations at its base commit."""
    from patchgym.making.git_source import open_source
    from patchgym.tasks.catalog import repo_source

    source = open_source(repo_source(task))
    with RepoFiles(source.git_dir, task.base_commit) as files:
        recipes = candidate_recipes(files, version=str(task.version or "") or None, pythons=pythons,
                                    as_of=commit_date(files), limit=limit)
        tests = task_tests(task, files)
    return choose_environment(task, recipes, factory, tests=tests, timeout=timeout), recipes


def auto_test_spec(selection: str = "files") -> TestSpec:
    return TestSpec(selection="ids" if selection == "ids" else "files")


@dataclass
class AutoTask:
    """What choosing one imported task's environment came to: the task with it (None when there is
    none, and ``reason`` says why), the recipes tried (None when the repository could not be read),
    and the row ``tasks import-swebench --auto-report`` writes for it (None likewise)."""

    task: Task | None
    reason: str = ""
    found: AutoEnv | None = None
    row: dict[str, object] | None = None


def report_row(instance_id: str, found: AutoEnv, recipes: Sequence[Recipe]) -> dict[str, object]:
    """One automatic choice as ``--auto-report`` writes it: the winner, every attempt and why it
    failed, and, when none collected, the recipes the limit left untried: a repository no recipe
    fits is fixed by a user reading them."""
    winner = found.winner
    return {"instance_id": instance_id, "winner": winner.name if winner else None,
            "environment": winner.environment.model_dump() if winner else None,
            "attempts": [{"recipe": a.recipe.name, "ok": a.ok, "reason": a.reason, "seconds": round(a.seconds, 1)}
                         for a in found.attempts],
            "not_tried": [r.name for r in recipes[len(found.attempts):]] if not winner else [],
            "notes": recipes[0].notes if recipes else []}


def auto_task(task: Task, factory: Callable[[Task], object], *, limit: int, selection: str = "files") -> AutoTask:
    """``task`` with the environment of the first recipe whose tests collect, and the test spec of
    ``selection`` (an imported row's own does not fit the automatic environment), or why none did."""
    try:
        found, recipes = auto_environment(task, factory, limit=limit)
    except (RepoSetupError, TaskFileError) as exc:
        return AutoTask(None, f"no automatic environment: {exc}")
    row = report_row(task.instance_id, found, recipes)
    winner = found.winner
    if winner is None:
        return AutoTask(None, f"no recipe collected its tests ({found.summary()})", found, row)
    chosen = task.model_copy(update={"environment": winner.environment, "test_spec": auto_test_spec(selection)})
    return AutoTask(chosen, "", found, row)
