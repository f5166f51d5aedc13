"""Canaries copied from the hidden module's own tests (grading/canary_copies.py): that a
mutated copy really fails where its original passes, an unchanged one passes, in real pytest runs
(with a markupsafe-style autouse ``params`` fixture too); that they look like the module's tests;
and how a run of them is read (grading/integrity.py). The forgers they stop are in
test_canary_forgers.py."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from patchgym.grading import integrity
from patchgym.grading.outcome import TestStatus, parse_junit

PATH = "tests/test_things.py"

MODULE = textwrap.dedent('''\
    import pytest

    from things import Box, double, words


    def helper(x):
        return double(x)


    def test_double_small():
        assert double(2) == 4
        assert helper(3) == 6


    def test_box_holds_value():
        box = Box(3)
        assert box.value == 3
        assert 3 in box
        assert box.value is not None


    def test_words_split():
        assert words("a b") == ["a", "b"]
        assert not words("")


    def test_box_truthy():
        assert Box(1)
        assert Box(1).value != 2


    def test_words_join():
        assert words(
            "a b c"
        ) == ["a", "b", "c"], "split on spaces"
        for w in words("x y"):
            assert w
        with pytest.raises(AttributeError):
            words(None)


    def test_returns_early():
        assert double(1) == 2
        return


    @pytest.mark.parametrize("x, expected", [(1, 2), (5, 10)], ids=["one", "five"])
    def test_double_param(x, expected):
        assert double(x) == expected


    CASES = [("x y z", 3)]


    @pytest.mark.parametrize("text, count", CASES)
    def test_words_count(text, count):
        assert len(words(text)) == count


    def test_new_behaviour():
        assert double(-1) == -2


    class TestBox:
        def test_method(self):
            assert Box(2).value == 2
''')

THINGS = textwrap.dedent('''\
    class Box:
        def __init__(self, value):
            self.value = value

        def __contains__(self, item):
            return item == self.value


    def double(x):
        return 2 * x


    def words(text):
        return text.split()
''')

PASSING = [f"{PATH}::{n}" for n in ("test_double_small", "test_box_holds_value", "test_words_split",
                                    "test_box_truthy", "test_words_join", "test_returns_early",
                                    "test_double_param[one]", "test_double_param[five]",
                                    "test_words_count[text0-count0]", "TestBox::test_method")]
FAILING = [f"{PATH}::test_new_behaviour"]


def _run(tmp_path: Path, module: bytes, extra: dict[str, str] | None = None) -> tuple[int, dict[str, TestStatus]]:
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "things.py").write_text(THINGS)
    (tmp_path / PATH).write_bytes(module)
    for name, text in (extra or {}).items():
        (tmp_path / name).write_text(text)
    junit = tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                           "-o", "junit_family=xunit1", PATH], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    return done.returncode, parse_junit(junit.read_bytes())


def _canaries(seed: int) -> integrity.Canaries:
    return integrity.make_canaries(PATH, MODULE.encode(), passing=PASSING, failing=FAILING, seed=seed)


def test_copies_fail_and_pass_as_they_claim_in_a_real_run(tmp_path):
    """Across seeds, every mutation kind: each mutated copy fails and each unchanged copy passes
    wherever the original passes, parametrized ones variant by variant, and the run is believed."""
    for seed in range(4):
        canaries = _canaries(seed)
        assert canaries.originals and 3 <= len(canaries.must_fail) <= 6
        code, statuses = _run(tmp_path, canaries.written_into(MODULE.encode(), spread=True))
        assert code == 1
        for canary in canaries.ids:
            results = integrity.variants(canary, statuses)
            original = integrity.variants(canaries.original(canary), statuses)
            assert len(results) == len(original) >= 1, (canary, statuses)
            want = TestStatus.PASSED if canary in canaries.must_pass else TestStatus.FAILED
            assert set(results.values()) == {want}, (seed, canary, results)
        assert integrity.check_run(exit_code=code, output="", junit=statuses, record=None, reporter=False,
                                   requested=[], canaries=canaries) is None


def test_copies_look_like_the_module_s_tests():
    """Names in the module's style (``test_`` and its words), none it uses; bodies its own; each
    copy right after its original; only module-level tests known to pass are copied."""
    words = {w for n in ("double_small", "box_holds_value", "words_split", "box_truthy", "double_param",
                         "words_count", "new_behaviour", "method", "words_join", "returns_early")
             for w in n.split("_")}
    tree = ast.parse(MODULE)
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for seed in range(20):
        canaries = _canaries(seed)
        originals = dict(canaries.originals)
        assert set(originals) == set(canaries.ids)
        assert not {o.split("::")[-1] for o in originals.values()} & {"test_new_behaviour", "test_method"}
        for function, line in zip(canaries.functions, canaries.lines, strict=True):
            name = function.split("def ", 1)[1].split("(", 1)[0]
            assert name.startswith("test_") and name not in taken
            assert not any(c.isdigit() for c in name) and set(name[5:].split("_")) <= words
            original = originals[f"{PATH}::{name}"].split("::")[-1]
            end = next(n.end_lineno for n in tree.body if getattr(n, "name", None) == original)
            assert line >= end  # after the original, so every name its decorators read is bound
            assert "def test_" in function and ("assert" in function)
            # a mutated copy differs from its original in one assert statement of its own body
            copy = ast.parse(function).body[0]
            source = next(n for n in tree.body if getattr(n, "name", None) == original)
            assert original != "test_returns_early"  # a ``return`` may skip the assertion: not mutated
            changed = [(a, b) for a, b in zip(copy.body, source.body, strict=True) if ast.dump(a) != ast.dump(b)]
            if f"{PATH}::{name}" in canaries.must_pass:
                assert not changed and ast.dump(copy.args) == ast.dump(source.args)
            else:
                assert len(changed) == 1 and isinstance(changed[0][0], ast.Assert)
    assert integrity.make_canaries(PATH, MODULE.encode(), passing=PASSING, failing=FAILING, seed=7) == _canaries(7)
    assert _canaries(7) != _canaries(8)


def test_camel_case_names_and_modules_that_do_not_parse():
    module = b"from calc import add\n\n\ndef testAddSmall():\n    assert add(1, 2) == 3\n\n\n" \
             b"def testAddNegativeNumbers():\n    assert add(-1, -2) == -3\n"
    passing = ["t.py::testAddSmall", "t.py::testAddNegativeNumbers"]
    for seed in range(10):
        canaries = integrity.make_canaries("t.py", module, passing=passing, seed=seed)
        for canary in canaries.ids:
            name = canary.split("::")[1]
            assert name.startswith("test") and name[4].isupper() and "_" not in name
    for broken in (b"def test_x(:\n", b"\xff\xfe def", b""):
        canaries = integrity.make_canaries("t.py", broken, passing=["t.py::test_x"], seed=1)
        assert not canaries.originals and canaries.must_fail


def test_a_module_with_no_copyable_test_keeps_the_arithmetic_canaries():
    for passing in ([], [f"{PATH}::TestBox::test_method"], FAILING):
        canaries = integrity.make_canaries(PATH, MODULE.encode(), passing=passing, failing=FAILING, seed=1)
        assert not canaries.originals and not canaries.lines
        assert all("assert (" in f for f in canaries.functions)


def test_a_copy_is_read_against_its_original_and_its_guard():
    """A mutated copy must fail where its original and its guard passed; where the guard failed
    (a test that does not pass twice in a row) or the original failed (not resolved anyway), an
    honest run is not called forged; a guard or copy taken out of the run is."""
    canaries = integrity.Canaries(PATH, (f"{PATH}::test_g",), (f"{PATH}::test_m",), ("", ""),
                                  lines=(3, 3), originals=((f"{PATH}::test_g", f"{PATH}::test_o"),
                                                           (f"{PATH}::test_m", f"{PATH}::test_o")),
                                  guards=((f"{PATH}::test_m", f"{PATH}::test_g"),))

    def check(statuses):
        return integrity.check_run(exit_code=1, output="", junit=statuses, record=None, reporter=False,
                                   requested=[], canaries=canaries)

    assert check({f"{PATH}::test_o": TestStatus.PASSED, f"{PATH}::test_g": TestStatus.PASSED,
                  f"{PATH}::test_m": TestStatus.FAILED}) is None
    # a no-op forger: the mutated copy passed
    assert "must fail" in check({f"{PATH}::test_o": TestStatus.PASSED, f"{PATH}::test_g": TestStatus.PASSED,
                                 f"{PATH}::test_m": TestStatus.PASSED})
    # a state leak: the same test fails the second time, its mutated copy passes the third
    assert check({f"{PATH}::test_o": TestStatus.PASSED, f"{PATH}::test_g": TestStatus.FAILED,
                  f"{PATH}::test_m": TestStatus.PASSED}) is None
    # the agent broke the original (a PASS_TO_PASS test): unresolved, not tampering
    assert check({f"{PATH}::test_o": TestStatus.FAILED, f"{PATH}::test_g": TestStatus.FAILED,
                  f"{PATH}::test_m": TestStatus.PASSED}) is None
    # deselected
    assert check({f"{PATH}::test_o": TestStatus.PASSED, f"{PATH}::test_g": TestStatus.PASSED}) is not None
    assert check({f"{PATH}::test_o": TestStatus.PASSED, f"{PATH}::test_m": TestStatus.FAILED}) is not None
    # variant by variant (an autouse fixture's params, markupsafe's [_mod0]/[_mod1])
    assert check({f"{PATH}::test_o[a]": TestStatus.PASSED, f"{PATH}::test_o[b]": TestStatus.SKIPPED,
                  f"{PATH}::test_g[a]": TestStatus.PASSED, f"{PATH}::test_g[b]": TestStatus.SKIPPED,
                  f"{PATH}::test_m[a]": TestStatus.FAILED, f"{PATH}::test_m[b]": TestStatus.SKIPPED}) is None
    assert check({f"{PATH}::test_o[a]": TestStatus.PASSED, f"{PATH}::test_o[b]": TestStatus.PASSED,
                  f"{PATH}::test_g[a]": TestStatus.PASSED, f"{PATH}::test_g[b]": TestStatus.PASSED,
                  f"{PATH}::test_m[a]": TestStatus.FAILED, f"{PATH}::test_m[b]": TestStatus.PASSED}) is not None


MARKUPSAFE_CONFTEST = textwrap.dedent('''\
    import pytest

    import things

    try:
        import things_speedups as _speedups
    except ImportError:
        _speedups = None


    @pytest.fixture(
        scope="session",
        autouse=True,
        params=(
            things,
            pytest.param(_speedups, marks=pytest.mark.skipif(_speedups is None, reason="no speedups")),
        ),
    )
    def _mod(request):
        things.impl = request.param
''')


@pytest.mark.parametrize("spread", [True, False])
def test_markupsafe_autouse_params_fixture_and_module_setup(tmp_path, spread):
    """markupsafe's conftest parametrizes every test of the module with an autouse, session-scoped
    fixture whose second param is skipped at setup: every copy comes back as two variants (its
    outcome, and skipped), as its original does, and an honest run is believed. The
    module's setup (a constant its decorators read, defined after the imports) is bound where the
    copies go, after their originals."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text(MARKUPSAFE_CONFTEST)
    for seed in range(2):
        canaries = _canaries(seed)
        code, statuses = _run(tmp_path, canaries.written_into(MODULE.encode(), spread=spread))
        assert code == 1
        assert all("[" in k for k in statuses) and TestStatus.SKIPPED in statuses.values()
        assert integrity.check_run(exit_code=code, output="", junit=statuses, record=None, reporter=False,
                                   requested=[], canaries=canaries) is None, statuses
