"""Start a test runner *script* — Django's ``tests/runtests.py``, SymPy's ``bin/test`` — the way
``bootstrap.py`` starts pytest, and record each test's outcome from inside the runner.

Run as ``python -I -B script_runner.py --format FORMAT [--hidden FILE ...] -- SCRIPT ARGS...`` from
the repository root, with the results file's path in ``PATCHGYM_RESULTS``. In this order, before
anything of the repository is importable (``-I`` keeps the working directory off ``sys.path``):

1. stdlib names are pinned to the stdlib (``bootstrap.StdlibFirst``), the process forks under the
   supervisor (``supervisor.py``: the results are written once every process of the run is dead),
   and the records pipe's writer (``records.py``) sends its ``start``;
2. the audit hook (``audit.py``) is installed, with the records writer as its report;
3. patchgym's recorder is put into the runner: for ``django`` (any ``unittest`` runner) the
   methods of ``unittest.TestResult`` every result class inherits, for ``sympy`` the methods of
   ``PyTestReporter`` as ``sympy.testing.runtests`` (``sympy.utilities.runtests`` before 1.6) is
   imported; ``sys.pycache_prefix`` is set to the environment's read-only, checked-hash bytecode
   prefix (``bootstrap.bytecode_prefix``; else ``bootstrap.NO_BYTECODE``): no bytecode cache from
   the tree is ever read;
4. the script runs as ``python SCRIPT ARGS`` would run it (``runpy``, its directory first on
   ``sys.path``); the status it exits with is recorded (``finish``, ``exit``) and is the process's.

The records are the pytest runtime's (:func:`patchgym.grading.integrity.parse_record` reads both):
one ``report`` per test, ``when`` "call", with its id in the runner's own words (``str(test)`` for
unittest; ``path::name`` for SymPy), its docstring line (``aliases``) and two flags from patchgym's
own observation, which the runner's result objects cannot change:

* ``raised``: a passed report for a test whose method raised (unittest: the test method is wrapped
  on its instance at ``startTest``; SymPy: ``test_pass`` called while an exception is being
  handled, which the runner never does) — a result method was replaced or rewired;
* ``bypassed``: a passed unittest report for a test whose method was never called.

Printed result lines are never read: a forger that prints ``test_x (m.C) ... ok`` and ends the
process with ``os._exit(0)`` leaves a record with no ``exit``. SymPy's ``test()`` runs its tests in
a child interpreter (to seed hash randomization); here they run in this process (which has a random
hash seed: ``-I`` ignores ``PYTHONHASHSEED``), so that the recorder and the audit hook see them.

Standard library only, Python 3.6+ (no audit hook before 3.8: ``audit.py``).
"""

import functools
import importlib.machinery
import importlib.util
import inspect
import os
import runpy
import sys
import traceback

# unittest leaves this module's frames (the test method's observer) out of failure tracebacks.
__unittest = True
HERE = os.path.dirname(os.path.abspath(__file__))
WORKSPACE = os.getcwd()
START_FAILED = "patchgym-runtime: the test runner could not start:"  # bootstrap.START_FAILED
SYMPY_RUNNERS = ("sympy.testing.runtests", "sympy.utilities.runtests")
UNITTEST_METHODS = ("startTest", "stopTest", "addSuccess", "addError", "addFailure", "addSkip",
                    "addExpectedFailure", "addUnexpectedSuccess", "addSubTest")


def _load_bootstrap():
    """``bootstrap.py``, whose :func:`bootstrap.load_runtime_module` loads the rest of the runtime:
    the one module loaded by hand (the runtime's directory is never on ``sys.path``)."""
    spec = importlib.util.spec_from_file_location("patchgym_bootstrap", os.path.join(HERE, "bootstrap.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Records:
    """Test reports, from the runner's own process only (Django's parallel workers are forks of
    it, and their results come back to it to be reported), through the records pipe's writer
    (``records.py``; the audit hook's ``tampering`` records go through it from any process)."""

    def __init__(self, writer):
        self.writer = writer
        self.pid = os.getpid()

    def report(self, nodeid, outcome, xfail=False, raised=False, bypassed=False, aliases=()):
        if os.getpid() != self.pid:
            return
        self.writer.write(event="report", nodeid=nodeid, when="call", outcome=outcome, xfail=xfail,
                          raised=raised, bypassed=bypassed, aliases=list(aliases))

    def exit(self, code):
        self.writer.write(event="finish", exitstatus=code)
        self.writer.exit(code)


# -- unittest (Django's runtests.py) ---------------------------------------------------------------

class UnittestRecorder:
    """Wraps ``unittest.TestResult``'s methods (every result class calls them through ``super()``)."""

    def __init__(self, records):
        self.records = records
        self.states = {}  # id(test) -> what was seen of it

    def install(self):
        import unittest.result

        base = unittest.result.TestResult
        for name in UNITTEST_METHODS:
            original = base.__dict__.get(name)
            if original is not None:
                setattr(base, name, self._wrap(name, original))

    def _wrap(self, name, original):
        recorder = self

        @functools.wraps(original)
        def method(result, test, *args, **kwargs):
            try:
                getattr(recorder, "_" + name)(test, *args)
            except Exception:  # never let the recorder break the runner: the test stays unrecorded
                traceback.print_exc()
            return original(result, test, *args, **kwargs)

        return method

    def _state(self, test):
        state = self.states.get(id(test))
        if state is None:  # an error outside any test (setUpClass: unittest's _ErrorHolder)
            state = self.states[id(test)] = self._new_state(test)
            state["unstarted"] = True
        return state

    @staticmethod
    def _new_state(test):
        describe = getattr(test, "shortDescription", None)
        description = describe() if callable(describe) else None
        return {"id": str(test), "aliases": [description] if description else [], "outcome": None,
                "xfail": False, "raised": False, "called": False}

    def _startTest(self, test):
        state = self.states[id(test)] = self._new_state(test)
        name = getattr(test, "_testMethodName", None)
        method = getattr(test, name, None) if isinstance(name, str) else None
        if callable(method):
            setattr(test, name, _observed(method, state))

    def _stopTest(self, test):
        state = self.states.pop(id(test), None)
        if state is not None:
            self._report(state)

    def _set(self, test, outcome, xfail=False):
        state = self._state(test)
        if state["outcome"] != "failed":  # a failure is never overwritten
            state["outcome"], state["xfail"] = outcome, xfail
        if state.pop("unstarted", False):
            self._report(self.states.pop(id(test)))

    def _report(self, state):
        if state["outcome"] is None:
            return
        passed = state["outcome"] == "passed"
        self.records.report(state["id"], state["outcome"], xfail=state["xfail"],
                            raised=passed and state["raised"], bypassed=passed and not state["called"],
                            aliases=state["aliases"])

    def _addSuccess(self, test):
        self._set(test, "passed")

    def _addError(self, test, err=None):
        self._set(test, "failed")

    def _addFailure(self, test, err=None):
        self._set(test, "failed")

    def _addSkip(self, test, reason=None):
        self._set(test, "skipped")

    def _addExpectedFailure(self, test, err=None):
        self._set(test, "skipped", xfail=True)

    def _addUnexpectedSuccess(self, test):
        self._set(test, "failed")

    def _addSubTest(self, test, subtest=None, err=None):
        if err is not None:
            self._set(test, "failed")


def _observed(method, state):
    """``method`` (a bound test method), noting in ``state`` that it was called and whether it
    raised anything but a skip."""
    import unittest

    def watch(exc):
        if not isinstance(exc, unittest.SkipTest):
            state["raised"] = True

    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def observed_async(*args, **kwargs):
            state["called"] = True
            try:
                return await method(*args, **kwargs)
            except BaseException as exc:
                watch(exc)
                raise
        return observed_async

    @functools.wraps(method)
    def observed(*args, **kwargs):
        state["called"] = True
        try:
            return method(*args, **kwargs)
        except BaseException as exc:
            watch(exc)
            raise
    return observed


# -- SymPy's bin/test --------------------------------------------------------------------------------

class SympyRecorder:
    """Wraps ``PyTestReporter``'s methods as SymPy's runner module is imported, and keeps its
    tests in this process."""

    def __init__(self, records):
        self.records = records
        self.file = None
        self.test = None
        self.seen = {}
        self.installed = False

    def install(self):
        sys.meta_path.insert(0, _AfterImport(SYMPY_RUNNERS, self._patch))

    def _patch(self, module):
        reporter = getattr(module, "PyTestReporter", None)
        if reporter is None:
            return
        # The tests run here, not in a child interpreter the runtime does not start.
        if hasattr(module, "run_in_subprocess_with_hash_randomization"):
            module.run_in_subprocess_with_hash_randomization = lambda *args, **kwargs: False
        for name, hook in (("entering_filename", self._entering_filename), ("leaving_filename", self._leaving),
                           ("entering_test", self._entering_test), ("test_pass", self._pass),
                           ("test_fail", self._fail), ("test_exception", self._fail),
                           ("doctest_fail", self._fail), ("test_skip", self._skip), ("test_xfail", self._xfail),
                           ("test_xpass", self._xpass), ("import_error", self._import_error)):
            original = reporter.__dict__.get(name)
            if original is not None:
                setattr(reporter, name, _before(original, hook))
        self.installed = True

    def _relative(self, filename):
        return os.path.relpath(os.path.realpath(filename), os.path.realpath(WORKSPACE)).replace(os.sep, "/")

    def _entering_filename(self, reporter, filename, n=None):
        self.file, self.test = self._relative(filename), None

    def _leaving(self, reporter):
        self.test = None

    def _entering_test(self, reporter, f):
        self.test = getattr(f, "__name__", "<test>")

    def _outcome(self, outcome, xfail=False, raised=False):
        if self.test is None:  # the file itself failed (before its tests)
            nodeid = self.file or "<unknown>"
        else:
            nodeid = f"{self.file}::{self.test}"
        count = self.seen[nodeid] = self.seen.get(nodeid, 0) + 1
        if count > 1:  # generator tests are all "<lambda>"
            nodeid = f"{nodeid}[{count}]"
        self.records.report(nodeid, outcome, xfail=xfail, raised=raised)
        self.test = None

    def _pass(self, reporter, *args, **kwargs):
        # The runner calls test_pass only in its ``else:``: with an exception being handled, a
        # failure was routed here.
        self._outcome("passed", raised=sys.exc_info()[0] is not None)

    def _fail(self, reporter, *args, **kwargs):
        self._outcome("failed")

    def _skip(self, reporter, *args, **kwargs):
        self._outcome("skipped")

    def _xfail(self, reporter, *args, **kwargs):
        self._outcome("skipped", xfail=True)

    def _xpass(self, reporter, *args, **kwargs):
        self._outcome("passed")  # sympy does not fail a run for an @XFAIL test that passed

    def _import_error(self, reporter, filename, *args, **kwargs):
        self.file, self.test = self._relative(filename), None
        self._outcome("failed")


def _before(original, hook):
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        try:
            hook(self, *args, **kwargs)
        except Exception:
            traceback.print_exc()
        return original(self, *args, **kwargs)
    return method


class _AfterImport:
    """A meta path finder that runs ``after(module)`` once one of ``names`` has been executed."""

    def __init__(self, names, after):
        self.names, self.after = names, after

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, after = spec.loader.exec_module, self.after

        def run(module):
            exec_module(module)
            after(module)

        spec.loader.exec_module = run
        return spec


# -- starting ------------------------------------------------------------------------------------------

def _arguments(argv):
    """(format, hidden test files, script, its arguments) from ``--format F --hidden P ... -- SCRIPT ARGS``."""
    fmt, hidden = None, []
    rest = list(argv)
    while rest and rest[0] != "--":
        option = rest.pop(0)
        value = rest.pop(0) if rest else None
        if option == "--format":
            fmt = value
        elif option == "--hidden" and value:
            hidden.append(value)
        else:
            raise ValueError(f"unknown option {option!r}")
    if not rest or fmt not in ("django", "sympy") or len(rest) < 2:
        raise ValueError("usage: script_runner.py --format django|sympy [--hidden FILE] -- SCRIPT ARGS")
    return fmt, hidden, rest[1], rest[2:]


def _exit_code(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)
    sys.stderr.write(f"{code}\n")
    return 1


def main():
    results = os.environ.pop("PATCHGYM_RESULTS", None)
    try:
        fmt, hidden, script, args = _arguments(sys.argv[1:])
    except ValueError as exc:
        sys.stderr.write(f"{START_FAILED} {exc}\n")
        return 3
    if not results:
        sys.stderr.write(START_FAILED + " PATCHGYM_RESULTS is not set\n")
        return 3
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != os.path.realpath(HERE)]
    bootstrap = _load_bootstrap()
    prefix = bootstrap.bytecode_prefix(os.environ.pop(bootstrap.PREFIX_ENV, None))
    sys.meta_path.insert(0, bootstrap.StdlibFirst())
    supervisor = bootstrap.load_runtime_module("supervisor")
    fd = supervisor.supervise(results)
    try:
        writer = bootstrap.load_runtime_module("records").Writer(fd)
        records = Records(writer)
        audit = bootstrap.load_runtime_module("audit")
        policy = audit.Policy(WORKSPACE, hidden, HERE, writer.write, results_fd=fd, harness_files=[results])
        # The runner imports most of its stdlib after the hook is in (Django: decimal's namedtuple).
        policy.stdlib_getframe = True
        audit.install(policy)
        writer.before_write = policy.check_pending
        import unittest  # noqa: F401  (the runner's library, bound to the stdlib before the repository)

        policy.trust_loaded_modules()
        (UnittestRecorder if fmt == "django" else SympyRecorder)(records).install()
        if prefix == bootstrap.NO_BYTECODE:
            bootstrap.read_installed_bytecode(policy.stdlib + policy.installed, WORKSPACE)
        sys.pycache_prefix = prefix
        if bootstrap.NO_PYCACHE_PREFIX:  # the workspace's caches unread by hand
            bootstrap.no_workspace_bytecode(WORKSPACE)
        path = os.path.abspath(script)
    except Exception as exc:
        sys.stderr.write(f"{START_FAILED} {type(exc).__name__}: {exc}\n")
        return 3
    sys.argv[:] = [script, *args]
    sys.path.insert(0, os.path.dirname(path))  # what `python SCRIPT` puts first
    try:
        runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
    except Exception:
        pass
    records.exit(code)
    supervisor.end(code)


if __name__ == "__main__":
    sys.exit(main())
