"""Making tasks by injecting bugs into a repository (SWE-smith style), for ``patchgym tasks synth``.

1. The repository at ``rev`` goes into a scratch bare clone; its suite runs once (the baseline).
2. Candidate functions are the ones the tests reach by name (:func:`reachable_functions`: a
   static heuristic, no coverage run).
3. Every mutation site there (:mod:`.mutations`) is put in an order fixed by the seed: each
   kind's sites shuffled, one site per function before a second one, kinds taking turns.
4. Mutants are made in that order and the whole suite runs with each applied (``workers`` at a
   time) until ``n`` of them break a test that passed, without changing which tests are collected
   (an import or collection error changes it). The first ``n`` in the order are kept, so a seed
   always gives the same tasks.
5. Each kept mutant becomes a commit whose tree has the bug and which has *no parent*: a parent
   with the correct tree would hand the fix to anyone running ``git show`` in the sandbox. The
   commits live in a git bundle beside the output (``<stem>.bundle``, one ref per task under
   ``refs/heads/synth/``), which each task's ``repo_path`` names. The gold patch is the diff from the
   bug back to ``rev``; there is no test patch (the hidden tests are the existing ones);
   FAIL_TO_PASS are the tests the bug breaks, PASS_TO_PASS every other test passing in both runs.
6. Every task is validated (gold resolves on each of ``runs`` runs, no change does not); the valid
   ones are written.
"""

from __future__ import annotations

import ast
import os
import random
import re
import subprocess
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gym_envs.grading.patches import is_test_or_config
from gym_envs.grading.pyast import parse as parse_python
from gym_envs.grading.testrun import TestRun, probe
from gym_envs.grading.verifier import Verifier
from gym_envs.making.registry import RepoRecord
from gym_envs.making.synth import mutations
from gym_envs.making.synth.statement import failure_messages, rank_apis, rewrite, safe_statement, test_calls
from gym_envs.making.validation import TaskValidation, validate_tasks
from tasks.backends import SandboxFactory
from tasks.catalog import TaskSet
from tasks.model import Task, load_tasks, save_tasks

NON_SOURCE_DIRS = {"docs", "doc", "examples", "example", "benchmarks", "bench", "scripts", ".github"}
IDENTITY = {"GIT_AUTHOR_NAME": "patchgym", "GIT_AUTHOR_EMAIL": "synth@patchgym.invalid",
            "GIT_COMMITTER_NAME": "patchgym", "GIT_COMMITTER_EMAIL": "synth@patchgym.invalid"}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PROBE_TIMEOUT_FLOOR = 30.0  # seconds
PROBE_TIMEOUT_FACTOR = 10.0  # times the baseline run's (sandbox included)


class SynthError(RuntimeError):
    """Tasks cannot be made: the repository, the revision or its test suite is unusable."""


@dataclass
class SynthOptions:
    n: int
    seed: int = 0
    kinds: tuple[str, ...] = mutations.KINDS
    rev: str | None = None
    workers: int = 1
    validate: bool = True
    runs: int = 2
    max_failing_fraction: float = 1.0  # drop mutants breaking more of the passing tests than this
    probe_timeout: float | None = None  # seconds a mutant's test run may take (default: from the baseline's)
    rewrite_url: str | None = None
    rewrite_model: str | None = None
    rewrite_api_key: str | None = None
    rewrite_transport: object | None = None  # an httpx transport (tests)


@dataclass
class Attempt:
    """One mutant and what its test run showed (``verdict`` is empty when it broke tests)."""

    index: int
    kind: str
    path: str
    function: str
    description: str
    commit: str
    changed: list[str]
    verdict: str = "not run"
    failing: list[str] = field(default_factory=list)
    passing: list[str] = field(default_factory=list)
    output: str = ""

    @property
    def broke(self) -> bool:
        return not self.verdict


@dataclass
class SynthReport:
    repo: str
    rev: str
    output: Path
    bundle: Path | None = None
    functions: int = 0
    sites: int = 0
    baseline_passed: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    candidates: list[Task] = field(default_factory=list)  # tasks made from the kept mutants
    validations: list[TaskValidation] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)  # the tasks written
    seconds: dict[str, float] = field(default_factory=dict)

    def dropped(self) -> Counter[str]:
        """Why tried mutants were not kept (those that broke tests beyond ``n`` included)."""
        kept = {t.base_commit for t in self.candidates}
        return Counter(a.verdict or "broke tests, beyond --n" for a in self.attempts
                       if a.verdict != "not run" and a.commit not in kept)

    def by_kind(self) -> dict[str, tuple[int, int, int]]:
        """kind → (mutants tried, mutants that broke tests, tasks written)."""
        written = {t.base_commit for t in self.tasks}
        tried = Counter(a.kind for a in self.attempts if a.verdict != "not run")
        broke = Counter(a.kind for a in self.attempts if a.broke)
        kept = Counter(a.kind for a in self.attempts if a.commit in written)
        return {k: (tried[k], broke[k], kept[k]) for k in mutations.KINDS if tried[k] or broke[k] or kept[k]}


class Listener:
    """Progress of :func:`synthesize` (the command line draws bars); does nothing by default."""

    def stage(self, name: str, total: int | None) -> None:
        pass

    def step(self, status: str, advance: int = 1) -> None:
        pass


# -- the scratch repository --------------------------------------------------------------------------


class Scratch:
    """A bare clone of the repository, where mutant commits are made."""

    def __init__(self, source: str, workdir: Path) -> None:
        self.workdir = workdir
        self.path = workdir / "scratch.git"
        self.git("clone", "--bare", "--quiet", source, str(self.path), cwd=workdir)

    def git(self, *args: str, input: bytes | None = None, env: dict[str, str] | None = None,
            cwd: Path | None = None, check: bool = True) -> str:
        full = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", **IDENTITY, **(env or {})}
        proc = subprocess.run(["git", *args], cwd=cwd or self.path, input=input, capture_output=True, env=full,
                              timeout=600)
        if check and proc.returncode != 0:
            raise SynthError(f"git {' '.join(args[:2])} failed: {proc.stderr.decode(errors='replace').strip()}")
        return proc.stdout.decode("utf-8", errors="surrogateescape") if proc.returncode == 0 else ""

    def resolve(self, rev: str | None, fallback: str | None = None) -> str:
        """The commit ``rev`` names; by default HEAD, else ``fallback``, main, master, any branch."""
        tries = [rev] if rev else ["HEAD", *([fallback] if fallback else []), "refs/heads/main", "refs/heads/master"]
        if not rev:
            tries += self.git("for-each-ref", "--format=%(refname)", "refs/heads").split()
        for name in tries:
            sha = self.git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", check=False).strip()
            if sha:
                return sha
        raise SynthError(f"no commit {rev!r} in the repository" if rev else "the repository has no commits")

    def files(self, rev: str) -> dict[str, str]:
        """path → mode of every file at ``rev``."""
        found = {}
        for entry in self.git("ls-tree", "-r", "-z", "--full-tree", rev).split("\0"):
            if entry and "\t" in entry:
                meta, path = entry.split("\t", 1)
                mode, kind, _ = meta.split()
                if kind == "blob":
                    found[path] = mode
        return found

    def read(self, rev: str, path: str) -> str | None:
        proc = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=self.path, capture_output=True, timeout=60)
        try:
            return proc.stdout.decode("utf-8") if proc.returncode == 0 else None
        except UnicodeDecodeError:
            return None

    def date(self, rev: str) -> str:
        return self.git("show", "-s", "--format=%cI", rev).strip()

    def commit(self, rev: str, path: str, mode: str, content: str, message: str, date: str) -> str:
        """A commit with no parent whose tree is ``rev``'s with ``path`` replaced by ``content``."""
        blob = self.git("hash-object", "-w", "--stdin", input=content.encode("utf-8")).strip()
        index = {"GIT_INDEX_FILE": str(self.workdir / f"index-{uuid.uuid4().hex}")}
        try:
            self.git("read-tree", rev, env=index)
            self.git("update-index", "--cacheinfo", f"{mode},{blob},{path}", env=index)
            tree = self.git("write-tree", env=index).strip()
        finally:
            Path(index["GIT_INDEX_FILE"]).unlink(missing_ok=True)
        dates = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        return self.git("commit-tree", tree, "-m", message, env=dates).strip()

    def diff(self, old: str, new: str) -> str:
        return self.git("-c", "diff.noprefix=false", "diff", "--no-color", "--no-ext-diff", "--no-renames",
                        "--src-prefix=a/", "--dst-prefix=b/", old, new)

    def bundle(self, dest: Path, refs: dict[str, str]) -> None:
        """Write ``dest``: a bundle with these refs (name → commit), replacing any earlier one."""
        for name, commit in refs.items():
            self.git("update-ref", name, commit)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}")
        try:
            self.git("bundle", "create", "--quiet", str(tmp), "--stdin", input="".join(f"{r}\n" for r in refs).encode())
            tmp.replace(dest)
        finally:
            tmp.unlink(missing_ok=True)


# -- which functions ------------------------------------------------------------------------------------


def referenced_names(test_sources: Iterable[str]) -> set[str]:
    """Identifiers the tests mention: names, attributes, imported names, and words in strings (a
    test may name a function in a string, e.g. a command line or ``getattr``)."""
    names: set[str] = set()
    for source in test_sources:
        try:
            tree = parse_python(source)
        except SyntaxError:
            names.update(_WORD.findall(source))
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.update(node.name.split("."))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(_WORD.findall(node.value))
    return names


def _used_names(nodes: Iterable[ast.AST]) -> set[str]:
    names = set()
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
    return names


def _module_level(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """What runs when a module is imported, function bodies and imports left out."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from node.decorator_list
            yield from [d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None]
        elif isinstance(node, ast.ClassDef):
            yield from [*node.decorator_list, *node.bases, *node.keywords]
            yield from _module_level(node.body)
        elif not isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def reachable_functions(trees: dict[str, ast.Module], seeds: set[str]) -> dict[str, set[str]]:
    """path → qualified names of the functions the tests can reach by name.

    A function is reached when its name or its class's name is in ``seeds`` (what the tests
    mention), in code that runs on import, or in the body of a reached function; to a fixed point.
    Every method of a reached class is reached (operators and ``__init__`` are called implicitly).
    """
    names = set(seeds)
    for tree in trees.values():
        names |= _used_names(_module_level(tree.body))
    pending = [(path, f) for path, tree in sorted(trees.items()) for f in mutations.functions(tree)]
    reached: dict[str, set[str]] = defaultdict(set)
    changed = True
    while changed:
        changed = False
        rest = []
        for path, function in pending:
            if any(part in names for part in function.qualname.split(".")):
                reached[path].add(function.qualname)
                names |= _used_names(function.node.body)
                changed = True
            else:
                rest.append((path, function))
        pending = rest
    return dict(reached)


def order_sites(found: list[tuple[str, mutations.Site]], seed: int) -> list[tuple[str, mutations.Site]]:
    """The order mutants are tried in, fixed by ``seed``: each kind's sites shuffled, then each
    function's first site before any function's second, and kinds taking turns."""
    rng = random.Random(seed)
    by_kind: dict[str, list[tuple[str, mutations.Site]]] = defaultdict(list)
    for item in sorted(found, key=lambda ps: (ps[0], ps[1].key)):
        by_kind[item[1].kind].append(item)
    queues = []
    for kind in mutations.KINDS:
        items = by_kind.get(kind, [])
        rng.shuffle(items)
        seen: Counter[tuple[str, str]] = Counter()
        ranked = []
        for item in items:
            func = (item[0], item[1].function.qualname)
            ranked.append((seen[func], item))
            seen[func] += 1
        ranked.sort(key=lambda r: r[0])  # stable: the shuffle decides within a rank
        queues.append([item for _, item in ranked])
    ordered = []
    for round_ in range(max((len(q) for q in queues), default=0)):
        ordered += [q[round_] for q in queues if round_ < len(q)]
    return ordered


# -- running mutants ---------------------------------------------------------------------------------


def judge(run: TestRun, baseline: TestRun, max_failing_fraction: float = 1.0) -> tuple[str, list[str], list[str]]:
    """(verdict, tests the bug breaks, tests passing in both runs); an empty verdict keeps it."""
    if run.applied and not all(run.applied):
        return "the mutant does not apply", [], []
    if run.timed_out:
        return "the test run timed out", [], []
    if run.error or not run.statuses:
        return run.error or "no test results", [], []
    if set(run.statuses) != set(baseline.statuses):
        return "the collected tests changed (an import or collection error)", [], []
    failing = sorted(baseline.passed & run.failed)
    passing = sorted(baseline.passed & run.passed)
    if not failing:
        return "no test fails", [], []
    if len(failing) > max_failing_fraction * len(baseline.passed):
        return f"breaks {len(failing)} of {len(baseline.passed)} passing tests", failing, passing
    return "", failing, passing


def _probe_mutants(ordered: list[tuple[str, mutations.Site]], scratch: Scratch, rev: str, modes: dict[str, str],
                   sources: dict[str, str], record: RepoRecord, baseline: TestRun, options: SynthOptions,
                   factory: SandboxFactory | None, listener: Listener, message: str, date: str,
                   timeout: float) -> list[Attempt]:
    """Try mutants in order, ``workers`` at a time, until ``options.n`` broke tests (or none are left)."""
    attempts: list[Attempt] = []
    seen: set[tuple[str, str]] = set()
    sites = iter(enumerate(ordered))
    task = record.probe_task(rev, instance_id="synth-probe")
    task = task.model_copy(update={"test_spec": task.test_spec.model_copy(update={"timeout": timeout})})
    running: dict[Future[TestRun], Attempt] = {}
    broke = 0

    def submit(pool: ThreadPoolExecutor) -> bool:
        for index, (path, site) in sites:
            mutant = site.make()
            if mutant is None or (path, mutant.source) in seen:
                continue
            seen.add((path, mutant.source))
            commit = scratch.commit(rev, path, modes[path], mutant.source, message, date)
            attempt = Attempt(index, mutant.kind, path, mutant.function, mutant.description, commit,
                              mutations.changed_lines(sources[path], mutant.source))
            attempts.append(attempt)
            running[pool.submit(probe, task, [scratch.diff(rev, commit)], (), factory)] = attempt
            return True
        return False

    pool = ThreadPoolExecutor(max_workers=max(1, options.workers))
    try:
        for _ in range(max(1, options.workers)):
            submit(pool)
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                attempt = running.pop(future)
                run = future.result()
                attempt.verdict, attempt.failing, attempt.passing = judge(run, baseline, options.max_failing_fraction)
                if attempt.broke:
                    attempt.output = run.output
                    broke += 1
                tried = sum(a.verdict != "not run" for a in attempts)
                listener.step(f"{broke} broke tests of {tried} tried", int(attempt.broke and broke <= options.n))
                if broke < options.n:
                    submit(pool)
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return attempts


# -- the whole pipeline --------------------------------------------------------------------------------


def synthesize(record: RepoRecord, output: Path, options: SynthOptions, *, verifier: Verifier | None = None,
               factory: SandboxFactory | None = None, listener: Listener | None = None) -> SynthReport:
    """Make up to ``options.n`` tasks from ``record`` by bug injection and write them to ``output``
    (JSONL, with the bundle of their commits beside it). See the module docstring."""
    if options.n < 1:
        raise SynthError("--n must be at least 1")
    listener = listener or Listener()
    verifier = verifier or Verifier(factory)
    factory = factory or verifier.factory
    output = output.expanduser().resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="patchgym-synth-") as tmp:
        scratch = Scratch(record.source, Path(tmp))
        rev = scratch.resolve(options.rev, record.head)
        report = SynthReport(record.repo, rev, output)
        modes = {p: m for p, m in scratch.files(rev).items() if p.endswith(".py")}
        texts = {p: t for p in sorted(modes) if (t := scratch.read(rev, p)) is not None}
        tests = {p: t for p, t in texts.items() if is_test_or_config(p)}
        sources = {p: t for p, t in texts.items()
                   if not is_test_or_config(p) and PurePosixPath(p).parts[0] not in NON_SOURCE_DIRS
                   and p != "setup.py"}
        trees = {}
        for path, text in sources.items():
            try:
                trees[path] = parse_python(text)
            except SyntaxError:
                continue
        reach = reachable_functions(trees, referenced_names(tests.values()))
        found = [(path, site) for path in sorted(reach)
                 for site in mutations.sites(sources[path], options.kinds, reach[path].__contains__)]
        report.functions = sum(len(v) for v in reach.values())
        report.sites = len(found)
        if not found:
            raise SynthError(f"no mutation sites in functions the tests reach at {rev[:12]}")
        ordered = order_sites(found, options.seed)

        listener.stage("baseline test run", 1)
        clock = time.monotonic()
        baseline = probe(record.probe_task(rev, instance_id="synth-baseline"), factory=factory)
        baseline_seconds = time.monotonic() - clock
        listener.step(f"{len(baseline.passed)} passed, {len(baseline.failed)} failed")
        if baseline.error or not baseline.passed:
            raise SynthError(f"the test suite does not run at {rev[:12]}: {baseline.error or 'no test passes'}\n"
                             + baseline.output[-2000:])
        report.baseline_passed = len(baseline.passed)
        report.seconds["baseline"] = time.monotonic() - started

        listener.stage("trying mutants", options.n)
        date = scratch.date(rev)
        # A mutant may loop forever: its run gets a deadline from the baseline's, not the suite's own.
        timeout = options.probe_timeout or min(record.test_spec.timeout,
                                               max(PROBE_TIMEOUT_FLOOR, PROBE_TIMEOUT_FACTOR * baseline_seconds))
        report.attempts = _probe_mutants(ordered, scratch, rev, modes, sources, record, baseline, options, factory,
                                         listener, f"{record.repo} at {rev[:12]}", date, timeout)
        report.seconds["mutants"] = time.monotonic() - started - report.seconds["baseline"]
        kept = sorted((a for a in report.attempts if a.broke), key=lambda a: a.index)[: options.n]

        bundle = output.with_suffix(".bundle")
        defined = {f.qualname.rsplit(".", 1)[-1] for tree in trees.values() for f in mutations.functions(tree)}
        defined |= {n.name for tree in trees.values() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        calls = test_calls(tests, sorted(baseline.statuses), defined)
        report.candidates = [_task(record, a, scratch, rev, date, calls, bundle.name, options, len(baseline.statuses))
                             for a in kept]
        if not report.candidates:
            save_tasks([], output)
            report.seconds["total"] = time.monotonic() - started
            return report
        scratch.bundle(bundle, {_ref(t): t.base_commit for t in report.candidates})
        report.bundle = bundle
        tasks = report.candidates
        if options.validate:
            tasks = _validate(report, verifier, options, listener)
            report.seconds["validation"] = time.monotonic() - started - sum(report.seconds.values())
            if not tasks:
                bundle.unlink(missing_ok=True)
                report.bundle = None
            elif len(tasks) < len(report.candidates):
                scratch.bundle(bundle, {_ref(t): t.base_commit for t in tasks})
        save_tasks(tasks, output)
        report.tasks = tasks
    report.seconds["total"] = time.monotonic() - started
    return report


def _ref(task: Task) -> str:
    return f"refs/heads/synth/{task.instance_id.rsplit('.synth-', 1)[-1]}"


def _task(record: RepoRecord, attempt: Attempt, scratch: Scratch, rev: str, date: str, calls: dict[str, set[str]],
          bundle: str, options: SynthOptions, total: int) -> Task:
    messages = failure_messages(attempt.output, attempt.failing)
    apis = rank_apis(calls, attempt.failing)
    statement = safe_statement(record.repo, attempt.failing, messages, apis, total, attempt.changed)
    if options.rewrite_url and options.rewrite_model:
        statement = rewrite(statement, url=options.rewrite_url, model=options.rewrite_model,
                            api_key=options.rewrite_api_key, changed=attempt.changed,
                            transport=options.rewrite_transport)
    row = {
        **record.task_fields(),
        "instance_id": f"{record.repo.replace('/', '__')}.synth-{attempt.commit[:12]}",
        "base_commit": attempt.commit,
        "problem_statement": statement,
        "patch": scratch.diff(attempt.commit, rev),
        "test_patch": "",
        "FAIL_TO_PASS": attempt.failing,
        "PASS_TO_PASS": attempt.passing,
        "created_at": date,
        "repo_path": bundle,
        # Never shown to an agent (public_view leaves it out; the task file is hidden in sandboxes).
        "synth": {"kind": attempt.kind, "path": attempt.path, "function": attempt.function,
                  "mutation": attempt.description, "source_commit": rev, "seed": options.seed},
    }
    return Task.model_validate(row)


def _validate(report: SynthReport, verifier: Verifier, options: SynthOptions, listener: Listener) -> list[Task]:
    """Validate the candidates as loaded from a task file beside the output (so ``repo_path``
    resolves as it will for the written file); the valid ones."""
    scratch_file = report.output.with_name(f".{report.output.stem}.candidates-{uuid.uuid4().hex[:8]}.jsonl")
    try:
        save_tasks(report.candidates, scratch_file)
        task_set = TaskSet(load_tasks(scratch_file), str(scratch_file))
        listener.stage("validating", len(task_set))
        problems = 0

        def done(result: TaskValidation) -> None:
            nonlocal problems
            problems += 0 if result.ok else 1
            listener.step(f"{problems} problem(s)")

        report.validations = validate_tasks(task_set, verifier, runs=options.runs, workers=options.workers,
                                            on_done=done)
    finally:
        scratch_file.unlink(missing_ok=True)
    valid = {r.instance_id for r in report.validations if r.ok}
    return [t for t in report.candidates if t.instance_id in valid]
