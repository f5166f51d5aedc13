"""A PEP 578 audit hook that catches the primitives of an in-process forger while the tests run.

Code under test runs inside pytest's process, so an in-process forger finds pytest's objects and
bends them: it walks ``gc`` to find the ``Config`` and registers a plugin, walks frames up into the
runner's, traces or profiles the runner, swaps a function's ``__code__``, reads ``/proc/self`` or
writes the results files, or pokes memory with ``ctypes``. An audit hook cannot be removed once
added (``sys.addaudithook``), sees each of those as an event before it happens, and is installed by
:mod:`bootstrap` before any repository code is importable.

An event is judged by who asked for it: the first frame above the hook whose file is neither the
standard library nor an interpreter-made pseudo file (``<string>``, ``<frozen ...>``: code made by
``exec`` or importlib acts for its caller). That caller is *trusted* when its file is a hidden test
file, a test file or ``conftest.py`` not written during this run (the grader drops the agent's
changes to those), the runtime's own, a module the runner had loaded before the repository was
importable or a module of the runner's packages (``_pytest``, ``pluggy``: so pytest is trusted even
when it is the repository under test, pytester included), or installed code outside the workspace
(site-packages); anything else under the workspace (the repository, even installed
editable) or anywhere else is not. Events watched (the list comes from the attacks in
``tests/test_reward_forgery.py`` and the gold patches of the bundled tasks):

* ``gc.get_objects``, ``gc.get_referrers``, ``gc.get_referents``: how a forger finds pytest's
  ``Config``, session or items;
* ``sys.setprofile`` and ``sys.settrace`` when what they install is a Python function (it would be
  handed every frame, the runner's included): the event does not say what is installed, so an
  untrusted caller's event is noted and judged at the next watched event and before every result
  record, by what ``sys.getprofile()``/``sys.gettrace()`` then hold. A profiler written in C
  (``cProfile``, which real command-line tools start for a ``--profiler`` option: sqlfluff's does,
  under its tests) hands Python code no frame and is allowed. Profiling every thread at once
  (``sys._setprofileallthreads``, 3.12) is caught as it happens;
* ``sys._current_frames``, and ``sys._getframe`` when the
  frame it returns is one of the runner's or of the import machinery's (whose locals hold pytest's
  import hook, and through it the ``Config``, while pytest imports a test module) — from Python
  3.11: before it, the event names the caller's frame, not the one returned;
* ``object.__setattr__`` on a function, class or module of the runner's (``__code__``,
  ``__defaults__`` swaps);
* ``open`` of ``/proc/self``, ``/proc/<own pid>`` or ``/proc/thread-self``, of any path of the
  harness's (``.patchgym-`` names: results, junit; the runtime's own source only for writing) or
  of the results descriptor, and
  ``open`` of a hidden test file for writing (reading them is allowed);
* removing, renaming, linking, truncating or changing the mode of one of those paths, and listing
  ``/proc/self`` (``/proc/self/fd`` finds the results descriptor); listing the runtime's directory
  is allowed (sqlfluff's tests lint ``.``, and ``os.walk`` goes into it);
* ``ctypes`` memory and symbol access (``addressof``, ``cdata``, ``string_at``, ``wstring_at``,
  ``dlsym``, ``call_function``); ``ctypes.dlopen`` alone is what ``import ctypes`` does.

A caught event is written as a ``tampering`` record through the callback :func:`install` is given,
with the event and the caller's file and line, and the process ends at once (exit status 70, which
pytest never returns, so that a record that could not be written still leaves a contradiction): the
forger gets no chance to undo the record. A failure inside the hook itself prints its traceback
and ends the process with status 1 before the reporter's last record, so a bug here is never a
silent pass.

What stays open (frames reached through ``sys._getframe(0).f_back`` or a traceback, which no event
reports; setting attributes of a class, which CPython does not audit; installed code doing the
walking for the forger) is written down in ``docs/grading.md``.

Standard library only. Audit hooks exist from Python 3.8: under 3.6 and 3.7 :func:`install` adds
nothing (the rest of the runtime still runs there), and the supervisor's ``end`` record names the
interpreter, from which the harness reports the hook as missing (``protections_missing``).
"""

import fnmatch
import gc
import itertools
import operator
import os
import sys
import sysconfig
import threading
import time
import traceback
import types

WATCHED = frozenset({
    "compile", "code.__new__", "exec",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "sys.setprofile", "sys.settrace", "sys._setprofileallthreads", "sys._settraceallthreads",
    "sys._current_frames", "sys._getframe",
    "object.__setattr__", "open",
    "ctypes.addressof", "ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at", "ctypes.dlsym",
    "ctypes.call_function", "ctypes.cdata/buffer",
})
# Changing a path: the harness's files and the hidden tests may not be removed, renamed over,
# linked, truncated or have their mode changed by the code under test.
PATH_EVENTS = frozenset({"os.remove", "os.rename", "os.symlink", "os.link", "os.truncate", "os.chmod",
                         "os.chown", "os.utime", "os.mkdir", "shutil.rmtree", "shutil.move",
                         "os.listdir", "os.scandir"})
WATCHED = WATCHED | PATH_EVENTS
HARNESS_MARK = ".patchgym-"
RUNTIME_MARK = ".patchgym-rt-"  # testrun.run_tests's name for the runtime's directory
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
TAMPERED_EXIT = 70
# Installing these is judged by what was installed (see the docstring), not when it is asked for.
HOOK_EVENTS = {"sys.setprofile": sys.getprofile, "sys.settrace": sys.gettrace}
# Making code: judged by the file the new code claims (see Policy.creation_problem), not by who asks.
CREATION_EVENTS = frozenset({"compile", "code.__new__"})
# The function attributes that change what a test runs.
FUNCTION_BODY = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
REWRITER = os.path.join("_pytest", "assertion", "rewrite.py")
IMPORT_MACHINERY = "<frozen importlib"  # the frozen import system's code objects' file name
RUNNER_PREFIXES = ("_pytest", "pytest", "pluggy", "patchgym")
# The key of an object's identity in ``Policy.trusted_codes``: ``id()`` without its audit event
# (``builtins.id``: the hook is called for every event, and the trust walk keys tens of thousands of
# objects). ``object``'s own hash is the object's address, rotated: one key per live object, whatever
# its type defines, and no type can replace it.
identity = object.__hash__
_chain = itertools.chain.from_iterable
_consts = operator.attrgetter("co_consts")


# What grading.patches.is_test_or_config calls a test file (the runtime cannot import
# patchgym; tests/test_audit_hook.py checks that the two agree): files the filter drops from an
# agent's patch, so their content is the base commit's or the test patch's.
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py", "tests.py")
TEST_DIR_NAMES = frozenset({"tests", "test", "testing"})


def is_test_support(relative):
    """Whether ``relative`` (a path inside the workspace) is a test file, in a test directory, or a
    ``conftest.py``."""
    parts = relative.replace(os.sep, "/").split("/")
    if parts[-1] == "conftest.py" or any(part in TEST_DIR_NAMES for part in parts[:-1]):
        return True
    return any(fnmatch.fnmatchcase(parts[-1], pattern) for pattern in TEST_FILE_PATTERNS)


_REAL = {}


def _real(path):
    """``os.path.realpath``, once per path: the hook asks it of the same few files at every event
    (a path is then judged the same way throughout the run, whatever is linked there later)."""
    real = _REAL.get(path)
    if real is None:
        real = _REAL[path] = os.path.realpath(path)
    return real


def _spellings(dirs):
    """Each directory as written and resolved, with a trailing separator (frames name files both ways)."""
    return sorted({form.rstrip(os.sep) + os.sep for d in dirs if d for form in (os.path.abspath(d), _real(d))})


def _installed_dirs():
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("purelib", "platlib")}
    try:
        import site
        dirs.update(site.getsitepackages())
    except Exception:  # a virtualenv's old site.py has no getsitepackages
        pass
    return _spellings(dirs)


def _stdlib_dirs():
    paths = sysconfig.get_paths()
    return _spellings(paths.get(k) for k in ("stdlib", "platstdlib"))


class Policy:
    """Who may do what; see the module's docstring."""

    def __init__(self, workspace, hidden_tests, runtime_dir, report, results_fd=None, harness_files=()):
        self.workspace = _real(workspace) + os.sep
        self.hidden = {_real(os.path.join(workspace, p)) for p in hidden_tests}
        self.runtime = _real(runtime_dir) + os.sep
        self.runtime_name = os.path.basename(self.runtime.rstrip(os.sep))
        # Names of the harness's files (results, junit) and the runtime's directory: whatever their
        # paths, these random names in a path mean the path is the harness's.
        self.harness_names = tuple({HARNESS_MARK, self.runtime_name,
                                    *(os.path.basename(p) for p in harness_files if p)})
        self.stdlib = tuple(_stdlib_dirs())
        self.installed = tuple(d for d in _installed_dirs() if not d.startswith(self.workspace))
        self.report = report
        self.results_fd = results_fd
        self.runner_files = set()  # every module loaded before the repository was importable
        self.runner_modules = set()  # pytest's, pluggy's and the runtime's modules
        self.runner_frame_files = set()  # their files: the frames a forger must not reach
        self.runner_dirs = set()  # their packages' directories
        # Messages go to the stderr the process started with: pytest captures fds 1 and 2.
        try:
            self.stderr_fd = os.dup(2)
        except OSError:
            self.stderr_fd = 2
        self.pid = os.getpid()
        self.started = time.time()
        self._verdicts = {}  # filename -> trusted
        self.pending = {}  # event -> (file, line) of an untrusted sys.setprofile/settrace to judge
        self.stdlib_getframe = False  # see stdlib_frames_own
        # Code objects of every module loaded before the repository was importable (by :data:`identity`,
        # the objects kept so that no address is reused), and what is told of each hidden test module's
        # code as it is executed (effects.HiddenCode.add).
        self.trusted_codes = set()
        self._pinned = []
        self._walked = {}  # identity(module or class) -> (it, its namespace's values when walked): see _trust_code_of
        self.on_hidden_module = None
        self.trusting = False  # code is made and judged by identity once the runner is trusted

    def note_hook(self, event, filename, line):
        """An untrusted caller installs a profile or trace function: judged by :meth:`check_pending`."""
        self.pending.setdefault(event, (filename, line))

    def check_pending(self):
        """End the run as tampering if a profile or trace function an untrusted caller installed is
        Python code; forget the note otherwise (nothing, or a profiler written in C)."""
        while self.pending:
            event, (filename, line) = self.pending.popitem()
            installed = HOOK_EVENTS[event]()
            if _python_callable(installed):
                name = getattr(installed, "__qualname__", type(installed).__name__)
                _tampered(self, f"{event}({name})", (), filename, line)

    def trust_loaded_modules(self):
        """Trust the files of every module loaded so far: the runner, imported before the repository
        was importable (pytest itself, when it is the repository under test); and by identity the
        code objects of those outside the standard library, and of the frozen import machinery."""
        modules = list(sys.modules.items())
        for name, module in modules:
            path = getattr(module, "__file__", None)
            if path:
                self.runner_files.add(_real(path))
            if name.split(".")[0] in RUNNER_PREFIXES or name.startswith("patchgym_"):
                self.runner_modules.add(name)
                if path:
                    self.runner_frame_files.add(_real(path))
                # The runner's packages as a whole: modules of theirs imported later (pytester,
                # imported only when a run asks for it) are the runner's too.
                for directory in getattr(module, "__path__", None) or ():
                    self.runner_dirs.add(_real(directory) + os.sep)
        self._trust_code_of([module for _, module in modules if module is not None])
        self._verdicts.clear()
        self.trusting = True

    def _trust_code_of(self, modules):
        """Trust by identity the code of ``modules``: their functions', their classes' (methods,
        static and class methods, properties, nested classes), and the code nested in them
        (closures, comprehensions, lambdas made later). Called again (pytest's plugins loaded), it
        walks only what is new: the new modules, and every namespace walked before whose values are
        no longer the same objects (a plugin's function set on one of pytest's classes)."""
        function_type, functions, values = types.FunctionType, [], []
        walked, same = self._walked, operator.is_
        for owner, before in list(walked.values()):
            now = list(vars(owner).values())
            if len(now) != len(before) or not all(map(same, now, before)):
                walked[identity(owner)] = (owner, now)
                values.extend(now)
        for module in modules:
            namespace = getattr(module, "__dict__", {})
            if type(namespace) is not dict:  # not a module's namespace: walked each time
                values.extend(list(namespace.values()))
            elif identity(module) not in walked:
                walked[identity(module)] = (module, list(namespace.values()))
                values.extend(walked[identity(module)][1])
        while values:
            value = values.pop()
            kind = type(value)
            if kind is function_type:
                functions.append(value)
            elif kind is staticmethod or kind is classmethod:
                values.append(value.__func__)
            elif kind is property:
                values.extend(f for f in (value.fget, value.fset, value.fdel) if f is not None)
            elif isinstance(value, type):
                key = identity(value)
                if key not in walked:
                    walked[key] = (value, list(vars(value).values()))
                    values.extend(walked[key][1])
        # The functions' code in one call: a function's only code referent is its ``__code__``, and
        # reading ``__code__`` raises an audit event per function (ten thousand), this one event.
        code_type = types.CodeType
        self._trust_codes([code for code in gc.get_referents(*functions) if type(code) is code_type])

    def _trust_codes(self, level):
        """Trust ``level``'s code objects and the code nested in them, by identity: a level of
        nesting at a time, each in a few calls into C (ten thousand code objects at every start)."""
        code_type, seen, pinned = types.CodeType, self.trusted_codes, self._pinned
        while level:
            new = dict(zip(map(identity, level), level))  # noqa: B905  (zip has no strict before 3.10)
            for key in seen.intersection(new):
                del new[key]
            seen.update(new)
            level = list(new.values())
            pinned.extend(level)
            level = [c for c in _chain(map(_consts, level)) if type(c) is code_type]

    def register_module(self, code, caller):
        """A module's code is executed (``exec``): trust it by identity if it is a trusted file's
        own (a hidden test, a test-support file of the base commit, installed code, the standard
        library, a module of the runner's packages) — compiled by pytest's assertion rewriter from
        the file it read, or equal to the file's bytecode cache or to the file compiled. The hidden
        test modules' code is told to ``on_hidden_module`` too (``effects.HiddenCode``)."""
        if type(code) is not types.CodeType or code.co_name != "<module>" or identity(code) in self.trusted_codes:
            return
        real = _real(code.co_filename)
        kind = self.registrable(real)
        if kind is None:
            return
        rewritten = (caller is not None and identity(caller.f_code) in self.trusted_codes
                     and caller.f_code.co_filename.endswith(REWRITER))
        if not (rewritten or _same_code(code, real)):
            return
        self._trust_codes([code])
        if kind == "a hidden test" and self.on_hidden_module is not None:
            self.on_hidden_module(code, real)

    def registrable(self, real):
        """What kind of trusted file ``real`` is, for code executed after the runner was trusted."""
        if real in self.hidden:
            return "a hidden test"
        if real.startswith(self.workspace):
            relative = real[len(self.workspace):]
            return "a test-support file" if is_test_support(relative) and self._older_than_run(real) else None
        if real.startswith(self.installed) or real.startswith(tuple(self.runner_dirs)):
            return "installed code"
        if real.startswith(self.stdlib):
            return "the standard library"
        return None

    # -- who is asking --------------------------------------------------------------------------

    def _skipped(self, filename):
        # site-packages may sit inside the stdlib's directory (/usr/local/lib/python3.X/site-packages).
        return filename.startswith("<") or (filename.startswith(self.stdlib)
                                            and not filename.startswith(self.installed))

    def _acts_for_its_caller(self, code):
        """Code that asks on behalf of its caller: the standard library's, and code ``exec`` made
        (``<string>``). Once the runner is trusted, the standard library's and the import
        machinery's (``<frozen ...>``) only by identity: code that merely says so (compiled, or
        renamed in place with ``_imp._fix_co_filename``, under their names) asks for itself."""
        filename = code.co_filename
        if not self._skipped(filename):
            return False
        if not self.trusting or (filename.startswith("<") and not filename.startswith(IMPORT_MACHINERY)):
            return True
        return identity(code) in self.trusted_codes

    def stdlib_frames_own(self, frame):
        """Whether ``frame`` (the code that called ``sys._getframe``) is the standard library's and
        the policy leaves such calls alone (``stdlib_getframe``): ``collections.namedtuple`` or
        ``typing`` asking for their caller's module while a stdlib module is imported, from C, land
        on the import machinery's frames; the frame goes to the stdlib, not to the code that caused
        the import. Off for pytest, whose stdlib is imported before the repository is importable."""
        if not self.stdlib_getframe or frame is None:
            return False
        filename = frame.f_code.co_filename
        return filename.startswith(self.stdlib) and not filename.startswith(self.installed)

    def caller(self, frame):
        """The first frame from ``frame`` up that is neither stdlib nor interpreter-made."""
        while frame is not None and self._acts_for_its_caller(frame.f_code):
            frame = frame.f_back
        return frame

    def trusted(self, filename):
        verdict = self._verdicts.get(filename)
        if verdict is None:
            real = _real(filename)
            if (real in self.hidden or real in self.runner_files or real.startswith(self.runtime)
                    or real.startswith(tuple(self.runner_dirs))):
                verdict = True
            elif real.startswith(self.workspace):
                # Test files and conftest.py are the base commit's or the test patch's (the agent's
                # changes to them are dropped before grading) unless written during this run: not
                # cached, so that a file written after its first verdict is judged again.
                return is_test_support(real[len(self.workspace):]) and self._older_than_run(real)
            else:
                verdict = real.startswith(self.installed)
            self._verdicts[filename] = verdict
        return verdict

    def forged_identity(self, code):
        """Why ``code`` (a caller's) claims to be what it is not: code of a module loaded before the
        repository was importable, or the import machinery's, that is not one of those code objects
        (``compile(src, "<.../_pytest/runner.py>", "exec")``); None when it does not."""
        if identity(code) in self.trusted_codes:
            return None
        filename = code.co_filename
        if filename.startswith(IMPORT_MACHINERY):
            return f"code made at run time named {filename}"
        if filename.startswith("<"):
            return None
        real = _real(filename)
        if real in self.runner_files or real.startswith(self.runtime):
            return f"code made at run time claims the runner's file {filename}"
        return None

    def protected(self, filename):
        """What trusted file ``filename`` names (a string saying which kind), or None: a module of
        the runner's (loaded before the repository was importable, or of its packages), the
        runtime's, a hidden test, the import machinery. Code made claiming one of them must be
        that file's own (:meth:`creation_problem`)."""
        if not isinstance(filename, str):
            filename = os.fsdecode(filename) if isinstance(filename, bytes) else ""
        if filename.startswith(IMPORT_MACHINERY):
            return "the import machinery"
        if not filename or filename.startswith("<"):
            return None
        real = _real(filename)
        if real in self.hidden:
            return "a hidden test"
        if real.startswith(self.stdlib) and not real.startswith(self.installed):
            return None  # types.coroutine makes code of its caller's file
        if real in self.runner_files or real.startswith(self.runtime) or real.startswith(tuple(self.runner_dirs)):
            return "the runner"
        return None

    def creation_problem(self, event, args, frame):
        """Why making this code object is tampering (None: it is not): code that claims a trusted
        file (:meth:`protected`) must be that file's own: ``compile`` of a source equal to the
        file's content (what an import does), or of pytest's assertion rewriter's tree of the file
        it read; ``code.__new__`` (and ``code.replace``) never. Code renamed in place
        (``_imp._fix_co_filename``) raises no event: trust by identity does not believe it."""
        if event == "compile":
            source, filename = (args + (None, None))[:2]
            kind = self.protected(filename)
            if kind is None or _same_source(source, filename):
                return None
            if not isinstance(source, (str, bytes)) and _rewriter_read_the_file(frame, filename, self):
                return None
            return f"compile() of code claiming {kind} ({filename}) from another source"
        filename = args[1] if len(args) > 1 else None
        kind = self.protected(filename)
        return None if kind is None else f"a code object made claiming {kind} ({filename})"

    def hidden_function(self, obj):
        """Whether ``obj`` is a function of a hidden test file (its code says so)."""
        code = getattr(obj, "__code__", None)
        return isinstance(obj, types.FunctionType) and isinstance(code, types.CodeType) \
            and _real(code.co_filename) in self.hidden

    def _older_than_run(self, path):
        try:
            status = os.stat(path)
        except OSError:
            return False
        # ctime: no one can set it back (os.utime sets mtime and atime, and moves ctime to now).
        return max(status.st_ctime, status.st_mtime) < self.started

    # -- what is asked --------------------------------------------------------------------------

    def _runner_object(self, obj):
        module = getattr(obj, "__name__", None) if type(obj).__name__ == "module" else getattr(obj, "__module__", None)
        return isinstance(module, str) and module in self.runner_modules

    def _runner_frame(self, frame):
        if frame is None:
            return False
        filename = frame.f_code.co_filename
        # The import machinery's frames hold pytest's import hook (and through it the Config)
        # whenever pytest imports a test module.
        if filename.startswith("<frozen importlib"):
            return True
        real = _real(filename)
        return (real in self.runner_frame_files or real.startswith(self.runtime)
                or real.startswith(tuple(self.runner_dirs)))

    def say(self, text):
        try:
            os.write(self.stderr_fd, text.encode("utf-8", "replace"))
        except OSError:
            pass

    def _harness(self, path):
        return any(name in path for name in self.harness_names)

    def _own_proc(self, path):
        if not path.startswith("/proc/"):
            return False
        head = path[6:].split("/", 1)[0]
        return head in ("self", "thread-self", str(self.pid), str(os.getpid()))

    def _open_suspect(self, args):
        path = args[0] if args else None
        if isinstance(path, int):
            return self.results_fd is not None and path == self.results_fd
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return False
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 else 0
        writes = bool((isinstance(mode, str) and mode.strip("rbtU") != "") or (
            isinstance(flags, int) and flags & WRITE_FLAGS))
        if self._own_proc(path):
            return True
        if self._harness(path):
            # The runtime's source is no secret: tracebacks and inspect.stack() read it.
            return writes or (RUNTIME_MARK not in path and self.runtime_name not in path)
        return writes and _real(os.path.join(os.getcwd(), path)) in self.hidden

    def _path_suspect(self, args, listing):
        for arg in args:
            if isinstance(arg, bytes):
                arg = os.fsdecode(arg)
            if not isinstance(arg, str):
                continue
            if self._own_proc(arg):
                return True
            # Listing the runtime's directory tells nothing (its files are no secret; the results'
            # names show in a listing of the workspace too): os.walk of the repository does it.
            if listing is False and self._harness(arg):
                return True
            if listing is False and _real(os.path.join(os.getcwd(), arg)) in self.hidden:
                return True
        return False

    def suspect(self, event, args):
        """Whether ``event`` with ``args`` is one the forger needs (before asking who asked)."""
        if event == "open":
            return self._open_suspect(args)
        if event in PATH_EVENTS:
            return self._path_suspect(args, event in ("os.listdir", "os.scandir"))
        if event == "object.__setattr__":
            return bool(args) and (self._runner_object(args[0]) or (
                len(args) > 1 and args[1] in FUNCTION_BODY and self.hidden_function(args[0])))
        if event == "sys._getframe":
            return bool(args) and self._runner_frame(args[0])
        return True


def _read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except (OSError, TypeError, ValueError):
        return None


def _same_source(source, filename):
    """Whether ``source`` (text or bytes given to ``compile``) is the content of ``filename``."""
    if not isinstance(source, (str, bytes, bytearray, memoryview)):
        return False
    content = _read(filename)
    if content is None:
        return False
    if isinstance(source, str):
        try:
            import importlib.util
            return source == importlib.util.decode_source(content)
        except Exception:
            return False
    return bytes(source) == content


def _rewriter_read_the_file(frame, filename, policy):
    """pytest's assertion rewriter compiles the tree of a test module or plugin it read itself: the
    calling frame is the rewriter's own code, and a source it holds is the file's content."""
    if (frame is None or identity(frame.f_code) not in policy.trusted_codes
            or not frame.f_code.co_filename.endswith(REWRITER)):
        return False
    held = [v for v in frame.f_locals.values() if isinstance(v, (str, bytes))]
    return not held or any(_same_source(v, filename) for v in held)


def _same_code(code, path):
    """Whether ``code`` (a module's) is what ``path`` compiles to: equal (same bytecode, constants,
    names, lines) to the code in its bytecode cache, where the import system (with the runtime's
    redirections) would read it, or else to the file compiled."""
    import marshal

    try:
        import _frozen_importlib_external as external
        cached = _read(external.cache_from_source(path))
        if cached is not None and len(cached) > 16 and marshal.loads(cached[16:]) == code:
            return True
    except Exception:
        pass
    source = _read(path)
    try:
        return source is not None and compile(source, path, "exec", dont_inherit=True) == code
    except Exception:
        return False


def _python_callable(obj):
    """Whether calling ``obj`` runs Python code: a function, a method, or an instance of a class
    whose ``__call__`` is one (C profilers and tracers are neither)."""
    if obj is None:
        return False
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        return True
    call = next((vars(klass)["__call__"] for klass in type(obj).__mro__ if "__call__" in vars(klass)), None)
    return isinstance(call, types.FunctionType) or isinstance(getattr(obj, "func", None), types.FunctionType)


_state = threading.local()


def install(policy):
    """Add the hook for ``policy`` (once per process; it cannot be removed); None, and nothing
    added, under Python < 3.8, which has no audit hooks."""
    if not hasattr(sys, "addaudithook"):
        return None

    # Everything the hook needs is bound here: at interpreter shutdown module globals may be gone.
    watched, state, getframe, say, exit_now, format_exc, key = (WATCHED, _state, sys._getframe, policy.say, os._exit,
                                                                traceback.format_exc, identity)

    def hook(event, args):
        if event not in watched or getattr(state, "busy", False):
            return
        state.busy = True
        try:
            if event == "exec":
                if policy.trusting and args:
                    policy.register_module(args[0], getframe(1))
                return
            if policy.pending:
                policy.check_pending()
            if event in CREATION_EVENTS:
                # Before the runner is trusted nothing of the repository's can run: nothing to judge.
                problem = policy.trusting and policy.creation_problem(event, args, getframe(1))
                if problem:
                    frame = policy.caller(getframe(1))
                    _tampered(policy, problem, (), frame.f_code.co_filename if frame else "<unknown>",
                              frame.f_lineno if frame else 0)
                return
            if not policy.suspect(event, args):
                return
            if event == "sys._getframe" and policy.stdlib_frames_own(getframe(1)):
                return
            frame = policy.caller(getframe(1))
            filename = frame.f_code.co_filename if frame is not None else "<unknown>"
            if frame is not None and policy.trusting:
                # Trust by identity: the code of a module loaded before the repository was
                # importable, or executed since as a trusted file's own (Policy.register_module).
                if key(frame.f_code) in policy.trusted_codes:
                    return
                forged = policy.forged_identity(frame.f_code)
                if forged:
                    _tampered(policy, f"{_describe(event, args)} by {forged}", (), filename, frame.f_lineno)
            elif frame is not None and policy.trusted(filename):
                return
            line = frame.f_lineno if frame is not None else 0
            if event in HOOK_EVENTS:
                policy.note_hook(event, filename, line)
                return
            _tampered(policy, event, args, filename, line)
        except BaseException:
            say("patchgym-runtime: the audit hook failed:\n" + format_exc())
            exit_now(1)
        finally:
            state.busy = False

    sys.addaudithook(hook)
    return hook


def _describe(event, args):
    if event == "open" and args:
        return f"open({args[0]!r})"
    if event == "object.__setattr__" and len(args) > 1:
        target = getattr(args[0], "__qualname__", None) or getattr(args[0], "__name__", type(args[0]).__name__)
        return f"setattr({target}, {args[1]!r})"
    return event


def _tampered(policy, event, args, filename, line):
    what = _describe(event, args)
    policy.pending.clear()
    policy.say(f"patchgym-runtime: tampering: {what} from {filename}:{line}\n")
    try:
        policy.report(event="tampering", audit=what, file=filename, line=line)
    finally:
        # A status pytest never returns: after the reporter's last record (an atexit hook) the
        # record cannot be written, and the status then contradicts the recorded one.
        os._exit(TAMPERED_EXIT)
