"""Conflicting twins of the FAIL_TO_PASS tests and the hidden tests renamed (grading/twins.py): the
logic alone, without a sandbox (tests/test_forgery_round4.py grades them end to end)."""

from __future__ import annotations

import ast
import random

from patchgym.grading.outcome import TestStatus
from patchgym.grading.twins import make_twins

SOURCE = b'''import pytest

from pkg import bump


def test_bump_major():
    v = bump("1.2.3")
    assert v == "2.0.0"


def test_bump_count():
    assert len(bump("1.2.3")) == 5


def test_untouchable():
    assert bump("x") is None


def test_passing():
    assert bump("0.0.1") == "1.0.0"
'''
PATH = "tests/test_bump.py"
FAILING = [f"{PATH}::test_bump_major", f"{PATH}::test_bump_count", f"{PATH}::test_untouchable"]


def _twins(seed: int = 1):
    return make_twins({PATH: SOURCE}, FAILING, random.Random(seed))


def test_hidden_tests_are_renamed_and_mapped_back():
    twins = _twins()
    written = twins.files[PATH].decode()
    defined = {n.name for n in ast.parse(written).body if isinstance(n, ast.FunctionDef)}
    for test in FAILING:
        run = twins.run_id(test)
        assert run != test and twins.official_id(run) == test
        assert run.split("::")[1] in defined and test.split("::")[1] not in defined
    assert "def test_passing" in written  # only the FAIL_TO_PASS tests are renamed
    assert twins.official_id(twins.run_id(FAILING[0]) + "[a]") == FAILING[0] + "[a]"


def test_a_literal_compared_with_gets_conflicting_twins_of_its_type():
    twins = _twins()
    module = ast.parse(twins.files[PATH])
    functions = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
    for test, kind in ((FAILING[0], str), (FAILING[1], int)):
        run = twins.run_id(test)
        group = [run, *twins.twins[run]]
        assert 3 <= len(group) <= 5
        expected = [ast.literal_eval(functions[g.split("::")[1]].body[-1].test.comparators[0]) for g in group]
        assert all(type(e) is kind for e in expected) and len(set(expected)) == len(expected)
        assert all(twins.owns(t) for t in twins.twins[run]) and not twins.owns(run)
    assert twins.run_id(FAILING[2]) not in twins.twins  # nothing to change: renamed, no twins


def test_the_run_lists_each_group_in_random_order():
    orders = set()
    for seed in range(20):
        twins = _twins(seed)
        ids = twins.run_ids(FAILING)
        run = twins.run_id(FAILING[0])
        group = [run, *twins.twins[run]]
        assert sorted(ids[:len(group)]) == sorted(group)
        orders.add(ids.index(run))
    assert len(orders) > 1


def test_a_module_the_generator_runs_out_of_names_for_is_left_whole():
    source = b'def test_a():\n    assert f() == 1\n'
    twins = make_twins({"t.py": source}, ["t.py::test_a"], random.Random(0))
    assert twins.files == {} and twins.renamed == {} and twins.twins == {}
    assert twins.run_id("t.py::test_a") == "t.py::test_a"


def test_a_twin_that_passes_with_its_test_is_tampering_and_alone_is_a_wrong_answer():
    twins = _twins()
    run = twins.run_id(FAILING[0])
    twin = twins.twins[run][0]
    honest = {run: TestStatus.PASSED, **{t: TestStatus.FAILED for t in twins.twins[run]}}
    assert twins.problem(honest) is None
    assert "both passed" in twins.problem({**honest, twin: TestStatus.PASSED})
    # the base tree's bug (or an agent's wrong fix) can give exactly a twin's value: the test fails, honestly
    assert twins.problem({run: TestStatus.FAILED, twin: TestStatus.PASSED}) is None


def test_a_container_of_literals_gets_one_of_its_values_changed():
    source = SOURCE + (b'\n\ndef test_values_of_file():\n'
                       b'    assert values() == {"FIRST": "1", "SECOND": [2, "b"]}\n')
    twins = make_twins({"t.py": source}, ["t.py::test_values_of_file"], random.Random(3))
    run = twins.run_id("t.py::test_values_of_file")
    module = ast.parse(twins.files["t.py"])
    expected = {n.name: ast.literal_eval(n.body[-1].test.comparators[0]) for n in module.body
                if isinstance(n, ast.FunctionDef) and "values" in ast.unparse(n.body[-1])}
    group = [e.split("::")[1] for e in (run, *twins.twins[run])]
    assert expected[group[0]] == {"FIRST": "1", "SECOND": [2, "b"]}
    assert len({repr(expected[g]) for g in group}) == len(group)
    for name in group[1:]:  # the same keys: a number changed, never a key misspelt
        assert expected[name].keys() == expected[group[0]].keys()


def test_validation_calls_a_twin_that_passes_on_gold_or_base_a_problem_of_the_task():
    from patchgym import load_task_set
    from patchgym.grading.verifier import InstanceReport
    from patchgym.making.validation import validate_task

    task = load_task_set(None).get("patchgym__semverkit-1")

    class Grader:  # gold resolves; the base run finds a test and its twin both passing
        def verify(self, task, patch, run_empty=False):
            if patch:
                return InstanceReport(instance_id=task.instance_id, resolved=True, duration_seconds=0.0)
            return InstanceReport(instance_id=task.instance_id, tampering_detected=True, duration_seconds=0.0,
                                  tampering_reason="a hidden test and its conflicting twin both passed: t::x")

    validation = validate_task(task, Grader(), runs=1)
    assert validation.problems == ["tampering found on the base: a hidden test and its conflicting twin both passed: "
                                   "t::x"]


CLASS_SOURCE = b'''import unittest

from pkg import bump


class TestBump:
    def test_bump_major_part(self):
        v = bump("1.2.3")
        assert v == "2.0.0"

    def test_bump_patch_of_release(self):
        assert bump("0.0.1") == "1.0.0"


class TestBumpCase(unittest.TestCase):
    def test_count_release_parts(self):
        self.assertEqual(len(bump("1.2.3")), 5)
'''


def _methods(source: bytes) -> dict[str, dict[str, ast.FunctionDef]]:
    return {c.name: {m.name: m for m in c.body if isinstance(m, ast.FunctionDef)}
            for c in ast.parse(source).body if isinstance(c, ast.ClassDef)}


def test_a_method_of_a_test_class_is_renamed_in_its_class_and_gets_twins_there():
    failing = [f"{PATH}::TestBump::test_bump_major_part", f"{PATH}::TestBumpCase::test_count_release_parts"]
    twins = make_twins({PATH: CLASS_SOURCE}, failing, random.Random(2))
    methods = _methods(twins.files[PATH])
    assert "test_bump_patch_of_release" in methods["TestBump"]  # only the FAIL_TO_PASS tests are renamed
    for test, kind in zip(failing, (str, int), strict=True):
        run = twins.run_id(test)
        _, owner, name = run.split("::")
        assert owner == test.split("::")[1] and name in methods[owner] and twins.official_id(run) == test
        group = [run, *twins.twins[run]]
        assert 3 <= len(group) <= 5 and all(g.split("::")[1] == owner for g in group)
        values = []
        for member in group:
            last = methods[owner][member.split("::")[2]].body[-1]
            literal = last.test.comparators[0] if isinstance(last, ast.Assert) else last.value.args[1]
            values.append(ast.literal_eval(literal))
        assert all(type(v) is kind for v in values) and len(set(values)) == len(values)


def test_a_class_referred_to_keeps_its_methods_names_and_one_expecting_failures_gets_no_twins():
    """A subclass would run the renamed methods under its own name. Where a failure is expected
    (pytest's xfail, unittest's expectedFailure: on the test, its class or its module), a failing
    twin counts as passing, as its test does: renamed, no twins."""
    test = f"{PATH}::TestBump::test_bump_major_part"
    subclassed = CLASS_SOURCE + b"\n\nclass TestMore(TestBump):\n    pass\n"
    assert make_twins({PATH: subclassed}, [test], random.Random(0)).renamed == {}
    for source in (CLASS_SOURCE.replace(b"class TestBump:", b"@pytest.mark.xfail\nclass TestBump:"),
                   CLASS_SOURCE.replace(b"    def test_bump_major_part", b"    pytestmark = [pytest.mark.xfail]\n\n"
                                                                        b"    def test_bump_major_part"),
                   CLASS_SOURCE.replace(b"    def test_bump_major_part", b"    @unittest.expectedFailure\n"
                                                                        b"    def test_bump_major_part"),
                   b"pytestmark = pytest.mark.xfail(strict=False)\n" + CLASS_SOURCE):
        twins = make_twins({PATH: source}, [test], random.Random(0))
        assert twins.renamed and twins.twins == {}
    # Decorators that act on a test and its twins alike: settings, mocks, skips
    decorated = (CLASS_SOURCE.replace(b"class TestBump:", b"@override_settings(DEBUG=True)\nclass TestBump:")
                 .replace(b"    def test_bump_major_part(self)", b"    @mock.patch('pkg.now')\n"
                                                                  b"    def test_bump_major_part(self, now)"))
    assert make_twins({PATH: decorated}, [test], random.Random(0)).twins


# Other tests of the module: words for the name generator.
WORDS = b"def test_total_of_parts():\n    pass\n\n\ndef test_share_of_each_part():\n    pass\n\n\n"


def test_a_float_spelled_to_its_last_digit_gets_no_twin_equal_to_it():
    """0.30000000000000004 moved by a few units of its last digit is the same float (or within
    ``approx``'s tolerance): the twin would pass with the right answer, an honest fix called forged."""
    source = WORDS + b"def test_sum():\n    assert 0.1 + 0.2 == 0.30000000000000004\n"
    for seed in range(30):
        twins = make_twins({"t.py": source}, ["t.py::test_sum"], random.Random(seed))
        assert twins.twins == {} and twins.renamed
    source = WORDS + b"def test_ratio():\n    assert ratio() == 1.25\n"
    for seed in range(30):
        twins = make_twins({"t.py": source}, ["t.py::test_ratio"], random.Random(seed))
        module = ast.parse(twins.files["t.py"])
        values = sorted(ast.literal_eval(n.body[-1].test.comparators[0]) for n in module.body
                        if isinstance(n.body[-1], ast.Assert))
        assert 1.25 in values and all(b - a > 1e-5 * abs(b) for a, b in zip(values, values[1:], strict=False))


def test_a_comparison_with_what_equals_many_values_gets_no_twins():
    for test in (b"assert pytest.approx(ratio()) == 1.25", b"assert ratio() == approx(1.25)",
                 b"assert {'at': mock.ANY} == {'at': 3}", b"self.assertEqual(IsInt(), 3)"):
        source = WORDS + b"def test_ratio():\n    " + test + b"\n"
        twins = make_twins({"t.py": source}, ["t.py::test_ratio"], random.Random(0))
        assert twins.twins == {} and twins.renamed  # renamed all the same


def _group_values(source: bytes, test: str, seed: int) -> list[str]:
    """The source text of each member of ``test``'s group (the test first), empty without twins."""
    twins = make_twins({"t.py": source}, [f"t.py::{test}"], random.Random(seed))
    run = twins.run_id(f"t.py::{test}")
    functions = {n.name: n for n in ast.parse(twins.files["t.py"]).body if isinstance(n, ast.FunctionDef)}
    return [ast.unparse(functions[m.split("::")[1]]) for m in (run, *twins.twins.get(run, ()))]


def test_a_literal_bound_to_a_name_read_once_or_beside_expressions_gets_twins():
    named = WORDS + b'def test_render():\n    expected = "a 1.2 b"\n    actual = render()\n    assert actual == expected\n'
    mixed = WORDS + b'def test_render():\n    assert render() == ["a 1", version(), 2]\n'
    for source in (named, mixed):
        for seed in range(10):
            members = _group_values(source, "test_render", seed)
            assert 3 <= len(members) <= 5
            bodies = [m.split(":", 1)[1] for m in members]  # the names differ, the rest in one literal
            assert len(set(bodies)) == len(bodies)
    # read twice: the value is used for more than the comparison (the code under test gets it too)
    twice = WORDS + b'def test_render():\n    expected = "a 1.2 b"\n    assert render(expected) == expected\n'
    assert len(_group_values(twice, "test_render", 0)) == 1


def test_sympys_bare_ids_map_to_twins_and_a_name_two_modules_define_is_left():
    from patchgym.grading.runner_twins import sympy_twins

    body = b"def test_bump_count():\n    assert len(bump('1.2.3')) == 5\n"
    sources = {"a/test_a.py": WORDS + body, "b/test_b.py": b"def test_other_thing():\n    pass\n"}
    twins = sympy_twins(sources, ["test_bump_count", "test_total_of_parts"], {"test_total_of_parts"},
                        random.Random(4))
    group = twins.run_ids(["test_bump_count", "test_total_of_parts"])
    assert 3 <= len(group) - 1 <= 5 and group[-1] == "test_total_of_parts" and "test_bump_count" not in group
    assert all("::" not in name for name in group)
    renamed = next(name for name in group[:-1] if not twins.owns(name))
    statuses = {name: TestStatus.FAILED for name in group} | {renamed: TestStatus.PASSED}
    assert twins.problem(statuses) is None
    assert twins.to_official(statuses) == {"test_bump_count": TestStatus.PASSED, "test_total_of_parts": TestStatus.FAILED}
    forged = {name: TestStatus.PASSED for name in group}
    assert "both passed" in twins.problem(forged)
    # defined in both modules: the bare id names two tests, neither is renamed
    sources["b/test_b.py"] += b"\n\n" + body
    assert sympy_twins(sources, ["test_bump_count"], set(), random.Random(4)) is None


def test_djangos_ids_in_both_wordings_map_to_twins_of_the_method():
    from patchgym.grading.runner_twins import django_twins

    source = (b"from django.test import SimpleTestCase\n\n\nclass BumpTests(SimpleTestCase):\n"
              b"    def test_total_of_parts(self):\n        pass\n\n    def test_share_of_each_part(self):\n"
              b"        pass\n\n    def test_bump_count(self):\n        self.assertEqual(len(bump('1.2.3')), 5)\n")
    official = "test_bump_count (bumps.tests.BumpTests)"
    twins = django_twins({"tests/bumps/tests.py": source}, [official, "Docstring line."], set(), random.Random(5))
    group = twins.run_ids([official, "Docstring line."])
    assert group[-1] == "Docstring line." and 3 <= len(group) - 1 <= 5
    assert all(name.endswith(" (bumps.tests.BumpTests)") and official not in name for name in group[:-1])
    renamed = next(name for name in group[:-1] if not twins.owns(name))
    new = renamed.split()[0]
    statuses = {name: TestStatus.FAILED for name in group[:-1]} | {renamed: TestStatus.PASSED,
                                                                   f"{new} (bumps.tests.BumpTests.{new})": TestStatus.PASSED}
    assert twins.problem(statuses) is None
    assert twins.to_official(statuses) == {official: TestStatus.PASSED,
                                           "test_bump_count (bumps.tests.BumpTests.test_bump_count)": TestStatus.PASSED}
    assert "both passed" in twins.problem({name: TestStatus.PASSED for name in group[:-1]})


def test_a_test_whose_name_its_module_mentions_keeps_it():
    """pytester names a test's files after it: SWE-bench's pytest-5227 expects
    ``test_log_cli_default_level.py::test_log_cli`` in its output, and failed renamed."""
    source = WORDS + (b"def test_log_cli_default_level(testdir):\n"
                      b"    result = testdir.runpytest()\n"
                      b"    result.stdout.fnmatch_lines(['test_log_cli_default_level.py::test_log_cli '])\n"
                      b"    assert result.ret == 0\n")
    twins = make_twins({"t.py": source}, ["t.py::test_log_cli_default_level"], random.Random(0))
    assert twins.renamed == {} and twins.twins == {}
    # a longer name that starts with it is no mention
    other = source.replace(b"'test_log_cli_default_level.py::", b"'test_log_cli_default_level_of.py::")
    assert make_twins({"t.py": other}, ["t.py::test_log_cli_default_level"], random.Random(0)).twins
