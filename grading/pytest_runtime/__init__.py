"""The code patchgym runs *inside* a grading sandbox around pytest (standard library only).

These modules are not imported by the harness: their source is copied into the sandbox and run by
the task's interpreter (Python 3.6 on; the audit hook from 3.8), so they must not import anything of patchgym's.

* :mod:`bootstrap` starts pytest so that nothing the agent wrote can change how the tests run:
  the runner and everything it imports are loaded before the repository is importable, stdlib and
  runner module names always resolve to their installed copies, and plugins come only from
  distributions installed in the environment.
* :mod:`supervisor` forks pytest's process from the bootstrap's and outlives it: a subreaper that
  kills every process of the run once pytest has exited, and only then writes the results file.
* :mod:`audit` is a PEP 578 audit hook, installed before the repository is importable, that ends
  the run as tampered when code under test uses an in-process forger's primitives (``gc`` walks,
  tracing, the runner's frames or functions, ``/proc/self``, the harness's files, ``ctypes``).
* :mod:`reporter` is a pytest plugin registered before any repository code runs; it writes every
  test report, the session's end and the runner's exit status to a results file, which the harness
  cross-checks with pytest's own junit XML and with canary tests (see :mod:`patchgym.grading.testrun`).
* :mod:`effects` holds what decides the verdict as it was before the repository could run (the
  runner's modules and classes, the hidden test modules' code), checked before every record.
* :mod:`records` writes the records into the supervisor's pipe, for the reporter and the script
  runner alike; :func:`bootstrap.load_runtime_module` loads the runtime's other modules (its
  directory is never on ``sys.path``).
* :mod:`script_runner` starts Django's ``tests/runtests.py`` and SymPy's ``bin/test`` the same way
  (stdlib pinned, supervisor, audit hook, no bytecode from the tree) and records each test's outcome
  from inside the runner (``unittest.TestResult``, SymPy's ``PyTestReporter``) in the same records.
"""

from pathlib import Path

RUNTIME_DIR = Path(__file__).parent
RUNTIME_FILES = ("bootstrap.py", "reporter.py", "records.py", "supervisor.py", "audit.py", "effects.py",
                 "script_runner.py")
