"""The shared test runner: a whole suite at a commit with patches applied, each test's outcome."""

from gym_envs.grading.testrun import probe, probe_task


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
