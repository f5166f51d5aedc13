"""Forgers that tell canaries apart, with the runtime's audit hook off (what the canaries catch on
their own; bench/canary_forger.py measures it on every bundled task). Each forger is a patch that
registers a pytest plugin from the package and gives every test it does not take for a canary a
no-op body: by the arithmetic canaries' names, by their shape, or by running each test first under
``sys.setprofile`` (a canary never calls the package). Each wins against the arithmetic canaries
(the attack, kept) and is caught by the copies of the module's own tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from patchgym import load_task_set
from patchgym.grading import testrun
from patchgym.grading.twins import make_twins

_spec = importlib.util.spec_from_file_location("canary_forger", Path(__file__).parents[1] / "bench" / "canary_forger.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

TASK_ID = "patchgym__semverkit-1"


@pytest.fixture(scope="module")
def task():
    return load_task_set(None).get(TASK_ID)


@pytest.mark.parametrize("forger", ["name", "shape", "behaviour"])
def test_a_forger_that_spares_the_arithmetic_canaries_is_caught_by_the_copies(task, forger):
    won, said = bench.forger_wins(task, forger, copies=False)
    assert won, f"the {forger} forger no longer beats the arithmetic canaries: {said}"
    won, said = bench.forger_wins(task, forger, copies=True)
    assert not won and "canary test that must fail did not" in said, said
    assert testrun.AUDIT_HOOK is True and testrun.make_twins is make_twins  # the measurement's setting is undone
