"""The shared test runner: a whole suite at a commit with patches applied, each test's outcome."""

import pytest

from patchgym.grading.testrun import probe, probe_task


def test_probe_runs_the_whole_suite_and_reports_each_test(calc_task):
    stand_in = probe_task(repo=calc_task.repo, base_commit=calc_task.base_commit, repo_path=str(
        calc_task.source_file.parent / calc_task.repo_path) if calc_task.repo_path else None,
        environment=calc_task.environment, test_spec=calc_task.test_spec)
    before = probe(stand_in, [calc_task.test_patch])
    after = probe(stand_in, [calc_task.test_patch, calc_task.patch])
    assert set(calc_task.FAIL_TO_PASS) <= before.failed
    assert set(calc_task.FAIL_TO_PASS) <= after.passed and not after.failed
    assert set(calc_task.PASS_TO_PASS) <= before.passed
    assert before.consistent and after.consistent and before.applied == [True]


def test_probe_reports_a_patch_that_does_not_apply(calc_task):
    stand_in = probe_task(repo=calc_task.repo, base_commit=calc_task.base_commit, repo_path=str(
        calc_task.source_file.parent / calc_task.repo_path) if calc_task.repo_path else None,
        environment=calc_task.environment, test_spec=calc_task.test_spec)
    bad = "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n"
    run = probe(stand_in, [bad])
    assert run.applied == [False] and run.statuses == {} and run.error


ORDER_TESTS = '''_seen = []


def test_first_fills_the_cache():
    _seen.append("filled")


def test_second_reads_what_the_first_left():
    assert _seen == ["filled"]
'''


def _with_order_dependent_tests(task, selection: str):
    """``task`` whose test patch also adds a module where a test passes only after the one before it
    (sphinx-8721's test_viewcode_epub_enabled passes only after test_viewcode, as SWE-bench ran it),
    and whose PASS_TO_PASS names only the second."""
    lines = ORDER_TESTS.splitlines()
    new_file = ("diff --git a/tests/test_order.py b/tests/test_order.py\nnew file mode 100644\n"
                f"--- /dev/null\n+++ b/tests/test_order.py\n@@ -0,0 +1,{len(lines)} @@\n"
                + "".join(f"+{line}\n" for line in lines))
    spec = task.test_spec.model_copy(update={"selection": selection})
    return task.model_copy(update={"test_patch": task.test_patch + new_file, "test_spec": spec,
                                   "PASS_TO_PASS": ["tests/test_order.py::test_second_reads_what_the_first_left"]})


@pytest.mark.parametrize("selection", ["files", "ids"])
def test_whole_files_run_as_swebench_ran_them(calc_task, selection):
    """With ``selection: files`` the files that hold the ids run whole, in their own order, and the
    grade reads the ids; with ``ids`` the second test runs alone and fails."""
    from patchgym.grading.verifier import Verifier
    from patchgym.tasks.backends import sandbox_factory

    task = _with_order_dependent_tests(calc_task, selection)
    report = Verifier(sandbox_factory("local")).verify(task, task.patch)
    command = report.test_output.splitlines()[0]
    assert not report.tampering_detected and not report.infrastructure_failure, report.test_output[-2000:]
    if selection == "files":
        assert report.resolved and report.reward == 1.0, report.test_output[-2000:]
        assert command.endswith(" tests/test_calc.py tests/test_order.py"), command
    else:
        assert not report.resolved
        assert report.tests_status["PASS_TO_PASS"]["failure"] == task.PASS_TO_PASS
        assert "tests/test_order.py::test_second_reads_what_the_first_left" in command


def test_copies_are_made_only_where_a_failing_test_has_no_twins(calc_task, monkeypatch):
    """Twins are the must-fail tests where every FAIL_TO_PASS test has them (a bundled dotenvkit
    task: each compares with a literal); calc-1's expects an exception, so it gets none and the run
    has canaries as before. Either way gold resolves with no tampering, and the traceback is one
    line per failure unless the task's command chooses a style."""
    from patchgym import load_task_set
    from patchgym.grading import integrity, testrun
    from patchgym.grading.verifier import Verifier

    made = []
    real = integrity.make_canaries
    monkeypatch.setattr(integrity, "make_canaries", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    verifier = Verifier()
    twinned = load_task_set().get("patchgym__dotenvkit-1")
    for task, copies in ((twinned, 0), (calc_task, 1)):
        report = verifier.verify(task, task.patch)
        assert report.resolved and not report.tampering_detected, report.error
        assert len(made) == copies, task.instance_id
        assert f" {testrun.TRACEBACK_STYLE} " in report.test_output.splitlines()[0]
        made.clear()
    chosen = calc_task.model_copy(update={"test_spec": calc_task.test_spec.model_copy(
        update={"command": calc_task.test_spec.command + " --tb=short"})})
    assert testrun.TRACEBACK_STYLE not in verifier.verify(chosen, chosen.patch).test_output.splitlines()[0]
