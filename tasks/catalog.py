"""Task sets: the bundled catalog or a user's task file, and where each task's repository is."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import patchgym.tasks as bundled
from patchgym.tasks.model import Task, TaskFileError, load_tasks


class UnknownTaskError(KeyError):
    """An instance id that is not in the task set."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown task"


class TaskSet:
    """An ordered collection of tasks, looked up by instance id."""

    def __init__(self, tasks: Iterable[Task], origin: str = "") -> None:
        self._tasks: dict[str, Task] = {}
        self.origin = origin
        for task in tasks:
            if task.instance_id in self._tasks:
                raise TaskFileError(f"duplicate instance_id {task.instance_id!r} in {origin or 'task set'}")
            self._tasks[task.instance_id] = task

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._tasks

    @property
    def ids(self) -> list[str]:
        return list(self._tasks)

    def get(self, instance_id: str) -> Task:
        try:
            return self._tasks[instance_id]
        except KeyError:
            close = [i for i in self._tasks if instance_id.lower() in i.lower()][:5]
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            where = self.origin or "task set"
            raise UnknownTaskError(f"unknown instance id {instance_id!r} in {where}{hint}") from None

    def select(self, instance_ids: Iterable[str] | None) -> TaskSet:
        """The subset with these ids (all when None); unknown ids raise :class:`UnknownTaskError`."""
        if not instance_ids:
            return self
        return TaskSet([self.get(i) for i in dict.fromkeys(instance_ids)], self.origin)


def load_task_set(path: str | Path | None = None) -> TaskSet:
    """Load the bundled catalog (``path=None``), a task file, or every task file in a directory."""
    if path is None:
        files = sorted(bundled.INSTANCES_DIR.glob("*.jsonl"))
        origin = "bundled catalog"
    else:
        p = Path(path).expanduser()
        if p.is_dir():
            files = sorted([*p.glob("*.jsonl"), *p.glob("*.json")])
            if not files:
                raise TaskFileError(f"{p}: no .jsonl or .json task files in this directory")
        elif p.exists():
            files = [p]
        else:
            raise TaskFileError(f"{p}: no such task file or directory")
        origin = str(p)
    return TaskSet((t for f in files for t in load_tasks(f)), origin)


def repo_source(task: Task) -> str:
    """Where git can fetch ``task.repo`` from.

    In order: the row's ``repo_path`` (relative to its task file); a bundle or checkout named after
    the repository in ``repos/`` beside the task file or its parent; the same in each directory of
    ``$PATCHGYM_REPOS``; the bundled repositories.
    """
    base = task.source_file.parent if task.source_file else Path.cwd()
    if task.repo_path:
        if "://" in task.repo_path or task.repo_path.startswith("git@"):
            return task.repo_path
        candidate = (base / task.repo_path).resolve()
        if not candidate.exists():
            raise TaskFileError(f"{task.instance_id}: repo_path {task.repo_path!r} does not exist ({candidate})")
        return str(candidate)
    dirs = [base / "repos", base.parent / "repos"]
    dirs += [Path(d) for d in os.environ.get("PATCHGYM_REPOS", "").split(os.pathsep) if d]
    dirs.append(bundled.REPOS_DIR)
    names = [task.repo.replace("/", "__"), task.repo_name]
    for d in dirs:
        for name in names:
            for candidate in (d / f"{name}.bundle", d / name):
                if candidate.exists():
                    return str(candidate.resolve())
    raise TaskFileError(
        f"{task.instance_id}: cannot find repository {task.repo!r}; looked for "
        f"{' or '.join(n + '.bundle' for n in names)} in {', '.join(str(d) for d in dirs)} "
        "(set repo_path in the task row or PATCHGYM_REPOS)"
    )


def hidden_paths(task: Task) -> tuple[str, ...]:
    """Host paths a sandbox must hide: the catalog, the task's own file (hidden tests, gold patch)
    and its repository (later commits)."""
    paths = set(hidden_paths_of_catalog())
    if task.source_file is not None:
        paths.add(str(task.source_file))
    try:
        source = repo_source(task)
        if "://" not in source:
            paths.add(source)
    except TaskFileError:
        pass
    return tuple(sorted(paths))


def hidden_paths_of_catalog() -> tuple[str, ...]:
    """The bundled catalog's paths on this host (hidden tests and gold patches of every bundled task)."""
    return (str(bundled.CATALOG_DIR),)


# -- difficulty as data: what a curriculum filters and samples on -------------------------------------------

NUMERIC_FIELDS = ("changed_lines", "changed_files", "broken_tests", "passing_tests")
WHERE_OPERATORS = ("<=", ">=", "!=", "=", "<", ">")


def _changed(patch: str) -> tuple[int, int]:
    """(lines added or removed, files) of a unified diff."""
    lines = files = 0
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            files += 1
        elif line[:1] in "+-" and not line.startswith(("+++", "---")):
            lines += 1
    return lines, files


def difficulty(task: Task) -> dict[str, object]:
    """What a trainer can sort a curriculum by: the task's ``kind`` (a mutation kind for a
    synthesized bug, ``mined`` for a fix commit, ``swebench`` otherwise), the size of the gold
    patch, how many tests the bug breaks and how many must keep passing, and the repository.
    Recorded on the task by ``tasks synth``/``mine`` (the ``difficulty`` field); computed from the
    task itself for any other."""
    extra = task.model_extra or {}
    recorded = extra.get("difficulty")
    if isinstance(recorded, dict) and all(k in recorded for k in ("kind", *NUMERIC_FIELDS)):
        return {**recorded, "repo": task.repo}
    synth = extra.get("synth")
    kind = synth.get("kind") if isinstance(synth, dict) else ("mined" if extra.get("mined") else "swebench")
    lines, files = _changed(task.patch or "")
    return {"kind": kind, "changed_lines": lines, "changed_files": files, "broken_tests": len(task.FAIL_TO_PASS),
            "passing_tests": len(task.PASS_TO_PASS), "repo": task.repo}


def parse_where(condition: str) -> tuple[str, str, str]:
    """``field OP value`` (OP one of ``= != < <= > >=``; numbers for the numeric fields)."""
    for op in WHERE_OPERATORS:
        name, found, value = condition.partition(op)
        if found and name.strip():
            name, value = name.strip(), value.strip()
            known = ("kind", "repo", *NUMERIC_FIELDS)
            if name not in known:
                raise ValueError(f"--where {condition!r}: unknown field {name!r}; known: {', '.join(known)}")
            if name in NUMERIC_FIELDS:
                try:
                    float(value)
                except ValueError:
                    raise ValueError(f"--where {condition!r}: {name} takes a number") from None
            elif op not in ("=", "!="):
                raise ValueError(f"--where {condition!r}: {name} takes = or !=")
            return name, op, value
    raise ValueError(f"--where {condition!r}: expected FIELD=VALUE, FIELD<=N, ... (operators: "
                     f"{' '.join(WHERE_OPERATORS)})")


def _holds(value: object, op: str, wanted: str) -> bool:
    if isinstance(value, (int, float)):
        a, b = float(value), float(wanted)
        return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    options = set(wanted.split(","))  # kind=operator,comparison
    return (str(value) in options) == (op == "=")


def filter_tasks(task_set: TaskSet, where: Iterable[str] = (), sample: int | None = None,
                 seed: int = 0) -> TaskSet:
    """The tasks meeting every ``where`` condition (:func:`parse_where`), then ``sample`` of them
    drawn with ``seed`` (in the set's order; the same seed draws the same tasks)."""
    import random

    conditions = [parse_where(c) for c in where]
    kept = [t for t in task_set if all(_holds(difficulty(t)[name], op, value) for name, op, value in conditions)]
    if sample is not None and sample < len(kept):
        chosen = set(random.Random(seed).sample(range(len(kept)), sample))
        kept = [t for i, t in enumerate(kept) if i in chosen]
    return TaskSet(kept, task_set.origin)
