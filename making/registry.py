"""Registered repositories: what a task maker needs to know of a repository before any task exists
(where git fetches it, its environment, how its tests run). ``patchgym repos add`` writes one
record per repository under ``$PATCHGYM_HOME/registry``; the bundled libraries are listed too,
their environment taken from their tasks.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

import patchgym.tasks as bundled
from patchgym.grading.testrun import probe_task
from patchgym.sandboxes.paths import cache_dir
from patchgym.tasks.catalog import load_task_set
from patchgym.tasks.model import EnvironmentConfig, Task, TestSpec, safe_name


class UnknownRepoError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown repository"


class RepoRecord(BaseModel):
    """One repository patchgym can make tasks from."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Short name used on the command line")
    repo: str = Field(min_length=1, description="'owner/name' written into task rows")
    source: str = Field(min_length=1, description="What git fetches: an absolute path, a bundle or a URL")
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    test_spec: TestSpec = Field(default_factory=TestSpec)
    head: str | None = Field(None, description="The commit checked at registration")
    bundled: bool = False

    def probe_task(self, commit: str, instance_id: str = "probe") -> Task:
        """A stand-in task at ``commit``, for running this repository's tests (see :mod:`.testrun`)."""
        return probe_task(repo=self.repo, base_commit=commit, repo_path=self.source, environment=self.environment,
                          test_spec=self.test_spec, instance_id=instance_id)

    def task_fields(self) -> dict[str, object]:
        """The fields every task made from this repository carries (so ``--tasks FILE`` finds it)."""
        fields: dict[str, object] = {"repo": self.repo, "environment": self.environment.model_dump(),
                                     "test_spec": self.test_spec.model_dump()}
        if not self.bundled:
            fields["repo_path"] = self.source
        return fields


def registry_dir() -> Path:
    return cache_dir("registry")


def save_repo(record: RepoRecord) -> Path:
    path = registry_dir() / f"{safe_name(record.name)}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(record.model_dump_json(indent=2) + "\n")
    tmp.replace(path)
    return path


def bundled_repos() -> list[RepoRecord]:
    """The bundled libraries, with the environment and test command of their tasks."""
    by_name: dict[str, Task] = {}
    for task in load_task_set(None):
        by_name.setdefault(task.repo_name, task)
    records = []
    for bundle in sorted(bundled.REPOS_DIR.glob("*.bundle")):
        task = by_name.get(bundle.stem)
        if task is None:
            continue
        records.append(RepoRecord(name=bundle.stem, repo=task.repo, source=str(bundle), environment=task.environment,
                                  test_spec=task.test_spec, bundled=True))
    return records


def registered_repos() -> list[RepoRecord]:
    records = []
    for path in sorted(registry_dir().glob("*.json")):
        records.append(RepoRecord.model_validate(json.loads(path.read_text())))
    return records


def list_repos() -> list[RepoRecord]:
    """Registered repositories first (a registration may shadow a bundled name), then bundled ones."""
    registered = registered_repos()
    names = {r.name for r in registered}
    return registered + [r for r in bundled_repos() if r.name not in names]


def get_repo(name: str) -> RepoRecord:
    for record in list_repos():
        if record.name == name:
            return record
    known = ", ".join(r.name for r in list_repos()) or "none"
    raise UnknownRepoError(f"unknown repository {name!r}; known: {known} (register one with `patchgym repos add`)")
