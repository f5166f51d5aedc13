"""The runner's end of the records pipe, shared by the runtime's two recorders: the pytest plugin
(``reporter.py``) and the recorder of Django's and SymPy's runners (``script_runner.py``).

The pipe is the supervisor's (``supervisor.py``), which writes what it carries to the results file
once the run is over. Each record is one JSON line, written whole; the first is ``start`` (with the
runner's pid), the last ``exit`` (with the status the runner returns), after which the pipe is
closed. Before every record, ``before_write`` is called when set: the audit hook judges there what
it noted since its last event (``audit.Policy.check_pending``), so that a record is never written
while a forger's profile or trace function is installed.

Loaded through ``bootstrap.load_runtime_module`` as ``patchgym_records``: the audit hook counts its
functions among the runner's (a swap of their ``__code__`` is tampering).

Standard library only, Python 3.6+: this runs under the task's interpreter.
"""

import json
import os


class Writer:
    """JSON-line records into the descriptor ``fd`` (the supervisor's records pipe)."""

    def __init__(self, fd):
        self.fd = fd
        self.before_write = None  # audit.Policy.check_pending, once the hook is installed
        self.write(event="start", pid=os.getpid())

    def write(self, **record):
        if self.before_write is not None:
            self.before_write()
        data = memoryview((json.dumps(record) + "\n").encode("utf-8"))
        while data:
            data = data[os.write(self.fd, data):]

    def exit(self, code):
        """Write the last record, the runner's exit status, and close the pipe."""
        self.write(event="exit", code=code)
        os.close(self.fd)
