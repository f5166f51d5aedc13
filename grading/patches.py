"""Reading patches, and deciding which of an agent's file changes may be applied before grading.

An agent's diff is filtered before grading: changes to tests, to test configuration, to git's own
files, to interpreter start-up hooks and to compiled code (bytecode, native modules) are dropped (a
patch that only added a conftest.py scored as resolved in SWE-bench #631), as are changes to any
file the test patch touches.

Filtering is only sound if the filter reads the patch exactly as the appliers do, and attackers
exploited every disagreement (C-quoted names, a plain section hidden after a git one, context diffs
that only ``patch`` reads, ``.git/`` paths that only ``patch`` writes). So there is ONE parser here,
:func:`parse_patch`, which understands every form ``git apply`` and GNU ``patch`` accept and rejects
(:class:`PatchError`) what it cannot read unambiguously; and what gets applied is never the agent's
text but :func:`render_patch` of the parsed sections, a canonical git diff that both appliers read
the same way. The policy (:func:`drop_reason`) then judges exactly what will be written.

One file (about 770 lines) on purpose: parsing, rendering and the policy are one argument. The
filter is sound only while the policy judges exactly the sections the parser read and the renderer
writes back, so a reviewer checking an attack needs all three in view; the lenient readers of
trusted diffs at the end reuse the same parser, so no second reading of a diff exists anywhere.
"""

from __future__ import annotations

import base64
import fnmatch
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Literal

MAX_PATCH_BYTES = 64 << 20
# What one ``GIT binary patch`` block (and all of a patch's blocks together) may inflate to. The
# parser inflates in chunks and keeps none of it, so its memory is bounded by the patch's size
# whatever the data says; the caps bound its time, and what git will inflate in the sandbox.
MAX_BINARY_BLOCK = 64 << 20
MAX_BINARY_TOTAL = 256 << 20
_INFLATE_CHUNK = 1 << 20

# Files whose change could alter how tests are collected, run or reported.
TEST_CONFIG_NAMES = {
    "conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", ".pytest.ini", "pytest.toml",
    ".pytest.toml", "noxfile.py", "pytest.py", "sitecustomize.py", "usercustomize.py", ".coveragerc",
}
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py", "tests.py")
TEST_DIR_NAMES = {"tests", "test", "testing"}
PYTEST_PACKAGE = "a new file in a _pytest package (it would shadow the test runner)"
# What the interpreter runs without reading source: bytecode (a PEP 552 unchecked-hash pyc in
# __pycache__ is used whatever the .py says, and a foo.pyc with no foo.py is imported by
# SourcelessFileLoader) and native extension modules (imported before a .py of the same name).
COMPILED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")
COMPILED = "compiled code (bytecode or a native extension module), which the task does not allow"

Status = Literal["modify", "add", "delete", "rename", "copy"]
NO_NEWLINE = "\\ No newline at end of file"
_MODES = {"100644", "100755", "120000", "160000"}  # the only modes git writes
_LINK_MODES = {"120000": "a symlink", "160000": "a submodule (gitlink)"}

_GIT_HEADER = re.compile(r"(old mode|new mode|deleted file mode|new file mode|rename from|rename to|rename old|"
                         r"rename new|copy from|copy to|similarity index|dissimilarity index|index) (.*)$")
_HEADER_ALIASES = {"rename old": "rename from", "rename new": "rename to"}  # git's older spelling
_INDEX = re.compile(r"([0-9a-f]{4,64}\.\.[0-9a-f]{4,64})(?: ([0-7]{6}))?$")
_SIMILARITY = re.compile(r"\d{1,3}%$")
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_CONTEXT_SEPARATOR = re.compile(r"\*{15}(.*)$")
_CONTEXT_OLD = re.compile(r"\*\*\* (\d+)(?:,(\d+))? \*\*\*\*$")
_CONTEXT_NEW = re.compile(r"--- (\d+)(?:,(\d+))? ----$")
_BINARY_BLOCK = re.compile(r"(literal|delta) (\d+)$")
_SPACED_STAMP = re.compile(r"(.+?) +(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?: [+-]\d{4})?)$")
_ISO_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d+))?(?: ([+-]\d\d):?(\d\d))?$")
_CTIME_STAMP = re.compile(r"[A-Z][a-z]{2} ([A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d)(?:\.(\d+))? (\d{4})$")
# Outside a section, a line some applier could act on: a hunk, a file header, a binary change, or a
# command of GNU patch's "normal" and ed formats (12c12, 3,4d2, 5a6,7, 7d).
_DIFF_SYNTAX = re.compile(r"@@|--- |\+\+\+ |\*\*\* |\*{15}|GIT binary patch|Binary files "
                          r"|\d+(,\d+)?[acd](\d+(,\d+)?)?\s*$")
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
_QUOTED = {code: "\\" + char for char, code in _ESCAPES.items()}


class PatchError(ValueError):
    """The text is not a patch that can be read unambiguously: always the agent's failure, never
    infrastructure. The message names the line (1-based) and what was wrong."""


class _Malformed(Exception):
    """Raised inside the parser; :func:`parse_patch` adds the line number (``at``, else the line being
    read) and makes it a PatchError."""

    def __init__(self, message: str, at: int | None = None) -> None:
        super().__init__(message)
        self.at = at


@dataclass(frozen=True)
class Hunk:
    """One unified hunk. ``lines`` are the file's lines with their tag (``' '``, ``'-'``, ``'+'``),
    each ending in ``"\\n"`` unless the file line has no newline (then a ``\\ No newline`` marker
    is rendered after it). ``heading`` is the text after the closing ``@@`` (appliers ignore it)."""

    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[str, ...]
    heading: str = ""


@dataclass(frozen=True)
class FilePatch:
    """One file's change. Paths are normalized repository paths (None for /dev/null). ``index`` is the
    ``abbrev..abbrev`` of git's index line (binary patches need it); ``binary_data`` holds a ``GIT binary
    patch``'s validated ``literal``/``delta`` blocks verbatim, each closed by an empty line."""

    old_path: str | None
    new_path: str | None
    status: Status
    old_mode: str | None = None
    new_mode: str | None = None
    hunks: tuple[Hunk, ...] = ()
    index: str | None = None
    binary_data: tuple[str, ...] = ()

    @property
    def binary(self) -> bool:
        return bool(self.binary_data)

    @property
    def paths(self) -> set[str]:
        return {p for p in (self.old_path, self.new_path) if p}

    @property
    def text(self) -> str:
        """This section in canonical git format (what :func:`render_patch` emits for it)."""
        return render_patch([self])


# --- parsing ------------------------------------------------------------------------------------

def parse_patch(text: str) -> list[FilePatch]:
    """Every file section of ``text``: git diffs (plain or C-quoted names, extended headers, binary
    patches), plain unified diffs and context diffs (converted to unified hunks), in order.

    Text before, between and after sections is ignored (an email or commit message), except lines of
    diff syntax, which some applier might act on. Whitespace-only text has no sections; any other text
    without one is not a patch. Raises :class:`PatchError`.
    """
    if not text.strip():
        return []
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise PatchError("the patch is not UTF-8 text") from None
    parser = _Parser(text)
    try:
        files = parser.parse()
    except _Malformed as exc:
        raise PatchError(f"line {(parser.i if exc.at is None else exc.at) + 1}: {exc}") from None
    except (ArithmeticError, LookupError, ValueError, RecursionError, UnicodeError) as exc:
        # What the text made the reader itself raise (int() of a 5,000-digit hunk count: Python's
        # digit limit) is as unreadable as a malformed line.
        raise PatchError(f"line {parser.i + 1}: unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not files:
        raise PatchError("no file section found: this is not a patch")
    return files


class _Parser:
    """Reads lines split on ``"\\n"`` only, as git and GNU patch do (``str.splitlines`` would also split
    on ``\\r``, ``\\v``, ``\\f`` and more, and so see lines the appliers do not). ``i`` is the line being read."""

    def __init__(self, text: str) -> None:
        self.lines = text.split("\n")
        if text.endswith("\n"):
            self.lines.pop()
        self.i = 0
        self.inflated = 0  # bytes the binary blocks read so far declare

    def peek(self, ahead: int = 0) -> str:
        """The line ``ahead`` of the current one, or "" past the end (no rule accepts "" there)."""
        k = self.i + ahead
        return self.lines[k] if k < len(self.lines) else ""

    def at_end(self) -> bool:
        return self.i >= len(self.lines)

    def parse(self) -> list[FilePatch]:
        files: list[FilePatch] = []
        while not self.at_end():
            line, after = self.peek(), self.peek(1)
            if line.startswith("diff --git "):
                files.append(self.git_section())
            elif line.startswith("--- ") and after.startswith("+++ "):
                files.append(self.unified_section())
            elif line.startswith("*** ") and after.startswith("--- "):
                files.append(self.context_section())
            elif _DIFF_SYNTAX.match(line):
                raise _Malformed(f"diff syntax outside a file section: {line[:80]!r}")
            else:
                self.i += 1
        return files

    # git sections

    def git_section(self) -> FilePatch:
        start = self.i
        header_old, header_new = _git_header_names(self.peek()[len("diff --git "):])
        self.i += 1
        head: dict[str, str] = {}
        while not self.at_end() and (m := _GIT_HEADER.match(self.peek())):
            key = _HEADER_ALIASES.get(m[1], m[1])
            if key in head:
                raise _Malformed(f"repeated {key!r} line")
            head[key] = m[2]
            self.i += 1
        status, old_mode, new_mode, index = _git_header_meta(head)
        source = _header_path(head, "rename from" if status == "rename" else "copy from")
        target = _header_path(head, "rename to" if status == "rename" else "copy to")
        dash: tuple[str | None, str | None] | None = None
        hunks: tuple[Hunk, ...] = ()
        binary: tuple[str, ...] = ()
        if self.peek().startswith("--- ") and self.peek(1).startswith("+++ "):
            dash = self.file_names(git=True)
            if (dash[0] is None) != (status == "add") or (dash[1] is None) != (status == "delete"):
                raise _Malformed("/dev/null must stand for the old file exactly when the file is new, "
                                 "and for the new one exactly when it is deleted")
            hunks = self.hunks()
        elif self.peek().startswith("@@"):  # git accepts hunks with no ---/+++ lines
            hunks = self.hunks()
        elif self.peek() == "GIT binary patch":
            self.i += 1
            binary = self.binary_blocks()
        elif self.peek().startswith("Binary files "):
            raise _Malformed("a binary change without its data (make the diff with --binary)")
        olds = {n for n in (header_old, source, dash and dash[0]) if n}
        news = {n for n in (header_new, target, dash and dash[1]) if n}
        if status in ("rename", "copy"):
            if olds != {source} or news != {target}:
                raise _Malformed(f"the file names of the {status} disagree", start)
            old, new = source, target
        else:
            names = olds | news
            if len(names) != 1:
                raise _Malformed("the file names disagree" if names else "no file name", start)
            old = new = names.pop()
        if status == "add":
            old = None
        if status == "delete":
            new = None
        if status == "modify" and not hunks and not binary and old_mode == new_mode:
            raise _Malformed(f"the section for {old} changes nothing", start)
        return FilePatch(old, new, status, old_mode, new_mode, hunks, index, binary)

    def binary_blocks(self) -> tuple[str, ...]:
        """A forward block and an optional reverse one, each ``literal N``/``delta N`` then base85 lines
        then an empty line; the data is decoded and inflated to check it holds exactly N bytes."""
        out: list[str] = []
        for block in ("forward", "reverse"):
            m = _BINARY_BLOCK.match(self.peek())
            if not m:
                if block == "forward":
                    raise _Malformed("'GIT binary patch' without a literal or delta block")
                break
            size = int(m[2])
            if size > MAX_BINARY_BLOCK:
                raise _Malformed(f"a binary block of {size} bytes (a block may hold {MAX_BINARY_BLOCK})")
            self.inflated += size
            if self.inflated > MAX_BINARY_TOTAL:
                raise _Malformed(f"binary blocks of more than {MAX_BINARY_TOTAL} bytes in all")
            out.append(self.peek())
            self.i += 1
            data = bytearray()
            while not self.at_end() and self.peek():
                data += _base85_row(self.peek())
                out.append(self.peek())
                self.i += 1
            _check_inflated_size(bytes(data), size)
            out.append("")
            self.i += 1  # the empty line closing the block (or the end of the text)
        return tuple(out)

    # plain unified and context sections

    def unified_section(self) -> FilePatch:
        start = self.i
        old, new = self.file_names(git=False)
        return _plain_file(old, new, self.hunks(), start)

    def context_section(self) -> FilePatch:
        start = self.i
        old, new = self.file_names(git=False)
        hunks = []
        while not self.at_end() and (m := _CONTEXT_SEPARATOR.match(self.peek())):
            self.i += 1
            hunks.append(self.context_hunk(m[1]))
        if not hunks:
            raise _Malformed("a context diff's file header without hunks")
        return _plain_file(old, new, tuple(hunks), start)

    def file_names(self, *, git: bool) -> tuple[str | None, str | None]:
        """The names of a ``---``/``+++`` (or ``***``/``---``) pair, moving past both lines."""
        names = []
        for _ in range(2):
            names.append(_label_path(self.peek()[4:], git=git))
            self.i += 1
        return names[0], names[1]

    def hunks(self) -> tuple[Hunk, ...]:
        hunks = []
        while not self.at_end() and self.peek().startswith("@@"):
            m = _HUNK.match(self.peek())
            if not m:
                raise _Malformed(f"malformed hunk header {self.peek()[:80]!r}")
            self.i += 1
            counts = [int(m[2] or 1), int(m[4] or 1)]
            lines, self.i = _hunk_lines(self.lines, self.i, *counts)
            hunks.append(_hunk(int(m[1]), counts[0], int(m[3]), counts[1], lines, m[5]))
        if not hunks:
            raise _Malformed("a file header without hunks")
        return tuple(hunks)

    def context_hunk(self, heading: str) -> Hunk:
        start = self.i
        old = _CONTEXT_OLD.match(self.peek())
        if not old:
            raise _Malformed(f"expected a context hunk's '*** a,b ****' line, got {self.peek()[:80]!r}")
        self.i += 1
        old_part = None if _CONTEXT_NEW.match(self.peek()) else self.context_part(_range_size(old), " -!")
        new = _CONTEXT_NEW.match(self.peek())
        if not new:
            raise _Malformed(f"expected a context hunk's '--- a,b ----' line, got {self.peek()[:80]!r}")
        self.i += 1
        present = self.peek()[:2] in ("  ", "+ ", "! ")
        new_part = self.context_part(_range_size(new), " +!") if present and _range_size(new) else None
        try:
            unified = _merge_context(old_part, new_part)
            counts = [sum(line[0] in side for line in unified if line[0] != "\\") for side in (" -", " +")]
            for m, count in zip((old, new), counts, strict=True):
                if count > _range_size(m) or (m[2] is not None and count != _range_size(m)):
                    raise _Malformed(f"the context hunk's range {m[0]!r} does not hold {count} lines")
            lines, _ = _hunk_lines(unified, 0, *counts)
        except _Malformed as exc:
            raise _Malformed(str(exc), start) from None
        return _hunk(int(old[1]), counts[0], int(new[1]), counts[1], lines, heading)

    def context_part(self, size: int, tags: str) -> list[list]:
        """``size`` lines of one side of a context hunk as ``[tag, content, has_newline]``."""
        part: list[list] = []
        while True:
            line = self.peek()
            if line.startswith("\\") and part and part[-1][2]:
                part[-1][2] = False
            elif len(part) == size:
                return part
            elif self.at_end():
                raise _Malformed("the patch ends inside a context hunk")
            elif line == "":  # an empty line is an empty context line, as for unified hunks
                part.append([" ", "", True])
            elif line[:1] in tags and line[1:2] == " ":
                part.append([line[0], line[2:], True])
            else:
                raise _Malformed(f"unexpected line in a context hunk: {line[:80]!r}")
            self.i += 1


def _git_header_meta(head: dict[str, str]) -> tuple[Status, str | None, str | None, str | None]:
    """``(status, old_mode, new_mode, index)`` from a git section's extended header lines."""
    for key in ("old mode", "new mode", "deleted file mode", "new file mode"):
        if key in head and head[key] not in _MODES:
            raise _Malformed(f"unsupported file mode {head[key]!r}")
    for key in ("similarity index", "dissimilarity index"):
        if key in head and not _SIMILARITY.match(head[key]):
            raise _Malformed(f"malformed {key} {head[key]!r}")
    kinds: list[Status] = [kind for kind, keys in (("add", ("new file mode",)), ("delete", ("deleted file mode",)),
                                                   ("rename", ("rename from", "rename to")),
                                                   ("copy", ("copy from", "copy to")))
                           if any(k in head for k in keys)]
    if len(kinds) > 1:
        raise _Malformed(f"contradictory header lines ({' and '.join(kinds)})")
    status: Status = kinds[0] if kinds else "modify"
    if status in ("rename", "copy") and not (f"{status} from" in head and f"{status} to" in head):
        raise _Malformed(f"a {status} needs both its 'from' and 'to' lines")
    if ("old mode" in head) != ("new mode" in head) or ("old mode" in head and status in ("add", "delete")):
        raise _Malformed("'old mode' and 'new mode' come as a pair, and not for an added or deleted file")
    old_mode = head.get("old mode") or head.get("deleted file mode")
    new_mode = head.get("new mode") or head.get("new file mode")
    index = None
    if "index" in head:
        m = _INDEX.match(head["index"])
        if not m:
            raise _Malformed(f"malformed index line {head['index']!r}")
        index = m[1]
        if m[2]:  # git writes the mode here when it did not change; it is the file's mode then
            if m[2] not in _MODES or old_mode or new_mode:
                raise _Malformed(f"the index line's mode {m[2]!r} contradicts the other header lines")
            old_mode = new_mode = m[2]
    return status, old_mode, new_mode, index


def _header_path(head: dict[str, str], key: str) -> str | None:
    """A rename/copy line's name: a bare path (no a/ b/ prefix), possibly C-quoted."""
    if key not in head:
        return None
    raw = head[key]
    if raw.startswith('"'):
        raw, rest = _unquote(raw)
        if rest:
            raise _Malformed(f"text after the quoted name in {key!r}")
    return _normalize(raw)


def _git_header_names(rest: str) -> tuple[str | None, str | None]:
    """The two names of ``diff --git A B`` without their prefixes, or None where git's line is
    ambiguous (unquoted names with spaces that differ: then other header lines must name them)."""
    if rest.startswith('"'):
        first, tail = _unquote(rest)
        if not tail.startswith(" "):
            raise _Malformed("expected a space after the first quoted name")
        tail = tail[1:]
        second = _whole_quoted(tail) if tail.startswith('"') else tail
        return _normalize(first, strip=True), _normalize(second, strip=True)
    if rest.endswith('"') and ' "' in rest:
        first, _, tail = rest.partition(' "')
        return _normalize(first, strip=True), _normalize(_whole_quoted('"' + tail), strip=True)
    spaces = [k for k, char in enumerate(rest) if char == " "]
    splits = [(rest[:k], rest[k + 1:]) for k in spaces
              if len(spaces) == 1 or rest[:k].partition("/")[2] == rest[k + 1:].partition("/")[2]]
    if len(splits) != 1:
        return None, None
    return _normalize(splits[0][0], strip=True), _normalize(splits[0][1], strip=True)


def _whole_quoted(text: str) -> str:
    name, rest = _unquote(text)
    if rest:
        raise _Malformed(f"text after a quoted name: {rest[:40]!r}")
    return name


def _label_path(raw: str, *, git: bool) -> str | None:
    """The path of a ``---``/``+++``/``***`` line: quoted or not, a tab (or, for GNU diff's dates, spaces)
    before an optional timestamp. None for /dev/null, or, outside git sections, for the epoch timestamp
    by which GNU diff -N marks a missing file (git and patch read it so too)."""
    stamp = ""
    if raw.startswith('"'):
        name, rest = _unquote(raw)
        if rest and not rest.startswith("\t"):
            raise _Malformed(f"text after a quoted name: {rest[:40]!r}")
        stamp = rest[1:]
    else:
        name, tab, stamp = raw.partition("\t")
        if not tab:
            name = name.rstrip()
            if m := _SPACED_STAMP.match(name):
                name, stamp = m[1], m[2]
    if name == "/dev/null" or (not git and _is_epoch(stamp.strip())):
        return None
    return _normalize(name, strip=True if git else "/" in name)


def _normalize(path: str, *, strip: bool = False) -> str:
    """``path`` with its first component stripped (``-p1``) if ``strip``, then "" and "." components
    dropped. Rejects what could write outside the tree or be read differently by git and patch."""
    if "\0" in path:
        raise _Malformed("a NUL byte in a path")
    if path.startswith("/"):
        raise _Malformed(f"an absolute path {path[:80]!r}")
    if strip:
        prefix, slash, path = path.partition("/")
        if not slash:
            raise _Malformed(f"a git diff path without its a/ or b/ prefix: {prefix[:80]!r}")
        if path.startswith("/"):
            raise _Malformed(f"an absolute path {path[:80]!r}")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts:
        raise _Malformed("an empty path")
    if ".." in parts:
        raise _Malformed(f"a '..' component in {path[:80]!r}")
    if any(part != part.strip() for part in parts):  # GNU patch strips it, git keeps it
        raise _Malformed(f"a path component with leading or trailing whitespace in {path[:80]!r}")
    try:
        path.encode()
    except UnicodeEncodeError:
        raise _Malformed("a path that is not UTF-8") from None
    return "/".join(parts)


def _unquote(text: str) -> tuple[str, str]:
    """Decode git's C-quoting at the start of ``text`` (``\\NNN`` octal bytes form UTF-8);
    return the name and what follows the closing quote."""
    out = bytearray()
    k = 1
    while True:
        if k >= len(text):
            raise _Malformed("an unterminated quoted name")
        char = text[k]
        if char == '"':
            break
        if char != "\\":
            out += char.encode("utf-8", "surrogateescape")
            k += 1
        elif text[k + 1:k + 2] in _ESCAPES:
            out.append(_ESCAPES[text[k + 1]])
            k += 2
        elif re.fullmatch(r"[0-3][0-7][0-7]", text[k + 1:k + 4]):
            out.append(int(text[k + 1:k + 4], 8))
            k += 4
        else:
            raise _Malformed(f"an unknown escape {text[k:k + 4]!r} in a quoted name")
    try:
        return out.decode(), text[k + 1:]
    except UnicodeDecodeError:
        raise _Malformed("a quoted name that is not UTF-8") from None


def _is_epoch(stamp: str) -> bool:
    """GNU diff -N dates a missing file at the epoch, ISO style (-u) or ctime style (-c in the C
    locale). A date without a zone is local time, so then anything within 14 hours of it counts."""
    if m := _ISO_STAMP.match(stamp):
        text, fmt, fraction, zone = m[1], "%Y-%m-%d %H:%M:%S", m[2], m[3] and m[3] + m[4]
    elif m := _CTIME_STAMP.match(stamp):
        text, fmt, fraction, zone = f"{m[1]} {m[3]}", "%b %d %H:%M:%S %Y", m[2], None
    else:
        return False
    if fraction and fraction.strip("0"):
        return False
    if zone:
        return datetime.strptime(text + zone, fmt + "%z").timestamp() == 0
    return abs(datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()) <= 14 * 3600


def _base85_row(row: str) -> bytes:
    """One line of a binary block: a length letter (A-Z: 1-26, a-z: 27-52 bytes), then base85."""
    size = ord(row[0]) - 64 if "A" <= row[0] <= "Z" else ord(row[0]) - 70 if "a" <= row[0] <= "z" else 0
    if not size or len(row) - 1 != (size + 3) // 4 * 5:
        raise _Malformed(f"malformed binary patch line {row[:80]!r}")
    try:
        return base64.b85decode(row[1:])[:size]
    except ValueError:
        raise _Malformed(f"malformed binary patch line {row[:80]!r}") from None


def _check_inflated_size(data: bytes, size: int) -> None:
    """That zlib ``data`` inflates to exactly ``size`` bytes, inflating at most a chunk at a time
    and no further than ``size`` (so a small patch cannot make the harness hold gigabytes)."""
    inflater = zlib.decompressobj()
    total = 0
    pending = data
    try:
        while not inflater.eof:
            chunk = inflater.decompress(pending, _INFLATE_CHUNK)
            total += len(chunk)
            if total > size:
                raise _Malformed(f"binary patch data holds more than {size} bytes")
            if not chunk and len(inflater.unconsumed_tail) == len(pending):
                break  # no progress: the stream is truncated
            pending = inflater.unconsumed_tail
    except zlib.error:
        raise _Malformed("corrupt binary patch data") from None
    if not inflater.eof:
        raise _Malformed("corrupt binary patch data")
    if total != size:
        raise _Malformed(f"binary patch data holds {total} bytes, not {size}")


def _hunk_lines(lines: list[str], pos: int, old_left: int, new_left: int) -> tuple[tuple[str, ...], int]:
    """Read a hunk body at ``lines[pos]`` holding exactly the counted old and new lines (the counts, not
    the text, decide where it ends, as for git and patch); return it and the position after it."""
    out: list[str] = []
    old_ended = new_ended = False  # a line without newline was the side's last
    while True:
        line = lines[pos] if pos < len(lines) else None
        if line is not None and line.startswith("\\") and out and out[-1].endswith("\n"):
            out[-1] = out[-1][:-1]
            old_ended |= out[-1][0] in " -"
            new_ended |= out[-1][0] in " +"
            pos += 1
            continue
        if not old_left and not new_left:
            break
        if line is None:
            raise _Malformed(f"the patch ends inside a hunk ({old_left} old and {new_left} new lines missing)")
        tag = line[:1] or " "  # an empty line is an empty context line (git and patch agree)
        if tag not in " -+":
            raise _Malformed(f"unexpected line in a hunk: {line[:80]!r}")
        takes_old, takes_new = tag in " -", tag in " +"
        if (takes_old and (not old_left or old_ended)) or (takes_new and (not new_left or new_ended)):
            raise _Malformed(f"a {tag!r} line beyond what the hunk header counts (or after a last line)")
        old_left -= takes_old
        new_left -= takes_new
        out.append((line or " ") + "\n")
        pos += 1
    if not any(line[0] in "-+" for line in out):
        raise _Malformed("a hunk that changes nothing")
    return tuple(out), pos


def _hunk(old_start: int, old_count: int, new_start: int, new_count: int, lines: tuple[str, ...],
          heading: str) -> Hunk:
    if (old_count and not old_start) or (new_count and not new_start):
        raise _Malformed("a hunk starting at line 0 that is not empty")
    return Hunk(old_start, old_count, new_start, new_count, lines, heading)


def _range_size(m: re.Match[str]) -> int:
    """Lines in a context hunk's range: ``a,b`` holds b-a+1; a single number one (0: none)."""
    first, last = int(m[1]), m[2]
    if last is None:
        return 1 if first else 0
    if int(last) < first:
        raise _Malformed(f"a context hunk range {m[0]!r} that ends before it starts")
    return int(last) - first + 1


def _merge_context(old: list[list] | None, new: list[list] | None) -> list[str]:
    """A context hunk's two sides as unified lines. A side that is left out (only insertions, or only
    deletions) is the other side's context; ``!`` runs become ``-`` then ``+`` lines."""
    if old is None:
        old = [entry for entry in new or [] if entry[0] == " "]
    if new is None:
        new = [entry for entry in old if entry[0] == " "]
    out: list[str] = []

    def emit(tag: str, entry: list) -> None:
        out.append(tag + entry[1])
        if not entry[2]:
            out.append(NO_NEWLINE)

    i = j = 0
    while i < len(old) or j < len(new):
        o = old[i] if i < len(old) else None
        n = new[j] if j < len(new) else None
        if o and o[0] == "-":
            emit("-", o)
            i += 1
        elif n and n[0] == "+":
            emit("+", n)
            j += 1
        elif o and n and o[0] == n[0] == "!":
            for side, tag in ((old, "-"), (new, "+")):
                k = i if tag == "-" else j
                while k < len(side) and side[k][0] == "!":
                    emit(tag, side[k])
                    k += 1
                i, j = (k, j) if tag == "-" else (i, k)
        elif o and n and o[0] == n[0] == " " and o[1:] == n[1:]:
            emit(" ", o)
            i += 1
            j += 1
        else:
            raise _Malformed("the old and new sides of a context hunk do not match")
    return out


def _plain_file(old: str | None, new: str | None, hunks: tuple[Hunk, ...], start: int) -> FilePatch:
    """A plain unified or context section. Modes are unknown but for added and deleted files,
    which get git's default so that rendering and re-reading give the same section."""
    if old is None and new is None:
        raise _Malformed("both files are /dev/null", start)
    if old and new and old != new:
        raise _Malformed(f"the two file header lines name different files ({old!r}, {new!r})", start)
    if old is None:
        return FilePatch(None, new, "add", None, "100644", hunks)
    if new is None:
        return FilePatch(old, None, "delete", "100644", None, hunks)
    return FilePatch(old, new, "modify", hunks=hunks)


# --- rendering ----------------------------------------------------------------------------------

def render_patch(files: list[FilePatch]) -> str:
    """``files`` as a canonical git diff, which ``git apply`` and ``patch -p1`` read the same way:
    a/ and b/ prefixes, names C-quoted as git quotes them, exact hunk counts, no other text."""
    return "".join(_render_file(f) for f in files)


def _render_file(f: FilePatch) -> str:
    old, new = f.old_path or f.new_path, f.new_path or f.old_path
    assert old and new, "a file patch needs a path"
    out = [f"diff --git {_quote('a/' + old)} {_quote('b/' + new)}"]
    same_mode = f.old_mode == f.new_mode
    if f.status == "add":
        out.append(f"new file mode {f.new_mode}")
    elif f.status == "delete":
        out.append(f"deleted file mode {f.old_mode}")
    elif f.old_mode and (not same_mode or not f.index):
        out += [f"old mode {f.old_mode}", f"new mode {f.new_mode}"]
    if f.status in ("rename", "copy"):
        out += [f"{f.status} from {_quote(old)}", f"{f.status} to {_quote(new)}"]
    if f.index:
        keeps_mode = f.status not in ("add", "delete") and f.old_mode and same_mode
        out.append(f"index {f.index}" + (f" {f.old_mode}" if keeps_mode else ""))
    if f.binary:
        out += ["GIT binary patch", *f.binary_data]
    elif f.hunks:
        out += [f"--- {_label('a/', f.old_path)}", f"+++ {_label('b/', f.new_path)}"]
        for h in f.hunks:
            out.append(f"@@ -{_span(h.old_start, h.old_count)} +{_span(h.new_start, h.new_count)} @@{h.heading}")
            out += [line[:-1] if line.endswith("\n") else f"{line}\n{NO_NEWLINE}" for line in h.lines]
    return "\n".join(out) + "\n"


def _span(start: int, count: int) -> str:
    return str(start) if count == 1 else f"{start},{count}"


def _label(prefix: str, path: str | None) -> str:
    """A ---/+++ name; like git, a tab ends a name with a space so that patch reads all of it."""
    if path is None:
        return "/dev/null"
    return _quote(prefix + path) + ("\t" if " " in path else "")


def _quote(name: str) -> str:
    """Git's C-quoting (core.quotePath): needed for control characters, DEL, ``"``, ``\\`` and non-ASCII."""
    data = name.encode()
    if not any(b < 0x20 or b >= 0x7F or b in (0x22, 0x5C) for b in data):
        return name
    body = "".join(_QUOTED.get(b) or (f"\\{b:03o}" if b < 0x20 or b >= 0x7F else chr(b)) for b in data)
    return f'"{body}"'


# --- policy -------------------------------------------------------------------------------------

def is_test_or_config(path: str) -> bool:
    """True for test files, test directories' contents and test-run configuration."""
    p = PurePosixPath(path)
    if p.name in TEST_CONFIG_NAMES or p.suffix == ".pth":
        return True
    if any(part in TEST_DIR_NAMES for part in p.parts[:-1]):
        return True
    return any(fnmatch.fnmatch(p.name, pat) for pat in TEST_FILE_PATTERNS)


def is_compiled(path: str) -> bool:
    """True for bytecode, anything in a ``__pycache__`` directory and native extension modules
    (case-insensitively: what a case-insensitive file system would import must not slip through)."""
    lowered = path.lower().split("/")
    return "__pycache__" in lowered or lowered[-1].endswith(COMPILED_SUFFIXES)


def _path_reason(path: str, protected: set[str], allow_compiled: bool = False) -> str | None:
    parts = path.split("/")
    lowered = [part.lower() for part in parts]
    if ".git" in lowered:
        return "inside .git (hooks and config run code)"
    if not allow_compiled and is_compiled(path):
        return COMPILED
    if parts[-1] in ("sitecustomize.py", "usercustomize.py") or parts[-1].endswith(".pth"):
        return "an interpreter start-up hook"
    if any(part.endswith((".dist-info", ".egg-info", ".egg-link")) for part in lowered):
        return "installed-package metadata (entry points load plugins)"
    if parts[-1] in (".gitattributes", ".gitmodules"):
        return "git attributes or submodules"
    if path in protected:
        return "a file the test patch changes"
    if is_test_or_config(path):
        return "a test file or test configuration"
    if "_pytest" in parts:
        return PYTEST_PACKAGE
    return None


def drop_reason(file: FilePatch, protected: set[str], *, allow_compiled: bool = False) -> str | None:
    """Why ``file`` may not be applied before grading (either side of a rename or copy counts), or None.

    Compiled files (:func:`is_compiled`: added, changed, deleted, renamed or copied onto, text or
    ``GIT binary patch``) are refused unless the task opts in (``TestSpec.allow_compiled_files``).
    A new ``_pytest`` package would shadow the test runner, so none may be made; but changing a
    file that is already there is changing the pytest repository's own source (``src/_pytest``),
    the code under test of its tasks, and is kept (SWE-bench grades pytest with itself too)."""
    for mode in (file.old_mode, file.new_mode):
        if mode in _LINK_MODES:
            return _LINK_MODES[mode]
    for path in sorted(file.paths):
        reason = _path_reason(path, protected, allow_compiled)
        if reason == PYTEST_PACKAGE and file.status in ("modify", "delete"):
            continue
        if reason:
            return reason
    return None


@dataclass
class FilteredPatch:
    """The agent's patch to apply (the kept sections, as parsed: what is applied is their canonical
    rendering, never the agent's own text), and the paths dropped from it with the reason for each."""

    files: list[FilePatch] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The kept sections' canonical text (what the appliers read)."""
        return render_patch(self.files)


def read_agent_patch(diff: str) -> list[FilePatch]:
    """The agent's diff, parsed once for the whole grading; raises :class:`PatchError` if it cannot
    be read or is larger than ``MAX_PATCH_BYTES`` (checked before parsing)."""
    if len(diff) > MAX_PATCH_BYTES or len(diff.encode("utf-8", "surrogateescape")) > MAX_PATCH_BYTES:
        raise PatchError(f"the patch is larger than {MAX_PATCH_BYTES} bytes")
    return parse_patch(diff)


def filter_agent_patch(files: Sequence[FilePatch], protected: set[str], *, allow_compiled: bool = False,
                       ) -> FilteredPatch:
    """Drop the sections of the parsed patch (:func:`read_agent_patch`) that :func:`drop_reason`
    refuses."""
    kept: list[FilePatch] = []
    reasons: dict[str, str] = {}
    for f in files:
        reason = drop_reason(f, protected, allow_compiled=allow_compiled)
        if reason is None:
            kept.append(f)
        else:
            reasons.update({p: _path_reason(p, protected, allow_compiled) or reason for p in f.paths})
    return FilteredPatch(kept, sorted(reasons), reasons)


# --- lenient readers of trusted diffs -------------------------------------------------------------

def split_diff(diff: str) -> list[FilePatch]:
    """:func:`parse_patch`, but [] for text it cannot read: for trusted diffs (mining, a task's own
    patches) and for asking whether there is anything to apply at all. Graders must call
    :func:`filter_agent_patch`, which raises."""
    try:
        return parse_patch(diff)
    except PatchError:
        return []


def touched_paths(diff: str) -> set[str]:
    return {path for section in split_diff(diff) for path in section.paths}
