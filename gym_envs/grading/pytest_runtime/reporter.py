"""patchgym's results reporter: a pytest plugin registered before any repository code runs.

It writes one JSON line per event to a results file it creates itself (``O_EXCL``: a file the
agent planted there is refused): ``start``, one ``report`` per test phase (node id, phase,
outcome, whether it was an expected failure), ``finish`` when the session ends, and ``exit`` with
the status pytest returned. The harness requires all of them, in order, and the process's exit
status to equal the recorded one: a runner that code under test ends early (``os._exit``, an
``atexit`` hook, a forced exit status) leaves the record incomplete or contradicted.

Standard library and pytest only, Python 3.8+.
"""

import json
import os
import sys

import pytest


class Reporter:
    def __init__(self, path, workspace):
        self.workspace = workspace
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self.undeclared_xfail = set()
        self._write(event="start", pid=os.getpid())

    def _write(self, **record):
        os.write(self.fd, (json.dumps(record) + "\n").encode("utf-8"))

    @pytest.hookimpl(tryfirst=True)
    def pytest_load_initial_conftests(self, early_config):
        # What `python -m pytest` does (the working directory first), but only now: plugins and
        # `-p` modules have been loaded from installed code already.
        if self.workspace not in sys.path:
            sys.path.insert(0, self.workspace)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        # An expected failure the test does not declare (`pytest.xfail()` called from somewhere,
        # e.g. the code under test): recorded, so that it cannot stand in for a pass.
        if hasattr(report, "wasxfail") and item.get_closest_marker("xfail") is None:
            self.undeclared_xfail.add((report.nodeid, report.when))

    def pytest_runtest_logreport(self, report):
        self._write(event="report", nodeid=report.nodeid, when=report.when, outcome=report.outcome,
                    xfail=hasattr(report, "wasxfail"),
                    declared=(report.nodeid, report.when) not in self.undeclared_xfail)

    def pytest_collectreport(self, report):
        if report.failed:
            self._write(event="collect_error", nodeid=report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self._write(event="finish", exitstatus=int(exitstatus))

    def exit(self, code):
        self._write(event="exit", code=code)
        os.close(self.fd)
