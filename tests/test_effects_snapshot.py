"""What the runtime's snapshot of the runner (grading/pytest_runtime/effects.py) lets change, and what not.

Old pytests add to their own namespaces while they run: pytest 3.x's configuration puts ``config``,
``ensuretemp`` and its plugins' ``pytest_namespace`` into the ``pytest`` module, and py.xml caches
the tag classes it makes (``Junit.testcase``) on its namespace classes. Gold under pytest 3.3 was
called tampering for both; so was a SWE-bench row whose run made pytest's ``python.py`` warn
(Python keeps a ``__warningregistry__`` in the module that warned). What is accepted must stay
exactly that: a name added to a module that runs code shadows a builtin there, a dunder on ``pytest`` (``__getattr__``) answers every lookup, and
a "tag" with code of its own is not a tag, nor one put anywhere but on a py.xml namespace class.
Checked in a child Python (the snapshot watches the ``_pytest`` modules this test session runs on).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from patchgym.grading import pytest_runtime

SCRIPT = textwrap.dedent('''
    import json, sys, types
    sys.path.insert(0, sys.argv[1])
    import pytest, _pytest.python, _pytest.runner
    xmlgen = types.ModuleType("py._xmlgen")
    class Tag(list):
        pass
    class Namespace:
        pass
    Tag.__module__ = Namespace.__module__ = "py._xmlgen"
    xmlgen.Tag, xmlgen.Namespace = Tag, Namespace
    sys.modules["py._xmlgen"] = xmlgen
    import effects
    out = {}

    def at_start(change, undo):
        snapshot = effects.Snapshot()
        change()
        out_ = snapshot.rebase(set())
        undo()
        return out_

    def while_running(change, undo):
        snapshot = effects.Snapshot()
        change()
        out_ = snapshot.changed()
        undo()
        return out_

    def setter(ns, key, value):
        return (lambda: ns.__setitem__(key, value)) if isinstance(ns, dict) else (lambda: setattr(ns, key, value))

    def unsetter(ns, key):
        return (lambda: ns.pop(key)) if isinstance(ns, dict) else (lambda: delattr(ns, key))

    ns = vars(_pytest.runner)
    out["name added to pytest"] = at_start(setter(pytest, "ensuretemp", object()), unsetter(pytest, "ensuretemp"))
    out["dunder added to pytest"] = at_start(setter(pytest, "__getattr__", lambda n: None), unsetter(pytest, "__getattr__"))
    out["builtin shadowed in _pytest.runner"] = at_start(setter(ns, "isinstance", lambda *a: True), unsetter(ns, "isinstance"))
    plain = type("testcase", (Tag,), {})
    with_code = type("failure", (Tag,), {"__init__": lambda self, *a, **k: None})
    renamed = type("testcase", (Tag,), {})
    out["tag cached"] = while_running(setter(Namespace, "testcase", plain), unsetter(Namespace, "testcase"))
    out["tag with code"] = while_running(setter(Namespace, "failure", with_code), unsetter(Namespace, "failure"))
    out["tag under another name"] = while_running(setter(Namespace, "failure", renamed), unsetter(Namespace, "failure"))
    as_builtin = type("isinstance", (Tag,), {})
    out["tag shadowing a builtin in a module"] = while_running(setter(ns, "isinstance", as_builtin),
                                                               unsetter(ns, "isinstance"))
    error_module = types.ModuleType("py._error")
    class Error(EnvironmentError):
        pass
    error_module.Error = Error
    sys.modules["py._error"] = error_module
    maker = sys.modules["py.error"] = types.ModuleType("py.error")
    def errno_class(name, bases=(Error,), **extra):
        return type(name, bases, {"__module__": "py.error", "__doc__": "No such file or directory", **extra})
    out["errno class cached"] = while_running(setter(maker, "ENOENT", errno_class("ENOENT")), unsetter(maker, "ENOENT"))
    out["errno class under another name"] = while_running(setter(maker, "EEXIST", errno_class("ENOENT")),
                                                          unsetter(maker, "EEXIST"))
    out["errno class with code"] = while_running(setter(maker, "ENOENT", errno_class("ENOENT", __str__=lambda s: "")),
                                                 unsetter(maker, "ENOENT"))
    out["errno class of another base"] = while_running(setter(maker, "ENOENT", errno_class("ENOENT", (OSError,))),
                                                       unsetter(maker, "ENOENT"))
    python_ns = vars(_pytest.python)
    out["warning registry"] = while_running(setter(python_ns, "__warningregistry__", {"version": 0}),
                                            unsetter(python_ns, "__warningregistry__"))
    print(json.dumps(out))
''')


def test_what_old_pytests_add_is_accepted_and_nothing_like_it():
    runtime = pytest_runtime.__path__[0]
    done = subprocess.run([sys.executable, "-c", SCRIPT, runtime], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["name added to pytest"] is None
    assert found["tag cached"] is None
    assert found["warning registry"] is None  # Python's own, where a module warned (SWE-bench's seaborn-2848)
    assert found["dunder added to pytest"] == "pytest.__getattr__ was added"
    assert found["builtin shadowed in _pytest.runner"] == "_pytest.runner.isinstance was added"
    assert found["tag with code"] == "py._xmlgen.Namespace.failure was added"
    assert found["tag under another name"] == "py._xmlgen.Namespace.failure was added"
    assert found["tag shadowing a builtin in a module"] == "_pytest.runner.isinstance was added"
    # py.error's exception classes, made on first use (SWE-bench's pytest-5413), and nothing like them
    assert found["errno class cached"] is None
    assert found["errno class under another name"] == "py.error.EEXIST was added"
    assert found["errno class with code"] == "py.error.ENOENT was added"
    assert found["errno class of another base"] == "py.error.ENOENT was added"


HIDDEN = '''
import functools


def wraps_it(f):
    @functools.wraps(f)
    def wrapper():
        return f()
    return wrapper


def test_plain():
    assert 1


@wraps_it
def test_wrapped():
    assert 1
'''


def test_a_hidden_test_is_its_own_code_or_a_wrapper_of_it_where_its_file_decorates_it(tmp_path):
    """``HiddenCode.problem``: a test called as compiled needs no look at its decorators (the file is
    parsed only for a test that is not); a wrapper passes only where the file decorates the test; a
    function with other code is forged, decorated or not."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pg_effects", pytest_runtime.RUNTIME_DIR / "effects.py")
    effects = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(effects)
    path = str(tmp_path / "test_hidden.py")
    code = compile(HIDDEN, path, "exec")
    hidden = effects.HiddenCode([path])
    hidden.add(code, path)
    namespace: dict = {}
    exec(code, namespace)

    def never():
        raise AssertionError("asked whether a test called as compiled is decorated")

    assert hidden.problem(namespace["test_plain"], "test_plain", path, never) is None
    assert hidden.problem(namespace["test_wrapped"], "test_wrapped", path, lambda: True) is None
    assert hidden.problem(namespace["test_wrapped"], "test_wrapped", path, lambda: False)
    assert hidden.problem(lambda: None, "test_plain", path, lambda: True)


PYTEST_ITSELF = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import pytest, pluggy, _pytest.doctest, _pytest.runner
    import effects
    out = {}
    for mine in (False, True):
        snapshot = effects.Snapshot(pytest_is_the_repository=mine)
        saved = _pytest.doctest.CHECKER_CLASS
        _pytest.doctest.CHECKER_CLASS = object()
        pytest.FIXTURE_ORDER = []
        out["pytest's own changed, pytest is the repository" if mine else "pytest's own changed"] = snapshot.changed()
        _pytest.doctest.CHECKER_CLASS = saved
        del pytest.FIXTURE_ORDER
        snapshot.take()
        saved = pluggy.PluginManager.register
        pluggy.PluginManager.register = lambda self, plugin, name=None: None
        out["pluggy changed" + (", pytest is the repository" if mine else "")] = snapshot.changed()
        pluggy.PluginManager.register = saved
    print(json.dumps(out))
''')


def test_where_pytest_is_the_repository_its_own_modules_are_the_code_under_test():
    """pytest-dev/pytest rows: pytest's tests monkeypatch pytest (gold of 7 of 10 SWE-bench Lite rows
    was called tampering for it); its modules are the agent's code there, changed on disk as easily.
    The rest of the runner (pluggy, the runtime) is still watched."""
    done = subprocess.run([sys.executable, "-c", PYTEST_ITSELF, pytest_runtime.__path__[0]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert "was replaced" in out["pytest's own changed"]
    assert out["pytest's own changed, pytest is the repository"] is None
    assert "pluggy" in out["pluggy changed"] and "pluggy" in out["pluggy changed, pytest is the repository"]
