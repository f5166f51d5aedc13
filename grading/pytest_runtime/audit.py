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
import os
import sys
import sysconfig
import threading
import time
import traceback
import types

WATCHED = frozenset({
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
RUNNER_PREFIXES = ("_pytest", "pytest", "pluggy", "patchgym")


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


def _real(path):
    return os.path.realpath(path)


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
        was importable (pytest itself, when it is the repository under test)."""
        for name, module in list(sys.modules.items()):
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
        self._verdicts.clear()

    # -- who is asking --------------------------------------------------------------------------

    def _skipped(self, filename):
        # site-packages may sit inside the stdlib's directory (/usr/local/lib/python3.X/site-packages).
        return filename.startswith("<") or (filename.startswith(self.stdlib)
                                            and not filename.startswith(self.installed))

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
        while frame is not None and self._skipped(frame.f_code.co_filename):
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
            return bool(args) and self._runner_object(args[0])
        if event == "sys._getframe":
            return bool(args) and self._runner_frame(args[0])
        return True


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
    watched, state, getframe, say, exit_now, format_exc = (WATCHED, _state, sys._getframe, policy.say, os._exit,
                                                           traceback.format_exc)

    def hook(event, args):
        if event not in watched or getattr(state, "busy", False):
            return
        state.busy = True
        try:
            if policy.pending:
                policy.check_pending()
            if not policy.suspect(event, args):
                return
            if event == "sys._getframe" and policy.stdlib_frames_own(getframe(1)):
                return
            frame = policy.caller(getframe(1))
            filename = frame.f_code.co_filename if frame is not None else "<unknown>"
            if frame is not None and policy.trusted(filename):
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
