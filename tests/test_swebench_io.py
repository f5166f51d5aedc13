"""SWE-bench import and export, and the Django and SymPy test runners.

The runner samples are real output: Django 5.2 under Python 3.11 and Django 3.2 under Python 3.9
(``manage.py test --verbosity 2``, the runner Django's ``tests/runtests.py`` uses) and SymPy 1.14's
own runner (``sympy.testing.runtests.test(verbose=True)``, what ``bin/test`` calls), with the
database migrations cut.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import PYTEST_PIN, git
from typer.testing import CliRunner

from patchgym import load_task_set, load_tasks
from patchgym.cli import app
from patchgym.cli import common as cli_common
from patchgym.grading.outcome import TestStatus, grade
from patchgym.grading.patches import filter_agent_patch, read_agent_patch
from patchgym.grading.runners import (
    changed_test_files,
    django_command,
    django_label,
    django_labels,
    parse_django_log,
    parse_sympy_log,
    pytest_selectors,
    sympy_command,
)
from patchgym.grading.testrun import run_tests
from patchgym.sandboxes import ExecResult
from patchgym.sandboxes.repos import pristine_checkout
from patchgym.tasks.catalog import repo_source
from patchgym.tasks.model import TaskFileError, TestSpec
from patchgym.tasks.row_sources import read_source_rows
from patchgym.tasks.swebench_io import (
    RepoNotFoundError,
    builtin_constants,
    builtin_specs,
    clone_url,
    environment_from_config,
    export_row,
    find_repo,
    import_rows,
    import_swebench,
)

cli_common.out.width = cli_common.console.width = 300  # no wrapping inside table cells
P, F, E, S, X = TestStatus.PASSED, TestStatus.FAILED, TestStatus.ERROR, TestStatus.SKIPPED, TestStatus.XFAIL

DJANGO_PY311 = """\
Testing against Django installed in '/testbed/django' with up to 1 processes
Found 8 test(s).
Creating test database for alias 'default' ('file:memorydb_default?mode=memory&cache=shared')...
Operations to perform:
  Synchronize unmigrated apps: shop
  Apply all migrations: auth, contenttypes
Synchronizing apps without migrations:
  Creating tables...
    Running deferred SQL...
Running migrations:
  Applying contenttypes.0001_initial... OK
  Applying auth.0012_alter_user_first_name_max_length... OK
System check identified no issues (0 silenced).
test_empty_cart (shop.tests.CartTests.test_empty_cart) ... ok
test_discount (shop.tests.PriceTests.test_discount)
Discounts never make a price negative. ... FAIL
test_error (shop.tests.PriceTests.test_error) ... ERROR
test_gateway (shop.tests.PriceTests.test_gateway) ... skipped 'needs a payment gateway'
test_known_bug (shop.tests.PriceTests.test_known_bug) ... expected failure
test_prints (shop.tests.PriceTests.test_prints) ... Internal Server Error: /cart/
ok
test_rounding (shop.tests.PriceTests.test_rounding) ... ok
test_subtests (shop.tests.PriceTests.test_subtests) ... \n\
  test_subtests (shop.tests.PriceTests.test_subtests) (i=2) ... FAIL

======================================================================
ERROR: test_error (shop.tests.PriceTests.test_error)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/tmp/djcap/shop/tests.py", line 13, in test_error
    raise KeyError("sku")
KeyError: 'sku'

======================================================================
FAIL: test_discount (shop.tests.PriceTests.test_discount)
Discounts never make a price negative.
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/tmp/djcap/shop/tests.py", line 10, in test_discount
    self.assertEqual(1, 2)
AssertionError: 1 != 2

======================================================================
FAIL: test_subtests (shop.tests.PriceTests.test_subtests) (i=2)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/tmp/djcap/shop/tests.py", line 30, in test_subtests
    self.assertLess(i, 2)
AssertionError: 2 not less than 2

----------------------------------------------------------------------
Ran 8 tests in 0.002s

FAILED (failures=2, errors=1, skipped=1, expected failures=1)
Destroying test database for alias 'default' ('file:memorydb_default?mode=memory&cache=shared')...
"""

DJANGO_PY39 = """\
Creating test database for alias 'default' ('file:memorydb_default?mode=memory&cache=shared')...
Operations to perform:
  Synchronize unmigrated apps: shop
  Apply all migrations: auth, contenttypes
Running migrations:
  Applying contenttypes.0001_initial... OK
  Applying sites.0002_alter_domain_unique...test_no_migrations (migrations.test_commands.MakeMigrationsTests) ... ok
System check identified no issues (0 silenced).
test_empty_cart (shop.tests.CartTests) ... ok
test_discount (shop.tests.PriceTests)
Discounts never make a price negative. ... FAIL
test_error (shop.tests.PriceTests) ... ERROR
test_gateway (shop.tests.PriceTests) ... skipped 'needs a payment gateway'
test_known_bug (shop.tests.PriceTests) ... expected failure
test_prints (shop.tests.PriceTests) ... Internal Server Error: /cart/
ok
test_rounding (shop.tests.PriceTests) ... ok
test_subtests (shop.tests.PriceTests) ... \n\
======================================================================
ERROR: test_error (shop.tests.PriceTests)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/tmp/djcap/shop/tests.py", line 13, in test_error
    raise KeyError("sku")
KeyError: 'sku'

======================================================================
FAIL: test_discount (shop.tests.PriceTests)
Discounts never make a price negative.
----------------------------------------------------------------------
AssertionError: 1 != 2

======================================================================
FAIL: test_subtests (shop.tests.PriceTests) (i=2)
----------------------------------------------------------------------
AssertionError: 2 not less than 2

----------------------------------------------------------------------
Ran 8 tests in 0.002s

FAILED (failures=2, errors=1, skipped=1, expected failures=1)
"""

SYMPY = """\
============================= test process starts ==============================
executable:         /testbed/.venv/bin/python  (3.9.18-final-0) [CPython]
architecture:       64-bit
cache:              no
ground types:       python \n\
numpy:              None
random seed:        35225539
hash randomization: on (PYTHONHASHSEED=402412778)

sympy/core/tests/test_singleton.py[3] \n\
test_Singleton ok
test_singleton_redefinition ok
test_names_in_namespace ok                                                  [OK]

sympy/core/tests/test_zz_sample.py[9] \n\
test_issue_1234_passes ok
test_prints_something hello from the test
ok
test_fails F
test_raises_error E
test_expected_failure f
test_unexpected_pass X
test_skipped requires numpy s
test_slow_one Slow w
test_last_ok ok                                                           [FAIL]

sympy/core/tests/test_broken.py[?]   Failed to import                     [FAIL]

________________________________ xpassed tests _________________________________
sympy/core/tests/test_zz_sample.py: test_unexpected_pass

________________________________________________________________________________
_____________ sympy/core/tests/test_zz_sample.py:test_raises_error _____________
Traceback (most recent call last):
  File "/testbed/sympy/core/tests/test_zz_sample.py", line 15, in test_raises_error
    raise ValueError("boom")
ValueError: boom

________________________________________________________________________________
________________ sympy/core/tests/test_zz_sample.py::test_fails ________________
Traceback (most recent call last):
  File "/testbed/sympy/core/tests/test_zz_sample.py", line 12, in test_fails
    assert 1 == 2
AssertionError

 tests finished: 7 passed, 1 failed, 1 skipped, 1 expected to fail, \n\
1 expected to fail but passed, 2 exceptions, in 0.02 seconds \n\
DO *NOT* COMMIT!
"""


# --- runners --------------------------------------------------------------------------------------

@pytest.mark.parametrize("log, where", [(DJANGO_PY311, "{c}.{t}"), (DJANGO_PY39, "{c}")])
def test_django_log_both_id_styles(log, where):
    statuses = parse_django_log(log)

    def st(test: str, cls: str = "shop.tests.PriceTests"):
        # Ids in either Python's wording find the same status.
        old, new = statuses.get(f"{test} ({cls})"), statuses.get(f"{test} ({cls}.{test})")
        assert old == new, test
        return old

    assert st("test_empty_cart", "shop.tests.CartTests") is P
    assert st("test_discount") is F and statuses["Discounts never make a price negative."] is F
    assert st("test_error") is E
    assert st("test_gateway") is S
    assert st("test_known_bug") is X
    assert st("test_prints") is P, "a status pushed to the next line by the test's output"
    assert st("test_rounding") is P
    assert st("test_subtests") is F, "a failing subtest fails its test"
    assert not any(k.startswith(("Applying", "Creating", "System")) for k in statuses)


def test_django_log_output_running_into_a_result_line():
    statuses = parse_django_log(DJANGO_PY39)
    assert statuses["test_no_migrations (migrations.test_commands.MakeMigrationsTests)"] is P


def test_django_a_printed_pass_does_not_undo_a_failure():
    log = "test_a (m.tests.T) ... FAIL\ntest_a (m.tests.T) ... ok\n"
    assert parse_django_log(log)["test_a (m.tests.T)"] is F


def test_sympy_log():
    statuses = parse_sympy_log(SYMPY)
    assert statuses["test_Singleton"] is P and statuses["test_names_in_namespace"] is P
    assert statuses["test_issue_1234_passes"] is P
    assert statuses["test_prints_something"] is P, "a status after the test's own output"
    assert statuses["test_fails"] is F and statuses["test_raises_error"] is E
    assert statuses["test_expected_failure"] is X and statuses["test_unexpected_pass"] is P
    assert statuses["test_skipped"] is S and statuses["test_slow_one"] is S
    assert statuses["test_last_ok"] is P, "the file's [FAIL] mark is not the test's status"
    assert statuses["sympy/core/tests/test_broken.py"] is E
    g = grade(["test_issue_1234_passes", "test_fails"], ["test_Singleton", "test_missing"], statuses)
    assert g.tests_status["FAIL_TO_PASS"]["failure"] == ["test_fails"] and g.missing == ["test_missing"]


def test_sympy_traceback_header_marks_a_test_failed():
    log = "sympy/a/tests/test_b.py[1] \ntest_x ok   [OK]\n___ sympy/a/tests/test_b.py::test_x ___\nAssertionError\n"
    assert parse_sympy_log(log)["test_x"] is F


def test_django_labels():
    assert django_label("test_add (arith.tests.ArithTests)") == "arith.tests.ArithTests.test_add"
    assert django_label("test_add (arith.tests.ArithTests.test_add)") == "arith.tests.ArithTests.test_add"
    assert django_label("Adding zero changes nothing.") is None
    assert django_labels(["test_a (m.tests.C)", "test_a (m.tests.C.test_a)", "test_b (n.tests.D)"]) == [
        "m.tests.C.test_a", "n.tests.D.test_b"]
    # A docstring id cannot be a label: the test patch's modules run instead (SWE-bench's way).
    files = ["tests/m/tests.py", "tests/m/sub/__init__.py", "django/core/x.py"]
    assert django_labels(["test_a (m.tests.C)", "Docstring.", "test_z (o.tests.D)"], files) == [
        "m.tests", "m.sub", "django.core.x", "o.tests.D.test_z"]


def test_commands_per_runner():
    cmd = django_command("./tests/runtests.py --settings=test_sqlite --parallel 1", ["test_a (m.tests.C)"])
    assert cmd == "./tests/runtests.py --settings=test_sqlite --parallel 1 --verbosity 2 m.tests.C.test_a"
    assert django_command("./tests/runtests.py --verbosity 2", []) == "./tests/runtests.py --verbosity 2"
    assert django_command("./tests/runtests.py -v 3", [], ["tests/m/tests.py"]) == "./tests/runtests.py -v 3 m.tests"
    assert sympy_command("bin/test -C --verbose", ["test_x"], ["sympy/a/tests/test_b.py", "doc/a.rst"]) == (
        "bin/test -C --verbose sympy/a/tests/test_b.py")
    assert sympy_command("bin/test -C", []) == "bin/test -C --verbose"
    patch = ("diff --git a/tests/m/tests.py b/tests/m/tests.py\n--- a/tests/m/tests.py\n+++ b/tests/m/tests.py\n"
             "@@ -1 +1 @@\n-a\n+b\n"
             "diff --git a/tests/m/data.json b/tests/m/data.json\n--- a/tests/m/data.json\n+++ b/tests/m/data.json\n"
             "@@ -1 +1 @@\n-a\n+b\n")
    assert changed_test_files(patch) == ["tests/m/tests.py"]


def test_test_spec_defaults_per_format():
    assert TestSpec().command == "python -m pytest -p no:cacheprovider" and TestSpec().format == "pytest"
    assert TestSpec.model_validate({"format": "django"}).command.startswith("./tests/runtests.py --verbosity 2")
    assert TestSpec.model_validate({"format": "sympy"}).command == "bin/test -C --verbose"
    assert TestSpec.model_validate({"format": "sympy", "command": "bin/test"}).command == "bin/test"
    with pytest.raises(ValueError):
        TestSpec.model_validate({"format": "nose"})


class FakeSandbox:
    """Records commands; answers with a canned output, which the runner's tee also 'wrote'."""

    workdir = "/testbed"
    base_commit = "0" * 40

    def __init__(self, output: str, exit_code: int = 0) -> None:
        self.output, self.exit_code, self.commands = output, exit_code, []
        self.written: dict[str, bytes] = {}

    def exec(self, command, timeout=60.0, cwd=None, env=None, output_limit=None):
        self.commands.append(command)
        return ExecResult(exit_code=self.exit_code, output=self.output[:100], timed_out=False, duration=0.1)

    def read_file(self, path):
        if path.startswith(".patchgym-log-") and path in self.commands[-1]:
            return self.output.encode()
        if path in self.written:
            return self.written[path]
        raise FileNotFoundError(path)

    def write_file(self, path, content):
        self.written[path] = content.encode() if isinstance(content, str) else content


def test_run_tests_pytest_command_goes_through_the_runtime():
    sandbox = FakeSandbox("")
    run = run_tests(sandbox, TestSpec(), ["tests/a.py::test_x", "tests/a.py::test_x", "tests/b.py::test y"],
                    files=["ignored.py"])
    (command,) = sandbox.commands
    start = re.fullmatch(r"PATCHGYM_RESULTS=\.patchgym-results-[0-9a-f]{32}\.jsonl python -I -B "
                         r"\.patchgym-rt-[0-9a-f]{32}/bootstrap\.py -p no:cacheprovider --tb=native -rA "
                         r"--junitxml=\.patchgym-junit-[0-9a-f]{32}\.xml --override-ini=junit_family=xunit1 (.*)", command)
    assert start, command
    ids = shlex.split(start.group(1))
    asked = ["tests/a.py::test_x", "tests/b.py::test y"]
    assert [i for i in ids if i in asked] == asked, "each id once, in order"
    canaries = [i for i in ids if i not in asked]
    assert 4 <= len(canaries) <= 9, "1-3 must-pass and 3-6 must-fail canaries interleaved with the ids"
    module = sandbox.written["tests/a.py"].decode()
    assert all(c.startswith("tests/a.py::") and c.split("::")[1] in module for c in canaries)
    assert any(path.endswith("/bootstrap.py") for path in sandbox.written)
    assert run.command == command and run.error == "the test runner did not finish"


def test_ids_cut_at_a_space_select_their_function_and_grade_by_every_parameter():
    """SWE-bench publishes ``test_x[a b]`` as ``test_x[a``: pytest exits 4 on that argument and
    runs nothing, so the function is selected, and the id passes only if every test cut to it does."""
    assert pytest_selectors(["t.py::test_x[a", "t.py::test_x[b", "t.py::test_y[1]", "t.py::C::test_z"]) == [
        "t.py::test_x", "t.py::test_y[1]", "t.py::C::test_z"]
    statuses = {"t.py::test_x[a b]": TestStatus.PASSED, "t.py::test_x[a c]": TestStatus.FAILED,
                "t.py::test_x[ab]": TestStatus.PASSED, "t.py::test_y[p q]": TestStatus.PASSED}
    graded = grade(["t.py::test_x[a", "t.py::test_y[p"], [], statuses)
    assert graded.tests_status["FAIL_TO_PASS"] == {"success": ["t.py::test_y[p"], "failure": ["t.py::test_x[a"]}
    statuses["t.py::test_x[a c]"] = TestStatus.PASSED
    assert grade(["t.py::test_x[a"], [], statuses).resolved

    # pylint's options parser keeps "/" + the last component of an absolute-path parameter
    assert pytest_selectors(["t.py::C::test_stdin[/m.py]"]) == ["t.py::C::test_stdin"]
    statuses = {"t.py::C::test_stdin[/testbed/tests/m.py-m-/testbed/tests/m.py]": TestStatus.PASSED,
                "t.py::C::test_stdin[m.py-m-m.py]": TestStatus.FAILED}
    graded = grade(["t.py::C::test_stdin[/m.py]"], ["t.py::C::test_stdin[m.py-m-m.py]"], statuses)
    assert graded.tests_status["FAIL_TO_PASS"]["success"] == ["t.py::C::test_stdin[/m.py]"]
    assert graded.tests_status["PASS_TO_PASS"]["failure"] == ["t.py::C::test_stdin[m.py-m-m.py]"]


def test_the_pytest_repositorys_own_source_is_applied_but_no_new_pytest_package():
    """pytest-dev/pytest's gold patches change src/_pytest/*.py: they were all dropped as test files.
    A new _pytest package (which would shadow the runner) is still dropped, as are its tests."""
    def diff(path, new=False):
        head = "new file mode 100644\n--- /dev/null\n" if new else f"--- a/{path}\n"
        old = "@@ -0,0 +1 @@\n" if new else "@@ -1 +1 @@\n-x = 1\n"
        return f"diff --git a/{path} b/{path}\n{head}+++ b/{path}\n{old}+x = 2\n"

    patch = (diff("src/_pytest/assertion/rewrite.py") + diff("_pytest/__init__.py", new=True)
             + diff("src/_pytest/shadow.py", new=True) + diff("testing/test_assertion.py"))
    filtered = filter_agent_patch(read_agent_patch(patch), set())
    assert "src/_pytest/assertion/rewrite.py" in filtered.text
    assert filtered.dropped == ["_pytest/__init__.py", "src/_pytest/shadow.py", "testing/test_assertion.py"]


def test_steps_before_pytest_run_first_and_pytest_still_goes_through_the_runtime():
    """requests' spec starts httpbin on the sandbox's loopback before its tests (a spec's list of
    test commands, joined with &&): the steps run as written, then pytest under patchgym's runtime."""
    sandbox = FakeSandbox("")
    setup = "(python -m httpbin.core --port 5081 >/dev/null 2>&1 &) && sleep 1"
    run_tests(sandbox, TestSpec(command=f"{setup} && HTTPBIN_URL=http://127.0.0.1:5081/ pytest -rA"), ["t.py::test_x"])
    (command,) = sandbox.commands
    assert command.startswith(f"{setup} && HTTPBIN_URL=http://127.0.0.1:5081/ PATCHGYM_RESULTS=.patchgym-results-")
    assert "/bootstrap.py -rA --tb=native -rA --junitxml=" in command
    sandbox = FakeSandbox("")
    run_tests(sandbox, TestSpec(command="pytest -k 'a && b'"), ["t.py::test_x"])
    assert "/bootstrap.py -k 'a && b' --tb=native -rA" in sandbox.commands[0], "&& inside an argument is not a step"
    requests = environment_from_config(builtin_specs()["psf/requests"]["2.4"], "psf/requests")
    assert requests[1].command.endswith(" && HTTPBIN_URL=http://127.0.0.1:5081/ pytest -rA")
    assert "httpbin==0.10.4" in requests[0].packages


def test_the_runtime_runs_pytester_under_filterwarnings_error(tmp_path):
    """pytest's own repository runs with -p pytester and filterwarnings = error: the runtime had
    imported _pytest.pytester_assertions beforehand, pytest warned it could not rewrite it, and the
    run died before its first test (pytest-dev 7.x/8.x: "exited before its final record")."""
    from patchgym.grading.pytest_runtime import RUNTIME_DIR

    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")
    (tmp_path / "test_p.py").write_text("def test_inline(pytester):\n"
                                        "    pytester.makepyfile('def test_ok():\\n    assert 1')\n"
                                        "    pytester.runpytest().assert_outcomes(passed=1)\n")
    results = tmp_path / "results.jsonl"
    proc = subprocess.run([sys.executable, "-I", "-B", str(RUNTIME_DIR / "bootstrap.py"), "-p", "pytester",
                           "-p", "no:cacheprovider", "-q", "test_p.py"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PATCHGYM_RESULTS": str(results)}, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout


def test_run_tests_django_and_sympy_read_the_whole_log():
    """Where patchgym's runtime cannot start them (here: the fake's interpreter probe fails, as for
    Python < 3.8), the runners are read from their whole output."""
    sandbox = FakeSandbox(DJANGO_PY311, exit_code=1)
    spec = TestSpec(format="django")
    run = run_tests(sandbox, spec, ["test_rounding (shop.tests.PriceTests)", "test_error (shop.tests.PriceTests)"])
    assert run.command == ("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 "
                           "shop.tests.PriceTests.test_rounding shop.tests.PriceTests.test_error")
    assert "| tee .patchgym-log-" in sandbox.commands[-1] and 'exit "${PIPESTATUS[0]}"' in sandbox.commands[-1]
    assert run.statuses["test_rounding (shop.tests.PriceTests)"] is P, "parsed from the file, not the capped output"
    assert run.consistent and run.error is None

    sandbox = FakeSandbox(SYMPY, exit_code=1)
    run = run_tests(sandbox, TestSpec(format="sympy"), ["test_fails"], files=["sympy/core/tests/test_zz_sample.py"])
    assert run.command == "bin/test -C --verbose sympy/core/tests/test_zz_sample.py"
    assert run.failed >= {"test_fails", "test_raises_error"} and run.consistent

    lying = FakeSandbox("test_a (m.tests.C) ... ok\n", exit_code=1)
    assert not run_tests(lying, spec, ["test_a (m.tests.C)"]).consistent
    assert run_tests(FakeSandbox("boom\n", 1), spec, ["test_a (m.tests.C)"]).error.startswith("no test results")


# --- environments ---------------------------------------------------------------------------------

def test_install_config_swe_rebench_style():
    env, spec, warnings = environment_from_config({
        "python": "3.9", "install": "pip install -e .", "packages": "requirements.txt",
        "reqs_path": ["requirements/base.txt"], "pip_packages": ["pytest", "hypothesis==6.0"],
        "pre_install": ["apt-get install -y gcc"], "log_parser": "parse_log_pytest",
        "test_cmd": "pytest --no-header -rA --tb=line --color=no -p no:cacheprovider", "env_yml_path": None,
    }, "o/r")
    assert env.python == "3.9" and env.packages == ["pytest", "hypothesis==6.0"]
    assert env.pre_install == ["apt-get install -y gcc"]
    assert env.install == ["if [ -f requirements/base.txt ]; then python -m pip install -r requirements/base.txt; "
                           "else echo 'requirements/base.txt: not in this checkout, not installed' >&2; fi",
                           "pip install -e ."]
    assert spec.format == "pytest" and spec.command.startswith("pytest --no-header") and not warnings
    assert spec.selection == "files", "whole test files, as SWE-bench's harness ran them"


def test_swebench_specs_style_django_and_sympy():
    env, spec, warnings = environment_from_config({
        "python": "3.6", "packages": "requirements.txt", "install": "python -m pip install -e .",
        "pip_packages": "setuptools", "test_cmd": "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1",
        "eval_commands": ["export LANG=en_US.UTF-8", "export LC_ALL=en_US.UTF-8", "locale-gen"],
    }, "django/django")
    assert spec.format == "django" and env.packages == ["setuptools"]
    assert spec.command == ("LANG=en_US.UTF-8 LC_ALL=en_US.UTF-8 "
                            "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1")
    first, second = env.install
    assert first.startswith("for f in requirements.txt requirements-dev.txt") and second == "python -m pip install -e ."
    assert warnings == ["eval_commands step not run before the tests: 'locale-gen'"]
    env, spec, _ = environment_from_config({
        "python": "3.9", "packages": "mpmath flake8", "pip_packages": ["mpmath==1.3.0", "flake8-comprehensions"],
        "install": "python -m pip install -e .", "timeout": 1200,
        "test_cmd": "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose",
    }, "sympy/sympy")
    assert spec.format == "sympy" and spec.timeout == 1200
    assert env.packages == ["mpmath", "flake8", "mpmath==1.3.0", "flake8-comprehensions"]
    _, spec, warnings = environment_from_config({"packages": "environment.yml"}, "sympy/sympy")
    assert spec.format == "sympy" and spec.command == "bin/test -C --verbose" and "conda" in warnings[0]


def test_pre_install_steps_that_edit_the_checkout_run_in_it_before_install():
    """SWE-bench runs pre_install in the repository: sphinx's specs pin dependencies with sed on
    setup.py, which fails in an environment built without the checkout; apt-get stays a system step."""
    env, _, _ = environment_from_config({
        "python": "3.9", "packages": "requirements.txt", "reqs_path": ["requirements.txt"],
        "pre_install": ["apt-get update && apt-get install -y graphviz", "sed -i 's/Jinja2>=2.3/Jinja2<3.0/' setup.py",
                        "echo 'en_US UTF-8' > /etc/locale.gen", "locale-gen en_US.UTF-8"],
        "install": "python -m pip install -e .[test]",
    }, "sphinx-doc/sphinx")
    assert env.pre_install == ["apt-get update && apt-get install -y graphviz", "echo 'en_US UTF-8' > /etc/locale.gen",
                               "locale-gen en_US.UTF-8"]
    assert env.install[0].startswith("if [ -f requirements.txt ]; then python -m pip install -r requirements.txt;")
    assert env.install[1:] == ["sed -i 's/Jinja2>=2.3/Jinja2<3.0/' setup.py", "python -m pip install -e .[test]"]
    sphinx, test_spec, _ = environment_from_config(builtin_specs()["sphinx-doc/sphinx"]["3.5"], "sphinx-doc/sphinx")
    assert not any("setup.py" in step or "tox.ini" in step for step in sphinx.pre_install)
    # tox --current-env runs a venv's interpreter through a link that loses the venv: pytest itself
    assert test_spec.command == "pytest -rA --durations 25" and not any("tox" in step for step in sphinx.install)
    assert {"docutils<0.21", "sphinxcontrib-jsmath<2"} <= set(sphinx.packages), "releases newer than sphinx 3.x"


def test_find_repo_tries_each_layout_and_says_which(tmp_path):
    (tmp_path / "name.git").mkdir()
    (tmp_path / "name.git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "name.git" / "objects").mkdir()
    assert find_repo(tmp_path, "owner/name") == (tmp_path / "name.git").resolve()
    (tmp_path / "owner__name.bundle").write_bytes(b"# v2 git bundle\n")
    assert find_repo(tmp_path, "owner/name") == (tmp_path / "owner__name.bundle").resolve()
    (tmp_path / "plain").mkdir()
    with pytest.raises(RepoNotFoundError) as err:
        find_repo(tmp_path, "who/plain")
    message = str(err.value)
    for name in ("who__plain", "who__plain.git", "who__plain.bundle", "plain.git", "plain.bundle"):
        assert name in message
    assert "not git repositories" in message


# --- import and export ----------------------------------------------------------------------------

RUNTESTS = '''\
#!/usr/bin/env python
"""A stand-in for Django's tests/runtests.py: the same options, labels and unittest output."""
import argparse
import os
import sys
import unittest

parser = argparse.ArgumentParser()
parser.add_argument("labels", nargs="*")
parser.add_argument("-v", "--verbosity", type=int, default=1)
parser.add_argument("--settings")
parser.add_argument("--parallel")
args = parser.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.dirname(here)]  # Django's is installed in the venv instead
loader = unittest.TestLoader()
suite = loader.loadTestsFromNames(args.labels) if args.labels else loader.discover(here, pattern="tests.py")
print("Testing against Django installed in '/testbed/django' with up to 1 processes")
print("System check identified no issues (0 silenced).")
sys.exit(not unittest.TextTestRunner(verbosity=args.verbosity).run(suite).wasSuccessful())
'''

BIN_TEST = '''\
#!/usr/bin/env python
"""A stand-in for SymPy's bin/test: test_* functions of the files given, reported as sympy does."""
import importlib.util
import os
import sys
import traceback

paths = [a for a in sys.argv[1:] if not a.startswith("-")]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # as sympy's does
print("=" * 29 + " test process starts " + "=" * 30)
failures, bad = [], False
for path in paths:
    spec = importlib.util.spec_from_file_location("t", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [(n, f) for n, f in vars(module).items() if n.startswith("test_") and callable(f)]
    sys.stdout.write(f"{path}[{len(tests)}] ")
    file_bad = False
    for name, func in tests:
        sys.stdout.write(f"\\n{name} ")
        try:
            func()
            sys.stdout.write("ok")
        except AssertionError:
            sys.stdout.write("F")
            file_bad = True
            failures.append((path, name, traceback.format_exc()))
        except Exception:
            sys.stdout.write("E")
            file_bad = True
            failures.append((path, name, traceback.format_exc()))
    sys.stdout.write(" " + ("[FAIL]" if file_bad else "[OK]").rjust(50) + "\\n\\n")
    bad = bad or file_bad
for path, name, tb in failures:
    print("_" * 10 + f" {path}:{name} " + "_" * 10)
    print(tb)
print("tests finished")
sys.exit(1 if bad else 0)
'''

FILES_V1 = {
    "minilib/__init__.py": "def add(a, b):\n    return a + b\n\n\ndef clamp(x, lo, hi):\n    return max(lo, x)\n",
    "minilib/tests/__init__.py": "",
    "minilib/tests/test_core.py": "from minilib import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    "tests/__init__.py": "",
    "tests/test_basic.py": "from minilib import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n",
    "tests/arith/__init__.py": "",
    "tests/arith/tests.py": textwrap.dedent('''\
        import unittest

        from minilib import add


        class ArithTests(unittest.TestCase):
            def test_add(self):
                self.assertEqual(add(1, 1), 2)

            def test_zero(self):
                """Adding zero changes nothing."""
                self.assertEqual(add(5, 0), 5)
        '''),
    "tests/runtests.py": RUNTESTS,
    "bin/test": BIN_TEST,
}
FIX = {"minilib/__init__.py": FILES_V1["minilib/__init__.py"].replace("max(lo, x)", "max(lo, min(x, hi))")}
NEW_TESTS = {
    # test_clamp_pairs's ids have a space, which SWE-bench's log parsers cut: both are published as
    # "test_clamp_pairs[x", an id pytest cannot select and that stands for both parameters.
    "pytest": {"tests/test_basic.py": "import pytest\n\n" + FILES_V1["tests/test_basic.py"].replace(
        "import add", "import add, clamp") + "\n\ndef test_clamp_high():\n    assert clamp(9, 0, 5) == 5\n"
        + "\n\n@pytest.mark.parametrize('pair', ['x 2', 'x 4'])\ndef test_clamp_pairs(pair):\n"
        + "    hi = int(pair.split()[1])\n    assert clamp(hi + 10, 0, hi) == hi\n"},
    "django": {"tests/arith/tests.py": FILES_V1["tests/arith/tests.py"].replace("import add", "import add, clamp")
               + "\n    def test_clamp_high(self):\n        self.assertEqual(clamp(9, 0, 5), 5)\n"},
    "sympy": {"minilib/tests/test_core.py": FILES_V1["minilib/tests/test_core.py"].replace(
        "import add", "import add, clamp") + "\n\ndef test_clamp_high():\n    assert clamp(9, 0, 5) == 5\n"},
}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if name in ("tests/runtests.py", "bin/test"):
            path.chmod(0o755)


def _diff(repo: Path, files: dict[str, str]) -> str:
    _write(repo, files)
    diff = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    return diff


@pytest.fixture(scope="module")
def swebench_dataset(tmp_path_factory) -> dict:
    """A repository with real history, laid out three ways in a repos directory (a clone, a bare
    mirror, a bundle), and SWE-bench rows over it: a pytest one in SWE-bench Verified's shape
    whose environment comes from a specs file, and Django- and SymPy-style ones in SWE-rebench's
    shape with an install_config."""
    root = tmp_path_factory.mktemp("swebench")
    repos = root / "repos"
    work = repos / "acme__minilib"
    work.mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    _write(work, FILES_V1)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "minilib: add and clamp", date="2024-03-01T10:00:00Z")
    base = git(work, "rev-parse", "HEAD").strip()
    patch = _diff(work, FIX)
    test_patches = {style: _diff(work, files) for style, files in NEW_TESTS.items()}
    _write(work, FIX)
    git(work, "commit", "-q", "-am", "clamp: respect the upper bound", date="2024-03-02T10:00:00Z")
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(repos / "djangoish.git")], check=True)
    git(work, "bundle", "create", str(repos / "acme__sympyish.bundle"), "--all")

    rows = [
        {"repo": "acme/minilib", "instance_id": "acme__minilib-1", "base_commit": base, "patch": patch,
         "test_patch": test_patches["pytest"], "problem_statement": "clamp() ignores the upper bound\n",
         "hints_text": "", "created_at": "2024-03-01T12:00:00Z", "version": "0.1",
         "FAIL_TO_PASS": json.dumps(["tests/test_basic.py::test_clamp_high", "tests/test_basic.py::test_clamp_pairs[x"]),
         "PASS_TO_PASS": json.dumps(["tests/test_basic.py::test_add"]),
         "environment_setup_commit": base, "difficulty": "<15 min fix"},
        {"instance_id": "acme__djangoish-2", "base_commit": base, "created_at": "2024-03-01T12:00:00Z",
         "environment_setup_commit": base, "hints_text": "See #1.", "patch": patch,
         "problem_statement": "clamp(9, 0, 5) returns 9", "repo": "acme/djangoish",
         "test_patch": test_patches["django"], "meta": {"has_test_patch": True, "num_modified_files": 1},
         "version": "3.0",
         "install_config": {"python": "3.11", "install": "", "packages": "", "pip_packages": [],
                            "pre_install": [], "log_parser": "parse_log_django",
                            "test_cmd": "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"},
         "FAIL_TO_PASS": json.dumps(["test_clamp_high (arith.tests.ArithTests)"]),
         "PASS_TO_PASS": json.dumps(["test_add (arith.tests.ArithTests)", "Adding zero changes nothing."]),
         "environment": "name: testbed\nchannels:\n  - defaults\n", "license_name": "BSD-3-Clause"},
        {"instance_id": "acme__sympyish-3", "base_commit": base, "created_at": "2024-03-01T12:00:00Z",
         "environment_setup_commit": base, "hints_text": "", "patch": patch, "problem_statement": "clamp is wrong",
         "repo": "acme/sympyish", "test_patch": test_patches["sympy"], "version": "1.1",
         "install_config": {"python": "3.11", "install": "",
                            "test_cmd": "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose"},
         "FAIL_TO_PASS": json.dumps(["test_clamp_high"]), "PASS_TO_PASS": json.dumps(["test_add"])},
    ]
    specs = root / "specs.json"
    specs.write_text(json.dumps({"acme/minilib": {"0.1": {
        "python": ">=3.9", "pip_packages": [PYTEST_PIN], "test_cmd": "python -m pytest -p no:cacheprovider"}}}))
    source = root / "swebench.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"root": root, "repos": repos, "rows": rows, "specs": specs, "source": source}


def run(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def _read(path: Path) -> list[dict]:
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_import_validates_and_export_gives_back_the_input(swebench_dataset):
    d = swebench_dataset
    tasks_file = d["root"] / "tasks.jsonl"
    result = run("tasks", "import-swebench", str(d["source"]), "--repos", str(d["repos"]), "--specs", str(d["specs"]),
                 "--output", str(tasks_file), "--runs", "1", "--workers", "3")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "wrote 3 tasks" in text and "0 dropped" in text, result.output
    assert "1 from specs" in text and "2 from install_config" in text

    tasks = {t.instance_id: t for t in load_tasks(tasks_file)}
    pytest_task, django_task, sympy_task = (tasks[r["instance_id"]] for r in d["rows"])
    assert pytest_task.environment.packages == [PYTEST_PIN] and pytest_task.test_spec.format == "pytest"
    assert django_task.test_spec.format == "django" and sympy_task.test_spec.format == "sympy"
    assert sympy_task.test_spec.command.startswith("PYTHONWARNINGS=")
    assert {t.repo_path for t in tasks.values()} == {"repos/acme__minilib", "repos/djangoish.git",
                                                     "repos/acme__sympyish.bundle"}, "relative: repos lie under"
    # SWE-rebench's own "environment" (a conda listing) is kept beside patchgym's.
    assert django_task.model_extra["original_environment"].startswith("name: testbed")

    back = d["root"] / "back.jsonl"
    result = run("tasks", "export", "--tasks", str(tasks_file), "--output", str(back), "--swebench-only")
    assert result.exit_code == 0, result.output
    exported = _read(back)
    assert exported == d["rows"]
    assert [list(r) for r in exported] == [list(r) for r in d["rows"]], "same key order"
    assert back.read_text() == d["source"].read_text(), "byte for byte, when written the same way"


def test_exported_rows_with_patchgym_fields_load_anywhere(swebench_dataset, tmp_path):
    d = swebench_dataset
    tasks_file = d["root"] / "tasks-unvalidated.json"
    result = run("tasks", "import-swebench", str(d["source"]), "--repos", str(d["repos"]), "--specs", str(d["specs"]),
                 "--output", str(tasks_file), "--no-validate")
    assert result.exit_code == 0 and "without validation" in " ".join(result.output.split())
    assert isinstance(json.loads(tasks_file.read_text()), list), ".json: an array"
    out = tmp_path / "elsewhere" / "full.json"
    assert run("tasks", "export", "--tasks", str(tasks_file), "--output", str(out)).exit_code == 0
    rows = _read(out)
    assert all(isinstance(r["FAIL_TO_PASS"], str) for r in rows), "JSON strings, as published"
    assert all(Path(r["repo_path"]).is_absolute() for r in rows), "repos do not lie under the new file"
    assert list(rows[1])[-3:] == ["environment", "test_spec", "repo_path"]
    assert rows[1]["environment"]["python"] == "3.11" and rows[1]["original_environment"].startswith("name:")
    again = load_task_set(out)
    assert [t.test_spec.format for t in again] == ["pytest", "django", "sympy"]
    swebench_only = tmp_path / "rows.jsonl"
    run("tasks", "export", "--tasks", str(out), "--output", str(swebench_only), "--swebench-only")
    assert _read(swebench_only) == d["rows"], "a second round trip changes nothing either"


def test_import_drops_rows_it_cannot_use_and_says_why(swebench_dataset, tmp_path):
    d = swebench_dataset
    rows = [
        dict(d["rows"][0]),
        {**d["rows"][0], "instance_id": "who__lost-1", "repo": "who/lost"},
        {**d["rows"][0], "instance_id": "acme__minilib-bad", "base_commit": "f" * 40},
        {**d["rows"][0], "instance_id": "acme__minilib-nof2p", "FAIL_TO_PASS": "[]"},
        {**d["rows"][0]},
    ]
    source = tmp_path / "rows.json"
    source.write_text(json.dumps(rows, indent=1))
    out = tmp_path / "t.jsonl"
    result = run("tasks", "import-swebench", str(source), "--repos", str(d["repos"]), "--output", str(out),
                 "--no-validate")
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "cannot find repository 'who/lost'" in text and "who__lost.bundle" in text
    assert "at least one FAIL_TO_PASS test" in text and "duplicate instance_id" in text
    assert f"base_commit {'f' * 40} is not in" in text, "warned about under --no-validate"
    assert "no install_config and no spec; using defaults" in text
    assert "wrote 2 tasks" in text
    (first, bad_commit) = load_tasks(out)
    assert first.environment.install == ["python -m pip install -e ."] and first.environment.packages == ["pytest"]

    result = run("tasks", "import-swebench", str(source), "--repos", str(d["repos"]), "--output", str(out),
                 "--specs", str(d["specs"]), "--runs", "1")
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert f"base_commit {'f' * 40} is not in" in text and "acme__minilib-bad" in text
    assert "wrote 1 tasks" in text and "4 dropped" in text, "validation drops the bad commit"

    empty = tmp_path / "none.jsonl"
    empty.write_text(json.dumps(rows[1]) + "\n")
    result = run("tasks", "import-swebench", str(empty), "--repos", str(d["repos"]), "--output", str(tmp_path / "x"))
    assert result.exit_code == 1 and "no task to write" in result.output
    result = run("tasks", "import-swebench", str(empty), "--repos", str(tmp_path / "nowhere"), "--output", "x.jsonl")
    assert result.exit_code == 2 and "not a directory" in result.output


def test_entries_that_name_no_test_are_dropped_from_pytest_tasks(swebench_dataset, tmp_path):
    """pytest-dev__pytest-5227's PASS_TO_PASS holds "[100%]" and "[" (SWE-bench's parser read progress
    output as ids): pytest refuses them (exit 4, nothing runs), so they are dropped, with a warning."""
    d = swebench_dataset
    junk = ["[100%]", "[", "[100%]------------------------------"]
    pytest_row = {**d["rows"][0], "PASS_TO_PASS": json.dumps(["tests/test_basic.py::test_add", *junk])}
    sympy_row = d["rows"][2]
    result = import_rows([("line 1", pytest_row), ("line 2", sympy_row)], repos=d["repos"],
                         output=tmp_path / "t.jsonl")
    pytest_task, sympy_task = result.tasks
    assert pytest_task.PASS_TO_PASS == ["tests/test_basic.py::test_add"]
    assert any("name no test dropped: '[100%]', '['" in w for w in result.warnings), result.warnings
    assert sympy_task.PASS_TO_PASS == ["test_add"], "other runners' ids are not node ids and are kept"


def test_list_encoded_rows_round_trip_with_source_encoding(swebench_dataset, tmp_path):
    d = swebench_dataset
    row = {**d["rows"][2], "FAIL_TO_PASS": ["test_clamp_high"], "PASS_TO_PASS": ["test_add"], "version": 1.1,
           "hints_text": None, "__index_level_0__": 7}
    result = import_rows([("line 1", row)], repos=d["repos"], output=tmp_path / "t.jsonl")
    (task,) = result.tasks
    assert task.version == "1.1" and task.hints_text == ""
    assert export_row(task, swebench_only=True, tests_encoding="source") == row
    assert list(export_row(task, swebench_only=True, tests_encoding="source")) == list(row)
    as_json = export_row(task, swebench_only=True)
    assert as_json["FAIL_TO_PASS"] == '["test_clamp_high"]' and as_json["version"] == 1.1
    task.version = "2.0"  # a changed value is written as it is now
    assert export_row(task, swebench_only=True)["version"] == "2.0"


def test_export_of_the_bundled_catalog(tmp_path):
    out = tmp_path / "catalog.jsonl"
    result = run("tasks", "export", "--output", str(out), "--instance-ids", "patchgym__textable-1", "--swebench-only")
    assert result.exit_code == 0, result.output
    (row,) = _read(out)
    assert list(row)[:2] == ["instance_id", "repo"] and row["environment_setup_commit"] is None
    assert set(row) >= {"instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
                        "hints_text", "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS"}
    assert not set(row) & {"environment", "test_spec", "repo_path"}
    assert json.loads(row["FAIL_TO_PASS"])
    full = tmp_path / "catalog.json"
    assert run("tasks", "export", "--output", str(full), "--format", "json", "--tests-encoding", "list",
               "--instance-ids", "patchgym__textable-1").exit_code == 0
    (row,) = _read(full)
    assert isinstance(row["FAIL_TO_PASS"], list) and row["repo_path"].endswith("textable.bundle")
    assert load_tasks(full)[0].instance_id == "patchgym__textable-1"
    bad = run("tasks", "export", "--output", str(full), "--format", "csv")
    assert bad.exit_code == 2 and "unknown format" in bad.output


# --- rows and repositories from elsewhere ----------------------------------------------------------

def _pytest_rows(d: dict, n: int) -> list[dict]:
    return [{**d["rows"][0], "instance_id": f"acme__minilib-{i}"} for i in range(n)]


def test_rows_from_a_parquet_file_and_a_dataset_directory(swebench_dataset, tmp_path):
    """The same rows as parquet, and as a Hugging Face dataset directory with two splits (read by
    the datasets library, offline), make the same tasks as the JSONL file."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("datasets")
    d = swebench_dataset
    rows = _pytest_rows(d, 3)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    (tmp_path / "hf" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "hf" / "data" / "test-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:1]), tmp_path / "hf" / "data" / "dev-00000-of-00001.parquet")
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def imported(source: str) -> list[dict]:
        result = import_swebench(source, repos=d["repos"], output=tmp_path / "t.jsonl", specs_path=d["specs"])
        assert not result.dropped, result.dropped
        return [export_row(t, swebench_only=True) for t in result.tasks]

    expected = imported(str(jsonl))
    assert [r["instance_id"] for r in expected] == [r["instance_id"] for r in rows]
    assert imported(str(tmp_path / "rows.parquet")) == expected
    assert imported(str(tmp_path / "hf")) == expected, "a dataset's default split is test"
    assert imported(f"{tmp_path / 'hf'}:dev") == expected[:1]
    assert [w for w, _ in read_source_rows(str(tmp_path / "rows.parquet"))] == ["row 1", "row 2", "row 3"]


def test_bad_row_sources_say_what_they_are(tmp_path):
    with pytest.raises(TaskFileError, match="no such file, and not a Hugging Face dataset"):
        list(read_source_rows(str(tmp_path / "missing" / "rows.jsonl")))
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(TaskFileError, match="cannot read parquet"):
        list(read_source_rows(str(bad)))
    result = run("tasks", "import-swebench", str(tmp_path / "nope.jsonl"), "--repos", str(tmp_path),
                 "--output", str(tmp_path / "t.jsonl"))
    assert result.exit_code == 2 and "no such file" in result.output


def test_clone_urls_from_a_template_or_a_base():
    assert clone_url("https://github.com", "psf/requests") == "https://github.com/psf/requests"
    assert clone_url("https://git.internal/mirrors/", "psf/requests") == "https://git.internal/mirrors/psf/requests"
    assert clone_url("file:///srv/git/{owner}__{name}.git", "psf/requests") == "file:///srv/git/psf__requests.git"
    assert clone_url("git@host:{repo}.git", "a/b") == "git@host:a/b.git"


def test_repositories_from_a_clone_url_are_cloned_once_and_cached(swebench_dataset, tmp_path):
    d = swebench_dataset
    template = f"file://{d['repos']}/{{owner}}__{{name}}"
    out = tmp_path / "t.jsonl"
    result = run("tasks", "import-swebench", str(d["source"]), "--repos", template, "--specs", str(d["specs"]),
                 "--output", str(out), "--no-validate")
    assert result.exit_code == 0, result.output
    tasks = {t.instance_id: t for t in load_tasks(out)}
    task = tasks["acme__minilib-1"] if "acme__minilib-1" in tasks else next(iter(tasks.values()))
    assert task.repo_path == f"file://{d['repos']}/acme__minilib"
    first = pristine_checkout(repo_source(task), task.base_commit)
    assert (first / ".git").is_dir() and git(first, "rev-parse", "HEAD").strip() == task.base_commit
    assert pristine_checkout(repo_source(task), task.base_commit) == first, "cached"


def test_swebench_repositories_need_no_specs_file(swebench_dataset, tmp_path):
    """A row of one of SWE-bench's repositories gets its environment from the built-in specs."""
    d = swebench_dataset
    repos = tmp_path / "repos"
    repos.mkdir()
    (repos / "psf__requests").symlink_to(d["repos"] / "acme__minilib")
    row = {**d["rows"][0], "instance_id": "psf__requests-1", "repo": "psf/requests", "version": "2.0"}
    result = import_rows([("line 1", row)], repos=repos, output=tmp_path / "t.jsonl")
    (task,) = result.tasks
    assert result.environment_source == {"psf__requests-1": "builtin"}
    spec = builtin_specs()["psf/requests"]["2.0"]
    assert task.environment.python == spec["python"] and task.test_spec.format == "pytest"


def test_builtin_specs_cover_swebench_and_all_convert():
    """Every Python repository SWE-bench's harness lists (constants/python.py before its
    restructuring): its test split's and Verified's 12, Lite dev's 6, dbt-core and HumanEval."""
    tables = builtin_constants()
    specs = tables.specs
    assert set(specs) == {
        "astropy/astropy", "django/django", "matplotlib/matplotlib", "mwaskom/seaborn", "pallets/flask",
        "psf/requests", "pydata/xarray", "pylint-dev/pylint", "pytest-dev/pytest", "scikit-learn/scikit-learn",
        "sphinx-doc/sphinx", "sympy/sympy", "marshmallow-code/marshmallow", "pvlib/pvlib-python",
        "pydicom/pydicom", "pylint-dev/astroid", "pyvista/pyvista", "sqlfluff/sqlfluff", "dbt-labs/dbt-core",
        "swe-bench/humaneval"}
    for repo, versions in specs.items():
        for version, config in versions.items():
            environment, test_spec, _ = environment_from_config(config, repo)
            assert environment.python and test_spec.command, (repo, version)
            assert test_spec.format == {"django/django": "django", "sympy/sympy": "sympy"}.get(repo, "pytest")
            if config.get("packages") == "requirements.txt" and not config.get("reqs_path"):
                assert tables.reqs_paths.get(repo), f"{repo} {version}: requirements.txt from no path"
    assert tables.reqs_paths["pyvista/pyvista"] == ["requirements_test.txt", "requirements.txt"]
    assert tables.replace_req_packages == (("types-pkg_resources", "types-setuptools"),)
    # scikit-learn 1.3+ quotes its specifiers for SWE-bench's shell; pip must not see the quotes
    sklearn = environment_from_config(specs["scikit-learn/scikit-learn"]["1.3"], "scikit-learn/scikit-learn")[0]
    assert "numpy==1.19.2" in sklearn.packages and "pandas<2.0.0" in sklearn.packages
    assert not any("'" in p for p in sklearn.packages)
    assert specs["django/django"]["3.0"]["python"].startswith("3.")
    # flask 2.0's requirements/dev.txt installs sphinx from a git URL; its tests need only tests.txt
    flask = environment_from_config(specs["pallets/flask"]["2.0"], "pallets/flask")[0]
    assert flask.install[0].startswith("if [ -f requirements/tests.txt ]; then python -m pip install -r "
                                       "requirements/tests.txt;")
    # a checkout has no tags: setuptools_scm would call pytest 0.1.devN, below its own minversion
    pytest_env = environment_from_config(specs["pytest-dev/pytest"]["5.4"], "pytest-dev/pytest")[0]
    assert pytest_env.install == ["SETUPTOOLS_SCM_PRETEND_VERSION=5.4.0 python -m pip install -e ."]
    # pylint loads its checkers through astroid's modutils, which needs the checkout on sys.path
    pylint_env = environment_from_config(specs["pylint-dev/pylint"]["2.15"], "pylint-dev/pylint")[0]
    assert pylint_env.install[-1] == "python -m pip install -e . --config-settings editable_mode=compat"


def test_imported_pytest_rows_run_whole_files_unless_asked_for_ids(swebench_dataset, tmp_path):
    """SWE-bench's lists come from whole-file runs, so imported rows run the files that hold them;
    --selection ids trades that for speed (flask-4045: 11.2 s a grading whole-file, 0.9 s on its ids)."""
    d = swebench_dataset
    row = d["rows"][0]
    (default,) = import_rows([("line 1", row)], repos=d["repos"], output=tmp_path / "t.jsonl").tasks
    (fast,) = import_rows([("line 1", row)], repos=d["repos"], output=tmp_path / "t.jsonl", selection="ids").tasks
    assert default.test_spec.selection == "files" and fast.test_spec.selection == "ids"
    own = {**row, "environment": {"python": ">=3.8"}, "test_spec": {"command": "python -m pytest", "selection": "ids"}}
    (kept,) = import_rows([("line 1", own)], repos=d["repos"], output=tmp_path / "t.jsonl").tasks
    assert kept.test_spec.selection == "ids", "a row's own test spec is kept as it is"

    result = CliRunner().invoke(app, ["tasks", "import-swebench", str(d["source"]), "--repos", str(d["repos"]),
                                      "--output", str(tmp_path / "x.jsonl"), "--selection", "tests"])
    assert result.exit_code == 2 and "--selection: expected 'files' or 'ids'" in result.output
