"""Effects a forger cannot avoid, checked against what they were before the repository could run.

The audit hook (``audit.py``) stops the primitives it is shown; a forger that finds others (a frame
reached through ``f_back``, an attribute of a class, which CPython does not audit) still has to
change something that decides the verdict. This module holds what those things were:

* :class:`Snapshot`: every attribute of the runner's modules and of the classes they define
  (``_pytest.*``, ``pytest``, ``pluggy``, ``py``, the runtime's own ``patchgym_*`` modules), and of
  the runtime's own objects, by identity, taken before the repository is importable. Compared
  before every record the runtime writes and at the end: an attribute replaced, added or removed is
  tampering, but for the few pytest itself changes while it runs (:data:`VOLATILE`) and, once, at
  the session's start, what pytest's own configuration adds (:meth:`Snapshot.rebase`).
* :class:`HiddenCode`: the code objects the hidden test modules were compiled to (each module's
  code as it is executed, seen by the audit hook's ``exec`` event; the creation of a code object
  claiming a hidden file is itself watched, see ``audit.py``), and what a test function pytest is
  about to call must be to be the test's own (:meth:`HiddenCode.problem`).

Comparisons are by identity (``is``), never ``==``: a replacement can make ``==`` say what it likes.
Standard library only, Python 3.6+.
"""

import errno
import itertools
import operator
import os
import sys
import types
from itertools import repeat

# Modules whose attributes decide the verdict: pytest, pluggy, pytest's old ``py`` library, the runtime.
RUNNER_PACKAGES = ("_pytest", "pytest", "pluggy", "py")
RUNTIME_PREFIX = "patchgym_"
# What pytest changes while it runs: each test's assertion-message hooks, the debugger's handles, and a
# flag it sets on item classes. None of them decides an outcome.
VOLATILE = {
    "_pytest.assertion.util": frozenset({"_reprcompare", "_assertion_pass", "_config"}),
    "_pytest.debugging.pytestPDB": frozenset({"_config", "_pluginmanager", "_recursive_debug",
                                              "_wrapped_pdb_cls", "_saved"}),
}
# ... and what Python itself changes on a class or module: before 3.7, abc's caches are class attributes
# of each ABC (and typing's of each generic), set anew as isinstance() and issubclass() run (gold on
# Python 3.6 was called tampering for _abc_generic_negative_cache); the warnings module keeps which
# warnings a module already showed in its __warningregistry__ (SWE-bench's seaborn-2848: pytest's
# python.py warned). A registry only silences a repeated warning: no more than the code under test
# may do anyway with warnings.filterwarnings, which the runtime does not watch.
VOLATILE_ANYWHERE = frozenset({"__warningregistry__", "_pytest_diamond_inheritance_warning_shown",
                               "_abc_registry", "_abc_cache", "_abc_negative_cache", "_abc_negative_cache_version",
                               "_abc_generic_negative_cache", "_abc_generic_negative_cache_version"})
# The modules on the way from a test's call to its record (running it, reporting it, writing junit,
# calling hooks, the runtime): checked before each test's call is recorded; the rest before the
# session's own records (a third of the cost).
VERDICT_PATH = ("_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.main", "_pytest.junitxml",
                "_pytest.skipping", "_pytest.outcomes", "_pytest.fixtures", "_pytest.nodes", "_pytest.unittest",
                "pluggy", RUNTIME_PREFIX)
# pytest's legacy accessors (``Config.rootdir``, ``Node.fspath``, ...), added to its classes when a
# session is configured: accepted at the session's start when they are that module's own code (as
# are an installed plugin's own functions, see _configure_accessor).
CONFIGURE_ADDS_FROM = os.path.join("_pytest", "legacypath.py")
# The module(s) that are pytest's public namespace: re-exports, no code of their own.
PUBLIC_NAMESPACES = frozenset({"pytest", "py.test"})
RUNTIME_DIR_PART = os.path.basename(os.path.dirname(os.path.abspath(__file__)))

_chain = itertools.chain.from_iterable
_values = operator.methodcaller("values")
_MISSING = object()


def _runner_module(name):
    return name.split(".")[0] in RUNNER_PACKAGES or name.startswith(RUNTIME_PREFIX)


def _classes_of(module_name, namespace, seen):
    """The classes defined in a module (``__module__`` is the module), nested ones included."""
    for value in list(namespace.values()):
        if isinstance(value, type) and id(value) not in seen and getattr(value, "__module__", None) == module_name:
            seen.add(id(value))
            yield value
            yield from _classes_of(module_name, vars(value), seen)


# Where pytest is the repository (pytest-dev/pytest rows): its modules are the code under test, which
# its own tests monkeypatch (``_pytest.doctest.CHECKER_CLASS``, ``_pytest.assertion.util.istext``...)
# and which the agent may change on disk anyway: the snapshot leaves them out.
PYTEST_ITSELF = ("_pytest", "pytest", "py.test")


class Snapshot:
    """The runner's modules and classes, and ``objects`` (the runtime's own), as they are now;
    with ``pytest_is_the_repository``, none of pytest's own (:data:`PYTEST_ITSELF`)."""

    def __init__(self, objects=(), pytest_is_the_repository=False):
        self.owners = []  # (name, namespace): a module's or class's __dict__, an object's vars()
        seen = set()
        left_out = PYTEST_ITSELF if pytest_is_the_repository else ()
        for name, module in sorted(sys.modules.items()):
            if module is None or not _runner_module(name) or name.split(".")[0] in left_out or name in left_out:
                continue
            self.owners.append((name, vars(module)))
            for cls in _classes_of(name, vars(module), seen):
                self.owners.append((f"{name}.{cls.__qualname__}", vars(cls)))
        for label, obj in objects:
            self.owners.append((label, vars(obj)))
        watched = {name for name, _ in self.owners}
        self.modules = {name: module for name, module in sys.modules.items() if name in watched}
        self.configured = {}  # owner -> keys pytest's configuration set (removed again at its end)
        self.take()

    def _allowed(self, name):
        return VOLATILE.get(name, frozenset()) | VOLATILE_ANYWHERE | self.configured.get(name, frozenset())

    def take(self):
        """(Re)take the reference: each owner's attributes (what a difference is named by), and for
        the fast comparison the values of the owners that may not change at all, in order, and of
        the others the value of each key that may not change."""
        self.references = [(name, ns, dict(ns), self._allowed(name)) for name, ns in self.owners]
        self.stable, self.stable_values, self.path, self.path_values = [], [], [], []
        self.getters, self.keys, self.values, self.volatile = [], [], [], []
        for name, ns, reference, allowed in self.references:
            if name in VOLATILE or name in self.configured or allowed.intersection(ns):
                keys = [key for key in reference if key not in allowed]
                self.getters.append(ns.get)
                self.keys.append(keys)
                self.values.extend(reference[key] for key in keys)
                self.volatile.append((ns, frozenset(keys), allowed))
            elif name.startswith(VERDICT_PATH):
                self.path.append(ns)
                self.path_values.extend(reference.values())
            else:
                self.stable.append(ns)
                self.stable_values.extend(reference.values())
        self.sizes = (len(self.path_values), len(self.stable_values))
        self.module_names = list(self.modules)
        self.module_objects = [self.modules[name] for name in self.module_names]

    def check(self, record):
        """:meth:`changed` before ``record`` is written: before a test's report, the modules on the
        verdict's path (:data:`VERDICT_PATH`); before the session's own records, everything."""
        return self.changed(whole=record.get("event") != "report")

    def changed(self, whole=True):
        """What differs from the snapshot (``"<owner>.<attribute> was replaced"``), or None. Fast
        when nothing does: identity comparisons of every value, in C. ``whole=False``: only the
        modules and classes on the verdict's path."""
        found = _chain(map(map, self.getters, self.keys, repeat(repeat(_MISSING))))
        if (sum(map(len, self.path)) != self.sizes[0]
                or not all(map(operator.is_, _chain(map(_values, self.path)), self.path_values))
                or (whole and (sum(map(len, self.stable)) != self.sizes[1]
                               or not all(map(operator.is_, _chain(map(_values, self.stable)), self.stable_values))))
                or not all(map(operator.is_, found, self.values))
                or not all(map(_only_allowed_added, self.volatile))):
            problem = self._difference(_submodule, added=_lazy_addition)
            if problem is None:  # only what is allowed changed: the new reference
                self.take()
            return problem
        return self.changed_modules()

    def _difference(self, accept=None, added=None):
        for name, ns, reference, allowed in self.references:
            problem = _differs(name, ns, reference, allowed, accept, added)
            if problem:
                return problem
        return None

    def rebase(self, trusted_codes):
        """At the session's start, once: what pytest's own configuration added to its classes (the
        accessors of :data:`CONFIGURE_ADDS_FROM`, whose code ``trusted_codes`` knows) becomes part
        of the reference; any other difference is returned, as :meth:`changed` names it."""
        problem = (self._difference(lambda value: _submodule(value) or _configure_accessor(value, trusted_codes),
                                    added=_configure_addition)
                   or self.changed_modules())
        if problem is None:
            for name, ns, reference, _ in self.references:
                keys = {k for k in ns if (k not in reference or ns[k] is not reference[k]) and not _submodule(ns[k])}
                if keys:
                    self.configured[name] = frozenset(keys)
            self.take()
        return problem

    def changed_modules(self):
        if all(map(operator.is_, map(sys.modules.get, self.module_names), self.module_objects)):
            return None
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                return f"sys.modules[{name!r}] was replaced"
        return None


def _only_allowed_added(volatile):
    """Whether a volatile owner's namespace ``ns`` has no key but its reference ``keys`` (all there:
    :meth:`Snapshot.changed` looked each up) and ``allowed`` ones: counted, not a set made per test."""
    ns, keys, allowed = volatile
    return len(ns) == len(keys) + sum(map(ns.__contains__, allowed))


def _differs(name, ns, reference, allowed, accept=None, added=None):
    """The first difference of ``ns`` from ``reference`` but in ``allowed`` keys, to a new value
    ``accept`` takes, or a key ``added(name, key, value)`` lets the owner gain."""
    for key, value in reference.items():
        if key in allowed:
            continue
        if key not in ns:
            return f"{name}.{key} was removed"
        if ns[key] is not value and not (accept and accept(ns[key])):
            return f"{name}.{key} was replaced"
    for key in list(ns):
        if (key not in reference and key not in allowed and not (accept and accept(ns[key]))
                and not (added and added(name, key, ns[key]))):
            return f"{name}.{key} was added"
    return None


def _submodule(value):
    """A module of the runner's, bound in its package's namespace when first imported (pytester)."""
    return isinstance(value, types.ModuleType) and _runner_module(getattr(value, "__name__", ""))


def _configure_addition(owner, key, value):
    return _public_namespace_addition(owner, key) or _lazy_addition(owner, key, value)


def _lazy_addition(owner, key, value):
    return _cached_tag(owner, key, value) or _errno_class(owner, key, value)


def _errno_class(owner, key, value):
    """An exception class the ``py`` library's ``py.error`` makes on first use and caches on itself
    (``py.error.ENOENT``: pytest's tmpdir and py.path raise them; SWE-bench's pytest-5413): a plain
    subclass of ``py._error.Error`` (the snapshot's own) named after the errno ``key`` names, with no
    code. The same class a forger could add does nothing else."""
    error = getattr(sys.modules.get("py._error"), "Error", None)
    number = getattr(errno, key, None)
    if owner != "py.error" or not isinstance(error, type) or type(value) is not type or not isinstance(number, int):
        return False
    own = vars(value).keys() - {"__module__", "__doc__", "__dict__", "__weakref__"}
    return (value.__bases__ == (error,) and not own and vars(value).get("__module__") == "py.error"
            and value.__name__ == errno.errorcode.get(number, f"UnknownErrno{number}"))


def _cached_tag(owner, key, value):
    """An XML tag class ``py.xml``'s namespaces make on first use and cache on themselves (pytest
    3.x's ``Junit.testcase``): added to a subclass of py.xml's ``Namespace`` (never a module, where
    a name shadows a builtin), a plain subclass of its ``Tag`` named as the key, with no code (at
    most its ``xmlname``, the key). The same class a forger could add does nothing else."""
    xmlgen = sys.modules.get("py._xmlgen")  # itself in the snapshot: its Tag and Namespace are the real ones
    tag, namespace = getattr(xmlgen, "Tag", None), getattr(xmlgen, "Namespace", None)
    if tag is None or not isinstance(namespace, type) or type(value) is not type:
        return False
    home = _owner_class(owner)
    own = vars(value).keys() - {"__module__", "__doc__", "__dict__", "__weakref__"}
    return (isinstance(home, type) and issubclass(home, namespace) and value.__bases__ == (tag,)
            and value.__name__ == key and own <= {"xmlname"} and vars(value).get("xmlname", key) == key)


def _owner_class(owner):
    """The class a snapshot owner's name (``module.Class[.Nested]``) names, or None (a module)."""
    parts = owner.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            found = module
            for part in parts[cut:]:
                found = vars(found).get(part) if isinstance(found, (type, types.ModuleType)) else None
            return found if isinstance(found, type) else None
    return None


def _public_namespace_addition(owner, key):
    """A name pytest's configuration adds to the ``pytest`` module itself (and its alias ``py.test``):
    pytest 3.x puts ``config``, ``ensuretemp`` and its plugins' ``pytest_namespace`` there. That
    module re-exports and runs no code of its own, so a name added to it is looked up by nobody but
    the code under test; a name it had that is replaced, or a dunder (``__getattr__``), is still
    a difference. Modules with code are not so: a name added there shadows a builtin."""
    return owner in PUBLIC_NAMESPACES and not (key.startswith("__") and key.endswith("__"))


def _configure_accessor(value, trusted_codes):
    """What a session's configuration sets on pytest's classes: a function or property of pytest's
    legacy accessors module, or of an installed plugin (hypothesis wraps ``FixtureFunctionMarker``),
    compiled before the repository was importable (its code is in ``trusted_codes``). Never one of
    pytest's or pluggy's own functions put somewhere else (``append_failure = append_pass``)."""
    value = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    function = value.fget if isinstance(value, property) else value
    code = getattr(function, "__code__", None)
    if not isinstance(code, types.CodeType) or object.__hash__(code) not in trusted_codes:  # audit.identity
        return False
    parts = set(code.co_filename.split(os.sep))
    return code.co_filename.endswith(CONFIGURE_ADDS_FROM) or not parts & {"_pytest", "pluggy", RUNTIME_DIR_PART}


def nested_codes(code):
    """``code`` and every code object among its constants, recursively."""
    stack, out = [code], []
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return out


class HiddenCode:
    """The code objects of the hidden test modules, as executed (``add``, from the audit hook)."""

    def __init__(self, files):
        self.files = set(files)  # real paths of the hidden test files
        self.codes = {}  # real path -> {id(code): code}
        self.sources = {}  # real path -> the file's content when its module code was first executed

    def add(self, code, path):
        found = self.codes.setdefault(path, {})
        for inner in nested_codes(code):
            found[id(inner)] = inner
        if path not in self.sources:
            try:
                with open(path, "rb") as fh:
                    self.sources[path] = fh.read()
            except OSError:
                self.sources[path] = b""

    def source(self, path):
        return self.sources.get(path, b"")

    def watches(self, path):
        """Whether the test functions of ``path`` can be checked (its module code was seen)."""
        return bool(self.codes.get(path))

    def problem(self, function, name, path, decorated):
        """Why ``function``, which pytest is about to call as the test ``name`` of ``path``, is not
        that test's own code (None when it is): its code must be one the module was compiled to,
        named ``name``. ``decorated()`` (asked only when ``function`` is not that code: the file
        gives the test a decorator that is not a mark): the function may be a wrapper whose
        ``__wrapped__`` chain ends at that code."""
        function = getattr(function, "__func__", function)
        known = self.codes.get(path, {})
        hops = 0
        while True:
            code = getattr(function, "__code__", None)
            if isinstance(code, types.CodeType) and known.get(id(code)) is code and code.co_name == name:
                return None
            inner = getattr(function, "__wrapped__", None) if decorated() else None
            if inner is None or hops > 20:
                what = code.co_filename + ":" + str(code.co_firstlineno) if isinstance(code, types.CodeType) \
                    else type(function).__name__
                return f"the test function {name} is not the code its file was compiled to ({what})"
            function, hops = getattr(inner, "__func__", inner), hops + 1
