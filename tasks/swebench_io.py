"""SWE-bench rows in and out: import a SWE-bench JSON/JSONL file as patchgym tasks, export tasks as
SWE-bench rows.

Import finds each row's repository in a directory of local clones, mirrors or bundles, and derives
what SWE-bench keeps outside the row — the environment and the test command — from, in order: the
row's own patchgym ``environment``/``test_spec``; its ``install_config`` (SWE-rebench's field); the
``--specs`` file (``{"owner/name": {"<version>": {...}}}``, SWE-bench's MAP_REPO_VERSION_TO_SPECS;
a ``"*"`` version applies to every version); the built-in specs of SWE-bench's repositories
(``tasks/specs/swebench.json``, SWE-bench's constants as JSON, made by :mod:`patchgym.tasks.builtin_specs`, read
and applied as ``--specs`` is); defaults, with a warning.

Round trip: a task keeps the row it was read from (:attr:`Task.raw_row`), and rows are written
from it — its key order, its fields unknown to patchgym verbatim, ``FAIL_TO_PASS``/``PASS_TO_PASS``
and ``version``/``created_at``/``hints_text`` in the encoding they came in as long as their value
is unchanged. An imported file holds the original row plus patchgym's three fields (``environment``,
``test_spec``, ``repo_path``, appended); ``export --swebench-only`` drops those three again, so
import then export gives back the input. A source row's own field of one of those names that is
not patchgym's (SWE-rebench's ``environment`` is a conda listing) is kept as ``original_<name>``
in its place and restored by ``--swebench-only``.

``repo_path`` is written relative to the task file when the repository lies under the task file's
directory (the two move together), absolute otherwise.

One file (about 650 lines): import and export are the two halves of one round trip, each one's
rules the inverse of the other's (fields kept verbatim, encodings remembered, ``original_<name>``
restored); apart, a change to one half would not show what it breaks in the other.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import shlex
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from patchgym.tasks.builtin_specs import BUILTIN_SPECS
from patchgym.tasks.catalog import repo_source
from patchgym.tasks.model import (
    DEFAULT_TEST_COMMANDS,
    EnvironmentConfig,
    Selection,
    Task,
    TaskFileError,
    TestFormat,
    TestSpec,
    _format_error,
)
from patchgym.tasks.swebench_constants import (
    SPECS_NAME,
    ConstantsError,
    HarnessConstants,
    clean_requirements,
    is_constants_json,
    read_constants,
    requirements_at,
)

log = logging.getLogger(__name__)

# SWE-bench's fields, in the order of the published datasets.
SWEBENCH_FIELDS = ("repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement", "hints_text",
                   "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS", "environment_setup_commit")
PATCHGYM_FIELDS = ("environment", "test_spec", "repo_path")
SHADOW_PREFIX = "original_"
TEST_LIST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")
STRINGIFIED_FIELDS = ("version", "created_at", "hints_text")
DEFAULT_INSTALL = "python -m pip install -e ."
# Where SWE-bench looks for a repository's requirements when a spec says "requirements.txt" and
# names no reqs_path (the first that exists is installed).
REQS_CANDIDATES = ("requirements.txt", "requirements-dev.txt", "requirements/dev.txt", "requirements/test.txt",
                   "requirements/testing.txt", "test-requirements.txt", "requirements_test.txt")

# SWE-bench runs a spec's ``pre_install`` steps in the repository, just before ``install``. Steps that
# change the system (packages, locales, /etc) belong to the environment; the others edit the checkout
# (sphinx's specs pin dependencies by editing setup.py and tox.ini) and so must run where it is.
_SYSTEM_STEP = re.compile(r"\b(?:apt-get|apt|dpkg|locale-gen|update-locale)\b|>\s*/etc/")
REQS_HEREDOC = "PATCHGYM_REQUIREMENTS_EOF"

TestsEncoding = Literal["json", "list", "source"]
RowFormat = Literal["jsonl", "json"]


class RepoNotFoundError(LookupError):
    """No clone, mirror or bundle of a repository in the repositories directory."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "repository not found"


@dataclass
class DroppedRow:
    where: str
    instance_id: str | None
    reason: str


@dataclass
class ImportResult:
    """What an import made: the tasks, the rows it could not use and why, and what it had to guess."""

    tasks: list[Task] = field(default_factory=list)
    dropped: list[DroppedRow] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # instance_id → where its environment came from: row, install_config, specs, builtin or defaults
    environment_source: dict[str, str] = field(default_factory=dict)

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)


# --- repositories ---------------------------------------------------------------------------------

def repo_candidates(repos_dir: Path, repo: str) -> list[Path]:
    """Where ``owner/name`` may be in ``repos_dir``, in the order tried."""
    owner, _, name = repo.rpartition("/")
    stems = [repo.replace("/", "__"), name, *([repo] if owner else [])]
    return list(dict.fromkeys(repos_dir / f"{stem}{suffix}" for stem in stems for suffix in ("", ".git", ".bundle")))


def _is_git_source(path: Path) -> bool:
    if path.is_file():
        return True  # a bundle
    return path.is_dir() and ((path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir()))


def find_repo(repos_dir: Path, repo: str) -> Path:
    """The clone, bare mirror or bundle of ``repo`` in ``repos_dir``."""
    tried = repo_candidates(repos_dir, repo)
    for path in tried:
        if _is_git_source(path):
            return path.resolve()
    not_git = [str(p) for p in tried if p.exists()]
    extra = f" ({', '.join(not_git)} exist but are not git repositories)" if not_git else ""
    raise RepoNotFoundError(f"cannot find repository {repo!r} in {repos_dir}; tried "
                            f"{', '.join(p.name for p in tried)}{extra}")


def is_url(text: str) -> bool:
    """Whether ``text`` names a remote git repository rather than a local path."""
    return "://" in text or text.startswith("git@")


def clone_url(template: str, repo: str) -> str:
    """The clone URL of ``owner/name`` from ``template``: its ``{repo}``, ``{owner}`` and ``{name}``
    filled in (``file:///srv/git/{owner}__{name}.git``), or, with none of them, ``owner/name``
    appended as a path (``https://github.com`` → ``https://github.com/owner/name``). Clones are
    cached as mirrors (:mod:`patchgym.sandboxes.repos`) and fetched again only when a commit is missing."""
    owner, _, name = repo.rpartition("/")
    if any(f"{{{key}}}" in template for key in ("repo", "owner", "name")):
        return template.replace("{repo}", repo).replace("{owner}", owner).replace("{name}", name)
    return f"{template.rstrip('/')}/{repo}"


def portable_path(path: Path, base_dir: Path) -> str:
    """``path`` relative to ``base_dir`` when it lies under it, else absolute."""
    path, base_dir = path.resolve(), base_dir.resolve()
    try:
        return path.relative_to(base_dir).as_posix()
    except ValueError:
        return str(path)


def missing_commits(tasks: Iterable[Task]) -> dict[str, str]:
    """instance_id → why its ``base_commit`` is not in its repository (checked in clones and
    mirrors with one ``git cat-file`` per repository; bundles are not checked)."""
    by_repo: dict[str, list[Task]] = {}
    for task in tasks:
        try:
            source = repo_source(task)
        except TaskFileError as exc:
            by_repo.setdefault("", []).append(task)
            log.debug("%s", exc)
            continue
        if "://" not in source and Path(source).is_dir():
            by_repo.setdefault(source, []).append(task)
    problems: dict[str, str] = {}
    for source, group in by_repo.items():
        if not source:
            problems.update({t.instance_id: "repository not found" for t in group})
            continue
        query = "".join(f"{t.base_commit}^{{commit}}\n" for t in group)
        proc = subprocess.run(["git", "cat-file", "--batch-check"], cwd=source, input=query, capture_output=True,
                              text=True, timeout=600)
        lines = proc.stdout.splitlines() if proc.returncode == 0 else []
        for n, task in enumerate(group):
            if n >= len(lines) or lines[n].endswith(" missing"):
                problems[task.instance_id] = f"base_commit {task.base_commit} is not in {source}"
    return problems


# --- environments ---------------------------------------------------------------------------------

def load_specs(path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """A specs file: ``{"owner/name": {"<version>": {install_config}}}`` as JSON (or YAML when
    PyYAML is installed)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskFileError(f"{path}: cannot read specs file: {exc.strerror or exc}") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise TaskFileError(f"{path}: YAML specs need PyYAML (pip install pyyaml), or write JSON") from None
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except (json.JSONDecodeError, ValueError) as exc:
        raise TaskFileError(f"{path}: invalid specs file: {exc}") from None
    if is_constants_json(data):
        data = data[SPECS_NAME]
    if not isinstance(data, dict):
        raise TaskFileError(f"{path}: expected an object of repositories, each an object of versions")
    data = {repo: versions for repo, versions in data.items() if not repo.startswith("_")}  # "_source": notes
    for repo, versions in data.items():
        if not isinstance(versions, dict) or not all(isinstance(v, dict) for v in versions.values()):
            raise TaskFileError(f"{path}: {repo!r}: expected an object of versions, each an install config object")
    return {repo: {str(v): cfg for v, cfg in versions.items()} for repo, versions in data.items()}


def load_spec_tables(path: Path) -> HarnessConstants:
    """``--specs``: SWE-bench's harness constants (the ``swebench/harness/constants`` directory, a
    Python file of it, or JSON with its names; :mod:`patchgym.tasks.swebench_constants`) or a spec map
    alone (JSON/YAML, :func:`load_specs`).

    SWE-bench's harness reads a spec's requirement file from ``MAP_REPO_TO_REQS_PATHS`` and rewrites
    it with ``REPLACE_REQ_PACKAGES`` whatever the spec, so a file that does not hold those tables (a
    spec map alone, as many forks publish it) gets SWE-bench's own (:func:`builtin_constants`): else
    sqlfluff's requirements would ask for ``types-pkg_resources``, which PyPI no longer has. A file
    that does hold them overrides them."""
    try:
        if path.is_dir() or path.suffix == ".py":
            return _with_harness_tables(read_constants(path), path)
        if path.suffix == ".json" and is_constants_json(json.loads(path.read_text(encoding="utf-8"))):
            return _with_harness_tables(read_constants(path), path)
    except ConstantsError as exc:
        raise TaskFileError(str(exc)) from None
    except (OSError, ValueError):
        pass  # load_specs says what is wrong with it
    return _with_harness_tables(HarnessConstants(specs=load_specs(path)), path)


def _with_harness_tables(tables: HarnessConstants, path: Path) -> HarnessConstants:
    """``tables`` with SWE-bench's requirement paths for the repositories it names none for (its
    ``REPLACE_REQ_PACKAGES`` is already the harness's unless the file set its own)."""
    if path == BUILTIN_SPECS:
        return tables
    tables.reqs_paths = {**builtin_constants().reqs_paths, **tables.reqs_paths}
    return tables


def _git_reader(repo_path: str, commit: str) -> Callable[[str], str | None]:
    """Reads a file at ``commit`` of a local repository (a checkout or a mirror); None when absent."""
    def read(path: str) -> str | None:
        proc = subprocess.run(["git", "-C", repo_path, "show", f"{commit}:{posixpath.normpath(path)}"],
                              capture_output=True, timeout=60, check=False)
        return proc.stdout.decode("utf-8", errors="replace") if proc.returncode == 0 else None
    return read


def _reqs_paths(repo: str, config: Mapping[str, Any], constants: HarnessConstants | None) -> list[str] | None:
    """``MAP_REPO_TO_REQS_PATHS[repo]`` when the spec installs SWE-bench's requirement file and
    names no ``reqs_path`` of its own; else None."""
    declared = config.get("packages")
    if (constants is None or not isinstance(declared, str) or declared.strip() != "requirements.txt"
            or config.get("reqs_path") or repo not in constants.reqs_paths):
        return None
    return constants.reqs_paths[repo]


def _read_requirements(row: Mapping[str, Any], repo: str, repo_path: str | None, config: Mapping[str, Any],
                       constants: HarnessConstants | None, result: ImportResult) -> tuple[str, str] | None:
    """A spec's requirement file as SWE-bench's harness reads it: the first of
    ``MAP_REPO_TO_REQS_PATHS[repo]`` at the row's ``environment_setup_commit`` (else its base
    commit), with its ``-r`` files, and ``REPLACE_REQ_PACKAGES`` applied. None when the spec
    needs none, names its own ``reqs_path``, or the file cannot be read here (then it is
    installed from the checkout at build time: the first of those paths there)."""
    paths = _reqs_paths(repo, config, constants)
    if constants is None or paths is None:
        return None
    commit = row.get("environment_setup_commit") or row.get("base_commit")
    found = None
    if repo_path and not is_url(repo_path) and isinstance(commit, str) and commit:
        found = requirements_at(_git_reader(repo_path, commit), paths)
    if found is None:
        result.warn(f"{repo}: none of {', '.join(paths)} could be read at {str(commit)[:12]} here; "
                    f"installed from the checkout at build time, without SWE-bench's package rewrites")
        return None
    return found[0], clean_requirements(found[1], constants.replace_req_packages)


@cache
def builtin_constants() -> HarnessConstants:
    """SWE-bench's constants patchgym carries for every Python repository SWE-bench lists, with
    patchgym's changes (:mod:`patchgym.tasks.builtin_specs`), read as ``--specs`` reads them."""
    return load_spec_tables(BUILTIN_SPECS)


def builtin_specs() -> dict[str, dict[str, dict[str, Any]]]:
    """The built-in spec map: repository → version → spec."""
    return builtin_constants().specs


def lookup_spec(specs: Mapping[str, Mapping[str, dict[str, Any]]] | None, repo: str, version: Any) -> dict | None:
    if not specs or repo not in specs:
        return None
    versions = specs[repo]
    key = "" if version is None else str(version)
    return versions.get(key) or versions.get("*")


def _as_list(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if v is not None and str(v).strip()]
    return [str(value)]


def _shell_words(text: str) -> list[str]:
    """``text`` split as a shell would (SWE-bench puts ``packages`` into a shell command); plain
    whitespace splitting where it is not valid shell."""
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def detect_format(config: Mapping[str, Any], command: str, repo: str) -> TestFormat:
    """The runner: from the config's ``log_parser``, else the command, else the repository."""
    parser = str(config.get("log_parser") or "").lower()
    for fmt in ("django", "sympy", "pytest"):
        if fmt in parser:
            return fmt
    if "runtests.py" in command:
        return "django"
    if "bin/test" in command:
        return "sympy"
    return {"django/django": "django", "sympy/sympy": "sympy"}.get(repo, "pytest")


def _requirements_step(path: str) -> str:
    """Install a spec's requirements file where the checkout has it. SWE-bench's specs name them per
    version, and a version's early commits may predate the file (sympy 1.13's requirements-dev.txt is
    not there at sympy-24909's base): that is said in the build log, and validation judges the rest."""
    quoted = shlex.quote(path)
    return (f"if [ -f {quoted} ]; then python -m pip install -r {quoted}; "
            f"else echo {shlex.quote(f'{path}: not in this checkout, not installed')} >&2; fi")


def _requirements_text_step(path: str, text: str) -> str:
    """Install requirements read when the task was made (SWE-bench's harness writes them into the
    build the same way, as a here-document)."""
    body = text if text.endswith("\n") else text + "\n"
    return (f"# {path} at the environment's commit, as SWE-bench's harness installs it\n"
            f"python -m pip install -r /dev/stdin <<'{REQS_HEREDOC}'\n{body}{REQS_HEREDOC}")


def environment_from_config(config: Mapping[str, Any], repo: str, *, requirements: tuple[str, str] | None = None,
                            reqs_paths: list[str] | None = None) -> tuple[EnvironmentConfig, TestSpec, list[str]]:
    """An ``install_config`` (SWE-rebench) or a SWE-bench spec as patchgym's environment and test
    spec, with warnings for what could not be carried over. ``requirements`` (path, text) are the
    spec's requirement file as read at the row's environment commit (:func:`_read_requirements`);
    without them, the first of ``reqs_paths`` (SWE-bench's ``MAP_REPO_TO_REQS_PATHS[repo]``, else
    :data:`REQS_CANDIDATES`) in the checkout is installed at build time. A ``packages`` string is
    split as the shell SWE-bench gives it to does (scikit-learn's quotes its specifiers)."""
    warnings: list[str] = []
    packages: list[str] = []
    install: list[str] = []
    declared = config.get("packages")
    if isinstance(declared, str) and declared.strip() == "requirements.txt" and requirements is not None:
        install.append(_requirements_text_step(*requirements))
    elif isinstance(declared, str) and declared.strip() == "requirements.txt":
        reqs = _as_list(config.get("reqs_path"))
        candidates = reqs_paths or list(REQS_CANDIDATES)
        install += [_requirements_step(r) for r in reqs] or [
            f"for f in {' '.join(shlex.quote(c) for c in candidates)}; do if [ -f \"$f\" ]; then "
            f"exec python -m pip install -r \"$f\"; fi; done; "
            f"echo {shlex.quote('no requirements file: tried ' + ', '.join(candidates))} >&2; exit 1"]
    elif isinstance(declared, str) and declared.strip() in ("environment.yml", "environment.yaml"):
        warnings.append("packages from environment.yml (conda) are not installed; list them in pip_packages")
    elif isinstance(declared, str):
        packages += _shell_words(declared)
    else:
        packages += _as_list(declared)
    pip_packages = config.get("pip_packages")
    packages += _shell_words(pip_packages) if isinstance(pip_packages, str) else _as_list(pip_packages)
    pre_install = [s for s in _as_list(config.get("pre_install")) if _SYSTEM_STEP.search(s)]
    install += [s for s in _as_list(config.get("pre_install")) if not _SYSTEM_STEP.search(s)]
    install += _as_list(config.get("install"))
    python = str(config.get("python") or EnvironmentConfig().python)
    environment = EnvironmentConfig(python=python, packages=list(dict.fromkeys(packages)), pre_install=pre_install,
                                    install=install)

    commands = _as_list(config.get("test_cmd"))
    command = " && ".join(commands)
    fmt = detect_format(config, command, repo)
    command = command or DEFAULT_TEST_COMMANDS[fmt]
    env_vars = {str(k): str(v) for k, v in (config.get("env_vars_test") or {}).items()}
    for step in _as_list(config.get("eval_commands")):
        words = shlex.split(step) if step.strip().startswith("export ") else []
        if len(words) >= 2 and all("=" in w for w in words[1:]):
            env_vars.update(w.split("=", 1) for w in words[1:])
        else:
            warnings.append(f"eval_commands step not run before the tests: {step!r}")
    if env_vars:
        command = " ".join(f"{k}={shlex.quote(v)}" for k, v in env_vars.items()) + " " + command
    spec: dict[str, Any] = {"command": command, "format": fmt, "selection": "files"}  # as SWE-bench ran them
    timeout = config.get("timeout")
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        spec["timeout"] = float(timeout)
    return environment, TestSpec(**spec), warnings


def default_environment(repo: str) -> tuple[EnvironmentConfig, TestSpec]:
    fmt = detect_format({}, "", repo)
    packages = ["pytest"] if fmt == "pytest" else []
    return EnvironmentConfig(packages=packages, install=[DEFAULT_INSTALL]), TestSpec(format=fmt, selection="files")


def _patchgym_value(key: str, value: Any) -> bool:
    """Whether a source row's ``environment``/``test_spec`` is patchgym's own (kept as it is)."""
    model = {"environment": EnvironmentConfig, "test_spec": TestSpec}.get(key)
    if model is None or not isinstance(value, dict):
        return False
    try:
        model.model_validate(value)
    except ValidationError:
        return False
    return True


def _install_config(row: Mapping[str, Any]) -> dict[str, Any] | None:
    config = row.get("install_config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError:
            return None
    return config if isinstance(config, dict) and config else None


# --- import ---------------------------------------------------------------------------------------

def import_rows(rows: Iterable[tuple[str, Any]], *, repos: str | Path, output: Path,
                specs: Mapping[str, Mapping[str, dict[str, Any]]] | None = None, origin: str = "",
                selection: Selection = "files", constants: HarnessConstants | None = None) -> ImportResult:
    """Make tasks of SWE-bench rows (``(where, row)`` pairs) to be written to ``output``; each
    row's repository is found in the directory ``repos`` or is ``repos`` as a clone URL
    (:func:`clone_url`). A test spec made here (not the row's own) runs pytest with ``selection``:
    "files" as SWE-bench ran its lists, or "ids", faster where test files are large (see
    ``TestSpec.selection``)."""
    result = ImportResult()
    seen: dict[str, str] = {}
    output_dir = output.resolve().parent
    label = Path(origin) if origin else Path("<rows>")
    for where, row in rows:
        if not isinstance(row, dict):
            result.dropped.append(DroppedRow(where, None, f"expected a JSON object, got {type(row).__name__}"))
            continue
        instance_id = row.get("instance_id") if isinstance(row.get("instance_id"), str) else None
        repo = row.get("repo")
        if not isinstance(repo, str) or not repo:
            result.dropped.append(DroppedRow(where, instance_id, "field 'repo': missing"))
            continue
        if instance_id in seen:
            reason = f"duplicate instance_id (first at {seen[instance_id]})"
            result.dropped.append(DroppedRow(where, instance_id, reason))
            continue
        if is_url(str(repos)):
            repo_path = clone_url(str(repos), repo)
        else:
            try:
                repo_path = portable_path(find_repo(Path(repos), repo), output_dir)
            except RepoNotFoundError as exc:
                result.dropped.append(DroppedRow(where, instance_id, str(exc)))
                continue

        augmented: dict[str, Any] = {}
        for key, value in row.items():
            if key == "repo_path":
                continue  # relative to the source file; replaced by the repository found in repos_dir
            if key in PATCHGYM_FIELDS and not _patchgym_value(key, value):
                augmented[SHADOW_PREFIX + key] = value
            else:
                augmented[key] = value
        missing = [k for k in ("environment", "test_spec") if k not in augmented]
        if missing:
            local = None if is_url(repo_path) else str((output_dir / repo_path).resolve())
            environment, test_spec, source = _environment_for(row, repo, specs, result, constants=constants,
                                                              repo_path=local)
            if "environment" in missing:
                augmented["environment"] = environment.model_dump()
            if "test_spec" in missing:
                augmented["test_spec"] = test_spec.model_copy(update={"selection": selection}).model_dump()
        else:
            source = "row"
        augmented["repo_path"] = repo_path
        try:
            task = Task.model_validate(augmented)
        except ValidationError as exc:
            reason = _format_error(label, where, exc).replace(f"{label}:{where}: ", "")
            result.dropped.append(DroppedRow(where, instance_id, reason.replace("\n", "; ")))
            continue
        _drop_non_tests(task, result)
        task._source_file = output.resolve()
        seen[task.instance_id] = where
        result.tasks.append(task)
        result.environment_source[task.instance_id] = source
    return result


def is_pytest_id(test_id: str) -> bool:
    """Whether ``test_id`` can name a pytest test: a node id (``path::name``) or a test file."""
    return "::" in test_id or test_id.endswith(".py")


def _drop_non_tests(task: Task, result: ImportResult) -> None:
    """Drop what a pytest task's test lists hold that names no test: SWE-bench's log parser read
    progress output as ids (pytest-dev__pytest-5227's PASS_TO_PASS has "[100%]" and "["), which
    SWE-bench counts as passing and which pytest, given them, refuses (exit 4: nothing runs)."""
    if task.test_spec.format != "pytest":
        return
    for name in TEST_LIST_FIELDS:
        ids = getattr(task, name)
        kept = [t for t in ids if is_pytest_id(t)]
        if len(kept) != len(ids):
            setattr(task, name, kept)
            dropped = ", ".join(repr(t) for t in ids if not is_pytest_id(t))
            result.warn(f"{task.instance_id}: {name} entries that name no test dropped: {dropped}")


def _environment_for(row: Mapping[str, Any], repo: str, specs: Mapping[str, Mapping[str, dict[str, Any]]] | None,
                     result: ImportResult, *, constants: HarnessConstants | None = None,
                     repo_path: str | None = None) -> tuple[EnvironmentConfig, TestSpec, str]:
    version = row.get("version")
    config, source = _install_config(row), "install_config"
    if config is None:
        config, source = lookup_spec(specs, repo, version), "specs"
    if config is None:
        config, source = lookup_spec(builtin_specs(), repo, version), "builtin"
    if config is None:
        environment, test_spec = default_environment(repo)
        result.warn(f"{repo} {version}: no install_config and no spec; using defaults (python "
                    f"{environment.python}, packages {environment.packages}, install {environment.install}, "
                    f"{test_spec.format} runner)")
        return environment, test_spec, "defaults"
    tables = {"specs": constants, "builtin": builtin_constants()}.get(source)
    requirements = _read_requirements(row, repo, repo_path, config, tables, result)
    environment, test_spec, warnings = environment_from_config(config, repo, requirements=requirements,
                                                               reqs_paths=_reqs_paths(repo, config, tables))
    for message in warnings:
        result.warn(f"{repo} {version}: {message}")
    return environment, test_spec, source


def import_swebench(source: str | Path, *, repos: str | Path, output: Path,
                    specs_path: Path | None = None, selection: Selection = "files") -> ImportResult:
    """Read SWE-bench rows (a JSON/JSONL/parquet file or a Hugging Face dataset,
    :func:`patchgym.tasks.row_sources.read_source_rows`) and make them tasks (see :func:`import_rows`)."""
    from patchgym.tasks.row_sources import read_source_rows

    if not is_url(str(repos)) and not Path(repos).is_dir():
        raise TaskFileError(f"{repos}: not a directory of repositories, nor a clone URL")
    constants = load_spec_tables(specs_path) if specs_path else None
    rows = read_source_rows(source)
    return import_rows(rows, repos=repos, output=output, specs=constants.specs if constants else None,
                       origin=str(source), selection=selection, constants=constants)


# --- export ---------------------------------------------------------------------------------------

def _stringified(value: Any) -> Any:
    return "" if value is None else str(value) if isinstance(value, (int, float)) else value


def _decodes_to(text: str, tests: list[str]) -> bool:
    try:
        return json.loads(text) == tests
    except json.JSONDecodeError:
        return False


def _encode_tests(tests: list[str], raw: Any, encoding: TestsEncoding) -> Any:
    if encoding == "list" or (encoding == "source" and isinstance(raw, list) and raw == tests):
        return tests
    if isinstance(raw, str) and _decodes_to(raw, tests):
        return raw  # verbatim, spacing and escapes as they came
    return json.dumps(tests)


def _exported_repo_path(task: Task, output_dir: Path | None) -> str | None:
    try:
        source = repo_source(task)
    except TaskFileError:
        return task.repo_path
    if "://" in source or source.startswith("git@"):
        return source
    return portable_path(Path(source), output_dir) if output_dir else source


def export_row(task: Task, *, swebench_only: bool = False, tests_encoding: TestsEncoding = "json",
               output_dir: Path | None = None) -> dict[str, Any]:
    """The SWE-bench row of ``task``: SWE-bench's fields and the task's other fields in the order
    and encoding it was read with, then patchgym's ``environment``, ``test_spec`` and ``repo_path``
    (relocated for a file in ``output_dir``) unless ``swebench_only``."""
    current = task.to_row()
    raw = task.raw_row
    order = [*raw, *SWEBENCH_FIELDS, *(k for k in current if k not in PATCHGYM_FIELDS), *PATCHGYM_FIELDS]
    row: dict[str, Any] = {}
    for key in dict.fromkeys(order):
        if key in PATCHGYM_FIELDS:
            if swebench_only:
                continue
            value = _exported_repo_path(task, output_dir) if key == "repo_path" else current.get(key)
            if value is not None:
                row[key] = value
        elif key.startswith(SHADOW_PREFIX) and key[len(SHADOW_PREFIX):] in PATCHGYM_FIELDS and key in current:
            row[key[len(SHADOW_PREFIX):] if swebench_only else key] = current[key]
        elif key in TEST_LIST_FIELDS:
            row[key] = _encode_tests(current[key], raw.get(key), tests_encoding)
        elif key in STRINGIFIED_FIELDS and key in raw and _stringified(raw[key]) == current[key]:
            row[key] = raw[key]
        elif key in current:
            row[key] = current[key]
    return row


def export_rows(tasks: Iterable[Task], **options: Any) -> list[dict[str, Any]]:
    return [export_row(task, **options) for task in tasks]


def row_format(path: Path, fmt: str | None = None) -> RowFormat:
    fmt = fmt or ("json" if path.suffix == ".json" else "jsonl")
    if fmt == "json":
        return "json"
    if fmt == "jsonl":
        return "jsonl"
    raise ValueError(f"unknown format {fmt!r}; use jsonl or json")


def write_rows(rows: list[dict[str, Any]], path: Path, fmt: str | None = None) -> None:
    """Write rows as JSONL or a JSON array (by ``fmt``, else by the file's suffix), atomically."""
    fmt = row_format(path, fmt)
    if fmt == "json":
        text = json.dumps(rows, indent=2, ensure_ascii=False) + "\n"
    else:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
