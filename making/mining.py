"""Mining tasks from a repository's history: each commit that changes code and tests it.

The rules (``patchgym tasks mine`` follows them; each is decided here, once):

* **Which commits.** The first-parent history of the repository's default branch (its ``HEAD``;
  else its only branch; else ``main`` or ``master``), oldest first, after ``since``. A merge
  counts as one change against its first parent. The walk stops once ``max_candidates``
  candidates were found, so ``--max N`` is "the N oldest candidates".
* **Which files are what.** Each file of the commit's diff is put in one of four kinds:
  *test*: :func:`.patches.is_test_or_config`, the very rule the grader uses to drop an agent's
  changes (test files, anything in a ``tests``/``test``/``testing`` folder, test configuration
  such as ``conftest.py``, ``pyproject.toml``, ``setup.cfg``, ``tox.ini``);
  *docs*: ``*.md``/``*.rst``/``*.adoc``, anything under a top-level ``docs``/``doc`` folder,
  ``README``, ``LICENSE``, ``CHANGELOG``, ``NEWS``... (any suffix);
  *meta*: any path with a dot-component (``.github/``, ``.gitignore``, ``.pre-commit-config.yaml``);
  *source*: everything else.
* **Candidates.** A commit with a parent, at least one *source* file, and at least one *test
  module* added or changed (a *test* file named ``test_*.py``, ``*_test.py`` or ``tests.py``).
  Docs-only, config-only, tests-only and source-only commits are not candidates.
* **The task.** ``base_commit`` is the parent. ``test_patch`` is the diff of every *test* file
  (configuration included: the grader drops an agent's changes to it, so a gold patch holding it
  could never be graded as written). ``patch`` (gold) is the diff of the *source* files only:
  *docs* and *meta* changes are in neither (they are not code; if a test needed them, the runs
  below see it and the commit is dropped).
* **Tests.** The touched test modules are run twice at the parent, in fresh sandboxes: with the
  test patch, then with the test patch and the gold patch. FAIL_TO_PASS: the tests of those
  modules that pass after and did not pass before (failed, errored, skipped or not even collected,
  e.g. a module importing a name the fix adds). PASS_TO_PASS: the tests that passed both times —
  in the touched modules, or in the whole suite with ``p2p_all``. A commit with no FAIL_TO_PASS
  test is dropped.
* **Problem statement.** The commit message (subject and body), unless issue texts are given:
  a ``.json`` object ``{"<commit>": "<text>"}``, a ``.jsonl`` file of
  ``{"commit": ..., "text": ...}`` rows (commits may be any revision git resolves: a short sha,
  a tag), or any other file, whose whole text is the statement of the one commit mined (more than
  one candidate is an error). A commit missing from a map falls back to its message.
* **Ids.** ``<owner>__<name>-<short sha>`` (git's unique abbreviation); ``created_at`` is the
  committer date (ISO 8601); ``version`` is empty; the repository's ``task_fields()`` (repo,
  environment, test command, ``repo_path``) are copied in.
* **Validation.** Every mined task is validated as soon as it is mined (:mod:`.validation`: the
  gold patch resolves on each of ``runs`` runs and they agree, the empty patch does not); a task
  that fails is dropped. Outcomes are taken in history order and each kept task is appended to
  the output then, so an interrupted run keeps them and a rerun goes on.

One file (about 530 lines): the rules above are one pipeline (walk, classify, build, run, validate,
append), each step feeding the next the same commit record; the crash-safe output itself lives in
:mod:`.incremental`.
"""

from __future__ import annotations

import copy
import enum
import fnmatch
import hashlib
import json
import os
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from patchgym.grading.patches import TEST_FILE_PATTERNS, FilePatch, is_test_or_config, split_diff
from patchgym.grading.testrun import probe
from patchgym.grading.verifier import Verifier
from patchgym.making.incremental import Progress, TaskFile, Workers
from patchgym.making.registry import RepoRecord
from patchgym.making.validation import TaskValidation, validate_task
from patchgym.sandboxes import SandboxError
from patchgym.tasks.backends import SandboxFactory, make_sandbox
from patchgym.tasks.catalog import difficulty
from patchgym.tasks.model import Task

PathKind = Literal["test", "docs", "meta", "source"]
DOC_SUFFIXES = {".md", ".markdown", ".rst", ".adoc", ".rdoc"}
DOC_DIRS = {"docs", "doc"}
DOC_STEMS = {"README", "LICENSE", "LICENCE", "COPYING", "AUTHORS", "CONTRIBUTORS", "CHANGELOG", "CHANGES",
             "HISTORY", "NEWS", "NOTICE"}
DOC_NAME_SUFFIXES = DOC_SUFFIXES | {"", ".txt"}  # README, LICENSE.txt; not history.py
KIND_ORDER: tuple[PathKind, ...] = ("test", "source", "docs", "meta")  # a section touching a test path is a test's
DIFF_OPTIONS = ("--binary", "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/",
                "--dst-prefix=b/")
IssueTexts = dict[str, str] | str


class MiningError(RuntimeError):
    """The history cannot be read as asked (unknown repository source or revision, bad issue texts)."""


class DropReason(str, enum.Enum):
    """Why a commit did not become a task."""

    ROOT = "root commit"
    NO_SOURCE_CHANGE = "no source change"
    NO_TEST_CHANGE = "no test change"
    PATCH_DOES_NOT_APPLY = "patch does not apply"
    ENVIRONMENT = "environment failure"
    TESTS_DID_NOT_RUN = "tests did not run"
    NO_FAIL_TO_PASS = "no FAIL_TO_PASS test"
    INVALID = "validation failed"


@dataclass(frozen=True)
class Candidate:
    """A commit that changes source and tests, with its two diffs against its parent."""

    sha: str
    parent: str
    short_sha: str
    created_at: str
    message: str
    patch: str
    test_patch: str
    test_files: tuple[str, ...]

    @property
    def subject(self) -> str:
        return self.message.strip().splitlines()[0] if self.message.strip() else ""


@dataclass(frozen=True)
class Dropped:
    """A commit that did not become a task, and why."""

    sha: str
    short_sha: str
    subject: str
    reason: DropReason
    detail: str = ""


@dataclass
class Scan:
    """The walk over the history: how many commits were read, the candidates, the rest."""

    tip: str
    scanned: int = 0
    candidates: list[Candidate] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)


@dataclass
class MiningResult:
    """What :func:`mine` found. ``outcomes`` has one entry per candidate, in history order."""

    repo: str
    tip: str
    scanned: int
    candidates: list[Candidate]
    tasks: list[Task]
    dropped: list[Dropped]
    outcomes: dict[str, Task | Dropped] = field(default_factory=dict)
    validations: list[TaskValidation] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False  # stopped by Ctrl-C: rerunning the same command goes on

    def summary(self) -> dict[str, object]:
        """The counts (and why commits were dropped), as written beside the output."""
        reasons = self.drop_counts()
        validated = sum(isinstance(o, Task) for o in self.outcomes.values())
        return {"repo": self.repo, "tip": self.tip, "scanned": self.scanned, "candidates": len(self.candidates),
                "finished": len(self.outcomes), "validated": validated, "interrupted": self.interrupted,
                "dropped": {r.value: n for r, n in reasons.items()},
                "dropped_commits": [{"commit": d.sha, "subject": d.subject, "reason": d.reason.value,
                                     "detail": d.detail} for d in self.dropped],
                "seconds": self.seconds}

    def drop_counts(self) -> dict[DropReason, int]:
        counts = Counter(d.reason for d in self.dropped)
        return {reason: counts[reason] for reason in DropReason if counts[reason]}

    def write_summary(self, output: Path) -> Path:
        """Write :meth:`summary` as ``<stem>.summary.json`` beside the task file ``output`` (where
        ``patchgym tasks mine`` and docs/new_tasks.md say it is), through a temporary file renamed
        over it, so an interrupted write leaves the last summary rather than a torn one."""
        path = output.with_name(f"{output.stem}.summary.json")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.summary(), indent=2) + "\n")
        tmp.replace(path)
        return path


# --- reading the history --------------------------------------------------------------------------


def _git(git_dir: Path | None, *args: str) -> str:
    cmd = ["git", "--literal-pathspecs", *(["--git-dir", str(git_dir)] if git_dir else []), *args]
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, env=env, stdin=subprocess.DEVNULL, timeout=900)
    except subprocess.TimeoutExpired:
        raise MiningError(f"git {' '.join(args[:3])} timed out") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise MiningError(f"git {' '.join(args[:3])} failed: {err}")
    return proc.stdout.decode("utf-8", "replace")


@contextmanager
def cloned_history(source: str) -> Iterator[Path]:
    """A bare mirror of ``source`` (a path, a bundle or a URL) in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="patchgym-mine-") as tmp:
        git_dir = Path(tmp) / "repo.git"
        _git(None, "clone", "--quiet", "--mirror", source, str(git_dir))
        yield git_dir


def rev_parse(git_dir: Path, rev: str) -> str | None:
    """The commit ``rev`` names, or None."""
    if not rev or rev.startswith("-"):
        return None
    try:
        return _git(git_dir, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip() or None
    except MiningError:
        return None


def resolve_tip(git_dir: Path, rev: str | None = None, registered: str | None = None) -> str:
    """The commit to mine back from: ``rev``, else HEAD, else the only branch, else main/master,
    else ``registered`` (the commit ``repos add`` checked: a clone of a bundle without HEAD has
    only ``origin/main``, which its registration named with ``--rev``)."""
    if rev is not None:
        sha = rev_parse(git_dir, rev)
        if sha is None:
            raise MiningError(f"unknown revision {rev!r}")
        return sha
    head = rev_parse(git_dir, "HEAD")
    if head:
        return head
    branches = _git(git_dir, "for-each-ref", "--format=%(refname)", "refs/heads").split()
    for name in branches if len(branches) == 1 else ["refs/heads/main", "refs/heads/master"]:
        sha = rev_parse(git_dir, name) if name in branches else None
        if sha:
            return sha
    if registered and rev_parse(git_dir, registered):
        return registered
    raise MiningError(f"cannot tell which branch to mine (no HEAD; branches: {', '.join(branches) or 'none'}); "
                      f"register the repository again with --rev naming it")


def path_kind(path: str) -> PathKind:
    """The kind of a changed file: test (and test configuration), docs, meta (dot-paths) or source."""
    if is_test_or_config(path):
        return "test"
    p = PurePosixPath(path)
    suffix = p.suffix.lower()
    doc_name = p.stem.upper() in DOC_STEMS and suffix in DOC_NAME_SUFFIXES
    if p.parts[0] in DOC_DIRS or suffix in DOC_SUFFIXES or doc_name:
        return "docs"
    if any(part.startswith(".") for part in p.parts):
        return "meta"
    return "source"


def is_test_module(path: str) -> bool:
    """A file pytest collects tests from: a test file by the grader's rule, named like a test module."""
    p = PurePosixPath(path)
    return (p.suffix == ".py" and is_test_or_config(path)
            and any(fnmatch.fnmatch(p.name, pat) for pat in TEST_FILE_PATTERNS))


def _section_kind(section: FilePatch) -> PathKind:
    kinds = {path_kind(p) for p in section.paths}
    return next((kind for kind in KIND_ORDER if kind in kinds), "meta")


def _join(sections: Sequence[FilePatch]) -> str:
    text = "".join(s.text for s in sections)
    return text if not text or text.endswith("\n") else text + "\n"


def classify_commit(git_dir: Path, sha: str, parent: str) -> tuple[str, str, tuple[str, ...], dict[PathKind, int]]:
    """``(patch, test_patch, test modules to run, files per kind)`` of ``sha`` against ``parent``."""
    sections = split_diff(_git(git_dir, "diff", *DIFF_OPTIONS, parent, sha))
    by_kind: dict[PathKind, list[FilePatch]] = {"test": [], "docs": [], "meta": [], "source": []}
    for section in sections:
        by_kind[_section_kind(section)].append(section)
    test_files = tuple(sorted({s.new_path for s in by_kind["test"] if s.new_path and is_test_module(s.new_path)}))
    counts = {kind: len(items) for kind, items in by_kind.items()}
    return _join(by_kind["source"]), _join(by_kind["test"]), test_files, counts


def candidate_commits(git_dir: Path, tip: str, *, since: str | None = None,
                      max_candidates: int | None = None) -> Scan:
    """Walk the first-parent history up to ``tip`` (oldest first, after ``since``) and keep the
    commits that change both source and a test module, at most ``max_candidates`` of them."""
    scan = Scan(tip=tip)
    span = tip
    if since is not None:
        since_sha = rev_parse(git_dir, since)
        if since_sha is None:
            raise MiningError(f"unknown revision {since!r} (--since)")
        span = f"{since_sha}..{tip}"
    log = _git(git_dir, "log", "--first-parent", "--reverse", "-z", "--format=%H%x1f%P%x1f%h%x1f%cI%x1f%B", span)
    for record in filter(None, log.split("\0")):
        if max_candidates is not None and len(scan.candidates) >= max_candidates:
            break
        sha, parents, short, date, message = record.lstrip("\n").split("\x1f", 4)
        scan.scanned += 1
        subject = message.strip().splitlines()[0] if message.strip() else ""
        if not parents.split():
            scan.dropped.append(Dropped(sha, short, subject, DropReason.ROOT))
            continue
        parent = parents.split()[0]
        patch, test_patch, test_files, counts = classify_commit(git_dir, sha, parent)
        files = ", ".join(f"{'test/config' if kind == 'test' else kind} {n}" for kind, n in counts.items() if n)
        if not counts["source"]:
            scan.dropped.append(Dropped(sha, short, subject, DropReason.NO_SOURCE_CHANGE, f"files: {files or 'none'}"))
        elif not test_files:
            scan.dropped.append(Dropped(sha, short, subject, DropReason.NO_TEST_CHANGE, f"files: {files or 'none'}"))
        else:
            scan.candidates.append(Candidate(sha=sha, parent=parent, short_sha=short, created_at=date,
                                             message=message.strip() + "\n", patch=patch, test_patch=test_patch,
                                             test_files=test_files))
    return scan


# --- issue texts ----------------------------------------------------------------------------------


def load_issue_texts(path: Path) -> IssueTexts:
    """A map commit → problem statement (``.json`` object, ``.jsonl`` rows of ``commit`` and
    ``text``), or one text for a single mined commit (any other file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MiningError(f"{path}: cannot read issue texts: {exc}") from None
    if path.suffix not in (".json", ".jsonl"):
        if not text.strip():
            raise MiningError(f"{path}: the issue text is empty")
        return text
    try:
        if path.suffix == ".json":
            data = json.loads(text)
            if not isinstance(data, dict):
                raise MiningError(f"{path}: expected a JSON object mapping commits to texts")
            rows = [{"commit": k, "text": v} for k, v in data.items()]
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise MiningError(f"{path}: invalid JSON: {exc}") from None
    texts: dict[str, str] = {}
    for n, row in enumerate(rows, 1):
        body = row.get("text", row.get("problem_statement")) if isinstance(row, dict) else None
        commit = row.get("commit") if isinstance(row, dict) else None
        if not isinstance(commit, str) or not isinstance(body, str) or not body.strip():
            raise MiningError(f"{path}: entry {n}: expected a commit and a non-empty text")
        texts[commit] = body
    return texts


def resolve_issue_texts(git_dir: Path, texts: IssueTexts | None, candidates: Sequence[Candidate]) -> dict[str, str]:
    """Problem statements by full sha (every key resolved now: a typo is an error, not a silent fallback)."""
    if texts is None:
        return {}
    if isinstance(texts, str):
        if len(candidates) > 1:
            raise MiningError(f"a single issue text needs a single commit to mine, found {len(candidates)} "
                              "candidates (narrow with --since/--max, or give a JSON map commit → text)")
        return {c.sha: texts for c in candidates}
    resolved = {}
    for key, text in texts.items():
        sha = rev_parse(git_dir, key)
        if sha is None:
            raise MiningError(f"issue text for unknown commit {key!r}")
        resolved[sha] = text
    return resolved


# --- running the tests ----------------------------------------------------------------------------


def instance_id(record: RepoRecord, candidate: Candidate) -> str:
    return f"{record.repo.replace('/', '__')}-{candidate.short_sha}"


def mine_commit(record: RepoRecord, candidate: Candidate, *, problem_statement: str | None = None,
                factory: SandboxFactory | None = None, p2p_all: bool = False) -> Task | Dropped:
    """Run the candidate's tests before and after its fix; a task when some test goes from failing
    to passing, else the reason it was dropped."""
    def drop(reason: DropReason, detail: str = "") -> Dropped:
        return Dropped(candidate.sha, candidate.short_sha, candidate.subject, reason, detail)

    stand_in = record.probe_task(candidate.parent, instance_id=instance_id(record, candidate))
    tests = () if p2p_all else candidate.test_files
    try:
        before = probe(stand_in, [candidate.test_patch], tests, factory)
        if not all(before.applied):
            return drop(DropReason.PATCH_DOES_NOT_APPLY, "the test patch does not apply to the parent")
        after = probe(stand_in, [candidate.test_patch, candidate.patch], tests, factory)
    except SandboxError as exc:
        return drop(DropReason.ENVIRONMENT, f"{type(exc).__name__}: {exc}")
    if not all(after.applied):
        return drop(DropReason.PATCH_DOES_NOT_APPLY, "the source patch does not apply after the test patch")
    for name, run in (("before", before), ("after", after)):
        # With no results before the fix (e.g. a conftest importing what the fix adds), nothing
        # passed before; with none after, there is nothing to keep.
        if run.timed_out or (name == "after" and run.error):
            return drop(DropReason.TESTS_DID_NOT_RUN, f"{name} the fix: {run.error or 'the test run timed out'}")
    touched = set(candidate.test_files)
    f2p = sorted(t for t in after.passed - before.passed if t.split("::", 1)[0] in touched)
    p2p = sorted(before.passed & after.passed)
    if not f2p:
        return drop(DropReason.NO_FAIL_TO_PASS, f"{len(before.failed)} failing before, {len(after.passed)} passing "
                                               f"and {len(after.failed)} failing after")
    row = {
        "instance_id": stand_in.instance_id, "base_commit": candidate.parent,
        "problem_statement": problem_statement or candidate.message, "patch": candidate.patch,
        "test_patch": candidate.test_patch, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "version": "",
        "created_at": candidate.created_at, **record.task_fields(),
    }
    measured = {k: v for k, v in difficulty(Task.model_validate(row)).items() if k != "repo"}
    return Task.model_validate({**row, "difficulty": {**measured, "kind": "mined"}})


def _mine_and_validate(record: RepoRecord, candidate: Candidate, statement: str | None, factory: SandboxFactory,
                       verifier: Verifier | None, runs: int,
                       p2p_all: bool) -> tuple[Task | Dropped, TaskValidation | None]:
    """One candidate from the first test run to its validation (a worker's job)."""
    outcome = mine_commit(record, candidate, problem_statement=statement, factory=factory, p2p_all=p2p_all)
    if not isinstance(outcome, Task) or verifier is None:
        return outcome, None
    check = validate_task(outcome, verifier, runs)
    if check.ok:
        return outcome, check
    infra = all(p.startswith("infrastructure failure") for p in check.problems)
    return Dropped(candidate.sha, candidate.short_sha, candidate.subject,
                   DropReason.ENVIRONMENT if infra else DropReason.INVALID, "; ".join(check.problems)), check


def mine(record: RepoRecord, *, since: str | None = None, max_candidates: int | None = None,
         issue_texts: IssueTexts | None = None, workers: int = 1, factory: SandboxFactory | None = None,
         verifier: Verifier | None = None, validate_runs: int = 2, p2p_all: bool = False,
         on_stage: Callable[[str, int], None] | None = None,
         on_item: Callable[[str, Task | Dropped], None] | None = None,
         output: Path | None = None, note: Callable[[str], None] = lambda message: None) -> MiningResult:
    """Mine ``record``'s history into tasks (see the module docstring for the rules).

    Each candidate is mined and validated (``validate_runs`` gold runs; 0 skips validation) by one
    of ``workers`` threads; outcomes are taken in history order, and with ``output`` each kept task
    is appended to it then (:class:`~.incremental.TaskFile`). A run on an ``output`` written by an
    earlier run with the same arguments goes on after the last candidate it finished (an
    ``output`` from other arguments is replaced). Ctrl-C stops the workers, keeps what is written
    and returns with ``interrupted`` set. ``on_stage("mining", total)`` is called once,
    ``on_item("mining", outcome)`` as each candidate's outcome is taken (in this thread).
    """
    start = time.monotonic()
    with cloned_history(record.source) as git_dir:
        tip = resolve_tip(git_dir, registered=record.head)
        scan = candidate_commits(git_dir, tip, since=since, max_candidates=max_candidates)
        statements = resolve_issue_texts(git_dir, issue_texts, scan.candidates)
    result = MiningResult(repo=record.name, tip=tip, scanned=scan.scanned, candidates=scan.candidates, tasks=[],
                          dropped=list(scan.dropped))
    outcomes: dict[str, Task | Dropped] = {}
    task_file = progress = None
    first = 0
    if output is not None:
        key = {"repo": record.repo, "since": since, "max": max_candidates, "p2p_all": p2p_all,
               "validate_runs": validate_runs, "statements": hashlib.sha256(
                   json.dumps(statements, sort_keys=True).encode()).hexdigest()}
        progress = Progress(output, key)
        if output.exists() and output.stat().st_size and not progress.matches():
            note(f"{output.name} was written by a run with other arguments: starting afresh")
            output.unlink()
        task_file = TaskFile(output, note)
        task_file.create()
        first = progress.read()
        earlier = {t.instance_id: t for t in task_file.tasks}
        drops = progress.notes()
        for c in scan.candidates:
            if instance_id(record, c) in earlier:
                outcomes[c.sha] = earlier[instance_id(record, c)]
            elif c.sha in drops:
                reason, detail = drops[c.sha]
                outcomes[c.sha] = Dropped(c.sha, c.short_sha, c.subject, DropReason(reason), detail)
        if outcomes:
            note(f"going on from an earlier run: {len(outcomes)} of {len(scan.candidates)} candidates done")
        progress.write(first, drops)
    if on_stage:
        on_stage("mining", len(scan.candidates))
    todo = [(i, c) for i, c in enumerate(scan.candidates) if c.sha not in outcomes and i >= first]
    for i, c in enumerate(scan.candidates):
        if i < first and c.sha not in outcomes:  # finished by an earlier run whose notes were lost
            outcomes[c.sha] = Dropped(c.sha, c.short_sha, c.subject, DropReason.INVALID, "dropped by an earlier run")
    for c in scan.candidates:
        if c.sha in outcomes and on_item:
            on_item("mining", outcomes[c.sha])
    pool = Workers(workers, factory or (verifier.factory if verifier else make_sandbox))
    checker = None
    if validate_runs > 0:
        checker = copy.copy(verifier or Verifier(factory))
        checker.factory = pool.factory
    results: dict[int, tuple[Task | Dropped, TaskValidation | None]] = {}
    try:
        waiting = list(todo)
        line = [i for i, _ in todo]
        while line:
            while waiting and pool.in_flight < max(1, workers):
                index, candidate = waiting.pop(0)
                pool.submit(index, lambda c=candidate: _mine_and_validate(
                    record, c, statements.get(c.sha), pool.factory, checker, validate_runs, p2p_all))
            for index, outcome, error in pool.results():
                if error is not None:
                    raise error
                results[index] = outcome
            while line and line[0] in results:
                index = line.pop(0)
                candidate = scan.candidates[index]
                outcome, check = results.pop(index)
                outcomes[candidate.sha] = outcome
                if check is not None:
                    result.validations.append(check)
                if task_file is not None and progress is not None:
                    if isinstance(outcome, Task):
                        task_file.append(outcome)
                    progress.write(index + 1, {sha: [o.reason.value, o.detail] for sha, o in outcomes.items()
                                               if isinstance(o, Dropped)})
                if on_item:
                    on_item("mining", outcome)
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        pool.stop()
    result.outcomes = {c.sha: outcomes[c.sha] for c in scan.candidates if c.sha in outcomes}
    result.tasks = [o for o in result.outcomes.values() if isinstance(o, Task)]
    result.dropped += [o for o in result.outcomes.values() if isinstance(o, Dropped)]
    result.seconds = round(time.monotonic() - start, 1)
    return result
