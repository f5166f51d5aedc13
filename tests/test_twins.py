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
