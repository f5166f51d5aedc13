"""Registering a repository: how its environment is built, how its tests run, and whether its
suite works at a commit — what ``patchgym repos add`` needs before any task exists.

Detection reads the files of one commit (:class:`~.git_source.RepoFiles`: git's object database,
no checkout, no code run: a setup.py is parsed, never executed), so what is detected is exactly
what sandboxes will check out. Every guess comes with a note saying where it came from, because a
wrong guess is only fixable by a user who can see it. The suite check (:func:`check_suite`) turns
a whole-suite :class:`~.testrun.TestRun` into a verdict with the reason, since "0 tests passed"
alone does not say what to fix.

One file (about 570 lines): detection is one chain of guesses over the same few files
(pyproject.toml, setup.cfg, setup.py, requirements, pytest and tox configuration), each guess
reading earlier ones (the chosen extra picks the requirements, the test options pick the plugins,
the Python constraint picks the interpreter), and the notes of every guess must come out in one
order; the suite check is the last step of the same registration.
"""

from __future__ import annotations

import ast
import configparser
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from patchgym.grading.outcome import TestStatus
from patchgym.grading.pyast import parse as parse_python
from patchgym.grading.testrun import TestRun
from patchgym.making.git_source import RepoFiles, RepoSetupError
from patchgym.sandboxes import EnvironmentSpec, SandboxError
from patchgym.sandboxes.environments import find_interpreter
from patchgym.tasks.model import DEFAULT_TEST_COMMAND, EnvironmentConfig, TestSpec

try:  # Python 3.11+; tomli is the same parser for 3.10
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

# The same pin as the bundled catalog: one runner whose junit output the grader is known to read,
# and a venv shared with the bundled tasks when a repository needs nothing else.
DEFAULT_PYTEST = "pytest==8.3.5"
TEST_EXTRAS = ("test", "tests", "testing")
DEV_EXTRAS = ("dev", "develop", "development")
TEST_REQUIREMENTS = ("requirements-test.txt", "requirements-tests.txt", "requirements_test.txt",
                     "requirements-testing.txt", "test-requirements.txt", "test_requirements.txt",
                     "tests-requirements.txt", "tests/requirements.txt", "requirements/test.txt",
                     "requirements/tests.txt", "requirements/testing.txt")
DEV_REQUIREMENTS = ("requirements-dev.txt", "requirements_dev.txt", "dev-requirements.txt",
                    "dev_requirements.txt", "requirements/dev.txt", "requirements/development.txt")
# addopts / ini keys that fail with "unrecognized arguments" unless their plugin is installed.
PLUGIN_OPTIONS = {"--cov": "pytest-cov", "-n": "pytest-xdist", "--numprocesses": "pytest-xdist",
                  "--dist": "pytest-xdist", "--timeout": "pytest-timeout", "--reruns": "pytest-rerunfailures",
                  "--benchmark": "pytest-benchmark", "--doctest-plus": "pytest-doctestplus"}
PLUGIN_INI_KEYS = {"asyncio_mode": "pytest-asyncio", "timeout": "pytest-timeout",
                   "DJANGO_SETTINGS_MODULE": "pytest-django", "mock_use_standalone_module": "pytest-mock"}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class UnsupportedRepoError(RepoSetupError):
    """A repository whose tests do not run with pytest (Django, SymPy)."""


# --------------------------------------------------------------------------------------------
# Reading the project's metadata


def _toml(files: RepoFiles, path: str, notes: list[str]) -> dict[str, Any]:
    text = files.read(path)
    if text is None:
        return {}
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        notes.append(f"cannot read {path}: install tomli (Python 3.10)")
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        notes.append(f"ignored {path}: invalid TOML ({exc})")
        return {}


def _ini(files: RepoFiles, path: str, notes: list[str]) -> configparser.ConfigParser | None:
    text = files.read(path)
    if text is None:
        return None
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        notes.append(f"ignored {path}: {exc.__class__.__name__}")
        return None
    return parser


def _literal(node: ast.expr, names: dict[str, ast.expr], depth: int = 0,
             items: dict[str, list[tuple[ast.expr, ast.expr]]] | None = None) -> Any:
    """A literal value of setup.py, following module-level names (``extras_require=EXTRAS``), the
    keys set on them afterwards (``EXTRAS["dev"] = EXTRAS["tests"] + ["tox"]``, in ``items``) and
    subscripts of them."""
    if depth > 8:
        raise ValueError("too deep")
    items = items or {}
    if isinstance(node, ast.Name) and node.id in names:
        value = _literal(names[node.id], names, depth + 1, items)
        if isinstance(value, dict) and items.get(node.id):
            rest = {k: v for k, v in items.items() if k != node.id}
            for key, item in items[node.id]:  # in order, each seeing the dict as it stands
                current = {**names, node.id: ast.Constant(dict(value))}
                value[_literal(key, current, depth + 1, rest)] = _literal(item, current, depth + 1, rest)
        return value
    if isinstance(node, ast.Subscript):
        return _literal(node.value, names, depth + 1, items)[_literal(node.slice, names, depth + 1, items)]
    if isinstance(node, ast.Dict):
        return {_literal(k, names, depth + 1, items): _literal(v, names, depth + 1, items)
                for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e, names, depth + 1, items) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal(node.left, names, depth + 1, items) + _literal(node.right, names, depth + 1, items)
    if isinstance(node, ast.Constant):
        return node.value
    return ast.literal_eval(node)


def setup_py_keywords(text: str) -> dict[str, Any]:
    """The literal keywords of the ``setup(...)`` call (python_requires, extras_require,
    tests_require); computed values are left out. setup.py is parsed, never run."""
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError):
        return {}
    names: dict[str, ast.expr] = {}
    items: dict[str, list[tuple[ast.expr, ast.expr]]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            names[stmt.targets[0].id] = stmt.value
            items.pop(stmt.targets[0].id, None)
        elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript)
              and isinstance(stmt.targets[0].value, ast.Name)):
            items.setdefault(stmt.targets[0].value.id, []).append((stmt.targets[0].slice, stmt.value))
    found: dict[str, Any] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        fname = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if fname != "setup":
            continue
        for kw in node.keywords:
            if kw.arg in ("python_requires", "extras_require", "tests_require", "install_requires"):
                try:
                    found[kw.arg] = _literal(kw.value, names, items=items)
                except (ValueError, TypeError, SyntaxError, KeyError):
                    pass
    return found


def _lines(value: Any) -> list[str]:
    """A requirement list as setup.cfg (newline/semicolon text) or TOML (a list) spells it."""
    if isinstance(value, str):
        return [s.strip() for s in value.splitlines() if s.strip() and not s.strip().startswith("#")]
    if isinstance(value, (list, tuple)):
        return [str(s).strip() for s in value if str(s).strip()]
    return []


def _req_name(text: str) -> str | None:
    try:
        return canonicalize_name(Requirement(text).name)
    except InvalidRequirement:
        return None


def _normal_extra(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pick_extra(extras: dict[str, list[str]]) -> str | None:
    """The extra that installs what the tests need: a test extra, else a dev extra."""
    by_normal = {_normal_extra(k): k for k in extras}
    for wanted in (*TEST_EXTRAS, *DEV_EXTRAS):
        if wanted in by_normal:
            return by_normal[wanted]
    return None


def parse_requirements(files: RepoFiles, path: str, notes: list[str], seen: set[str] | None = None) -> list[str]:
    """Requirement strings of a requirements file, following ``-r`` includes inside the
    repository. Editable/local lines (the project itself) and pip options are left out: packages
    are pip-installed outside the checkout, where relative paths mean nothing."""
    seen = set() if seen is None else seen
    if path in seen:
        return []
    seen.add(path)
    text = files.read(path)
    if text is None:
        notes.append(f"{path} is referenced but not in the repository")
        return []
    base = str(Path(path).parent)
    reqs: list[str] = []
    joined = re.sub(r"\\\n", " ", text)
    for raw in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        include = re.match(r"^(-r|--requirement|-c|--constraint)\s*=?\s*(\S+)", line)
        if include:
            target = str(Path(base) / include.group(2)) if base != "." else include.group(2)
            if include.group(1) in ("-r", "--requirement"):
                reqs += parse_requirements(files, target, notes, seen)
            else:
                notes.append(f"{path}: constraints file {include.group(2)} not applied")
            continue
        if line.startswith("-"):
            if line.startswith(("-e", "--editable")):
                notes.append(f"{path}: editable line {line!r} left to the install step")
            continue
        line = re.split(r"\s--hash[=\s]", line)[0].strip()
        if line.startswith((".", "/")) or line.startswith("file:"):
            continue
        if _req_name(line) is None and "://" not in line:
            notes.append(f"{path}: skipped unreadable requirement {line!r}")
            continue
        reqs.append(line)
    return reqs


def dependency_group(groups: dict[str, Any], name: str, seen: frozenset[str] = frozenset()) -> list[str]:
    """A PEP 735 ``[dependency-groups]`` entry, ``{include-group = ...}`` expanded."""
    reqs: list[str] = []
    for item in groups.get(name, []):
        if isinstance(item, str):
            reqs.append(item)
        elif isinstance(item, dict) and isinstance(item.get("include-group"), str):
            inner = item["include-group"]
            if inner not in seen:
                reqs += dependency_group(groups, inner, seen | {name})
    return reqs


def _addopts(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    try:
        return shlex.split(str(value))
    except ValueError:
        return str(value).split()


# --------------------------------------------------------------------------------------------
# Detection


@dataclass
class Detection:
    """A repository's environment and test command as detected, with how each was found."""

    environment: EnvironmentConfig
    test_spec: TestSpec
    notes: list[str] = field(default_factory=list)


def check_supported(files: RepoFiles) -> None:
    """Refuse the repositories whose suites run with their own runner, not pytest."""
    if files.has_dir("django") and (files.exists("tests/runtests.py") or files.exists("runtests.py")):
        raise UnsupportedRepoError(
            "this looks like Django (runtests.py and django/): its tests run with Django's own runner, "
            "which `repos add` does not support yet; `patchgym import-swebench` imports Django's SWE-bench "
            "tasks with their environments (or pass --test-cmd with a pytest-compatible command to try anyway)")
    if files.exists("bin/test") and files.has_dir("sympy"):
        raise UnsupportedRepoError(
            "this looks like SymPy (bin/test and sympy/): its tests run with SymPy's own runner, which "
            "`repos add` does not support yet; `patchgym import-swebench` imports SymPy's SWE-bench tasks "
            "with their environments (or pass --test-cmd with a pytest-compatible command to try anyway)")


def _pythons_here() -> str:
    """The Python versions this machine has, for an error message."""
    from patchgym.sandboxes.environments import _candidate_executables, _probe

    versions = {Version(i.version) for i in map(_probe, _candidate_executables()) if i}
    return ", ".join(f"{v.major}.{v.minor}" for v in sorted({Version(f"{v.major}.{v.minor}") for v in versions}))


def pick_python(constraint: str | None, origin: str | None = None) -> tuple[str, str]:
    """``X.Y`` of an interpreter on this machine that satisfies ``constraint`` (this one when it
    fits, as sandboxes would choose), and a note. A concrete version, not the constraint, is
    stored so that every task made later runs on the Python the suite was checked with."""
    spec = EnvironmentSpec(python=constraint or ">=3.8")
    try:
        interpreter = find_interpreter(spec)
    except SandboxError as exc:
        where = f" ({origin})" if origin else ""
        raise RepoSetupError(f"no Python on this machine satisfies {constraint!r}{where} (it has "
                             f"{_pythons_here()}); install one or pass --python X.Y") from exc
    version = Version(interpreter.version)
    chosen = f"{version.major}.{version.minor}"
    if constraint:
        return chosen, f"python {chosen}: requires-python {constraint!r} in {origin}"
    return chosen, f"python {chosen}: no requires-python found; this machine's Python"


def validate_python(value: str) -> str:
    """The version of the interpreter on this machine that a ``--python`` value selects."""
    spec = EnvironmentSpec(python=value)
    try:
        spec.specifier()
        return find_interpreter(spec).version
    except SandboxError as exc:
        if "invalid python constraint" in str(exc):
            raise RepoSetupError(f"--python {value!r}: {exc}") from None
        raise RepoSetupError(f"--python {value!r}: no interpreter on this machine satisfies it (it has "
                             f"{_pythons_here()})") from None


def _plugins_for(options: Iterable[str], ini_keys: Iterable[str]) -> dict[str, str]:
    """Plugins a pytest configuration needs (plugin → the option that needs it)."""
    needed: dict[str, str] = {}
    for opt in options:
        for flag, plugin in PLUGIN_OPTIONS.items():
            if opt == flag or opt.startswith(flag + "=") or (flag.startswith("--") and opt.startswith(flag + "-")) \
                    or (flag == "-n" and re.fullmatch(r"-n\d+|-nauto", opt)):
                needed.setdefault(plugin, opt)
    for key in ini_keys:
        if key in PLUGIN_INI_KEYS:
            needed.setdefault(PLUGIN_INI_KEYS[key], key)
    return needed


def _extend(target: list[str], items: Iterable[str]) -> None:
    for item in items:
        if item not in target:
            target.append(item)


def detect_setup(files: RepoFiles, *, python: str | None = None, install: list[str] | None = None,
                 packages: list[str] | None = None, test_cmd: str | None = None) -> Detection:
    """Detect the environment (python, packages, install steps) and the test command of a commit.

    Rules, in order: PEP 621 ``[project]`` / ``[build-system]`` / setup.py / setup.cfg make the
    project installable (``pip install -e .``, with the first of the test/tests/testing extras,
    else a dev extra, as ``.[extra]``); test requirements files (else dev ones), PEP 735 test
    dependency groups, setup.py ``tests_require`` and, when none of these exist, tox's
    ``[testenv] deps`` become ``packages``, as does requirements.txt when the project is not
    installable; plugins the pytest configuration needs (``--cov``, ``-n``, ``asyncio_mode``,
    ``required_plugins``) and pytest itself are added when nothing else brings them.

    What the user gives wins: ``python`` replaces the detected version, ``install`` the detected
    install steps, ``test_cmd`` the test command; ``packages`` are added to the detected ones.
    """
    given_install, given_packages = install, packages or []
    notes: list[str] = []
    if test_cmd is None:
        check_supported(files)
    pyproject = _toml(files, "pyproject.toml", notes)
    setup_cfg = _ini(files, "setup.cfg", notes)
    tox_ini = _ini(files, "tox.ini", notes)
    pytest_ini = _ini(files, "pytest.ini", notes)
    setup_py = setup_py_keywords(files.read("setup.py") or "") if files.exists("setup.py") else {}
    project = pyproject.get("project") if isinstance(pyproject.get("project"), dict) else {}

    # Python
    constraint, origin = None, None
    for value, where in ((project.get("requires-python"), "pyproject.toml"),
                         (setup_cfg.get("options", "python_requires", fallback=None) if setup_cfg else None,
                          "setup.cfg"),
                         (setup_py.get("python_requires"), "setup.py")):
        if isinstance(value, str) and value.strip():
            try:
                SpecifierSet(value.strip())
            except InvalidSpecifier:
                notes.append(f"ignored python requirement {value!r} in {where}: not a PEP 440 specifier")
                continue
            constraint, origin = value.strip(), where
            break
    if python:
        actual = validate_python(python)
        notes.append(f"python {python}: given with --python")
    else:
        python, note = pick_python(constraint, origin)
        actual = python
        notes.append(note)

    # Installing the project, and the extras that bring test dependencies
    extras: dict[str, list[str]] = {}
    extras_origin = ""
    if isinstance(project.get("optional-dependencies"), dict):
        extras = {k: _lines(v) for k, v in project["optional-dependencies"].items()}
        extras_origin = "pyproject.toml [project.optional-dependencies]"
    elif setup_cfg is not None and setup_cfg.has_section("options.extras_require"):
        extras = {k: _lines(v) for k, v in setup_cfg.items("options.extras_require")}
        extras_origin = "setup.cfg [options.extras_require]"
    elif isinstance(setup_py.get("extras_require"), dict):
        extras = {str(k): _lines(v) for k, v in setup_py["extras_require"].items()}
        extras_origin = "setup.py extras_require"
    installable_by = ("pyproject.toml [project]" if project else
                      "pyproject.toml [build-system]" if "build-system" in pyproject else
                      "setup.py" if files.exists("setup.py") else
                      "setup.cfg [metadata]" if setup_cfg is not None and setup_cfg.has_section("metadata") else None)
    known: set[str] = set()  # canonical names of what the environment will have
    install: list[str] = []
    own_install = installable_by is not None and given_install is None  # else the user's steps install it
    extra = _pick_extra(extras) if own_install else None
    if own_install:
        if extra:
            install.append(f"python -m pip install -e {shlex.quote(f'.[{extra}]')}")
            notes.append(f"install: editable, with the {extra!r} extra of {extras_origin}")
            known.update(n for n in map(_req_name, extras[extra]) if n)
        else:
            install.append("python -m pip install -e .")
            notes.append(f"install: editable ({installable_by}; no test or dev extra)")
        known.update(n for n in map(_req_name, _lines(project.get("dependencies", []))) if n)
        known.update(n for n in map(_req_name, _lines(setup_py.get("install_requires", []))) if n)
        if setup_cfg is not None:
            known.update(n for n in map(_req_name, _lines(setup_cfg.get("options", "install_requires",
                                                                         fallback=""))) if n)

    # Packages: test requirements that an install does not bring
    packages: list[str] = []
    req_files = [p for p in TEST_REQUIREMENTS if files.exists(p)] or [p for p in DEV_REQUIREMENTS if files.exists(p)]
    if not installable_by and files.exists("requirements.txt"):
        req_files.insert(0, "requirements.txt")
    for path in req_files:
        reqs = parse_requirements(files, path, notes)
        _extend(packages, reqs)
        notes.append(f"packages: {len(reqs)} from {path}")
    groups = pyproject.get("dependency-groups")
    if isinstance(groups, dict):
        group = _pick_extra({k: [] for k in groups})
        if group:
            reqs = dependency_group(groups, group)
            _extend(packages, reqs)
            notes.append(f"packages: {len(reqs)} from pyproject.toml [dependency-groups] {group}")
    tests_require = _lines(setup_py.get("tests_require", []))
    if tests_require and not extra:
        _extend(packages, tests_require)
        notes.append(f"packages: {len(tests_require)} from setup.py tests_require")
    if not extra and not packages and tox_ini is not None and tox_ini.has_option("testenv", "deps"):
        deps = [re.sub(r"^[\w,{}!-]+:\s+", "", d) for d in _lines(tox_ini.get("testenv", "deps"))]  # "py38: x"
        deps = [d for d in deps if not d.startswith(("-", ".")) and "{" not in d and _req_name(d)]
        _extend(packages, deps)
        if deps:
            notes.append(f"packages: {len(deps)} from tox.ini [testenv] deps")
    if given_packages:
        _extend(packages, given_packages)
        notes.append(f"packages: {len(given_packages)} given with --package")
    known.update(n for n in map(_req_name, packages) if n)
    if not installable_by and given_install is None and files.has_dir("src"):
        notes.append("warning: a src/ layout, but no pyproject.toml/setup.py installs it; pass --install")

    # The test runner
    config_origin = None
    options: list[str] = []
    ini_keys: list[str] = []
    required: list[str] = []
    tool = pyproject.get("tool", {}) if isinstance(pyproject.get("tool"), dict) else {}
    pytest_tool = tool.get("pytest", {}) if isinstance(tool.get("pytest"), dict) else {}
    sections: list[tuple[str, dict[str, Any]]] = []
    if files.exists("pytest.ini"):  # pytest reads it first, even without a [pytest] section
        has = pytest_ini is not None and pytest_ini.has_section("pytest")
        sections.append(("pytest.ini", dict(pytest_ini.items("pytest")) if has and pytest_ini else {}))
    if isinstance(pytest_tool.get("ini_options"), dict):
        sections.append(("pyproject.toml [tool.pytest.ini_options]", pytest_tool["ini_options"]))
    elif pytest_tool:
        sections.append(("pyproject.toml [tool.pytest]", pytest_tool))
    for parser, path, section in ((tox_ini, "tox.ini", "pytest"), (setup_cfg, "setup.cfg", "tool:pytest")):
        if parser is not None and parser.has_section(section):
            sections.append((f"{path} [{section}]", dict(parser.items(section))))
    if sections:
        config_origin, config = sections[0]  # pytest reads the first configuration file it finds
        options = _addopts(config.get("addopts", ""))
        ini_keys = list(config)
        value = config.get("required_plugins", [])
        required = [str(v) for v in value] if isinstance(value, list) else str(value).split()
    test_dirs = [d for d in ("tests", "test", "testing") if files.has_dir(d)]
    test_files = [p for p in files.paths if re.search(r"(^|/)(test_[^/]*|[^/]*_test)\.py$", p)]
    if test_cmd:
        command = test_cmd
        notes.append("tests: the given --test-cmd")
    else:
        command = DEFAULT_TEST_COMMAND
        if config_origin:
            notes.append(f"tests: pytest, configured in {config_origin}")
        elif test_dirs:
            notes.append(f"tests: pytest, on the {test_dirs[0]}/ directory (no pytest configuration)")
        elif test_files:
            notes.append(f"tests: pytest, on {len(test_files)} test_*.py files (no pytest configuration)")
        else:
            notes.append("tests: no pytest configuration, tests/ directory or test_*.py files found; trying pytest")

    # Plugins the configuration needs, and pytest itself
    additions = [r for r in required if _req_name(r) and _req_name(r) not in known]
    if additions:
        notes.append(f"packages: {', '.join(additions)}, the required_plugins of {config_origin}")
    for plugin, why in _plugins_for(options, ini_keys).items():
        if plugin not in known and all(_req_name(r) != plugin for r in additions):
            additions.append(plugin)
            notes.append(f"packages: {plugin}, for {why!r} in {config_origin}")
    _extend(packages, additions)
    known.update(n for n in map(_req_name, additions) if n)
    if "pytest" not in known:
        pin = DEFAULT_PYTEST if Version(actual) >= Version("3.8") else "pytest"
        packages.insert(0, pin)
        notes.append(f"packages: {pin}, since nothing else installs pytest")

    if given_install is not None:
        install = list(given_install)
        notes.append("install: the given --install steps (replacing the detected ones)")
    environment = EnvironmentConfig(python=python, packages=packages, install=install)
    return Detection(environment=environment, test_spec=TestSpec(command=command), notes=notes)


# --------------------------------------------------------------------------------------------
# Checking the suite


@dataclass
class SuiteCheck:
    """The verdict on a whole-suite run at the registered commit."""

    passed: int
    failed: int
    errors: int
    skipped: int
    failing: list[str]
    reasons: dict[str, str]
    pass_rate: float | None
    ok: bool
    problem: str | None
    tail: str
    collected: bool

    @property
    def counts(self) -> str:
        return f"{self.passed} passed, {self.failed} failed, {self.errors} errors, {self.skipped} skipped"


PYTEST_EXIT = {1: "some tests failed", 2: "interrupted (collection errors?)", 3: "internal error",
               4: "usage error (an option in addopts whose plugin is missing? a bad --test-cmd?)",
               5: "no tests collected"}


def output_tail(output: str, lines: int = 30, chars: int = 4000) -> str:
    return "\n".join(output.rstrip().splitlines()[-lines:])[-chars:]


def check_suite(run: TestRun, min_pass: float) -> SuiteCheck:
    """Whether the suite collects and mostly passes (≥ ``min_pass`` of the tests that ran, skips
    left out): a repository whose suite does not run makes no tasks, and one whose suite mostly
    fails makes tasks whose PASS_TO_PASS says little."""
    statuses = run.statuses
    passed = sum(s in (TestStatus.PASSED, TestStatus.XFAIL) for s in statuses.values())
    failed = sum(s is TestStatus.FAILED for s in statuses.values())
    errors = sum(s is TestStatus.ERROR for s in statuses.values())
    skipped = sum(s is TestStatus.SKIPPED for s in statuses.values())
    failing = [t for t, s in statuses.items() if s in (TestStatus.FAILED, TestStatus.ERROR)]
    reasons: dict[str, str] = {}
    for line in run.output.splitlines():  # -rA's short summary: "FAILED id - reason"
        m = re.match(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$", line)
        if m and m.group(3):
            reasons.setdefault(m.group(2), m.group(3).strip())
    ran = passed + failed + errors
    rate = passed / ran if ran else None
    problem = None
    if run.timed_out:
        problem = "the test suite timed out" + (" before writing results" if not statuses else "")
    elif not statuses:
        why = PYTEST_EXIT.get(run.exit_code, f"exit code {run.exit_code}") if run.exit_code is not None \
            else "no exit code"
        problem = f"nothing was collected: pytest reported {why}" + (f"; {run.error}" if run.error else "")
    elif not ran:
        problem = f"all {skipped} collected tests were skipped"
    elif rate is not None and rate < min_pass:
        problem = f"only {rate:.0%} of the tests pass (need {min_pass:.0%})"
    return SuiteCheck(passed=passed, failed=failed, errors=errors, skipped=skipped, failing=failing, reasons=reasons,
                      pass_rate=rate, ok=problem is None, problem=problem, tail=output_tail(run.output),
                      collected=bool(statuses))


def validate_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise RepoSetupError(f"invalid name {name!r}: use letters, digits, '.', '_' and '-' (it names a file)")
    return name
