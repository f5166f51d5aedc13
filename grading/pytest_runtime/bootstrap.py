"""Start pytest in a grading sandbox so that nothing in the repository changes how tests are run.

Run as ``python -I -B bootstrap.py PYTEST_ARGS...`` from the repository root, with the results
file's path in ``PATCHGYM_RESULTS`` (written by the supervisor, see ``supervisor.py``: this process
forks first, and pytest runs in the child). ``-I`` keeps the script's directory, the working directory,
``PYTHON*`` variables and the user's site-packages off ``sys.path``, so at first only the
interpreter's and the environment's own directories are importable. Then, in this order:

1. stdlib module names are pinned to the stdlib (a ``json.py`` or ``xml/`` in the repository can
   never stand in for them, even after pytest puts the repository first on ``sys.path``);
2. the results reporter is loaded, and the records pipe's writer (``records.py``) writes the
   first record;
3. pytest, every ``_pytest`` module, and every top-level module of pytest's installed requirements
   are imported, so their names are bound to the installed copies before the repository is
   importable (a ``pytest/``, ``_pytest/`` or ``pluggy/`` package in the repository is never seen);
4. pytest runs; its plugin auto-loading, ``-p`` options and the reporter all act before the
   reporter's ``pytest_load_initial_conftests`` puts the repository root first on ``sys.path``
   (what ``python -m pytest`` does), so entry points come only from installed distributions;
5. the exit status is recorded, and is the process's exit status.

Between 3 and 4, ``sys.pycache_prefix`` is set to the environment's bytecode prefix (named by
``PATCHGYM_BYTECODE_PREFIX``: a directory outside the repository, written only when the environment
was built, holding checked-hash pycs of the stdlib, site-packages and the repository at its base
commit; see ``sandboxes/bytecode.py``), or, where the environment has none, to :data:`NO_BYTECODE`
(a path under ``/dev/null``, where nothing can ever be created). Either way no bytecode cache found
in the tree (an image's own, or one the agent's patch slipped in) is read from then on: a module
imported after pytest — the repository's, pytest's assertion-rewritten test modules — comes from a
pyc whose source hash matches the source it is imported from, or is compiled from its source.
Setting it on the command line instead would also look up the stdlib and pytest there (with
``/dev/null``: 1.5 s -> 5.2 s to import pytest on a loaded 2-core machine). Python < 3.8 has no pycache
prefix: there the cache lookups of the workspace's sources are sent under :data:`NO_BYTECODE` by
hand (:func:`no_workspace_bytecode`, :func:`rewriter_reads_no_bytecode`). Neither is done when the
repository is pytest itself (:func:`runner_is_the_repository`); there only the patch filter holds.

Where the environment has no prefix, modules of the stdlib and of installed distributions outside
the workspace (the venv's site-packages, read-only in every sandbox) imported after that point keep
reading their own ``__pycache__`` (:func:`read_installed_bytecode`, with the audit policy's
directories): they are
the code the audit hook trusts as installed anyway, and compiling them from source would run the
compiler's warnings under the repository's warning filters (flask's ``filterwarnings = error``
turned blinker's ``invalid escape sequence`` DeprecationWarning into a SyntaxError: every
flask-4045 test failed to import), and cost every grading the compilation of its lazily imported
dependencies.

Standard library only, Python 3.6+ (no f-string ``=``, walrus or positional-only parameters): this
runs under the task's interpreter, not patchgym's. Under 3.6 and 3.7 there is no audit hook
(``audit.py``) and no ``sys.pycache_prefix``; the rest runs as above.
"""

import importlib
import importlib.machinery
import importlib.util
import os
import pkgutil
import re
import sys
import sysconfig
import traceback

WORKSPACE = os.getcwd()
HERE = os.path.dirname(os.path.abspath(__file__))
START_FAILED = "patchgym-runtime: the test runner could not start:"
# A bytecode cache prefix that cannot hold a file (``/dev/null`` is not a directory, even for root):
# reads find nothing, writes fail silently, and the code under test cannot plant a cache there.
NO_BYTECODE = "/dev/null/patchgym-no-bytecode"
# Python < 3.8 (read as this module is loaded, before anything sets the attribute).
NO_PYCACHE_PREFIX = not hasattr(sys, "pycache_prefix")
PREFIX_ENV = "PATCHGYM_BYTECODE_PREFIX"  # sandboxes.bytecode.PREFIX_ENV (this file imports no patchgym)
INTERNAL_ERROR = 3  # pytest.ExitCode.INTERNAL_ERROR
# Plugins that pytest marks for assertion rewriting when a run loads them (``-p pytester`` declares
# ``pytest_plugins = ["_pytest.pytester_assertions"]``): imported beforehand, pytest warns that it
# cannot rewrite them, and under ``filterwarnings = error`` (pytest's own configuration) the run
# dies. They stay unimported here; ``_pytest`` itself is bound to the installed package already, so
# they still come from there, not from the repository.
REWRITTEN_PLUGINS = {"_pytest.pytester", "_pytest.pytester_assertions"}  # pytester: before 5.x, no PYTEST_DONT_REWRITE
# Names of the stdlib that repositories commonly use for packages of their own.
NOT_PINNED = {"test", "tests"}


def _stdlib_dirs():
    paths = sysconfig.get_paths()
    dirs = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    dynload = os.path.join(paths.get("platstdlib", ""), "lib-dynload")
    if os.path.isdir(dynload):
        dirs.add(os.path.realpath(dynload))
    return sorted(dirs)


def _stdlib_names(dirs):
    names = set(getattr(sys, "stdlib_module_names", ()))
    if not names:  # Python < 3.10: what the stdlib directories hold
        for directory in dirs:
            for info in pkgutil.iter_modules([directory]):
                names.add(info.name)
    names.update(sys.builtin_module_names)
    return names - NOT_PINNED


class StdlibFirst:
    """A meta path finder that resolves stdlib top-level names from the stdlib directories only."""

    def __init__(self):
        self.dirs = _stdlib_dirs()
        self.names = _stdlib_names(self.dirs)

    def find_spec(self, fullname, path=None, target=None):
        if path is not None or fullname not in self.names:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, self.dirs)


def _requirement_names(requires):
    """Names of the requirements a distribution always needs (not those of its extras)."""
    for line in requires or ():
        if "extra" in line.partition(";")[2]:
            continue
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if match:
            yield match.group(1)


def _top_level_modules(dist):
    text = dist.read_text("top_level.txt")
    if text:
        return text.split()
    names = set()
    for item in dist.files or ():
        parts = item.parts
        if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith((".dist-info", ".egg-info")):
            continue
        if len(parts) == 1 and parts[0].endswith(".py"):
            names.add(parts[0][:-3])
        elif len(parts) > 1 and parts[-1] == "__init__.py":
            names.add(parts[0])
    return sorted(names)


def _preload_runner():
    """Import pytest and everything it is made of while only installed code is importable."""
    import _pytest
    import pytest  # noqa: F401

    for info in pkgutil.walk_packages(_pytest.__path__, "_pytest."):
        if info.name in REWRITTEN_PLUGINS:
            continue
        try:
            importlib.import_module(info.name)
        except Exception:  # optional parts (e.g. a Windows-only module)
            pass
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8: the backport pytest requires there, if installed
        try:
            import importlib_metadata as metadata
        except ImportError:
            return
    seen, queue = set(), ["pytest"]
    while queue:
        name = queue.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except Exception:
            continue
        queue.extend(_requirement_names(dist.requires))
        for module in _top_level_modules(dist):
            try:
                importlib.import_module(module)
            except Exception:
                pass


def read_installed_bytecode(dirs, workspace):
    """Let modules whose source lies under ``dirs`` (the stdlib's and the installed distributions'
    directories) read their bytecode cache beside the source whatever ``sys.pycache_prefix`` says;
    a source under ``workspace`` never does, even inside one of ``dirs`` (a venv in the tree).

    Such a source's cache path under :data:`NO_BYTECODE` becomes the one it would have without a
    prefix (:func:`_redirect_cache_paths`; pytest's assertion rewriter keeps its own)."""
    workspace = os.path.realpath(workspace) + os.sep
    roots = tuple(d.rstrip(os.sep) + os.sep for d in dirs if d)
    prefix = NO_BYTECODE + os.sep

    def readable(head):
        real = os.path.realpath(head) + os.sep
        return (head + os.sep).startswith(roots) and real.startswith(roots) and not real.startswith(workspace)

    def beside_source(cached):
        if not cached.startswith(prefix):
            return cached
        head, name = os.path.split(os.sep + cached[len(prefix):])
        return os.path.join(head, "__pycache__", name)

    _redirect_cache_paths(readable, beside_source)


def no_workspace_bytecode(workspace):
    """Python < 3.8 has no ``sys.pycache_prefix``: keep every bytecode cache of a source under
    ``workspace`` from being read from then on, as the prefix does from 3.8 (a pyc the code under
    test writes during the run, stamped with its source's mtime and size, would stand in for a
    test-support module or a test module imported later).

    Such a source's cache path becomes one under :data:`NO_BYTECODE`, where nothing can exist
    (:func:`_redirect_cache_paths`); pytest's assertion rewriter is handled by
    :func:`rewriter_reads_no_bytecode`."""
    root = os.path.realpath(workspace) + os.sep
    _redirect_cache_paths(lambda head: (os.path.realpath(head) + os.sep).startswith(root),
                          lambda cached: NO_BYTECODE + os.sep + cached.lstrip(os.sep))


def _redirect_cache_paths(applies, redirect):
    """Replace the import system's ``cache_from_source`` (looked up in its own module by
    ``SourceLoader.get_code``; ``importlib.util.cache_from_source`` is a separate binding, left
    alone): the cache path of a source whose directory ``applies`` (asked once per directory, a
    ``realpath`` each) becomes ``redirect(path)``."""
    import _frozen_importlib_external as external

    original = external.cache_from_source
    verdicts = {}

    def cache_from_source(path, debug_override=None, *, optimization=None):
        cached = original(path, debug_override, optimization=optimization)
        head = os.path.dirname(os.path.abspath(os.fspath(path)))
        verdict = verdicts.get(head)
        if verdict is None:
            verdict = verdicts[head] = applies(head)
        return redirect(cached) if verdict else cached

    external.cache_from_source = cache_from_source


def rewriter_reads_no_bytecode():
    """pytest's assertion rewriter (already imported) reads no cached rewritten module: each test
    module and ``conftest.py`` is rewritten from its source (Python < 3.8, where pytest keeps those
    caches beside the sources, and reads them whatever ``-B`` says)."""
    rewrite = sys.modules.get("_pytest.assertion.rewrite")
    if rewrite is not None and hasattr(rewrite, "_read_pyc"):
        rewrite._read_pyc = lambda *args, **kwargs: None


def runner_is_the_repository():
    """Whether the pytest running is the repository's own (pytest-dev/pytest rows: installed from
    the workspace by the environment build, as nothing else can make it so). Its tests write and
    read bytecode caches in this process (assertion rewriting's pyc tests), so there the pycache
    prefix is left alone and the patch filter alone keeps the agent's bytecode out."""
    import _pytest

    here = os.path.realpath(os.path.dirname(_pytest.__file__))
    return here.startswith(os.path.realpath(WORKSPACE) + os.sep)


def bytecode_prefix(named):
    """The pycache prefix for the run: the environment's bytecode prefix ``named`` by the sandbox,
    if it is an existing directory outside the repository that this process cannot write (mounted
    read-only, or root's while the tests run as another user), else :data:`NO_BYTECODE`."""
    if not named or not os.path.isabs(named) or not os.path.isdir(named) or os.access(named, os.W_OK):
        return NO_BYTECODE
    real, workspace = os.path.realpath(named), os.path.realpath(WORKSPACE)
    if real == workspace or real.startswith(workspace + os.sep) or workspace.startswith(real + os.sep):
        return NO_BYTECODE
    return real


def load_runtime_module(name):
    """The runtime's module ``name`` (``name.py`` beside this file) as ``patchgym_<name>``, in
    ``sys.modules``: the runtime's directory is never on ``sys.path`` (``-I``), and the audit hook
    counts the functions of ``patchgym_`` modules among the runner's."""
    spec = importlib.util.spec_from_file_location(f"patchgym_{name}", os.path.join(HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"patchgym_{name}"] = module
    spec.loader.exec_module(module)
    return module


def _hidden_test_files(args):
    """The test files the command line names (the hidden tests and the canaries' module)."""
    files = []
    for arg in args:
        if arg.startswith("-"):
            continue
        path = arg.split("::", 1)[0]
        if path.endswith(".py"):
            files.append(path)
    return files


def _guard(records, results, args, hidden_code):
    """Install the audit hook (:mod:`audit`) before the repository is importable; its tampering
    records go through the records pipe, and what it sees of the hidden test modules' code goes to
    ``hidden_code``. Returns the policy, to trust the runner once it is loaded."""
    audit = load_runtime_module("audit")
    junit = [a.split("=", 1)[1] for a in args if a.startswith("--junitxml=")]
    policy = audit.Policy(WORKSPACE, _hidden_test_files(args), HERE, records.write,
                          results_fd=records.fd, harness_files=[results, *junit])
    policy.on_hidden_module = hidden_code.add
    audit.install(policy)
    records.before_write = policy.check_pending
    return policy


def _watch(effects, policy, reporter, records):
    """When pytest has loaded its plugins (installed ones, and ``-p``; some patch pytest's classes as
    they load: hypothesis's) and the repository is not importable yet: their code trusted by
    identity too, and the runner's modules and classes and the runtime's own objects taken as they
    are, to be checked before every record (``effects.py``)."""
    policy.trust_loaded_modules()
    reporter.snapshot = effects.Snapshot([("patchgym_reporter.Reporter()", reporter),
                                          ("patchgym_records.Writer()", records),
                                          ("patchgym_reporter.Calls()", reporter.calls),
                                          ("patchgym_reporter.OwnCalls()", reporter.own),
                                          ("patchgym_audit.Policy()", policy)],
                                         pytest_is_the_repository=runner_is_the_repository())
    records.checks.append(reporter.snapshot.check)
    reporter.snapshot.take()  # with the two lines above in it


def main():
    results = os.environ.pop("PATCHGYM_RESULTS", None)
    prefix = bytecode_prefix(os.environ.pop(PREFIX_ENV, None))
    if not results:
        sys.stderr.write(START_FAILED + " PATCHGYM_RESULTS is not set\n")
        return 3
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != os.path.realpath(HERE)]
    sys.meta_path.insert(0, StdlibFirst())
    # A subreaper that writes the results file once every process of the run is dead (supervisor.py).
    supervisor = load_runtime_module("supervisor")
    fd = supervisor.supervise(results)
    try:
        effects = load_runtime_module("effects")
        reporter_module = load_runtime_module("reporter")
        records = load_runtime_module("records").Writer(fd)  # writes the first record
        hidden = sorted({os.path.realpath(p) for p in _hidden_test_files(sys.argv[1:])})
        hidden_code = effects.HiddenCode(hidden)
        policy = _guard(records, results, sys.argv[1:], hidden_code)
        _preload_runner()
        policy.trust_loaded_modules()
        own = reporter_module.OwnCalls(hidden_code)
        reporter = reporter_module.Reporter(records, WORKSPACE, own, trusted_codes=policy.trusted_codes)
        reporter.watch = lambda: _watch(effects, policy, reporter, records)
        import pytest
        if not runner_is_the_repository():
            if prefix == NO_BYTECODE:
                read_installed_bytecode(policy.stdlib + policy.installed, WORKSPACE)
            sys.pycache_prefix = prefix
            if NO_PYCACHE_PREFIX:  # the same, by hand
                no_workspace_bytecode(WORKSPACE)
                rewriter_reads_no_bytecode()
    except Exception as exc:
        sys.stderr.write(f"{START_FAILED} {type(exc).__name__}: {exc}\n")
        return 3
    try:
        code = int(pytest.main(sys.argv[1:], plugins=[reporter]))
    except Exception:
        # pytest itself raised (a plugin the repository's conftest names cannot be imported): the
        # traceback, and pytest's own status for an internal error, never a silent end.
        traceback.print_exc()
        code = INTERNAL_ERROR
    reporter.exit(code)
    supervisor.end(code)


if __name__ == "__main__":
    sys.exit(main())
