"""Reading junit XML into node ids and statuses, and SWE-bench's resolution rules."""

from __future__ import annotations

import subprocess
import sys

import pytest

from patchgym.grading.outcome import JunitError, TestStatus, grade, lookup, parse_junit

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


INHERITED_JUNIT = """<testsuites><testsuite name="pytest">
<testcase classname="tests.test_child.TestChild" name="test_m" file="tests/a/test_base.py" line="1"/>
<testcase classname="tests.test_child.TestBase" name="test_m[1]" file="tests/a/test_base.py" line="1"/>
<testcase classname="tests.test_child" name="test_f" file="tests/a/test_base.py" line="4"><failure message="x"/></testcase>
<testcase classname="app.tests.TestChild" name="test_m" file="app/base.py" line="4"/>
<testcase classname="tests.test_ab.TestK" name="test_k" file="tests/test_a.py" line="4"/>
</testsuite></testsuites>"""


def test_tests_defined_in_another_file_get_the_id_pytest_prints():
    """itsdangerous: a class inherits its test methods from a base class in another test file.
    pytest's junit ``file`` names the file that defines the method; the id (what pytest prints,
    what SWE-bench records) is the collecting module's and class's, which ``classname`` keeps."""
    assert parse_junit(INHERITED_JUNIT) == {
        "tests/test_child.py::TestChild::test_m": TestStatus.PASSED,
        "tests/test_child.py::TestBase::test_m[1]": TestStatus.PASSED,
        "tests/test_child.py::test_f": TestStatus.FAILED,  # a test function imported from another file
        "app/tests.py::TestChild::test_m": TestStatus.PASSED,  # a module not named test_*
        "tests/test_ab.py::TestK::test_k": TestStatus.PASSED,  # a module whose name starts with another's
    }


def test_junit_ids_of_inherited_tests_match_pytest_s_own(tmp_path):
    """The same through pytest itself: every id read from its junit is one it printed."""
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_base.py").write_text(
        "import pytest\n\nclass TestBase:\n    def test_m(self):\n        pass\n\n"
        "    @pytest.mark.parametrize('n', [1, 2])\n    def test_p(self, n):\n        assert n == 1\n\n"
        "def test_f():\n    pass\n")
    (tmp_path / "tests" / "test_child.py").write_text(
        "from a.test_base import TestBase, test_f\n\n\nclass TestChild(TestBase):\n    pass\n")
    junit = tmp_path / "junit.xml"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", f"--junitxml={junit}",
         "-o", "junit_family=xunit1", "--rootdir", str(tmp_path), "tests"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120).stdout
    printed = {line.split()[1]: line.split()[0] for line in out.splitlines()
               if line.startswith(("PASSED ", "FAILED "))}
    assert "tests/test_child.py::TestChild::test_m" in printed, out
    statuses = parse_junit(junit.read_text())
    assert {node: status.value for node, status in statuses.items()} == printed
