"""Which XFAILs and skips a test's own file declares (grading.declared), and grading by it."""

from __future__ import annotations

import textwrap

from patchgym.grading.declared import DeclaredTests, conftests_of, files_of
from patchgym.grading.outcome import TestStatus, grade

SOURCE = textwrap.dedent('''
    import pytest
    import unittest
    from pytest import mark
    known_bug = pytest.mark.xfail(reason="upstream")

    @pytest.mark.xfail(strict=True)
    def test_decorated(): pass

    @mark.xfail
    def test_bare_mark(): pass

    @known_bug
    def test_alias(): pass

    @pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.xfail)])
    def test_param_case(x): pass

    @pytest.mark.parametrize("x", [1, 2])
    def test_plain_param(x): pass

    def test_imperative():
        pytest.xfail("not yet")

    @pytest.fixture
    def broken():
        pytest.xfail("fixture says so")

    def test_via_fixture(broken): pass

    def test_plain():
        helper_skips()

    @pytest.mark.xfail
    class TestMarkedClass:
        def test_inside(self): pass

    class TestPytestmark:
        pytestmark = [pytest.mark.xfail]
        def test_inside(self): pass

    class TestPlain:
        def test_inside(self): pass

    class TestChild(TestMarkedClass):
        pass

    class TestUnit(unittest.TestCase):
        @unittest.expectedFailure
        def test_expected(self): pass

        def test_skips(self):
            self.skipTest("no network")

    def helper_skips():
        pass
''')


def declared() -> DeclaredTests:
    return DeclaredTests({"tests/test_m.py": SOURCE, "tests/test_module_marked.py":
                          "import pytest\npytestmark = pytest.mark.xfail\ndef test_a(): pass\n",
                          "tests/test_broken.py": b"def test_a(:\n", "tests/test_gone.py": None})


def test_markers_written_in_the_file_declare_an_xfail():
    d = declared()
    for name in ("test_decorated", "test_bare_mark", "test_alias", "test_param_case[2]", "test_param_case[1]",
                 "test_imperative", "test_via_fixture", "TestMarkedClass::test_inside",
                 "TestPytestmark::test_inside", "TestChild::test_inside", "TestUnit::test_expected"):
        assert d.declares_xfail(f"tests/test_m.py::{name}"), name
    assert d.declares_xfail("tests/test_module_marked.py::test_a")


def test_tests_the_file_marks_nowhere_declare_no_xfail():
    d = declared()
    for name in ("test_plain", "test_plain_param[1]", "TestPlain::test_inside", "TestUnit::test_skips"):
        assert not d.declares_xfail(f"tests/test_m.py::{name}"), name
    # A file that does not parse, is missing, or was never read declares nothing.
    for node in ("tests/test_broken.py::test_a", "tests/test_gone.py::test_a", "tests/other.py::test_a"):
        assert not d.declares_xfail(node)


def test_a_test_the_file_does_not_define_counts_as_declared_only_where_the_file_mentions_xfail():
    d = DeclaredTests({"a.py": "import pytest\nx = pytest.mark.xfail\n", "b.py": "def test_a(): pass\n"})
    assert d.declares_xfail("a.py::TestInherited::test_x")
    assert not d.declares_xfail("b.py::TestInherited::test_x")


def test_skips_are_declared_by_the_same_rules():
    d = declared()
    assert d.declares_skip("tests/test_m.py::TestUnit::test_skips")
    assert not d.declares_skip("tests/test_m.py::test_plain")


def test_test_files_are_the_python_files_of_node_ids():
    assert files_of(["t/a.py::x", "t/a.py::y", "t/b.py::C::z[1]", "t/dir", "t/c.txt::q"]) == ["t/a.py", "t/b.py"]


def test_an_undeclared_xfail_fails_both_sections_and_an_undeclared_call_skip_fails_pass_to_pass():
    statuses = {"f2p": TestStatus.XFAIL, "p2p": TestStatus.XFAIL, "p2p_skip": TestStatus.SKIPPED,
                "p2p_setup_skip": TestStatus.SKIPPED}
    g = grade(["f2p"], ["p2p", "p2p_skip", "p2p_setup_skip"], statuses, {"f2p", "p2p"}, {"p2p_skip"})
    assert g.tests_status["FAIL_TO_PASS"] == {"success": [], "failure": ["f2p"]}
    assert g.tests_status["PASS_TO_PASS"] == {"success": ["p2p_setup_skip"], "failure": ["p2p", "p2p_skip"]}
    assert not g.resolved
    declared_ok = grade(["f2p"], ["p2p", "p2p_skip"], statuses)
    assert declared_ok.resolved


def test_a_conftest_that_marks_xfails_declares_them_for_the_tests_below_it():
    assert conftests_of(["a/b/test_x.py", "test_y.py"]) == ["a/b/conftest.py", "a/conftest.py", "conftest.py"]
    marks = "def pytest_collection_modifyitems(items):\n    for i in items:\n        i.add_marker('xfail')\n"
    d = DeclaredTests({"a/b/test_x.py": "def test_x(): pass\n", "c/test_z.py": "def test_z(): pass\n"},
                      {"a/conftest.py": marks, "conftest.py": "import pytest\n", "c/conftest.py": None})
    assert d.declares_xfail("a/b/test_x.py::test_x")
    assert not d.declares_xfail("c/test_z.py::test_z")
