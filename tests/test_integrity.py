"""The run-integrity checks on their own: canaries, and the reporter's view of what each phase
raised. The attacks these checks stop are in test_reward_forgery.py; here, that honest runs of
every kind of test are believed, and that the checks read the records the way they should."""

from __future__ import annotations

import json

import pytest

from patchgym.grading import integrity
from patchgym.grading.outcome import TestStatus
from patchgym.grading.testrun import run_tests


def test_canaries_come_in_random_numbers_and_do_what_they_claim():
    counts = set()
    for _ in range(40):
        canaries = integrity.make_canaries("tests/test_x.py", b"from calc import add\n")
        assert 1 <= len(canaries.must_pass) <= 3 and 3 <= len(canaries.must_fail) <= 6
        assert len(set(canaries.ids)) == len(canaries.ids)
        counts.add((len(canaries.must_pass), len(canaries.must_fail)))
        namespace: dict = {"add": object()}
        exec(canaries.source, namespace)  # noqa: S102 - our own generated source
        for test_id in canaries.ids:
            function = namespace[test_id.split("::")[1]]
            try:
                function()
                passed = True
            except AssertionError:
                passed = False
            assert passed == (test_id in canaries.must_pass), canaries.source
    assert len(counts) > 3, "the numbers of canaries should vary from run to run"


HIDDEN_MODULE = b'''"""Tests."""
import pytest
from calc import (add,
                  mean)

CASES = [1, 2]


@pytest.mark.parametrize("n", CASES)
def test_one(n):
    text = """
def test_not_a_test(): pass
"""
    assert add(n, 0) == n


class TestTwo:
    def test_three(self):
        assert mean([1]) == 1


def test_four():
    assert True
'''


def test_canaries_spread_through_a_whole_file_keep_its_tests_and_their_order():
    """Where pytest runs whole files, the canaries run where they sit: anywhere after the imports,
    not always after the module's own tests (a forger would spare the end of each module)."""
    import ast

    own = ["test_one", "TestTwo", "test_four"]
    not_last = 0
    for _ in range(30):
        canaries = integrity.make_canaries("tests/test_x.py", HIDDEN_MODULE)
        text = canaries.written_into(HIDDEN_MODULE, spread=True).decode()
        tree = ast.parse(text)
        names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert [n for n in names if n in own] == own, "the module's tests stay, in their order"
        assert sorted(n for n in names if n not in own) == sorted(i.split("::")[1] for i in canaries.ids)
        first_canary = min(i for i, n in enumerate(names) if n not in own)
        assert all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body[1:3]), "imports first"
        assert "def test_not_a_test(): pass" in text and text.count("CASES = [1, 2]") == 1
        not_last += first_canary < names.index("test_four")
    assert not_last >= 10, "canaries should often run before the module's last test"
    # a module that does not parse gets them appended, as where ids run
    broken = b"def test_x(:\n"
    canaries = integrity.make_canaries("t.py", broken)
    assert canaries.written_into(broken, spread=True) == canaries.written_into(broken)


def _records(*reports: dict) -> str:
    lines = [{"event": "start", "pid": 1}]
    lines += [{"event": "report", "xfail": False, "declared": True, **r} for r in reports]
    lines += [{"event": "finish", "exitstatus": 1}, {"event": "exit", "code": 1}, {"event": "end", "status": 1}]
    return "\n".join(json.dumps(line) for line in lines) + "\n"


def test_a_phase_that_raised_but_reports_passed_is_tampering():
    record = integrity.parse_record(_records(
        {"nodeid": "t.py::a", "when": "call", "outcome": "passed", "raised": True}))
    assert record.rewritten == ["t.py::a (call)"]
    reason = integrity.check_run(exit_code=1, output="", junit={"t.py::a": TestStatus.PASSED},
                                 record=record, reporter=True, requested=["t.py::a"], canaries=None)
    assert reason is not None and "t.py::a (call) raised" in reason


def test_raised_and_skipped_or_failed_is_honest():
    record = integrity.parse_record(_records(
        {"nodeid": "t.py::a", "when": "setup", "outcome": "skipped", "raised": True},
        {"nodeid": "t.py::b", "when": "call", "outcome": "failed", "raised": True},
        {"nodeid": "t.py::c", "when": "call", "outcome": "passed"}))  # an older reporter's line
    assert record.rewritten == []


def test_pytest_3s_instance_node_in_an_id_is_the_test_junit_names():
    """pytest < 4.0 reports a method as ``m.py::C::()::test_x``, junit and SWE-bench as
    ``m.py::C::test_x``: an honest run under pytest 3.5 (marshmallow-1359 as an automatic recipe
    first chose it) was called tampering, "the runner saw it missing"."""
    record = integrity.parse_record(_records(
        *({"nodeid": "t.py::C::()::a", "when": when, "outcome": "passed"} for when in ("setup", "call", "teardown")),
        {"nodeid": "t.py::C::()::b", "when": "call", "outcome": "failed"}))
    assert record.statuses == {"t.py::C::a": TestStatus.PASSED, "t.py::C::b": TestStatus.FAILED}
    junit = {"t.py::C::a": TestStatus.PASSED, "t.py::C::b": TestStatus.FAILED}
    assert integrity.check_run(exit_code=1, output="", junit=junit, record=record, reporter=True,
                               requested=list(junit), canaries=None) is None
    twice = integrity.parse_record(_records({"nodeid": "t.py::C::()::a", "when": "call", "outcome": "failed"},
                                            {"nodeid": "t.py::C::a", "when": "call", "outcome": "passed"}))
    assert twice.reported_twice == ["t.py::C::a"]


TRICKY_TESTS = '''\
import unittest

import pytest


class TestCaseStyle(unittest.TestCase):
    def test_unittest_passes(self):
        self.assertEqual(1, 1)

    def test_unittest_fails(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_unittest_expected_failure(self):
        self.assertEqual(1, 2)

    @unittest.skip("not here")
    def test_unittest_skipped(self):
        pass


@pytest.mark.xfail(raises=ZeroDivisionError)
def test_xfail_raising():
    1 / 0


@pytest.fixture
def skipping():
    pytest.skip("no resource")


def test_skip_in_fixture(skipping):
    pass


@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown")


def test_error_in_teardown(broken_teardown):
    pass


def test_plain_pass():
    assert True


def test_plain_fail():
    assert False
'''


def test_honest_runs_of_every_kind_are_believed(calc_sandbox, calc_task):
    """unittest cases (which keep their failures instead of raising), xfail, skips from fixtures
    and teardown errors: the reporter's "raised" must never turn an honest run into tampering."""
    calc_sandbox.write_file("tests/test_tricky.py", TRICKY_TESTS)
    ids = [f"tests/test_tricky.py::{name}" for name in (
        "TestCaseStyle::test_unittest_passes", "TestCaseStyle::test_unittest_fails",
        "TestCaseStyle::test_unittest_expected_failure", "TestCaseStyle::test_unittest_skipped",
        "test_xfail_raising", "test_skip_in_fixture", "test_error_in_teardown", "test_plain_pass",
        "test_plain_fail")]
    run = run_tests(calc_sandbox, calc_task.test_spec, ids)
    assert run.tampering is None and run.error is None, run.output[-3000:]
    status = {t.rsplit("::", 1)[1]: s for t, s in run.statuses.items()}
    assert status == {
        "test_unittest_passes": TestStatus.PASSED, "test_unittest_fails": TestStatus.FAILED,
        "test_unittest_expected_failure": TestStatus.XFAIL, "test_unittest_skipped": TestStatus.SKIPPED,
        "test_xfail_raising": TestStatus.XFAIL, "test_skip_in_fixture": TestStatus.SKIPPED,
        "test_error_in_teardown": TestStatus.ERROR, "test_plain_pass": TestStatus.PASSED,
        "test_plain_fail": TestStatus.FAILED,
    }, run.output[-3000:]


@pytest.mark.parametrize("spared", [0, 2])
def test_every_must_fail_canary_is_checked(spared):
    """Sparing a few must-fail canaries (letting them fail) while forcing the others to pass is
    caught: each one is checked, not just the first."""
    canaries = integrity.make_canaries("t.py")
    junit = {c: TestStatus.PASSED for c in canaries.must_pass}
    junit |= {c: (TestStatus.FAILED if i < spared else TestStatus.PASSED)
              for i, c in enumerate(canaries.must_fail)}
    reason = integrity.check_run(exit_code=1, output="", junit=junit, record=None, reporter=False,
                                 requested=[], canaries=canaries)
    assert reason is not None and "must fail" in reason


def test_canaries_a_crashed_session_never_ran_are_not_tampering():
    """pytest-7168's bug is an INTERNALERROR (exit 3) at its own test: the session ends there, and
    canaries placed after it never run. That is no sign of forgery (the run is inconsistent, so not
    resolved, anyway); a canary that did run with the wrong outcome still is."""
    canaries = integrity.make_canaries("t.py")
    ran = {canaries.must_pass[0]: TestStatus.PASSED, canaries.must_fail[0]: TestStatus.FAILED}
    lines = [{"event": "start", "pid": 1}]
    lines += [{"event": "report", "nodeid": c, "when": "call", "xfail": False, "declared": True,
               "outcome": "passed" if s is TestStatus.PASSED else "failed"} for c, s in ran.items()]
    lines += [{"event": "finish", "exitstatus": 3}, {"event": "exit", "code": 3}, {"event": "end", "status": 3}]
    record = integrity.parse_record("\n".join(json.dumps(line) for line in lines) + "\n")
    assert set(record.statuses) == set(ran)
    assert integrity.check_run(exit_code=3, output="INTERNALERROR>", junit=dict(ran), record=record,
                               reporter=True, requested=[], canaries=canaries) is None
    # the same canaries missing from a session that ended normally: they were made to vanish
    record.exit_code = record.end_status = 1
    reason = integrity.check_run(exit_code=1, output="", junit=dict(ran), record=record, reporter=True,
                                 requested=[], canaries=canaries)
    assert reason is not None and "canary" in reason
    # a canary that ran before the crash is still checked
    forged = {**ran, canaries.must_fail[0]: TestStatus.PASSED}
    record.exit_code, record.end_status, record.statuses = 3, 3, dict(forged)
    reason = integrity.check_run(exit_code=3, output="", junit=forged, record=record, reporter=True,
                                 requested=[], canaries=canaries)
    assert reason is not None and "must fail" in reason


AUTOUSE_PARAM_CONFTEST = '''
import pytest

@pytest.fixture(scope="session", autouse=True,
                params=(object(), pytest.param(object(), marks=pytest.mark.skipif(True, reason="no"))))
def _mod(request):
    return request.param
'''


def _variant_run(canaries: integrity.Canaries, outcomes: dict[str, tuple[str, str]]):
    """junit and the reporter's record of a run in which an autouse fixture with ``params``
    (markupsafe's conftest) parametrized every canary: ``outcomes`` maps each node id to its
    (phase, outcome), and every canary not in it ran as it should in ``[_mod0]`` and was skipped
    by its marker at setup in ``[_mod1]``."""
    reports = {}
    for canary in canaries.ids:
        reports[f"{canary}[_mod0]"] = ("call", "passed" if canary in canaries.must_pass else "failed")
        reports[f"{canary}[_mod1]"] = ("setup", "skipped")
    reports |= outcomes
    record = integrity.parse_record(_records(*(
        {"nodeid": node, "when": when, "outcome": outcome} for node, (when, outcome) in reports.items())))
    return record, dict(record.statuses)


def test_canaries_parametrized_by_an_autouse_fixture_are_read_through_their_variants():
    """markupsafe: each canary comes back as ``[_mod0]`` (ran) and ``[_mod1]`` (skipped at setup by
    its marker). That is an honest run, not tampering."""
    canaries = integrity.make_canaries("t.py")
    record, junit = _variant_run(canaries, {})
    assert integrity.check_run(exit_code=1, output="", junit=junit, record=record, reporter=True,
                               requested=[], canaries=canaries) is None
    assert integrity.check_run(exit_code=1, output="", junit=junit, record=None, reporter=False,
                               requested=[], canaries=canaries) is None
    assert canaries.owns(f"{canaries.must_pass[0]}[_mod1]") and canaries.owns(canaries.must_fail[0])
    assert not canaries.owns(f"{canaries.must_pass[0]}x[_mod1]")


@pytest.mark.parametrize("forgery", ["all_skipped", "fail_passes", "pass_fails", "skipped_in_call",
                                     "must_fail_errors", "junit_disagrees"])
def test_parametrized_canaries_still_catch_forgery(forgery):
    """Reading variants weakens nothing: every canary needs one variant with its outcome and no
    variant with another (but a skip at setup); a forger that skips every test is caught."""
    canaries = integrity.make_canaries("t.py")
    must_pass, must_fail = canaries.must_pass[0], canaries.must_fail[0]
    outcomes = {
        "all_skipped": {f"{c}[_mod0]": ("setup", "skipped") for c in canaries.ids},
        "fail_passes": {f"{must_fail}[_mod1]": ("call", "passed")},
        "pass_fails": {f"{must_pass}[_mod1]": ("call", "failed")},
        "skipped_in_call": {f"{must_pass}[_mod0]": ("call", "skipped")},
        "must_fail_errors": {f"{must_fail}[_mod0]": ("setup", "failed")},
        "junit_disagrees": {},
    }[forgery]
    record, junit = _variant_run(canaries, outcomes)
    if forgery == "junit_disagrees":
        junit[f"{must_fail}[_mod0]"] = TestStatus.PASSED
    reason = integrity.check_run(exit_code=1, output="", junit=junit, record=record, reporter=True,
                                 requested=[], canaries=canaries)
    assert reason is not None and ("canary" in reason or "junit report says" in reason), reason


def test_honest_run_under_an_autouse_parametrized_fixture_is_believed(calc_sandbox, calc_task):
    """The same through a real run: a conftest whose autouse fixture has ``params`` parametrizes
    the canaries the grader appends to the hidden module; their variants are read as the canaries,
    and kept out of the hidden tests' results."""
    calc_sandbox.write_file("tests/conftest.py", AUTOUSE_PARAM_CONFTEST)
    calc_sandbox.write_file("tests/test_tricky.py", "def test_plain_pass():\n    pass\n")
    ids = [f"tests/test_tricky.py::test_plain_pass[_mod{i}]" for i in (0, 1)]
    run = run_tests(calc_sandbox, calc_task.test_spec, ids)
    assert run.tampering is None and run.error is None, run.output[-3000:]
    assert run.statuses == {"tests/test_tricky.py::test_plain_pass[_mod0]": TestStatus.PASSED,
                            "tests/test_tricky.py::test_plain_pass[_mod1]": TestStatus.SKIPPED}, run.output[-3000:]
