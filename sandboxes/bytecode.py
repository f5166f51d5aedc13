"""The read-only bytecode cache an environment is built with.

A graded test run must never read bytecode an agent could have written (a forged pyc stands in for
the source it claims to be), so the test runtime points ``sys.pycache_prefix`` away from the tree.
Pointing it at nothing (``/dev/null``) made every module imported after pytest compile from source
on every run: sympy's import went from 0.9 s to 7.4 s. Instead, each environment is built with a
prefix directory holding checked-hash pycs (PEP 552) of the standard library, the environment's
site-packages and the repository at the commit the environment was built from, compiled by
:mod:`patchgym.sandboxes.bytecode_compile` at the paths graded code imports them from. A checked-hash pyc is
used only when its source's hash matches, so a source a patch changed is compiled afresh, and the
directory is written only while the environment is built: the sandboxes mount it read-only (local)
or have it in the image, root's, while commands run as uid 1000 (docker).

A sandbox names its prefix in :data:`PREFIX_ENV` in every command's environment; where it is not
set (an environment built before prefixes existed) the runtime falls back to ``/dev/null``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from patchgym.sandboxes.lifetime import run_checked

log = logging.getLogger(__name__)

PREFIX_ENV = "PATCHGYM_BYTECODE_PREFIX"
COMPILER = Path(__file__).with_name("bytecode_compile.py")
PREFIX_NAME = "bytecode"
COMPILE_TIMEOUT = 1800.0


def compiler_source() -> str:
    """The compile script's text (run with ``python -c`` where the file cannot be mounted)."""
    return COMPILER.read_text()


def build_prefix(python: str, target: Path, roots: list[str], log_file: Path) -> Path | None:
    """Compile ``roots`` (arguments of :mod:`.bytecode_compile`: ``--stdlib``, ``--site``,
    ``SOURCE=AS``) with ``python`` into a prefix built under a temporary name next to ``target``
    and renamed to ``target`` once complete; return ``target``, or None when compiling failed (the
    environment is then used without a prefix, as before: bytecode is an optimization)."""
    if target.is_dir():
        return target
    staged = target.with_name(f".{target.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        with log_file.open("ab") as fh:
            fh.write(f"$ {python} -I {COMPILER.name} {staged} {' '.join(roots)}\n".encode())
            fh.flush()
            proc = run_checked([python, "-I", str(COMPILER), str(staged), *roots], stdout=fh,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=COMPILE_TIMEOUT)
        if proc.returncode != 0:
            log.warning("could not compile the bytecode prefix %s (see %s)", target, log_file)
            return None
        staged.mkdir(exist_ok=True)  # nothing to compile still makes a (valid, empty) prefix
        os.rename(staged, target)
        return target
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not compile the bytecode prefix %s: %s", target, exc)
        return None
    finally:
        shutil.rmtree(staged, ignore_errors=True)
