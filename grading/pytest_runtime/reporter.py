"""patchgym's results reporter: a pytest plugin registered before any repository code runs.

It writes one JSON line per event into the supervisor's records pipe (``supervisor.py``, which
writes them to the results file once the run is over, followed by its own ``end``) through the
pipe's writer (``records.py``, which ``script_runner.py`` writes through too):
``start``, one ``report`` per test phase (node id, phase,
outcome, whether it was an expected failure), ``finish`` when the session ends, and ``exit`` with
the status pytest returned. The harness requires all of them, in order, and the process's exit
status to equal the recorded one: a runner that code under test ends early (``os._exit``, an
``atexit`` hook, a forced exit status) leaves the record incomplete or contradicted.

Each ``report`` also says what the phase really did, for the harness to compare with its outcome
(pytest never reports a phase that raised as passed):

* ``raised``: the phase raised, as seen from the innermost wrapper around pytest's own
  ``pytest_runtest_setup/call/teardown`` (registered first, ``trylast``: every other wrapper is
  outside it) before any report exists, or the test function raised inside pytest's
  ``pytest_pyfunc_call`` and something between there and the phase swallowed it. A passed report
  with it was rewritten (a plugin, a patched ``TestReport``) or its failure hidden (a wrapper).
* ``bypassed``: a plain test function was not called through pytest's ``pytest_pyfunc_call`` (whose
  last hook, ours, was never reached) while a plugin that neither was installed nor is a
  ``conftest.py`` implements that hook, or the item's ``runtest`` was replaced on the item: the
  test ran under someone else's control.
* ``seen``: the call phase ran through ``pytest_runtest_call`` under the runtime's wrapper. A passed
  call without it was reported by something that never ran the test (``call_and_report`` replaced).
* ``own`` (a test of a hidden test file, where the audit hook saw the file's code executed): the
  runtime itself had pytest call the test function after checking it is the code the file was
  compiled to (:class:`OwnCalls`), and the call returned. ``forged``: why it was not (an
  ``item.obj`` made a no-op, a ``__code__`` swapped): tampering whatever the outcome.

Standard library and pytest only, Python 3.6+.
"""

import ast
import inspect
import os
import sys
import types

import _pytest.python
import pytest


class Calls:
    """A ``pytest_pyfunc_call`` implementation registered after the installed plugins and before
    the repository's (pluggy calls the later registered first, and pytest's own, ``trylast``, after
    all): reached exactly when no plugin registered later took the call over. For the tests of the
    hidden test files it makes the call itself (:class:`OwnCalls`)."""

    def __init__(self, own=None):
        self.reached = set()
        self.own = own

    @pytest.hookimpl()
    def pytest_pyfunc_call(self, pyfuncitem):
        self.reached.add(pyfuncitem.nodeid)
        return self.own.call(pyfuncitem) if self.own is not None else None


class _Checked:
    """An item whose ``obj`` is the function the runtime checked: what pytest's own
    ``pytest_pyfunc_call`` is given, so that nothing can swap the function between the check and
    the call."""

    def __init__(self, item, obj):
        object.__setattr__(self, "_item", item)
        object.__setattr__(self, "obj", obj)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_item"), name)


class OwnCalls:
    """Runs each test of the hidden test files through pytest's own ``pytest_pyfunc_call`` (bound
    when the runtime starts), given the function only after checking that it is the code the file
    was compiled to (``effects.HiddenCode``): ``ran`` holds the tests whose own code returned,
    ``forged`` why a test's function was not its own."""

    def __init__(self, hidden_code):
        self.hidden_code = hidden_code
        self.decorated = {}  # real path -> names of tests with a decorator that is not a mark
        self.paths = {}  # an item's path as pytest gives it -> its real path
        self.ran = set()  # node ids whose own code ran and returned (or is a coroutine an installed plugin runs)
        self.forged = {}
        self.pytest_pyfunc_call = _pytest.python.pytest_pyfunc_call

    def watched(self, item):
        """The real path of the hidden test file ``item`` is a plain test function of, if its
        code was seen executed; else None."""
        if type(item) is not pytest.Function:
            return None
        given = str(getattr(item, "path", None) or item.fspath)
        path = self.paths.get(given)
        if path is None:
            path = self.paths[given] = os.path.realpath(given)
        return path if self.hidden_code.watches(path) else None

    def call(self, item):
        path = self.watched(item)
        if path is None:
            return None
        name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
        function = item.obj
        problem = self.hidden_code.problem(function, name, path, lambda: name in self._decorated(path))
        if problem is not None:
            self.forged[item.nodeid] = problem
            return None
        if _asynchronous(function):  # its own code, run by an installed plugin (pytest-asyncio)
            self.ran.add(item.nodeid)
            return None
        result = self.pytest_pyfunc_call(pyfuncitem=_Checked(item, function))
        self.ran.add(item.nodeid)
        return result

    def _decorated(self, path):
        """The tests of ``path`` with a decorator that is not a mark, from the file's own text as the
        audit hook saw it executed: parsed only when a test's function is not its code as compiled
        (a test module's parse is milliseconds, and most tests are called as they are)."""
        if path not in self.decorated:
            self.decorated[path] = decorated_tests(self.hidden_code.source(path))
        return self.decorated[path]


def _asynchronous(function):
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    return code is not None and bool(code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR))


def decorated_tests(source):
    """Names of the test functions (and methods) in ``source`` that have a decorator that is not a
    pytest mark (``mock.patch``, ``given``): pytest calls a wrapper of theirs, not them."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            if any(not _is_mark(d) for d in node.decorator_list):
                names.add(node.name)
    return names


def _is_mark(decorator):
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    if not isinstance(node, ast.Attribute):
        return False
    owner = node.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "mark") or (
        isinstance(owner, ast.Name) and owner.id == "mark")


class Reporter:
    def __init__(self, records, workspace, own=None, trusted_codes=()):
        self.workspace = workspace
        self.records = records  # records.Writer: the supervisor's records pipe (its start written)
        self.undeclared_xfail = set()
        self.raised = {}
        self.bypassed = set()
        self.function_raised = set()
        self.calls = Calls(own)
        self.own = own  # OwnCalls, where the audit hook can see the hidden test modules' code
        self.snapshot = None  # effects.Snapshot (taken by watch), rebased once the session starts
        self.watch = None  # called once plugins are loaded, before the repository is importable
        self.trusted_codes = trusted_codes
        self.trusted = set()
        self.watched = {}  # node id -> whether its call is checked (OwnCalls.watched)
        # What the hooks below call of this object, bound now: replacing a method on the class
        # later changes nothing (and is a difference the snapshot sees).
        self._saw = self._saw
        self._bypassed = self._bypassed
        self._foreign = self._foreign

    @pytest.hookimpl(tryfirst=True)
    def pytest_load_initial_conftests(self, early_config):
        # What `python -m pytest` does (the working directory first), but only now: plugins and
        # `-p` modules have been loaded from installed code already.
        # Every plugin so far is installed code; the repository's come after.
        self.trusted.update(id(plugin) for plugin in early_config.pluginmanager.get_plugins())
        early_config.pluginmanager.register(self.calls, "patchgym-calls")
        if self.watch is not None:
            self.watch()
        if self.workspace not in sys.path:
            sys.path.insert(0, self.workspace)

    def _saw(self, item, when, outcome):
        # unittest.TestCase items do not raise: pytest keeps their failures in `_excinfo`.
        failed_unittest = when == "call" and bool(getattr(item, "_excinfo", None))
        swallowed = when == "call" and item.nodeid in self.function_raised
        self.raised[(item.nodeid, when)] = outcome.excinfo is not None or failed_unittest or swallowed
        if when == "call" and self._bypassed(item):
            self.bypassed.add(item.nodeid)

    def _bypassed(self, item):
        if not isinstance(item, pytest.Function) or item.nodeid in self.calls.reached:
            return False
        if "runtest" in vars(item):
            return True
        if type(item).runtest is not pytest.Function.runtest:  # unittest, plugins' own items
            return False
        try:
            impls = item.config.pluginmanager.hook.pytest_pyfunc_call.get_hookimpls()
        except AttributeError:  # a pluggy too old to list them
            return False
        return any(self._foreign(impl.plugin) for impl in impls)

    def _foreign(self, plugin):
        """A plugin registered after the installed ones that is not one of the repository's
        ``conftest.py`` files (or an object whose class one of them defines)."""
        if id(plugin) in self.trusted or plugin is self.calls:
            return False
        module = plugin if isinstance(plugin, types.ModuleType) else sys.modules.get(type(plugin).__module__)
        return os.path.basename(getattr(module, "__file__", None) or "") != "conftest.py"

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        outcome = yield
        if outcome.excinfo is not None:
            self.function_raised.add(pyfuncitem.nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session):
        # pytest has configured itself (its legacy accessors are on its classes now): from here on
        # the runner's modules and classes must stay as they are.
        if self.snapshot is not None:
            problem = self.snapshot.rebase(self.trusted_codes)
            if problem:
                self.records.tampered(f"the runner was changed before the session: {problem}")

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_setup(self, item):
        # A new attempt at the test (reruns run all three phases again): forget the last one's.
        self.function_raised.discard(item.nodeid)
        self.calls.reached.discard(item.nodeid)
        self.bypassed.discard(item.nodeid)
        if self.own is not None:
            self.own.ran.discard(item.nodeid)
            self.own.forged.pop(item.nodeid, None)
            self.watched[item.nodeid] = self.own.watched(item) is not None
        outcome = yield
        self._saw(item, "setup", outcome)

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_call(self, item):
        outcome = yield
        self._saw(item, "call", outcome)

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item):
        outcome = yield
        self._saw(item, "teardown", outcome)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        # An expected failure the test does not declare (`pytest.xfail()` called from somewhere,
        # e.g. the code under test): recorded, so that it cannot stand in for a pass.
        if hasattr(report, "wasxfail") and item.get_closest_marker("xfail") is None:
            self.undeclared_xfail.add((report.nodeid, report.when))

    def pytest_runtest_logreport(self, report):
        key = (report.nodeid, report.when)
        extra = {}
        if report.when == "call":
            extra["seen"] = key in self.raised
            if self.own is not None and self.watched.get(report.nodeid):
                extra["own"] = report.nodeid in self.own.ran
            forged = self.own.forged.get(report.nodeid) if self.own is not None else None
            if forged:
                extra["forged"] = forged
        self.records.write(event="report", nodeid=report.nodeid, when=report.when, outcome=report.outcome,
                           xfail=hasattr(report, "wasxfail"), declared=key not in self.undeclared_xfail,
                           raised=self.raised.pop(key, False),
                           bypassed=report.when == "call" and report.nodeid in self.bypassed, **extra)

    def pytest_collectreport(self, report):
        if report.failed:
            self.records.write(event="collect_error", nodeid=report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self.records.write(event="finish", exitstatus=int(exitstatus))

    def exit(self, code):
        self.records.exit(code)
