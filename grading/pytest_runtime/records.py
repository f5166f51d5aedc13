"""The runner's end of the records pipe, shared by the runtime's two recorders: the pytest plugin
(``reporter.py``) and the recorder of Django's and SymPy's runners (``script_runner.py``).

The pipe is the supervisor's (``supervisor.py``), which writes what it carries to the results file
once the run is over. Each record is one JSON line, written whole; the first is ``start`` (with the
runner's pid), the last ``exit`` (with the status the runner returns), after which the pipe is
closed. Before every record, ``before_write`` is called when set: the audit hook judges there what
it noted since its last event (``audit.Policy.check_pending``), so that a record is never written
while a forger's profile or trace function is installed.

Loaded through ``bootstrap.load_runtime_module`` as ``patchgym_records``: the audit hook counts its
functions among the runner's (a swap of their ``__code__`` is tampering). What it calls of the
standard library (``json.dumps``, ``os.write``) is bound when it is loaded, before the repository is
importable: replacing ``json.dumps`` later changes nothing it writes. Before every record but a
test's setup and teardown it also runs ``checks`` (``effects.Snapshot.changed``: the runner's
modules and classes as they were); a difference ends the run as tampering, as the audit hook does.

Standard library only, Python 3.6+: this runs under the task's interpreter.
"""

import json
import os

_dumps, _write, _close, _exit, _getpid = json.dumps, os.write, os.close, os._exit, os.getpid
TAMPERED_EXIT = 70  # audit.TAMPERED_EXIT: a status pytest never returns


class Writer:
    """JSON-line records into the descriptor ``fd`` (the supervisor's records pipe)."""

    def __init__(self, fd):
        self.fd = fd
        self.before_write = None  # audit.Policy.check_pending, once the hook is installed
        self.checks = []  # callables of the record to write, saying why the run was tampered with (or None)
        self.checking = set()  # not empty while the checks run (a check's own record is not checked)
        self.write(event="start", pid=_getpid())

    def write(self, **record):
        if self.before_write is not None:
            self.before_write()
        # A test's setup and teardown records are not checked (a third of the cost each): what a
        # forger changes to fake a test is still changed when its call is recorded, or was undone
        # without the call's own code having run (the reporter's ``seen`` and ``own``).
        if self.checks and not self.checking and record.get("when") in (None, "call"):
            self.checking.add(True)
            try:
                for check in self.checks:
                    problem = check(record)
                    if problem:
                        self.tampered(problem)
            finally:
                self.checking.clear()
        data = memoryview((_dumps(record) + "\n").encode("utf-8"))
        while data:
            data = data[_write(self.fd, data):]

    def tampered(self, what):
        """End the run as tampering (``what`` says why), as the audit hook ends it."""
        self.checking.add(True)
        try:
            self.write(event="tampering", audit=what)
        finally:
            _exit(TAMPERED_EXIT)

    def exit(self, code):
        """Write the last record, the runner's exit status, and close the pipe."""
        self.write(event="exit", code=code)
        _close(self.fd)
