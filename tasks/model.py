"""The task model: a SWE-bench instance plus what SWE-bench keeps outside the row.

A task row carries SWE-bench's fields unchanged (so SWE-bench JSON/JSONL loads and exports as is),
plus the environment to build (``environment``) and how to run the tests (``test_spec``). Unknown
fields are kept, so a round trip loses nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from patchgym.sandboxes import EnvironmentSpec

M = TypeVar("M", bound=BaseModel)

DEFAULT_TEST_COMMAND = "python -m pytest -p no:cacheprovider"


class TaskFileError(ValueError):
    """A task file could not be read; the message names the file, the line and the field."""


class EnvironmentConfig(BaseModel):
    """How to build the environment: SWE-rebench's ``install_config`` in a smaller form."""

    model_config = ConfigDict(extra="forbid")

    python: str = Field(">=3.8", description="PEP 440 constraint or bare version, e.g. '3.11'")
    packages: list[str] = Field(default_factory=list, description="pip requirement strings")
    pre_install: list[str] = Field(default_factory=list, description="shell steps run first")
    install: list[str] = Field(default_factory=list, description="shell steps run in the checkout")

    def to_spec(self) -> EnvironmentSpec:
        return EnvironmentSpec(python=self.python, packages=tuple(self.packages),
                               pre_install=tuple(self.pre_install), install=tuple(self.install))


TestFormat = Literal["pytest", "django", "sympy"]
Selection = Literal["ids", "files"]
# The command each runner's test ids are appended to when a row names the format but no command
# (the ones SWE-bench runs for django/django and sympy/sympy).
DEFAULT_TEST_COMMANDS: dict[str, str] = {
    "pytest": DEFAULT_TEST_COMMAND,
    "django": "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1",
    "sympy": "bin/test -C --verbose",
}


class TestSpec(BaseModel):
    """The command that runs tests (test ids are appended) and the runner it is, which says how
    test ids become arguments and how results are read (see :mod:`patchgym.grading.runners`)."""

    model_config = ConfigDict(extra="forbid")
    __test__ = False  # not a pytest test class

    command: str = DEFAULT_TEST_COMMAND
    format: TestFormat = "pytest"
    timeout: float = Field(900.0, gt=0, description="seconds the test run may take")
    # pytest only. SWE-bench's harness runs whole test files and its FAIL_TO_PASS/PASS_TO_PASS
    # lists come from such runs: a test that passes only after an earlier test of its file (a
    # shared fixture's state) passes there and fails when run alone. "files" runs the files that
    # hold the ids (grading still reads only the ids); "ids" runs just the ids (faster).
    selection: Selection = Field(
        "ids", description="pytest: run the test ids, or the whole files that hold them (as SWE-bench)")
    # Bytecode, __pycache__ and native extension modules run without their source being graded, so
    # an agent's patch may not add or change them (grading.patches.is_compiled) unless the
    # task needs it to.
    allow_compiled_files: bool = Field(
        False, description="let the agent's patch add or change *.pyc, *.pyo, __pycache__/, *.so, *.pyd")

    @model_validator(mode="before")
    @classmethod
    def _format_default_command(cls, data: Any) -> Any:
        if isinstance(data, dict) and "command" not in data and data.get("format") in DEFAULT_TEST_COMMANDS:
            data = {**data, "command": DEFAULT_TEST_COMMANDS[data["format"]]}
        return data


class Task(BaseModel):
    """One task instance (SWE-bench's fields, plus environment and test spec)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1)
    base_commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    problem_statement: str
    patch: str | None = None
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    version: str = ""
    created_at: str = ""
    environment_setup_commit: str | None = None
    hints_text: str = ""
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    test_spec: TestSpec = Field(default_factory=TestSpec)
    repo_path: str | None = Field(None, description="git path/URL of the repository; relative to the task file")

    _source_file: Path | None = PrivateAttr(None)
    # The row as it was read (key order, test lists as JSON strings or lists, numbers kept as
    # numbers), so an export can give back what was imported (see :mod:`patchgym.tasks.swebench_io`).
    _raw_row: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_row(cls, data: Any, handler: Any) -> Any:
        task = handler(data)
        if isinstance(data, dict) and task is not data:
            task._raw_row = dict(data)
        return task

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode_test_list(cls, value: Any) -> Any:
        # Published SWE-bench datasets store these as JSON-encoded strings.
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list of test ids: {exc}") from None
        return value

    @field_validator("FAIL_TO_PASS")
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("a task needs at least one FAIL_TO_PASS test")
        return value

    @field_validator("version", "created_at", "hints_text", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        return "" if value is None else str(value) if isinstance(value, (int, float)) else value

    @property
    def source_file(self) -> Path | None:
        return self._source_file

    @property
    def raw_row(self) -> dict[str, Any]:
        """The row this task was validated from (empty when it was built otherwise)."""
        return self._raw_row

    @property
    def repo_name(self) -> str:
        return self.repo.rsplit("/", 1)[-1]

    def public_view(self) -> dict[str, Any]:
        """What an agent may see: no gold patch, no hidden tests, no test ids."""
        return {
            "instance_id": self.instance_id, "repo": self.repo, "base_commit": self.base_commit,
            "problem_statement": self.problem_statement, "hints_text": self.hints_text,
            "version": self.version, "created_at": self.created_at,
        }

    def to_row(self, *, tests_as_json_strings: bool = False) -> dict[str, Any]:
        row = self.model_dump(mode="json", exclude_none=False)
        if row.get("repo_path") is None:
            row.pop("repo_path", None)
        if tests_as_json_strings:
            row["FAIL_TO_PASS"] = json.dumps(self.FAIL_TO_PASS)
            row["PASS_TO_PASS"] = json.dumps(self.PASS_TO_PASS)
        return row


def _format_error(path: Path, where: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(x) for x in err["loc"]) or "<row>"
        parts.append(f"{path}:{where}: field {field!r}: {err['msg']}")
    return "\n".join(parts)


def _rows_jsonl(path: Path, text: str) -> Iterator[tuple[str, Any]]:
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"line {lineno}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskFileError(f"{path}:line {lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None


def _rows_json(path: Path, text: str) -> Iterator[tuple[str, Any]]:
    """Entries of a JSON array, each with the line it starts on."""
    decoder = json.JSONDecoder()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskFileError(f"{path}:line {exc.lineno}: invalid JSON: {exc.msg}") from None
    if isinstance(data, dict):
        data = [data]
        starts = [1]
    elif isinstance(data, list):
        starts = []
        pos = text.index("[") + 1
        for _ in data:
            while text[pos] in " \t\r\n,":
                pos += 1
            starts.append(text.count("\n", 0, pos) + 1)
            _, pos = decoder.raw_decode(text, pos)
    else:
        raise TaskFileError(f"{path}: expected a JSON array of task objects")
    for lineno, row in zip(starts, data, strict=False):
        yield f"line {lineno}", row


def read_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for each JSON value of a ``.jsonl`` file or a ``.json`` array."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskFileError(f"{path}: cannot read file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TaskFileError(f"{path}: not UTF-8 text: {exc}") from None
    return _rows_json(path, text) if path.suffix == ".json" else _rows_jsonl(path, text)


def read_models(path: Path, model: type[M]) -> Iterator[tuple[str, M]]:
    """Validate each row of a JSON/JSONL file as ``model`` (which has an ``instance_id``).

    Errors name the file, the line and the field; an ``instance_id`` seen twice is an error.
    """
    seen: dict[str, str] = {}
    for where, row in read_rows(path):
        if not isinstance(row, dict):
            raise TaskFileError(f"{path}:{where}: expected a JSON object, got {type(row).__name__}")
        try:
            item = model.model_validate(row)
        except ValidationError as exc:
            raise TaskFileError(_format_error(path, where, exc)) from None
        key = item.instance_id
        if key in seen:
            raise TaskFileError(f"{path}:{where}: field 'instance_id': duplicate {key!r} (first at {seen[key]})")
        seen[key] = where
        yield where, item


def load_tasks(path: str | Path) -> list[Task]:
    """Load tasks from a ``.jsonl`` file (one per line) or a ``.json`` file (an array)."""
    path = Path(path)
    tasks: list[Task] = []
    for _, task in read_models(path, Task):
        task._source_file = path.resolve()
        tasks.append(task)
    return tasks


def save_tasks(tasks: Iterable[Task], path: str | Path, *, tests_as_json_strings: bool = False) -> None:
    """Write tasks as JSONL (``.jsonl``) or a JSON array (``.json``)."""
    path = Path(path)
    rows = [t.to_row(tests_as_json_strings=tests_as_json_strings) for t in tasks]
    if path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    """A filesystem-safe form of an instance id (used for per-instance output folders)."""
    return _SAFE_NAME.sub("_", text).strip("._") or "_"
