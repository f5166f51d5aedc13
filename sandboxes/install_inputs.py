"""Which commits of a repository can share one built environment.

An environment with ``install`` steps reads the repository, so it used to be built once per commit.
Most commits (every synthesized bug, most fixes) change only Python source, and an *editable*
install does not copy that source: the venv holds a path (a ``.pth`` file or an import finder)
to the tree at ``/testbed``, where every isolated sandbox mounts its own workspace. Such commits
get the same venv from the same install inputs, so they share it; anything else keeps one
environment per commit.

What counts as an install input, conservatively: every file at the repository's top level
(``pyproject.toml``, ``setup.py``/``setup.cfg``, requirement files, ``MANIFEST.in``, build hooks,
``versioneer.py``...), requirement and lock files anywhere, the sources of compiled extensions, and
the layout of packages and top-level modules (an editable install's import finder maps the
packages that existed when it was made). A step that is not a pip editable install, a named
requirement or a requirements file (``pip install .``, ``setup.py install``, ``make``, any other
command) makes the environment per-commit again.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import PurePosixPath

# pip options that take a value as the next word (the value is not a requirement).
_PIP_VALUE_OPTIONS = frozenset({
    "-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-f",
    "--find-links", "-t", "--target", "--prefix", "--root", "-C", "--config-settings", "--no-binary",
    "--only-binary", "--platform", "--python-version", "--implementation", "--abi", "--progress-bar",
    "--log", "--cache-dir", "--src", "--upgrade-strategy", "--global-option", "--install-option",
    "--python", "-p", "--group", "--extra",
})
_SEPARATORS = frozenset({"&&", "||", ";", "|", "&"})
_EXTENSION_SOURCES = frozenset({".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".pyx", ".pxd", ".pxi", ".rs",
                                ".f", ".f90", ".swg", ".i"})
_INPUT_NAMES = frozenset({"pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in", "Cargo.toml", "Cargo.lock",
                          "meson.build", "CMakeLists.txt", "Pipfile", "Pipfile.lock", "poetry.lock", "uv.lock",
                          "pdm.lock"})


def _segments(command: str) -> list[list[str]] | None:
    """The simple commands of a shell ``command`` as word lists, or None if it does not parse."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        return None
    out: list[list[str]] = [[]]
    for word in words:
        if word in _SEPARATORS:
            out.append([])
        else:
            out[-1].append(word)
    return [segment for segment in out if segment]


def _local_path(requirement: str) -> bool:
    """Whether a pip requirement names something in the checkout (built or copied from it)."""
    if requirement.startswith(("file:", "git+", "hg+", "svn+", "bzr+")) or "://" in requirement:
        return True
    name = requirement.split("[", 1)[0]
    return (name in (".", "..") or name.startswith(("./", "../", "/", "~")) or "/" in name
            or name.endswith((".whl", ".tar.gz", ".zip")))


def _pip_install_shareable(args: list[str]) -> bool:
    """``pip install ARGS``: only editable installs, named requirements and requirement files."""
    i = 0
    while i < len(args):
        word = args[i]
        if word in ("-e", "--editable"):
            i += 2  # the editable target, whatever it is, stays a path to /testbed
            continue
        if word.startswith("--editable=") or (word.startswith("-e") and not word.startswith("--")):
            i += 1
            continue
        if word in _PIP_VALUE_OPTIONS:
            i += 2
            continue
        if word.startswith("-"):
            i += 1
            continue
        if _local_path(word):
            return False  # a copy of the checkout (or of something in it) goes into the venv
        i += 1
    return True


def _segment_shareable(words: list[str]) -> bool:
    while words and "=" in words[0] and not words[0].startswith("-"):
        words = words[1:]  # VAR=value prefixes
    if not words:
        return True
    names = [PurePosixPath(w).name for w in words]
    if "pip" in names or any(n.startswith("pip3") for n in names):
        at = next(i for i, n in enumerate(names) if n == "pip" or n.startswith("pip3"))
        rest = words[at + 1:]
        if rest and rest[0] == "install":
            return _pip_install_shareable(rest[1:])
        return rest[:1] in (["--version"], ["list"], ["freeze"])
    if len(words) >= 3 and names[1] == "setup.py" and names[0].startswith("python"):
        return all(w == "develop" or w.startswith("-") for w in words[2:])
    return words[0] in ("true", ":", "echo")


def shareable_install(commands: tuple[str, ...]) -> bool:
    """Whether every install step leaves the venv independent of the checkout's Python source:
    editable installs, named requirements and requirement files only (those are install inputs)."""
    for command in commands:
        segments = _segments(command)
        if segments is None or not all(_segment_shareable(list(s)) for s in segments):
            return False
    return True


def _is_input(path: str, command_words: frozenset[str]) -> bool:
    parts = PurePosixPath(path)
    if len(parts.parts) == 1 or parts.name in _INPUT_NAMES or path in command_words:
        return True
    lowered = path.lower()
    if "requirements" in lowered or "constraints" in lowered:
        return True
    return parts.suffix in _EXTENSION_SOURCES


def _layout_entry(path: str) -> str | None:
    """The part of the package layout ``path`` shows: a package (its ``__init__.py``), or a
    top-level module (at the root or under ``src/``)."""
    parts = PurePosixPath(path)
    if parts.name == "__init__.py":
        return f"package {parts.parent}"
    if parts.suffix == ".py" and (len(parts.parts) == 1 or (len(parts.parts) == 2 and parts.parts[0] == "src")):
        return f"module {path}"
    return None


def install_inputs_digest(tree: list[tuple[str, str]], commands: tuple[str, ...]) -> str:
    """A digest of what an editable install reads from a tree of ``(path, blob id)`` entries: the
    same for two commits whose install would make the same venv."""
    command_words = frozenset(word.lstrip("./") for c in commands for s in (_segments(c) or []) for word in s)
    lines = []
    for path, blob in sorted(tree):
        if _is_input(path, command_words):
            lines.append(f"file {path} {blob}")
        entry = _layout_entry(path)
        if entry is not None:
            lines.append(entry)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:24]
