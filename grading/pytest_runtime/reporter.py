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

Standard library and pytest only, Python 3.6+.
"""

import os
import sys
import types

import pytest


class Calls:
    """The last ``pytest_pyfunc_call`` implementation to run before pytest's own (``trylast`` and
    registered after it): reached exactly when no earlier implementation took the call over."""

    def __init__(self):
        self.reached = set()

    @pytest.hookimpl(trylast=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        self.reached.add(pyfuncitem.nodeid)


class Reporter:
    def __init__(self, records, workspace):
        self.workspace = workspace
        self.records = records  # records.Writer: the supervisor's records pipe (its start written)
        self.undeclared_xfail = set()
        self.raised = {}
        self.bypassed = set()
        self.function_raised = set()
        self.calls = Calls()
        self.trusted = set()

    @pytest.hookimpl(tryfirst=True)
    def pytest_load_initial_conftests(self, early_config):
        # What `python -m pytest` does (the working directory first), but only now: plugins and
        # `-p` modules have been loaded from installed code already.
        # Every plugin so far is installed code; the repository's come after.
        self.trusted = {id(plugin) for plugin in early_config.pluginmanager.get_plugins()}
        early_config.pluginmanager.register(self.calls, "patchgym-calls")
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

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_setup(self, item):
        # A new attempt at the test (reruns run all three phases again): forget the last one's.
        self.function_raised.discard(item.nodeid)
        self.calls.reached.discard(item.nodeid)
        self.bypassed.discard(item.nodeid)
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
        self.records.write(event="report", nodeid=report.nodeid, when=report.when, outcome=report.outcome,
                    xfail=hasattr(report, "wasxfail"),
                    declared=(report.nodeid, report.when) not in self.undeclared_xfail,
                    raised=self.raised.pop((report.nodeid, report.when), False),
                    bypassed=report.when == "call" and report.nodeid in self.bypassed)

    def pytest_collectreport(self, report):
        if report.failed:
            self.records.write(event="collect_error", nodeid=report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self.records.write(event="finish", exitstatus=int(exitstatus))

    def exit(self, code):
        self.records.exit(code)
