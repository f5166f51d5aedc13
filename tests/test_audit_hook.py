"""The runtime's audit hook (grading/pytest_runtime/audit.py), run as the grader runs it:
``python -I -B <runtime>/bootstrap.py`` in a small repository whose package uses one forger's
primitive while the tests run. Each primitive must end the run with a ``tampering`` record naming the
event and the package's file; the controls (what libraries and tests do every day) must not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from patchgym.grading import integrity
from patchgym.grading.pytest_runtime import RUNTIME_DIR, RUNTIME_FILES

TEST_FILE = "tests/test_things.py"
TESTS = textwrap.dedent('''
    import pkg

    def test_value():
        assert pkg.value() == 1
''')

ATTACKS = {
    "gc walk": ("import gc\n_found = gc.get_objects()\n", "gc.get_objects"),
    "gc referrers": ("import gc, sys\ngc.get_referrers(sys.modules)\n", "gc.get_referrers"),
    "profile hook": ("import sys\nsys.setprofile(lambda *a: None)\nsys.setprofile(None)\n", "sys.setprofile"),
    "trace hook": ("import sys\nsys.settrace(lambda *a: None)\n", "sys.settrace"),
    "profile hook left in place": ("import sys\nsys.setprofile(lambda *a: None)\n", "sys.setprofile"),
    "profile hook of a callable class": ("import sys\nclass P:\n    def __call__(self, *a):\n        return None\n"
                                         "sys.setprofile(P())\n", "sys.setprofile"),
    "profile hook swapped for cProfile": ("import sys, cProfile\nsys.setprofile(lambda *a: None)\n"
                                          "cProfile.Profile().enable()\n", "sys.setprofile"),
    "frames of the runner by depth": ("import sys\ni = 0\nwhile '_pytest' not in sys._getframe(i).f_code.co_filename:"
                                      "\n    i += 1\n", "sys._getframe"),
    "every thread's frames": ("import sys\nsys._current_frames()\n", "sys._current_frames"),
    "__code__ swap of pytest's call hook": ("import _pytest.python as p\n"
                                            "p.pytest_pyfunc_call.__code__ = (lambda pyfuncitem: True).__code__\n",
                                            "setattr(pytest_pyfunc_call, '__code__')"),
    "/proc/self/maps": ("open('/proc/self/maps').read()\n", "open('/proc/self/maps')"),
    "/proc/self through pathlib": ("import pathlib\npathlib.Path('/proc/self/status').read_text()\n",
                                   "open('/proc/self/status')"),
    "/proc/self/fd listed": ("import os\nos.listdir('/proc/self/fd')\n", "os.listdir"),
    "results file opened": ("import os\n[open(n, 'a') for n in os.listdir('.') if n.startswith('.patchgym-results')]\n",
                            "open('.patchgym-results-"),
    "results descriptor by number": ("import os\nfor fd in range(3, 64):\n    try:\n        os.fstat(fd)\n"
                                     "    except OSError:\n        continue\n    open(fd, 'a', closefd=False)\n",
                                     "open("),
    "hidden test file written": (f"open({TEST_FILE!r}, 'a').close()\n", f"open({TEST_FILE!r})"),
    "harness file removed": ("import os, glob\nfor n in glob.glob('.patchgym-results-*'):\n    os.remove(n)\n",
                             "os.remove"),
    "ctypes memory read": ("import ctypes\nctypes.string_at(id(1), 8)\n", "ctypes.string_at"),
    "ctypes symbol": ("import ctypes\nctypes.pythonapi.Py_IncRef\n", "ctypes.dlsym"),
    "primitive inside exec": ("exec('import gc; gc.get_objects()')\n", "gc.get_objects"),
}

CONTROLS = {
    "own frames": "import sys, inspect\nsys._getframe(0)\ninspect.currentframe()\n",
    "inspect.stack and format_stack": "import inspect, traceback\ninspect.stack()\ntraceback.format_stack()\n",
    "logging and warnings": ("import logging, warnings\nlogging.getLogger('pkg').warning('careful')\n"
                             "warnings.warn('old', DeprecationWarning)\n"),
    "dataclasses and exec": ("import dataclasses\n@dataclasses.dataclass\nclass P:\n    x: int = 1\nP()\n"
                             "exec('y = 1')\n"),
    "own __code__ swapped": "def a():\n    return 1\ndef b():\n    return 2\na.__code__ = b.__code__\n",
    "files read": f"open(__file__).read()\nopen({TEST_FILE!r}).read()\nimport os\nos.listdir('.')\n",
    "temporary files": "import tempfile\nwith tempfile.TemporaryFile() as fh:\n    fh.write(b'x')\n",
    "ctypes imported": "import ctypes\n",
    "gc collected": "import gc\ngc.collect()\ngc.disable()\ngc.enable()\n",
    # sqlfluff's CLI starts cProfile for --profiler, and its tests run that option.
    "cProfile started and stopped": "import cProfile\n_p = cProfile.Profile()\n_p.enable()\nsum(range(9))\n_p.disable()\n",
    # sqlfluff's linter walks the directory it is given, `.` included: into the runtime's directory.
    "the workspace walked": "import os\n_walked = [names for _, _, names in os.walk('.')]\n",
    "cProfile left running": "import cProfile\n_q = cProfile.Profile()\n_q.enable()\n",
    "trace function cleared": "import sys\nsys.settrace(None)\nsys.setprofile(None)\n",
}


def _run(tmp_path: Path, payload: str, extra: dict[str, str] | None = None
         ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    for path, text in (extra or {}).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(payload + "\n\ndef value():\n    return 1\n")
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / TEST_FILE).write_text(TESTS)
    runtime = tmp_path / ".patchgym-rt-0123"
    runtime.mkdir()
    for name in RUNTIME_FILES:
        shutil.copy(RUNTIME_DIR / name, runtime / name)
    results = ".patchgym-results-0123.jsonl"
    (tmp_path / results).write_bytes(b"")  # as testrun.place_harness_files leaves it before the run
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PYTHON"))}
    proc = subprocess.run([sys.executable, "-I", "-B", f"{runtime.name}/bootstrap.py", "-q", "-p", "no:cacheprovider",
                           "--junitxml=.patchgym-junit-0123.xml", f"{TEST_FILE}::test_value"],
                          cwd=tmp_path, env={**env, "PATCHGYM_RESULTS": results}, capture_output=True, text=True,
                          timeout=120)
    path = tmp_path / results
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return proc, records


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_forgers_primitive_ends_the_run_as_tampering(name, tmp_path):
    payload, event = ATTACKS[name]
    proc, records = _run(tmp_path, payload)
    tampering = [r for r in records if r["event"] == "tampering"]
    assert tampering, proc.stdout + proc.stderr
    assert tampering[0]["audit"].startswith(event), tampering[0]
    assert tampering[0]["file"].endswith("pkg/__init__.py"), tampering[0]
    assert proc.returncode == 70
    record = integrity.parse_record("".join(json.dumps(r) + "\n" for r in records))
    reason = integrity.check_run(exit_code=proc.returncode, output=proc.stdout, junit=None, record=record,
                                 reporter=True, requested=[f"{TEST_FILE}::test_value"], canaries=None)
    assert reason and "pkg/__init__.py" in reason and event.split("(")[0] in reason


def test_what_libraries_do_every_day_is_not_tampering(tmp_path):
    proc, records = _run(tmp_path, "\n".join(CONTROLS.values()))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["event"] for r in records][-3:] == ["finish", "exit", "end"]  # the supervisor's end last
    assert not [r for r in records if r["event"] == "tampering"]


def test_test_support_files_are_trusted_unless_written_during_the_run(tmp_path):
    # A conftest.py of the base commit may walk gc (leak checks do); a helper the package writes into
    # tests/ during the run and imports is the package's code.
    gc_walk = "import gc\n_objects = gc.get_objects()\n"
    proc, records = _run(tmp_path / "a", "", {"tests/conftest.py": gc_walk, "tests/helpers.py": gc_walk,
                                               "tests/__init__.py": ""})
    assert proc.returncode == 0 and not [r for r in records if r["event"] == "tampering"], proc.stderr
    written = ("import importlib, pathlib\npathlib.Path('tests/pg_helper.py').write_text(%r)\n"
               "importlib.import_module('tests.pg_helper')\n" % gc_walk)
    proc, records = _run(tmp_path / "b", written, {"tests/__init__.py": ""})
    tampering = [r for r in records if r["event"] == "tampering"]
    assert tampering and tampering[0]["file"].endswith("tests/pg_helper.py"), (records, proc.stderr)


@pytest.mark.parametrize("path", ["conftest.py", "a/conftest.py", "tests/x.py", "pkg/test/y.py", "testing/z.py",
                                  "test_a.py", "pkg/b_test.py", "pkg/tests.py", "pkg/mod.py", "pkg/testsuite.py",
                                  "Tests/x.py", "pkg/contest.py"])
def test_the_runtime_and_the_patch_filter_agree_on_what_a_test_file_is(path):
    from patchgym.grading.patches import is_test_or_config
    from patchgym.grading.pytest_runtime.audit import is_test_support
    assert is_test_support(path) == is_test_or_config(path)


def test_a_failure_inside_the_hook_is_a_traceback_and_exit_1(tmp_path, monkeypatch):
    # A policy that raises: the run must end loudly, never pass.
    broken = tmp_path / "rt"
    shutil.copytree(RUNTIME_DIR, broken, ignore=shutil.ignore_patterns("__pycache__"))
    audit = broken / "audit.py"
    audit.write_text(audit.read_text().replace('    def suspect(self, event, args):\n',
                                               '    def suspect(self, event, args):\n        raise RuntimeError("boom")\n'))
    monkeypatch.setitem(globals(), "RUNTIME_DIR", broken)
    (tmp_path / "w").mkdir()
    proc, records = _run(tmp_path / "w", "import gc\ngc.get_objects()\n")
    assert proc.returncode == 1
    assert "the audit hook failed" in proc.stderr and "RuntimeError: boom" in proc.stderr
    assert [r["event"] for r in records] == ["start", "end"]  # the runner's start, the supervisor's end
