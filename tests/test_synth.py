"""Synthetic tasks: the mutation kinds on small sources, bug reports, and the pipeline end to end."""

from __future__ import annotations

import difflib
import json
import textwrap
from pathlib import Path

import httpx
import pytest
from conftest import PYTEST_PIN, git
from typer.testing import CliRunner

from patchgym import load_tasks
from patchgym.cli.app import app as cli_app
from patchgym.grading.outcome import TestStatus
from patchgym.grading.pyast import parse as parse_python
from patchgym.grading.testrun import TestRun
from patchgym.grading.verifier import Verifier
from patchgym.making.registry import RepoRecord
from patchgym.making.synth import KINDS, SynthOptions, mutants, synthesize
from patchgym.making.synth.generate import judge, order_sites, reachable_functions, referenced_names
from patchgym.making.synth.mutations import changed_lines, sites
from patchgym.making.synth.statement import failure_messages, leaks, rewrite, safe_statement
from patchgym.tasks.model import EnvironmentConfig, TestSpec

SOURCE = textwrap.dedent('''\
    """Module docstring: 1 + 1 < 3 is never mutated."""

    import math

    LIMIT = 10  # a module constant: never mutated


    def scale(values, factor=2, *, strict=False):
        """Scale values (docstring kept)."""
        # a comment that must survive
        out = []
        for v in values[1:]:
            if v < 0 and strict:
                raise ValueError("negative")
            out.append(v * factor - 1)
        return out


    def mean(xs, digits=3):
        total = sum(xs) / len(xs)
        return round(total, digits)


    class Box:
        def area(self, w, h):
            if w == h:
                return w ** 2
            else:
                return w * h

        def stub(self):
            """Not implemented: stubs are never mutated."""
            raise NotImplementedError
''')


def _diff(old: str, new: str) -> list[str]:
    """The changed lines of a zero-context diff: '-old' and '+new'."""
    return [line for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def _changes(kind: str) -> list[list[str]]:
    return [_diff(SOURCE, m.source) for m in mutants(SOURCE, [kind])]


@pytest.mark.parametrize("kind, expected", [
    ("operator", ["-        out.append(v * factor - 1)", "+        out.append(v / factor - 1)"]),
    ("operator", ["-        out.append(v * factor - 1)", "+        out.append(v * factor + 1)"]),
    ("operator", ["-        if v < 0 and strict:", "+        if v < 0 or strict:"]),
    ("operator", ["-    total = sum(xs) / len(xs)", "+    total = sum(xs) * len(xs)"]),
    ("comparison", ["-        if v < 0 and strict:", "+        if v <= 0 and strict:"]),
    ("comparison", ["-        if w == h:", "+        if w != h:"]),
    ("off_by_one", ["-    for v in values[1:]:", "+    for v in values[0:]:"]),
    ("off_by_one", ["-    for v in values[1:]:", "+    for v in values[2:]:"]),
    ("off_by_one", ["-        if v < 0 and strict:", "+        if v < 1 and strict:"]),
    ("off_by_one", ["-            return w ** 2", "+            return w ** 3"]),
    ("remove_statement", ["-    out = []"]),
    ("remove_statement", ['-            raise ValueError("negative")', "+            pass"]),
    ("remove_statement", ["-    for v in values[1:]:", "-        if v < 0 and strict:", '-            raise ValueError("negative")',
                          "-        out.append(v * factor - 1)"]),
    ("remove_branch", ["-        else:", "-            return w * h"]),
    ("swap_operands", ["-        out.append(v * factor - 1)", "+        out.append(1 - v * factor)"]),
    ("swap_operands", ["-            return w ** 2", "+            return 2 ** w"]),
    ("swap_operands", ["-        if v < 0 and strict:", "+        if 0 < v and strict:"]),
    ("swap_arguments", ["-    return round(total, digits)", "+    return round(digits, total)"]),
    ("invert_condition", ["-        if v < 0 and strict:", "+        if not (v < 0 and strict):"]),
    ("invert_condition", ["-        if w == h:", "+        if not (w == h):"]),
    ("change_default", ["-def scale(values, factor=2, *, strict=False):", "+def scale(values, factor=3, *, strict=False):"]),
    ("change_default", ["-def scale(values, factor=2, *, strict=False):", "+def scale(values, factor=2, *, strict=True):"]),
    ("change_default", ["-def mean(xs, digits=3):", "+def mean(xs, digits=4):"]),
    ("break_return", ["-    return out", "+    return None"]),
    ("break_return", ["-    return round(total, digits)", "+    return total"]),
])
def test_each_kind_changes_exactly_one_thing(kind, expected):
    """The expected mutant is there, and its diff is exactly that change: comments, docstrings and
    every other line keep their text."""
    assert expected in _changes(kind)


@pytest.mark.parametrize("kind", KINDS)
def test_mutants_never_touch_docstrings_comments_constants_outside_functions_or_stubs(kind):
    made = mutants(SOURCE, [kind])
    assert made, f"no {kind} mutant of the sample"
    for mutant in made:
        old = [line[1:] for line in _diff(SOURCE, mutant.source) if line.startswith("-")]
        assert not any(s in line for line in old for s in ('"""', "#", "LIMIT", "import math", "NotImplemented"))
        assert mutant.source.count("# a comment that must survive") == 1
        assert mutant.function in ("scale", "mean", "Box.area") and mutant.kind == kind
        compile(mutant.source, "<mutant>", "exec")


def test_mutants_are_deterministic_and_without_duplicates():
    first, second = mutants(SOURCE), mutants(SOURCE)
    assert [m.source for m in first] == [m.source for m in second]
    assert len({m.source for m in first}) == len(first) and SOURCE not in {m.source for m in first}
    found = [("m.py", s) for s in sites(SOURCE)]
    order = [s.key for _, s in order_sites(found, 7)]
    assert order == [s.key for _, s in order_sites(list(reversed(found)), 7)]  # the input order does not matter
    assert order != [s.key for _, s in order_sites(found, 8)]
    assert [s.kind for _, s in order_sites(found, 7)][:len(KINDS)] == list(KINDS)  # kinds take turns


def test_a_change_no_small_splice_reproduces_regenerates_only_that_function():
    source = "X = [1,2]  # keep\n\n\ndef f(a):\n    a += 1; return a  # same line\n\n\ndef g():\n    return  X\n"
    made = [m for m in mutants(source, ["remove_statement"]) if m.function == "f"]
    # Two statements share a line: removing one means regenerating f, and nothing else.
    assert [m.source for m in made] == ["X = [1,2]  # keep\n\n\ndef f(a):\n    return a\n\n\ndef g():\n    return  X\n",
                                        "X = [1,2]  # keep\n\n\ndef f(a):\n    a += 1\n\n\ndef g():\n    return  X\n"]


def test_multiline_docstrings_survive_a_regenerated_function():
    source = 'def f(a):\n    """Line one.\n\n    Line two.\n    """\n    x = a; return x\n'
    made = mutants(source, ["break_return"])
    assert made and all('"""Line one.\n\n    Line two.\n    """' in m.source for m in made)


def test_functions_the_tests_reach_by_name():
    import ast

    trees = {"pkg/a.py": ast.parse("def used():\n    return helper()\n\ndef helper():\n    return 1\n\n"
                                   "def unused():\n    return 2\n\nclass Thing:\n    def __eq__(self, o):\n"
                                   "        return True\n"),
             "pkg/cli.py": ast.parse("def main():\n    return 0\n\ndef orphan():\n    return 1\n")}
    seeds = referenced_names(["from pkg.a import used, Thing\n\ndef test():\n    assert used()\n",
                              "def test_cli():\n    run(['python', '-c', 'import pkg.cli; pkg.cli.main()'])\n"])
    assert reachable_functions(trees, seeds) == {"pkg/a.py": {"used", "helper", "Thing.__eq__"},
                                                 "pkg/cli.py": {"main"}}


OUTPUT = """\
=================================== FAILURES ===================================
__________________________________ test_mean ___________________________________

    def test_mean():
>       assert mean([1, 2]) == 1.5
E       AssertionError: assert 3.0 == 1.5
E        +  where 3.0 = mean([1, 2])

tests/test_m.py:4: AssertionError
_____________________________ TestBox.test_area[2] _____________________________

>       return w ** 2
E       TypeError: unsupported operand type(s)

pkg/m.py:12: TypeError
=========================== short test summary info ============================
FAILED tests/test_m.py::test_mean - AssertionError: assert 3.0 == 1.5
FAILED tests/test_m.py::TestBox::test_area[2] - TypeError: unsupported operand...
FAILED tests/test_m.py::test_other - ValueError: bad
PASSED tests/test_m.py::test_ok
"""


def test_failure_messages_come_from_the_failure_reports_never_from_tracebacks():
    tests = ["tests/test_m.py::test_mean", "tests/test_m.py::TestBox::test_area[2]", "tests/test_m.py::test_other"]
    assert failure_messages(OUTPUT, tests) == {
        "tests/test_m.py::test_mean": "AssertionError: assert 3.0 == 1.5",
        "tests/test_m.py::TestBox::test_area[2]": "TypeError: unsupported operand type(s)",
        "tests/test_m.py::test_other": "ValueError: bad",
    }


def test_statements_leave_out_messages_quoting_the_changed_code():
    failing = ["tests/test_m.py::test_mean", "tests/test_m.py::test_b"]
    messages = {failing[0]: "AssertionError: assert 3.0 == 1.5", failing[1]: "NameError: total = sum(xs) * len(xs)"}
    text = safe_statement("o/m", failing, messages, ["mean"], 10, ["total = sum(xs) * len(xs)"])
    assert "`mean` gives wrong results" in text and "assert 3.0 == 1.5" in text and "2 of its 10 tests" in text
    assert "sum(xs)" not in text and "`tests/test_m.py::test_b` fails\n" in text


def test_rewrite_uses_the_endpoint_and_falls_back_on_any_error_or_leak():
    seen = []

    def reply(content: str, status: int = 200):
        def handler(request: httpx.Request) -> httpx.Response:
            seen.append((str(request.url), json.loads(request.content), request.headers.get("authorization")))
            return httpx.Response(status, json={"choices": [{"message": {"content": content}}]})
        return httpx.MockTransport(handler)

    kwargs = {"url": "http://llm.invalid/v1/", "model": "m", "changed": ["return w * h"]}
    assert rewrite("T", transport=reply("Nicer report"), api_key="k", **kwargs) == "Nicer report\n"
    assert seen[0][0] == "http://llm.invalid/v1/chat/completions" and seen[0][1]["model"] == "m"
    assert seen[0][2] == "Bearer k" and "T" in seen[0][1]["messages"][0]["content"]
    assert rewrite("T", transport=reply("x", status=500), **kwargs) == "T"
    assert rewrite("T", transport=reply("it does return w * h"), **kwargs) == "T"
    assert rewrite("T", transport=reply("   "), **kwargs) == "T"
    assert rewrite("T", url="http://127.0.0.1:9/v1", model="m", timeout=2) == "T"  # nothing listens there


def _run(statuses: dict[str, TestStatus], exit_code: int = 1) -> TestRun:
    return TestRun(statuses, "pytest", "", exit_code, False, applied=[True])


def test_judge_keeps_bugs_that_break_tests_but_not_collection():
    p, f = TestStatus.PASSED, TestStatus.FAILED
    baseline = _run({"t::a": p, "t::b": p, "t::c": f}, 1)
    assert judge(_run({"t::a": f, "t::b": p, "t::c": f}), baseline) == ("", ["t::a"], ["t::b"])
    assert judge(_run({"t::a": p, "t::b": p, "t::c": f}), baseline)[0] == "no test fails"
    assert "collected" in judge(_run({"t": TestStatus.ERROR}), baseline)[0]
    assert "breaks 2 of 2" in judge(_run({"t::a": f, "t::b": f, "t::c": f}), baseline, 0.5)[0]
    assert judge(TestRun({}, "pytest", "", None, True, applied=[True]), baseline)[0] == "the test run timed out"


def test_parameter_ids_of_the_moment_are_not_a_collection_change():
    """marshmallow parametrizes with ``datetime.now()`` formatted into the ids, so no two runs
    collect the same ids: a case whose id changed is not a collection error, and it is in neither
    list (only tests seen in both runs are); a test that is gone or new still is one."""
    p, f = TestStatus.PASSED, TestStatus.FAILED
    baseline = _run({"t::a": p, "t::now[22:50:02]": p, "t::now[x]": p}, 0)
    later = _run({"t::a": f, "t::now[22:50:11]": f, "t::now[x]": p})
    assert judge(later, baseline) == ("", ["t::a"], ["t::now[x]"])
    assert "collected" in judge(_run({"t::a": f, "t::now[x]": p}), baseline)[0]  # a case fewer
    assert "collected" in judge(_run({"t::a": f, "t::now[1]": p, "t::now[x]": p, "t::b": p}), baseline)[0]
    assert "collected" in judge(_run({"t::b": f, "t::now[22:50:11]": p, "t::now[x]": p}), baseline)[0]


# -- end to end -------------------------------------------------------------------------------------

MINI_V1 = {
    "pyproject.toml": '[project]\nname = "mini"\nversion = "0.1"\n',
    "mini/__init__.py": "from .core import clamp, mean\n",
    "mini/core.py": textwrap.dedent('''\
        """Tiny helpers."""


        def clamp(x, lo, hi):
            if lo > hi:
                raise ValueError("empty interval")
            return max(lo, min(x, hi))


        def mean(values):
            values = list(values)
            return sum(values) / len(values)
        '''),
    "tests/test_core.py": textwrap.dedent('''\
        import pytest

        from mini import clamp, mean


        def test_clamp():
            assert clamp(5, 0, 3) == 3
            assert clamp(-1, 0, 3) == 0
            assert clamp(2, 0, 3) == 2


        def test_clamp_bad_interval():
            with pytest.raises(ValueError):
                clamp(1, 3, 0)


        def test_mean():
            assert mean([1, 2, 3, 6]) == 3
        '''),
}
MINI_V2 = {
    "mini/core.py": MINI_V1["mini/core.py"] + textwrap.dedent('''\


        def span(values, pad=0):
            values = sorted(values)
            return values[-1] - values[0] + 2 * pad
        '''),
    "mini/__init__.py": "from .core import clamp, mean, span\n",
    "tests/test_span.py": textwrap.dedent('''\
        from mini import span


        def test_span():
            assert span([4, 1, 3]) == 3


        def test_span_pad():
            assert span([1, 2], pad=1) == 3
        '''),
}


def _write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)


@pytest.fixture(scope="module")
def mini_repo(tmp_path_factory) -> RepoRecord:
    repo = tmp_path_factory.mktemp("synth") / "mini"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    _write(repo, MINI_V1)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "clamp and mean")
    _write(repo, MINI_V2)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "span", date="2026-01-02T00:00:00Z")
    return RepoRecord(name="mini", repo="fixture/mini", source=str(repo),
                      environment=EnvironmentConfig(python=">=3.9", packages=[PYTEST_PIN]),
                      test_spec=TestSpec(timeout=120))


@pytest.mark.slow
def test_synth_end_to_end_on_a_small_repository(mini_repo, tmp_path):
    output = tmp_path / "out" / "mini.jsonl"
    report = synthesize(mini_repo, output, SynthOptions(n=3, seed=0, workers=2))
    tasks = load_tasks(output)
    assert 1 <= len(tasks) <= 3 and len(report.tasks) == len(tasks)
    assert all(v.ok for v in report.validations if v.instance_id in {t.instance_id for t in tasks})
    assert report.bundle == output.with_suffix(".bundle") and report.bundle.exists()
    heads = git(tmp_path, "bundle", "list-heads", str(report.bundle))
    verifier = Verifier()
    for task in tasks:
        assert task.repo_path == "mini.bundle" and task.test_patch == "" and task.FAIL_TO_PASS
        assert f"{task.base_commit} refs/heads/synth/" in heads
        meta = task.model_extra["synth"]
        assert meta["kind"] in KINDS and meta["path"] == "mini/core.py"
        assert task.instance_id.startswith("fixture__mini.synth-") and meta["kind"] not in task.instance_id
        # The bug's commit has no parent: the fixed tree is nowhere in the sandbox's history.
        clone = tmp_path / f"clone-{task.base_commit[:8]}"
        git(tmp_path, "clone", "-q", str(report.bundle), str(clone))
        assert git(clone, "rev-list", "--count", task.base_commit).strip() == "1"
        changed = changed_lines(git(clone, "show", f"{task.base_commit}:mini/core.py"), MINI_V2["mini/core.py"])
        assert changed and not leaks(task.problem_statement, changed)
        assert not any(line in task.problem_statement for line in changed if len(line) >= 5)
        assert "mini/core.py" not in task.problem_statement
        gold = verifier.verify(task, task.patch)
        assert gold.resolved, gold.error or gold.tests_status
        assert not verifier.verify(task, "", run_empty=True).resolved
    again = synthesize(mini_repo, tmp_path / "again.jsonl", SynthOptions(n=3, seed=0, workers=1))
    assert [t.instance_id for t in again.tasks] == [t.instance_id for t in tasks]  # same seed, same tasks


@pytest.mark.slow
def test_synth_command_on_a_bundled_library(tmp_path):
    from patchgym.cli import app

    output = tmp_path / "synth.jsonl"
    result = CliRunner().invoke(app, ["tasks", "synth", "--repo", "dotenvkit", "--n", "2", "--seed", "3",
                                      "--kinds", "comparison,off_by_one", "--output", str(output), "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert "yield per mutation kind" in result.output and "validated" in result.output
    tasks = load_tasks(output)
    assert len(tasks) >= 1 and {t.model_extra["synth"]["kind"] for t in tasks} <= {"comparison", "off_by_one"}
    bad = CliRunner().invoke(app, ["tasks", "synth", "--repo", "dotenvkit", "--n", "1", "--kinds", "nope",
                                   "--output", str(output)])
    assert bad.exit_code == 2 and "unknown mutation kind" in bad.output


# -- incremental, resumable, interruptible -----------------------------------------------------------------


def test_a_torn_last_line_is_cut_off_with_a_message(tmp_path):
    from patchgym.making.incremental import TaskFile
    from patchgym.tasks.model import load_tasks as load_file

    whole = tmp_path / "whole.jsonl"
    rows = Path(__file__).parent.parent / "tasks" / "instances"
    task = next(t for f in sorted(rows.glob("*.jsonl")) for t in load_file(f))
    TaskFile(whole).append(task)
    line = whole.read_bytes()
    for torn in (line + line[: len(line) // 2], line + b'{"instance_id": "x"\n'):
        path = tmp_path / "torn.jsonl"
        path.write_bytes(torn)
        notes: list[str] = []
        kept = TaskFile(path, notes.append)
        assert [t.instance_id for t in kept.tasks] == [task.instance_id] and path.read_bytes() == line
        assert len(notes) == 1 and "torn last line" in notes[0]
        kept.append(task)
        assert path.read_bytes() == line + line
    quiet: list[str] = []
    assert len(TaskFile(whole, quiet.append).tasks) == 1 and not quiet


def test_stopping_the_workers_closes_their_sandboxes_and_joins_them():
    import threading
    import time

    from patchgym.making.incremental import Workers

    class Box:
        def __init__(self) -> None:
            self.closed = threading.Event()

        def close(self) -> None:
            self.closed.set()

    def busy(box_of):
        box = box_of(None)
        box.closed.wait(60)  # a test command that only ends when its sandbox is closed
        return "ended"

    workers = Workers(2, lambda task: Box())
    workers.submit(1, lambda: busy(workers.factory))
    workers.submit(2, lambda: busy(workers.factory))
    started = time.monotonic()
    while len(workers._open) < 2 and time.monotonic() - started < 10:
        time.sleep(0.01)
    assert workers.stop(timeout=10) and time.monotonic() - started < 10
    with pytest.raises(Exception, match="stopped"):
        workers.factory(None)  # nothing new starts once stopped

    stuck = Workers(1, lambda task: Box())
    release, running = threading.Event(), threading.Event()
    stuck.submit(1, lambda: (running.set(), release.wait(60)))  # a job no sandbox close can end
    assert running.wait(10)
    assert not stuck.stop(timeout=0.3)  # bounded: says so instead of waiting
    release.set()


@pytest.mark.slow
def test_an_interrupted_synth_run_goes_on_to_the_same_task_file(tmp_path):
    """SIGINT halfway through, then the same command again: the task file and the bundle's refs
    are those of an uninterrupted run with the same seed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from patchgym.making.registry import get_repo

    args = ["--repo", "dotenvkit", "--n", "2", "--seed", "5", "--kinds", "comparison,off_by_one", "--workers", "1"]
    whole = tmp_path / "whole" / "synth.jsonl"
    report = synthesize(get_repo("dotenvkit"), whole, SynthOptions(n=2, seed=5, kinds=("comparison", "off_by_one")))
    assert len(report.tasks) == 2 and not report.interrupted

    cut = tmp_path / "cut" / "synth.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "patchgym.cli", "tasks", "synth", *args, "--output", str(cut)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        while proc.poll() is None and not (cut.exists() and cut.read_bytes().count(b"\n") >= 1):
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        log, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    if proc.returncode == 130:  # stopped before the second task: the first is kept, whole
        assert time.monotonic() - signalled < 30, log
        assert "interrupted: rerun the same command" in log
        assert len(load_tasks(cut)) == 1
    else:
        assert proc.returncode == 0, log  # it had finished just before the signal

    again = CliRunner().invoke(cli_app, ["tasks", "synth", *args, "--output", str(cut)])
    assert again.exit_code == 0, again.output
    assert cut.read_bytes() == whole.read_bytes()
    heads = git(tmp_path, "bundle", "list-heads", str(cut.with_suffix(".bundle")))
    assert heads == git(tmp_path, "bundle", "list-heads", str(whole.with_suffix(".bundle")))
    assert not list(cut.parent.glob(".*.candidates.bundle"))
    done = CliRunner().invoke(cli_app, ["tasks", "synth", *args, "--output", str(cut)])
    assert done.exit_code == 0 and "nothing to do" in done.output and cut.read_bytes() == whole.read_bytes()


@pytest.mark.slow
def test_the_traced_run_maps_each_test_to_the_functions_it_calls(mini_repo):
    from patchgym.grading.testrun import probe
    from patchgym.making.synth.mutations import functions
    from patchgym.making.synth.testmap import build_map
    from patchgym.tasks.backends import make_sandbox

    head = git(Path(mini_repo.source), "rev-parse", "HEAD").strip()
    task = mini_repo.probe_task(head)
    baseline = probe(task)
    source = (Path(mini_repo.source) / "mini/core.py").read_text()
    decorated = source.replace("def mean(", "@staticmethod\ndef mean(")  # first line: the decorator's
    test_map, why = build_map(task, make_sandbox, {"mini/core.py": functions(parse_python(source))},
                              set(baseline.statuses))
    assert test_map is not None, why
    assert test_map.tests("mini/core.py", "clamp") == {"tests/test_core.py::test_clamp",
                                                       "tests/test_core.py::test_clamp_bad_interval"}
    assert test_map.tests("mini/core.py", "mean") == {"tests/test_core.py::test_mean"}
    assert test_map.tests("mini/core.py", "span") == {"tests/test_span.py::test_span",
                                                      "tests/test_span.py::test_span_pad"}
    assert functions(parse_python(decorated))[1].lines[0] == source[: source.index("def mean(")].count("\n") + 1
    no_ids, why = build_map(task, make_sandbox, {"mini/core.py": functions(parse_python(source))}, {"t.py::x"})
    assert no_ids is None and "match" in why


@pytest.mark.slow
def test_rewritten_statements_come_from_the_endpoint_and_never_quote_the_fix(mini_repo, tmp_path):
    """``--rewrite-url/--rewrite-model`` against a scripted OpenAI-compatible endpoint over real
    HTTP: an honest rewrite becomes the problem statement; a model that quotes the original source
    (which holds the fix) is refused, and the template, which quotes neither side of the change,
    stays. (Validation is left out: it does not touch the statement, and takes most of the time.)"""
    from tests.fake_openai import FakeModel, Turn
    from tests.serving import serve

    honest = "Spans and means come out wrong\n\nSince upgrading, several results are off; the tests fail."
    leaky = "Here is how it should read:\n" + "\n".join(MINI_V2.values())
    for reply, output in ((honest, tmp_path / "honest.jsonl"), (leaky, tmp_path / "leaky.jsonl")):
        model = FakeModel(default=[Turn(text=reply)])
        with serve(model.app) as url:
            synthesize(mini_repo, output, SynthOptions(n=1, seed=0, workers=1, fast=False, validate=False,
                                                       rewrite_url=f"{url}/v1", rewrite_model="scripted-writer"))
        (task,) = load_tasks(output)
        fix = [line[1:].strip() for line in task.patch.splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---")) and len(line[1:].strip()) >= 5]
        assert fix and not leaks(task.problem_statement, fix), task.problem_statement
        assert model.requests and {r["model"] for r in model.requests} == {"scripted-writer"}
        prompt = model.requests[-1]["messages"][0]["content"]  # the written task's (earlier ones failed validation)
        assert "test_" in prompt and not leaks(prompt, fix), "the model is shown the symptoms, never the change"
        if reply is honest:
            assert task.problem_statement == honest + "\n"
        else:
            assert task.problem_statement != leaky + "\n" and task.problem_statement in prompt


@pytest.mark.slow
def test_a_suite_whose_parameter_ids_change_every_run_still_gives_tasks(tmp_path):
    """Like marshmallow's (``datetime.now()`` in its ids): no run collects the baseline's ids, yet a
    bug breaking the stable tests is kept, by the warm check and by the whole-suite run, and the
    cases of the moment are in neither list (before, every such mutant was dropped as a
    collection change, and marshmallow gave no task)."""
    repo = tmp_path / "stamp"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    _write(repo, {
        "pyproject.toml": '[project]\nname = "stamp"\nversion = "0.1"\n',
        "stamp.py": "def gap(a, b):\n    return b - a\n",
        "tests/test_gap.py": textwrap.dedent('''\
            import time

            import pytest

            from stamp import gap


            def test_gap():
                assert gap(2, 5) == 3


            @pytest.mark.parametrize("now", [time.time_ns()])
            def test_gap_now(now):
                assert gap(now, now + 1) == 1
            '''),
    })
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "gap")
    record = RepoRecord(name="stamp", repo="fixture/stamp", source=str(repo),
                        environment=EnvironmentConfig(python=">=3.9", packages=[PYTEST_PIN]),
                        test_spec=TestSpec(timeout=120))
    output = tmp_path / "out" / "stamp.jsonl"
    synthesize(record, output, SynthOptions(n=1, seed=0, workers=1, validate=False, kinds=("swap_operands",)))
    (task,) = load_tasks(output)
    assert task.FAIL_TO_PASS == ["tests/test_gap.py::test_gap"] and task.PASS_TO_PASS == []
