"""Reading junit XML into node ids and statuses, and SWE-bench's resolution rules."""

from __future__ import annotations

import pytest

from gym_envs.grading.outcome import JunitError, TestStatus, grade, lookup, parse_junit

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="7">
<testcase classname="tests.test_a" name="test_pass" file="tests/test_a.py" line="1" time="0.1"/>
<testcase classname="tests.test_a" name="test_fail" file="tests/test_a.py" line="3"><failure message="x">boom</failure></testcase>
<testcase classname="tests.test_a.TestK" name="test_m[a-1]" file="tests/test_a.py" line="5"/>
<testcase classname="tests.sub.test_b" name="test_skip" file="tests/sub/test_b.py"><skipped type="pytest.skip" message="no"/></testcase>
<testcase classname="tests.sub.test_b" name="test_xfail" file="tests/sub/test_b.py"><skipped type="pytest.xfail" message="known"/></testcase>
<testcase classname="tests.sub.test_b" name="test_err" file="tests/sub/test_b.py"><error message="fixture"/></testcase>
<testcase classname="tests.sub.test_b" name="test_teardown" file="tests/sub/test_b.py"><failure message="call"/></testcase>
<testcase classname="tests.sub.test_b" name="test_teardown" file="tests/sub/test_b.py"/>
</testsuite></testsuites>"""


def test_parse_junit_rebuilds_pytest_node_ids_and_statuses():
    statuses = parse_junit(JUNIT)
    assert statuses == {
        "tests/test_a.py::test_pass": TestStatus.PASSED,
        "tests/test_a.py::test_fail": TestStatus.FAILED,
        "tests/test_a.py::TestK::test_m[a-1]": TestStatus.PASSED,
        "tests/sub/test_b.py::test_skip": TestStatus.SKIPPED,
        "tests/sub/test_b.py::test_xfail": TestStatus.XFAIL,
        "tests/sub/test_b.py::test_err": TestStatus.ERROR,
        "tests/sub/test_b.py::test_teardown": TestStatus.FAILED,
    }


@pytest.mark.parametrize("text", ["", "<html/>", "not xml <"])
def test_unreadable_junit_is_an_error(text):
    with pytest.raises(JunitError):
        parse_junit(text)


def test_truncated_parametrized_ids_match_by_unique_prefix():
    statuses = {"t.py::test_x[a-very-long-param-that-got-cut]": TestStatus.PASSED, "t.py::test_y[1]": TestStatus.FAILED}
    assert lookup("t.py::test_x[a-very-long-param", statuses) is TestStatus.PASSED
    assert lookup("t.py::test_z[1]", statuses) is None
    ambiguous = {"t.py::test_x[ab]": TestStatus.PASSED, "t.py::test_x[ac]": TestStatus.PASSED}
    assert lookup("t.py::test_x[a", ambiguous) is None


def test_grade_rules():
    s = parse_junit(JUNIT)
    ok = grade(["tests/test_a.py::test_pass", "tests/sub/test_b.py::test_xfail"],
               ["tests/test_a.py::TestK::test_m[a-1]", "tests/sub/test_b.py::test_skip"], s)
    assert ok.resolved
    assert ok.tests_status["PASS_TO_PASS"]["success"] == ["tests/test_a.py::TestK::test_m[a-1]", "tests/sub/test_b.py::test_skip"]
    skipped_f2p = grade(["tests/sub/test_b.py::test_skip"], [], s)
    assert not skipped_f2p.resolved, "a skipped FAIL_TO_PASS test fails"
    missing = grade(["tests/test_a.py::test_pass"], ["tests/test_a.py::gone"], s)
    assert not missing.resolved and missing.missing == ["tests/test_a.py::gone"]
    broke = grade(["tests/test_a.py::test_pass"], ["tests/sub/test_b.py::test_err"], s)
    assert broke.tests_status["PASS_TO_PASS"]["failure"] == ["tests/sub/test_b.py::test_err"]
    assert set(broke.tests_status) == {"FAIL_TO_PASS", "PASS_TO_PASS", "FAIL_TO_FAIL", "PASS_TO_FAIL"}
