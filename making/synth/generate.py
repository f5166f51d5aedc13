"""Making tasks by injecting bugs into a repository (SWE-smith style), for ``patchgym tasks synth``.

1. The repository at ``rev`` goes into a scratch bare clone; its suite runs once (the baseline).
2. Candidate functions are the ones the tests reach by name (:func:`reachable_functions`: a
   static heuristic, no coverage run).
3. Every mutation site there (:mod:`.mutations`) is put in an order fixed by the seed: each
   kind's sites shuffled, one site per function before a second one, kinds taking turns.
4. Mutants are made in that order and the whole suite runs with each applied (``workers`` at a
   time), without changing which tests are collected (an import or collection error changes it).
   A mutant that breaks a test that passed becomes a candidate task and is validated at once
   (gold resolves on each of ``runs`` runs, no change does not), its commit taken from a
   candidates bundle beside the output.
5. Each kept mutant becomes a commit whose tree has the bug and which has *no parent*: a parent
   with the correct tree would hand the fix to anyone running ``git show`` in the sandbox. The
   commits live in a git bundle beside the output (``<stem>.bundle``, one ref per task under
   ``refs/heads/synth/``), which each task's ``repo_path`` names. The gold patch is the diff from the
   bug back to ``rev``; there is no test patch (the hidden tests are the existing ones);
   FAIL_TO_PASS are the tests the bug breaks, PASS_TO_PASS every other test passing in both runs.
6. Outcomes are taken *in the order of step 3*, whichever worker finishes first: a valid task is
   added to the bundle, then appended to the output (:class:`~patchgym.making.incremental.TaskFile`),
   then the position is saved (:class:`~patchgym.making.incremental.Progress`), until ``n`` are
   written. So the output holds the first ``n`` valid tasks of the order whatever the workers, and a
   rerun of an interrupted run (same seed and kinds; the revision is the earlier run's) goes on
   after the last position saved and ends with the file an uninterrupted run writes.

The module is long (~680 lines) because steps 3-6 are one order: where mutants are ordered, tried,
judged and written in that order is what makes a rerun end with an uninterrupted run's file, and
it is read here in one place. The scratch repository (:mod:`.scratch`), the test map
(:mod:`.testmap`) and the resumable output (:mod:`patchgym.making.incremental`) are apart.
"""

from __future__ import annotations

import ast
import copy
import random
import re
import shlex
import shutil
import tempfile
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from patchgym.grading import integrity
from patchgym.grading.declared import files_of
from patchgym.grading.patches import is_test_or_config
from patchgym.grading.pyast import parse as parse_python
from patchgym.grading.testrun import TestRun, probe, run_tests
from patchgym.grading.verifier import Verifier
from patchgym.making.incremental import STOP_TIMEOUT, Progress, TaskFile, Workers
from patchgym.making.registry import RepoRecord
from patchgym.making.synth import mutations
from patchgym.making.synth.scratch import Scratch, SynthError
from patchgym.making.synth.statement import failure_messages, rank_apis, rewrite, safe_statement, test_calls
from patchgym.making.synth.testmap import TestMap, build_map
from patchgym.making.validation import TaskValidation, validate_task
from patchgym.sandboxes import Sandbox, SandboxError
from patchgym.tasks.backends import SandboxFactory
from patchgym.tasks.catalog import difficulty
from patchgym.tasks.model import Task

NON_SOURCE_DIRS = {"docs", "doc", "examples", "example", "benchmarks", "bench", "scripts", ".github"}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PROBE_TIMEOUT_FLOOR = 30.0  # seconds
PROBE_TIMEOUT_FACTOR = 10.0  # times the baseline run's (sandbox included)
WARM_RUNS = 50  # mutants checked in one warm sandbox before a fresh one (what test runs leave behind adds up)
LOOKAHEAD = 64  # mutants tried ahead of the first one not yet written or dropped


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
    fast: bool = True  # check each mutant with the tests that reach it (a traced run's map), warm
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
    check_seconds: float | None = None  # the first check's test run (warm, or the whole suite), in its worker

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
    ordered: list[tuple[str, mutations.Site]] = field(default_factory=list)  # the order mutants are tried in
    resumed: int = 0  # tasks the output already held
    interrupted: bool = False  # stopped by Ctrl-C: rerunning the same command goes on

    def dropped(self) -> Counter[str]:
        """Why tried mutants gave no task (those that broke tests beyond ``n`` included)."""
        written = {t.base_commit for t in self.tasks}
        ids = {t.base_commit: t.instance_id for t in self.candidates}
        problems = {v.instance_id: v.problems[0].split(" (")[0].split(":")[0] for v in self.validations if not v.ok}
        reasons: Counter[str] = Counter()
        for a in self.attempts:
            if a.verdict == "not run" or a.commit in written:
                continue
            problem = problems.get(ids.get(a.commit, ""))
            reasons[a.verdict or (f"failed validation: {problem}" if problem
                                  else "broke tests, not validated (beyond --n, or interrupted)")] += 1
        return reasons

    def by_kind(self) -> dict[str, tuple[int, int, int]]:
        """kind → (mutants tried, mutants that broke tests, tasks written)."""
        written = {t.base_commit for t in self.tasks}
        tried = Counter(a.kind for a in self.attempts if a.verdict != "not run")
        broke = Counter(a.kind for a in self.attempts if a.broke)
        kept = Counter(a.kind for a in self.attempts if a.commit in written)
        return {k: (tried[k], broke[k], kept[k]) for k in mutations.KINDS if tried[k] or broke[k] or kept[k]}


class Listener:
    """Progress of :func:`synthesize` (the command line draws bars); does nothing by default."""

    def stage(self, name: str, total: int | None, completed: int = 0) -> None:
        pass

    def step(self, status: str, advance: int = 1) -> None:
        pass

    def note(self, message: str) -> None:
        pass


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


def _unparametrized(test_id: str) -> str:
    return test_id.split("[", 1)[0]


def same_collection(run: set[str], baseline: set[str]) -> bool:
    """Whether two runs collected the same tests, up to parameter ids that differ from run to run.

    Some suites parametrize with values of the moment (marshmallow formats ``datetime.now()`` into
    its ids; an object's default repr holds its address): those ids never match across runs, so
    they may differ as long as each test function has as many cases; they are in neither list of
    a task, which takes only tests seen in both runs."""
    if run == baseline:
        return True
    return (all("[" in t for t in run ^ baseline)
            and Counter(map(_unparametrized, run)) == Counter(map(_unparametrized, baseline)))


def judge(run: TestRun, baseline: TestRun, max_failing_fraction: float = 1.0) -> tuple[str, list[str], list[str]]:
    """(verdict, tests the bug breaks, tests passing in both runs); an empty verdict keeps it."""
    if run.applied and not all(run.applied):
        return "the mutant does not apply", [], []
    if run.timed_out:
        return "the test run timed out", [], []
    if run.error or not run.statuses:
        return run.error or "no test results", [], []
    if not same_collection(set(run.statuses), set(baseline.statuses)):
        return "the collected tests changed (an import or collection error)", [], []
    failing = sorted(baseline.passed & run.failed)
    passing = sorted(baseline.passed & run.passed)
    if not failing:
        return "no test fails", [], []
    if len(failing) > max_failing_fraction * len(baseline.passed):
        return f"breaks {len(failing)} of {len(baseline.passed)} passing tests", failing, passing
    return "", failing, passing


@dataclass
class _Item:
    """One mutant on its way: checked, then (when it broke tests) made a task and validated."""

    attempt: Attempt
    state: str = "checking"  # checking (warm) → confirm → confirming (whole suite) → kept → validating → done
    selected: list[str] = field(default_factory=list)  # the tests the warm check ran
    task: Task | None = None
    validation: TaskValidation | None = None


def _mutant_stream(ordered: list[tuple[str, mutations.Site]],
                   start: int) -> Iterator[tuple[int, str, mutations.Mutant]]:
    """The mutants in order from position ``start`` (duplicates of an earlier one left out, from
    the first position on, so a resumed run skips exactly what an uninterrupted one does)."""
    seen: set[tuple[str, str]] = set()
    for index, (path, site) in enumerate(ordered):
        mutant = site.make()
        if mutant is None or (path, mutant.source) in seen:
            continue
        seen.add((path, mutant.source))
        if index >= start:
            yield index, path, mutant


@dataclass
class _Search:
    """The state :func:`synthesize` hands to :meth:`run` (the loop that tries mutants)."""

    record: RepoRecord
    options: SynthOptions
    report: SynthReport
    scratch: Scratch
    rev: str
    date: str
    modes: dict[str, str]
    sources: dict[str, str]
    baseline: TestRun
    calls: dict[str, set[str]]
    task_file: TaskFile
    progress: Progress
    workers: Workers
    verifier: Verifier
    listener: Listener
    probe_task: Task
    fast_task: Task
    test_map: TestMap | None = None
    candidates: dict[str, str] = field(default_factory=dict)  # candidate ref → commit
    local: threading.local = field(default_factory=threading.local)  # each worker's warm sandbox

    @property
    def bundle(self) -> Path:
        return self.report.output.with_suffix(".bundle")

    @property
    def candidates_bundle(self) -> Path:
        return self.report.output.with_name(f".{self.report.output.stem}.candidates.bundle")

    def status(self) -> str:
        attempts = self.report.attempts
        tried = sum(a.verdict != "not run" for a in attempts)
        broke = sum(a.broke for a in attempts)
        valid = sum(v.ok for v in self.report.validations)
        return f"tried {tried}, broke tests {broke}, validated {valid}"

    def run(self, start: int) -> None:
        options, workers = self.options, self.workers
        stream = _mutant_stream(self.report.ordered, start)
        line: deque[_Item] = deque()
        exhausted = False
        while len(self.task_file.tasks) < options.n:
            while workers.in_flight < max(1, options.workers):
                waiting = next((i for i in line if i.state == "kept"), None)
                if waiting is not None:
                    waiting.state = "validating"
                    task = waiting.task.model_copy(update={"repo_path": str(self.candidates_bundle)})
                    workers.submit(waiting, lambda t=task: validate_task(t, self.verifier, self.options.runs))
                    continue
                confirm = next((i for i in line if i.state == "confirm"), None)
                if confirm is not None:  # broke the tests that reach it: the whole suite, in a fresh sandbox
                    confirm.state = "confirming"
                    diff = self.scratch.diff(self.rev, confirm.attempt.commit)
                    workers.submit(confirm, lambda d=diff: probe(self.probe_task, [d], (), self.workers.factory))
                    continue
                pending = sum(i.task is not None and (i.validation is None or i.validation.ok) for i in line)
                if exhausted or len(self.task_file.tasks) + pending >= options.n or len(line) >= LOOKAHEAD:
                    break
                found = next(stream, None)
                if found is None:
                    exhausted = True
                    break
                line.append(self._check(*found))
            if not line:
                break
            for item, result, error in workers.results():
                if error is not None:
                    raise error
                self._finished(item, result)
            while line and line[0].state == "done" and len(self.task_file.tasks) < options.n:
                self._commit(line.popleft())
            self.listener.step(self.status(), 0)

    def _check(self, index: int, path: str, mutant: mutations.Mutant) -> _Item:
        commit = self.scratch.commit(self.rev, path, self.modes[path], mutant.source,
                                     f"{self.record.repo} at {self.rev[:12]}", self.date)
        attempt = Attempt(index, mutant.kind, path, mutant.function, mutant.description, commit,
                          mutations.changed_lines(self.sources[path], mutant.source))
        self.report.attempts.append(attempt)
        item = _Item(attempt)
        if self.test_map is not None:
            tests = sorted(self.test_map.tests(path, mutant.function))
            if not tests:
                attempt.verdict, item.state = "no test reaches the function (traced run)", "done"
                return item
            item.selected = tests
            self.workers.submit(item, lambda: _timed(attempt, self._warm, path, mutant.source, tests))
            return item
        diff = self.scratch.diff(self.rev, commit)
        self.workers.submit(item, lambda: _timed(attempt, probe, self.probe_task, [diff], (), self.workers.factory))
        item.state = "confirming"
        return item

    def _warm(self, path: str, source: str, tests: list[str]) -> TestRun:
        """The mutant's file written into this worker's warm sandbox, the tests that reach it run,
        and the file (and what the run wrote) put back; a sandbox whose run went wrong is dropped."""
        local = self.local
        sandbox = getattr(local, "sandbox", None)
        if sandbox is None or local.uses >= WARM_RUNS:
            if sandbox is not None:
                _close(sandbox)
            sandbox = local.sandbox = self.workers.factory(self.fast_task)
            local.uses = 0
        local.uses += 1
        # Put back after the run, each once: the test files (the run renames their tests, grading.twins:
        # the next run in this sandbox would ask for names they no longer have and collect nothing),
        # the canaries' module (usually one of them; None: it was not there) and the mutated file.
        saved: dict[str, bytes | str | None] = {file: sandbox.read_file(file) for file in files_of(tests)}
        canary = integrity.canary_path(tests)
        if canary not in saved:
            try:
                saved[canary] = sandbox.read_file(canary)
            except FileNotFoundError:
                saved[canary] = None
        saved[path] = self.sources[path]
        sandbox.write_file(path, source)
        cache = shlex.quote(str(PurePosixPath(path).parent / "__pycache__"))
        sandbox.exec(f"rm -rf {cache}", timeout=60)
        run = None
        try:
            run = run_tests(sandbox, self.fast_task.test_spec, tests)
        finally:
            try:
                for file, content in saved.items():
                    if content is not None:
                        sandbox.write_file(file, content)
                gone = [shlex.quote(file) for file, content in saved.items() if content is None]
                sandbox.exec(f"rm -rf .patchgym-* {' '.join(gone)}", timeout=60)
            except (SandboxError, OSError):
                run = None
            if run is None or run.timed_out or run.error:
                _close(sandbox)
                local.sandbox = None
        return run

    def _finished(self, item: _Item, result: TestRun | TaskValidation) -> None:
        if isinstance(result, TaskValidation):
            item.validation = result
            self.report.validations.append(result)
            item.state = "done"
            return
        attempt = item.attempt
        if item.state == "checking":  # the warm check with the tests that reach the function
            # Only the selected tests count: whatever else the runner reported (a whole file's other
            # parameters, the canaries' verdict) is for the whole-suite run to judge.
            reach = TestRun({t: self.baseline.statuses[t] for t in item.selected}, "", "", 0, False)
            functions = {_unparametrized(t) for t in reach.statuses}  # and their cases with ids of the moment
            seen = TestRun({t: s for t, s in result.statuses.items() if t in reach.statuses or (
                                t not in self.baseline.statuses and _unparametrized(t) in functions)}, "", "", 0,
                           result.timed_out, result.error, result.applied)
            attempt.verdict, attempt.failing, attempt.passing = judge(seen, reach)
            item.state = "confirm" if attempt.broke else "done"
            return
        attempt.verdict, attempt.failing, attempt.passing = judge(result, self.baseline,
                                                                  self.options.max_failing_fraction)
        if not attempt.broke:
            item.state = "done"
            return
        attempt.output = result.output
        item.task = _task(self.record, attempt, self.scratch, self.rev, self.date, self.calls, self.bundle.name,
                          self.options, len(self.baseline.statuses))
        self.report.candidates.append(item.task)
        if not self.options.validate:
            item.state = "done"
            return
        self.candidates[f"refs/candidates/{attempt.commit}"] = attempt.commit
        self.scratch.bundle(self.candidates_bundle, self.candidates)
        item.state = "kept"

    def _commit(self, item: _Item) -> None:
        """Write what ``item`` gave, in order: its task (bundle first, then the task's line), then how far we got."""
        if item.task is not None and (item.validation is None or item.validation.ok):
            refs = {_ref(t): t.base_commit for t in [*self.task_file.tasks, item.task]}
            self.scratch.bundle(self.bundle, refs)
            self.report.bundle = self.bundle
            self.task_file.append(item.task)
            self.report.tasks.append(item.task)
            self.listener.step(self.status(), 1)
        self.progress.write(item.attempt.index + 1)


# -- the whole pipeline --------------------------------------------------------------------------------


def synthesize(record: RepoRecord, output: Path, options: SynthOptions, *, verifier: Verifier | None = None,
               factory: SandboxFactory | None = None, listener: Listener | None = None) -> SynthReport:
    """Make ``options.n`` tasks from ``record`` by bug injection, appending each to ``output`` (JSONL,
    with the bundle of their commits beside it) as it is validated; a run on an ``output`` that
    holds tasks of an earlier run with the same options goes on from there. Ctrl-C returns the
    report with ``interrupted`` set. See the module docstring."""
    if options.n < 1:
        raise SynthError("--n must be at least 1")
    listener = listener or Listener()
    verifier = verifier or Verifier(factory)
    factory = factory or verifier.factory
    output = output.expanduser().resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    task_file = TaskFile(output, listener.note)
    earlier_rev = _resumable(task_file.tasks, options, output)
    report = SynthReport(record.repo, "", output, resumed=len(task_file.tasks))
    report.tasks = list(task_file.tasks)
    workdir = Path(tempfile.mkdtemp(prefix="patchgym-synth-"))
    workers: Workers | None = None
    try:
        scratch = Scratch(record.source, workdir)
        rev = report.rev = scratch.resolve(options.rev or earlier_rev, record.head)
        if earlier_rev and rev != earlier_rev:
            raise SynthError(f"{output} holds tasks made at {earlier_rev[:12]}, not {rev[:12]}: "
                             "rerun without --rev to go on, or write to another --output")
        bundle = output.with_suffix(".bundle")
        if task_file.tasks:
            if not bundle.exists():
                raise SynthError(f"{output} holds tasks but their bundle {bundle.name} is missing")
            scratch.fetch_bundle(bundle, "refs/heads/synth/*")
            report.bundle = bundle
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
        report.ordered = order_sites(found, options.seed)
        task_file.create()
        if len(task_file.tasks) >= options.n:
            listener.note(f"{output.name} already holds {len(task_file.tasks)} task(s); nothing to do")
            return report

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

        # A mutant may loop forever: its run gets a deadline from the baseline's, not the suite's own.
        timeout = options.probe_timeout or min(record.test_spec.timeout,
                                               max(PROBE_TIMEOUT_FLOOR, PROBE_TIMEOUT_FACTOR * baseline_seconds))
        check = record.probe_task(rev, instance_id="synth-probe")
        check = check.model_copy(update={"test_spec": check.test_spec.model_copy(update={"timeout": timeout})})
        fast = check.model_copy(update={"test_spec": check.test_spec.model_copy(update={"selection": "ids"})})
        test_map = None
        if options.fast:
            listener.stage("tracing which tests reach which function", 1)
            functions = {path: mutations.functions(trees[path]) for path in reach}
            test_map, why = build_map(record.probe_task(rev, instance_id="synth-map"), factory, functions,
                                      set(baseline.statuses))
            report.seconds["map"] = test_map.seconds if test_map else 0.0
            listener.step(f"{len(test_map.by_function)} functions reached" if test_map else why)
            if test_map is None:
                listener.note(f"every mutant is checked with the whole suite: {why}")
        defined = {f.qualname.rsplit(".", 1)[-1] for tree in trees.values() for f in mutations.functions(tree)}
        defined |= {n.name for tree in trees.values() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        progress = Progress(output, {"repo": record.repo, "rev": rev, "seed": options.seed,
                                     "kinds": list(options.kinds), "max_failing": options.max_failing_fraction,
                                     "validate": options.validate, "runs": options.runs, "fast": options.fast})
        start = max([_meta(t)["index"] + 1 for t in task_file.tasks] + [progress.read()])
        if start:
            listener.note(f"going on from an earlier run: {len(task_file.tasks)} task(s) written, "
                          f"mutants before #{start} done")
        workers = Workers(options.workers, factory)
        checked = copy.copy(verifier)
        checked.factory = workers.factory
        search = _Search(record, options, report, scratch, rev, scratch.date(rev), modes, sources, baseline,
                         test_calls(tests, sorted(baseline.statuses), defined), task_file, progress, workers,
                         checked, listener, check, fast, test_map)
        listener.stage("making tasks", options.n, len(task_file.tasks))
        listener.step(search.status(), 0)
        search.run(start)
        search.candidates_bundle.unlink(missing_ok=True)
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        ended = workers.stop() if workers is not None else True
        if ended:
            _remove(workdir)
        else:
            listener.note(f"a worker did not end within {STOP_TIMEOUT:.0f}s; its scratch space {workdir} is left")
        report.seconds["total"] = time.monotonic() - started
    return report


def _timed(attempt: Attempt, fn, *args):
    clock = time.monotonic()
    try:
        return fn(*args)
    finally:
        attempt.check_seconds = time.monotonic() - clock


def _close(sandbox: Sandbox) -> None:
    try:
        sandbox.close()
    except SandboxError:
        pass


def _remove(workdir: Path, patience: float = 5.0) -> None:
    """Remove the scratch space, again while a git process killed by Ctrl-C still lets go of it
    (``rmtree`` alone can leave what such a process wrote after it listed a directory)."""
    deadline = time.monotonic() + patience
    while True:
        shutil.rmtree(workdir, ignore_errors=True)
        if not workdir.exists() or time.monotonic() > deadline:
            return
        time.sleep(0.1)


def _meta(task: Task) -> dict:
    return (task.model_extra or {}).get("synth") or {}


def _resumable(tasks: list[Task], options: SynthOptions, output: Path) -> str | None:
    """The revision the tasks already in ``output`` were made at, when this run may go on from them."""
    if not tasks:
        return None
    metas = [_meta(t) for t in tasks]
    wanted = {"seed": options.seed, "kinds": list(options.kinds)}
    for meta in metas:
        if "index" not in meta or any(meta.get(k) != v for k, v in wanted.items()):
            raise SynthError(f"{output} holds tasks of another run (another --seed or --kinds, or not made by "
                             "tasks synth): write to another --output, or remove it")
    return metas[0].get("source_commit")


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
                  "mutation": attempt.description, "source_commit": rev, "seed": options.seed,
                  "kinds": list(options.kinds), "index": attempt.index},
    }
    return _with_difficulty(row)


def _with_difficulty(row: dict) -> Task:
    """The task with its ``difficulty`` recorded (:func:`patchgym.tasks.catalog.difficulty`)."""
    measured = difficulty(Task.model_validate(row))
    return Task.model_validate({**row, "difficulty": {k: v for k, v in measured.items() if k != "repo"}})
