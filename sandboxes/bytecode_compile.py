"""Compile Python sources into a bytecode prefix directory, as checked-hash pycs (PEP 552).

Run by the environment's own interpreter (its magic number and cache tag are the ones that count)
when an environment is built (:mod:`patchgym.sandboxes.bytecode`)::

    python -I bytecode_compile.py PREFIX [--stdlib] [--site] [SOURCE[=AS] ...]

Each ``.py`` under a root goes to where ``sys.pycache_prefix = PREFIX`` makes the interpreter look
for it (``PREFIX/<dir>/<name>.<tag>.pyc``): ``--stdlib`` compiles the interpreter's standard
library, ``--site`` its purelib and platlib (a venv's site-packages), and ``SOURCE=AS`` the tree
at ``SOURCE`` as the path ``AS`` it will have when imported (the repository's checkout on the host,
imported from ``/testbed`` in a sandbox). A checked-hash pyc holds the SipHash of its source, and
the interpreter uses it only if the source it is about to import has that hash: a source changed
since (by an agent's patch) is compiled afresh, and a pyc that does not match is never read.

A pyc already there that matches its source is left as it is (a second pass after install steps
writes only what they changed); sources that do not compile (test data, Python 2 files) are skipped.
Standard library only, Python 3.8+ (under an older one it writes nothing and succeeds: the prefix
is empty): this runs under the task's interpreter, not patchgym's.
"""

import importlib.util
import os
import py_compile
import sys
import sysconfig
import time

SKIPPED_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".tox", ".nox", "node_modules"}
# Directories of the standard library that graded code never imports (its own test suite), and the
# site directories (compiled with --site when they are the environment's).
STDLIB_SKIPPED = {"test", "tests", "idle_test", "site-packages", "dist-packages", "idlelib", "lib2to3", "ensurepip"}
CHECKED_HASH = 0b11  # PEP 552 flags: hash-based, check_source


def _sources(root, skipped):
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in skipped and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(directory, name)


def _up_to_date(cfile, source):
    """Whether ``cfile`` is already a checked-hash pyc of exactly ``source``."""
    try:
        with open(cfile, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return False
    return (len(head) == 16 and head[:4] == importlib.util.MAGIC_NUMBER
            and int.from_bytes(head[4:8], "little") == CHECKED_HASH
            and head[8:16] == importlib.util.source_hash(source))


def compile_tree(root, as_path, skipped=SKIPPED_DIRS):
    """Compile every source under ``root`` to the prefix as if it sat at ``as_path``; return how many
    pycs were written."""
    written = 0
    root = os.path.abspath(root)
    for path in _sources(root, skipped):
        imported_as = os.path.join(as_path, os.path.relpath(path, root))
        cfile = importlib.util.cache_from_source(imported_as)
        try:
            with open(path, "rb") as fh:
                source = fh.read()
        except OSError:
            continue
        if _up_to_date(cfile, source):
            continue
        try:
            py_compile.compile(path, cfile=cfile, dfile=imported_as, doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        except (py_compile.PyCompileError, OSError, ValueError, SyntaxError):
            continue
        written += 1
    return written


def main(argv):
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    prefix, rest = os.path.abspath(argv[0]), argv[1:]
    if not hasattr(sys, "pycache_prefix"):
        # Python < 3.8: no interpreter would look in a prefix, and cache_from_source would write
        # beside the sources instead (into the interpreter's own stdlib): an empty prefix.
        print(f"no pycs written: Python {sys.version.split()[0]} has no sys.pycache_prefix")
        return 0
    roots = []
    for arg in rest:
        if arg == "--stdlib":
            paths = sysconfig.get_paths()
            for key in ("stdlib", "platstdlib"):
                if paths.get(key):
                    roots.append((paths[key], paths[key], SKIPPED_DIRS | STDLIB_SKIPPED))
        elif arg == "--site":
            paths = sysconfig.get_paths()
            for key in ("purelib", "platlib"):
                if paths.get(key):
                    roots.append((paths[key], paths[key], SKIPPED_DIRS))
        else:
            source, _, imported_as = arg.partition("=")
            roots.append((source, imported_as or source, SKIPPED_DIRS))
    sys.pycache_prefix = prefix  # every import this script needs is done: only cache_from_source reads it
    written, seen, started = 0, set(), time.monotonic()
    for source, imported_as, skipped in roots:
        key = (os.path.realpath(source), imported_as)
        if key in seen or not os.path.isdir(source):
            continue
        seen.add(key)
        written += compile_tree(source, imported_as, skipped)
    print(f"{written} pycs written to {prefix} in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
