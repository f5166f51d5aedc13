"""``str_replace_editor``: the file viewing/editing tool agents are trained on, over a :class:`Sandbox`.

SWE-agent (``tools/edit_anthropic``), OpenHands (``openhands-aci``'s ``OHEditor``) and Anthropic's
text editor tool share one interface — ``view``, ``create``, ``str_replace``, ``insert``,
``undo_edit`` — and one style of observations (``cat -n`` listings, "did not appear verbatim",
"Multiple occurrences ... in lines [...]"). Models are trained on those words, so this tool keeps
them, while differing where those tools would corrupt a repository or leave it:

* the file text is kept exactly (tabs, CRLF, a missing final newline); tabs are expanded only in
  what the model is shown;
* every path is resolved inside the sandbox (``realpath``) and refused unless it stays inside the
  repository, so neither ``..`` nor a symlink can reach the rest of the machine;
* all file access goes through the sandbox protocol, so the tool works with any backend.

Every bad input raises :class:`ToolError`, whose message is meant to be shown to the model as the
observation; anything else that escapes is an infrastructure fault.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from patchgym.gym_envs.tools.editor_spec import (
    COMMANDS,
    DIRECTORY_CLIPPED,
    FILE_CLIPPED,
    OPTIONAL,
    PARAMETERS,
    REQUIRED,
    SCHEMA,
)
from patchgym.sandboxes import PathOutsideWorkspaceError, Sandbox, SandboxError

SNIPPET_LINES = 4  # context shown around an edit, as SWE-agent does
MAX_UNDO = 10  # previous versions kept per file: bounds memory over a long episode (as OpenHands)
MAX_FILE_BYTES = 10 * 1024 * 1024  # larger files are for grep/sed, not for an observation
ECHO_CHARS = 1000  # longest old_str/new_str echoed back in an error message


class ToolError(Exception):
    """A bad call (wrong arguments, missing file, ambiguous edit...): ``str(error)`` is the
    observation to show the model, which can then correct its call."""


@dataclass(frozen=True)
class _Target:
    """A path the model named, resolved inside the sandbox.

    ``shown`` is the path as the model should read it back (absolute, normalised, under
    ``workdir``); ``real`` is where it leads after symlinks, as commands in the sandbox see it;
    ``relative`` is ``real`` relative to the repository root, the form every backend's
    ``read_file``/``write_file`` accepts.
    """

    shown: str
    real: str
    relative: str
    kind: str  # "file", "dir", "other" (FIFO, socket, device) or "missing"
    size: int


class StrReplaceEditor:
    """The ``str_replace_editor`` tool bound to one sandbox.

    It keeps, per file, the contents before each edit so that ``undo_edit`` can step back; that
    history describes the sandbox's current workspace, so :meth:`reset` must be called whenever the
    sandbox is reset.
    """

    name = "str_replace_editor"
    schema: dict[str, Any] = SCHEMA

    def __init__(self, sandbox: Sandbox, *, max_output_chars: int = 16000) -> None:
        if max_output_chars < 1:
            raise ValueError("max_output_chars must be positive")
        self._sandbox = sandbox
        self._max_output_chars = max_output_chars
        # real path -> previous contents, oldest first; None means "did not exist" (undo deletes)
        self._history: dict[str, list[str | None]] = {}

    def reset(self) -> None:
        """Forget the undo history: after a sandbox reset it describes files that are gone."""
        self._history.clear()

    def __call__(self, **arguments: Any) -> str:
        """Run one tool call and return its observation; raise :class:`ToolError` on bad input."""
        command = self._check_arguments(arguments)
        target = self._resolve(arguments["path"])
        handlers: dict[str, Callable[[_Target, dict[str, Any]], str]] = {
            "view": self._view, "create": self._create, "str_replace": self._str_replace,
            "insert": self._insert, "undo_edit": self._undo_edit,
        }
        return handlers[command](target, arguments)

    # -- arguments ----------------------------------------------------------------------------

    def _check_arguments(self, arguments: dict[str, Any]) -> str:
        """Validate names, presence and types of the arguments; return the command.

        Parameters set to ``None`` count as absent, since many agent frameworks send every schema
        field and null the unused ones.
        """
        unknown = sorted(set(arguments) - set(PARAMETERS))
        if unknown:
            raise ToolError(
                f"Unexpected parameter(s) {', '.join(f'`{u}`' for u in unknown)} for the {self.name} "
                f"tool. Allowed parameters are: {', '.join(PARAMETERS)}."
            )
        command = arguments.get("command")
        if command is None:
            raise ToolError(f"Parameter `command` is required. Allowed commands are: {', '.join(COMMANDS)}.")
        if not isinstance(command, str) or command not in COMMANDS:
            raise ToolError(
                f"Unrecognized command {command!r}. The allowed commands for the {self.name} tool are: "
                f"{', '.join(COMMANDS)}."
            )
        for name in ("path", *REQUIRED[command]):
            if arguments.get(name) is None:
                raise ToolError(f"Parameter `{name}` is required for command: {command}.")
        allowed = {"command", "path", *REQUIRED[command], *OPTIONAL[command]}
        extra = [n for n in PARAMETERS if n not in allowed and arguments.get(n) is not None]
        if extra:
            raise ToolError(
                f"Parameter(s) {', '.join(f'`{e}`' for e in extra)} cannot be used with command: "
                f"{command}."
            )
        for name in ("path", "file_text", "old_str", "new_str"):
            value = arguments.get(name)
            if value is not None and not isinstance(value, str):
                raise ToolError(f"Invalid `{name}` parameter: {value!r}. It should be a string.")
        insert_line = arguments.get("insert_line")
        if insert_line is not None and not _is_int(insert_line):
            raise ToolError(f"Invalid `insert_line` parameter: {insert_line!r}. It should be an integer.")
        view_range = arguments.get("view_range")
        if view_range is not None and not (
            isinstance(view_range, list | tuple) and len(view_range) == 2 and all(map(_is_int, view_range))
        ):
            raise ToolError(f"Invalid `view_range` parameter: {view_range!r}. It should be a list of two integers.")
        return command

    # -- paths --------------------------------------------------------------------------------

    def _resolve(self, path: str) -> _Target:
        """Resolve ``path`` inside the sandbox and refuse it unless it stays in the repository.

        The lexical check catches ``..`` escapes without running anything; ``realpath`` in the
        sandbox then follows symlinks as the sandbox sees them (a symlink is only dangerous where
        it points, which only the sandbox knows). Running commands on the real path afterwards
        means ``find`` and ``rm`` never cross a symlink either.
        """
        workdir = posixpath.normpath(self._sandbox.workdir)
        if not path.strip() or "\0" in path:
            raise ToolError(f"Invalid `path` parameter: {path!r}. It should be a path inside the repository {workdir}.")
        shown = posixpath.normpath(posixpath.join(workdir, path))  # an absolute path replaces workdir
        if shown.startswith("//"):
            shown = "/" + shown.lstrip("/")
        if not _is_within(shown, workdir):
            raise self._outside(path, workdir)
        script = (
            f"w=$(realpath -m -- {shlex.quote(workdir)}) && p=$(realpath -m -- {shlex.quote(shown)}) || exit 3\n"
            'if [ -d "$p" ]; then t=dir; elif [ -f "$p" ]; then t=file; elif [ -e "$p" ]; then t=other; '
            "else t=missing; fi\n"
            's=0; if [ "$t" = file ]; then s=$(stat -c %s -- "$p") || exit 3; fi\n'
            'printf "%s\\0%s\\0%s\\0%s" "$t" "$s" "$w" "$p"\n'
        )
        result = self._sandbox.exec(script, timeout=30, cwd=None)
        fields = result.output.split("\0")
        if not result.ok or len(fields) != 4 or not fields[1].isdigit():
            raise SandboxError(f"could not resolve {shown} in the sandbox: {result.output[-500:]!r}")
        kind, size, real_workdir, real = fields
        if not _is_within(real, real_workdir):
            raise self._outside(path, workdir)
        relative = posixpath.relpath(real, real_workdir)
        return _Target(shown=shown, real=real, relative=relative, kind=kind, size=int(size))

    def _outside(self, path: str, workdir: str) -> ToolError:
        return ToolError(
            f"The path {path} is outside the repository {workdir}. Only files and directories inside "
            f"the repository can be viewed or edited; please provide a path under {workdir}."
        )

    # -- file access --------------------------------------------------------------------------

    def _read_text(self, target: _Target) -> str:
        """The text of an existing file, refusing what the tool cannot show or edit faithfully."""
        if target.kind == "missing":
            raise ToolError(f"The path {target.shown} does not exist. Please provide a valid path.")
        _require_file_or_missing(target)
        if target.size > MAX_FILE_BYTES:
            raise ToolError(
                f"The file {target.shown} is too large ({target.size / 2**20:.1f} MB; the editor handles "
                f"up to {MAX_FILE_BYTES // 2**20} MB). Use bash commands (grep -n, sed -n) to work with it."
            )
        data = self._sandbox_io(target, lambda: self._sandbox.read_file(target.relative))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or "\0" in text:
            raise ToolError(
                f"The file {target.shown} appears to be binary (it is not UTF-8 text), so it cannot be "
                "viewed or edited by this tool. Use bash commands to inspect it."
            )
        return text

    def _write_text(self, target: _Target, text: str) -> None:
        self._sandbox_io(target, lambda: self._sandbox.write_file(target.relative, text.encode("utf-8")))

    def _sandbox_io(self, target: _Target, operation: Callable[[], Any]) -> Any:
        """Run a read or write, turning the sandbox's refusals into messages for the model."""
        try:
            return operation()
        except PathOutsideWorkspaceError:
            raise self._outside(target.shown, posixpath.normpath(self._sandbox.workdir)) from None
        except FileNotFoundError:
            raise ToolError(f"The path {target.shown} does not exist. Please provide a valid path.") from None
        except IsADirectoryError:  # also what the sandbox raises for FIFOs and other special files
            raise ToolError(_not_regular(target.shown)) from None
        except (NotADirectoryError, FileExistsError):  # mkdir of the parents met a file
            raise ToolError(f"Cannot use {target.shown}: one of its parent paths is a file, not a directory.") from None
        except OSError as exc:
            raise ToolError(f"Ran into {exc.strerror or exc} while trying to access {target.shown}.") from None

    def _remember(self, target: _Target, previous: str | None) -> None:
        versions = self._history.setdefault(target.real, [])
        versions.append(previous)
        del versions[:-MAX_UNDO]

    # -- commands -----------------------------------------------------------------------------

    def _view(self, target: _Target, arguments: dict[str, Any]) -> str:
        view_range = arguments.get("view_range")
        if target.kind == "dir":
            if view_range is not None:
                raise ToolError(
                    f"Invalid `view_range` parameter: {list(view_range)}. The `view_range` parameter is not "
                    "allowed when `path` points to a directory."
                )
            return self._view_directory(target)
        lines = _lines(self._read_text(target))
        count = len(lines)
        if view_range is None:
            if not lines:
                return f"Here's the result of running `cat -n` on {target.shown}:\n(the file is empty)\n"
            return self._listing(lines, 1, target.shown)
        start, end = view_range
        shown_range = [start, end]
        if count == 0:
            raise ToolError(f"Invalid `view_range` parameter: {shown_range}. The file {target.shown} is empty.")
        if not 1 <= start <= count:
            raise ToolError(
                f"Invalid `view_range` parameter: {shown_range}. Its first element `{start}` should be within "
                f"the range of lines of the file: {[1, count]}."
            )
        note = ""
        if end == -1:
            end = count
        elif end < start:
            raise ToolError(
                f"Invalid `view_range` parameter: {shown_range}. Its second element `{end}` should be -1 or "
                f"greater than or equal to its first element `{start}`."
            )
        elif end > count:
            note = f"\nNOTE: We only show up to line {count} since there are only {count} lines in this file.\n"
            end = count
        return self._listing(lines[start - 1:end], start, target.shown) + note

    def _view_directory(self, target: _Target) -> str:
        """List two levels with GNU ``find`` in the sandbox, hidden entries pruned (not descended).

        ``find`` runs from the real directory without ``-L``, so symlinked directories are listed
        but never followed; the listing is capped by ``head`` so a huge tree cannot flood memory.
        """
        limit = self._max_output_chars
        script = (
            f"cd -- {shlex.quote(target.real)} || exit 3\n"
            "find . -mindepth 1 -maxdepth 1 -name '.*' 2>/dev/null | wc -l\n"
            "find . -mindepth 1 -maxdepth 2 -name '.*' -prune -o -type d -printf '%p/\\n' -o -print "
            f"2>/dev/null | LC_ALL=C sort | head -c {limit + 1}\n"
        )
        result = self._sandbox.exec(script, timeout=60, output_limit=limit + 4096)
        count_line, _, listing = result.output.partition("\n")
        if result.exit_code != 0 or not count_line.strip().isdigit():
            raise SandboxError(f"could not list {target.shown} in the sandbox: {result.output[-500:]!r}")
        clipped = len(listing) > limit
        raw = listing.splitlines()[:-1] if clipped else listing.splitlines()  # drop a cut-off last line
        base = target.shown.rstrip("/")
        body = "\n".join(base + "/" + line[2:] for line in raw if line.startswith("./"))
        body = _clip(body, limit, DIRECTORY_CLIPPED)
        if clipped and not body.endswith(DIRECTORY_CLIPPED):
            body += "\n" + DIRECTORY_CLIPPED
        out = f"Here's the files and directories up to 2 levels deep in {target.shown}, excluding hidden items:\n"
        out += (body or "(the directory is empty)") + "\n"
        hidden = int(count_line)
        if hidden:
            out += (
                f"\n{hidden} hidden files/directories in this directory are excluded. You can use "
                f"'ls -la {shlex.quote(target.shown)}' to see them.\n"
            )
        return out

    def _create(self, target: _Target, arguments: dict[str, Any]) -> str:
        if target.kind == "dir":
            raise ToolError(
                f"The path {target.shown} is a directory. Cannot create a file there using command `create`."
            )
        if target.kind != "missing":
            raise ToolError(
                f"File already exists at: {target.shown}. Cannot overwrite files using command `create`. "
                "Use `str_replace` to edit it."
            )
        self._write_text(target, arguments["file_text"])
        self._remember(target, None)
        return f"File created successfully at: {target.shown}"

    def _str_replace(self, target: _Target, arguments: dict[str, Any]) -> str:
        old: str = arguments["old_str"]
        new: str = arguments.get("new_str") or ""
        if not old:
            raise ToolError(
                "No replacement was performed: `old_str` is empty. Give the exact text to replace, or use "
                "`insert` to add text at a line."
            )
        if new == old:
            raise ToolError("No replacement was performed. `new_str` and `old_str` must be different.")
        text = self._read_text(target)
        positions = _occurrences(text, old)
        if not positions:
            raise ToolError(
                f"No replacement was performed, old_str `{_echo(old)}` did not appear verbatim in "
                f"{target.shown}.{_whitespace_hint(text, old)}"
            )
        if len(positions) > 1:
            lines = sorted({text.count("\n", 0, p) + 1 for p in positions})
            raise ToolError(
                f"No replacement was performed. Multiple occurrences of old_str `{_echo(old)}` in lines "
                f"{lines}: it appears {len(positions)} times in {target.shown}. Please ensure it is unique by "
                "including more surrounding lines in `old_str`."
            )
        at = positions[0]
        updated = text[:at] + new + text[at + len(old):]
        self._write_text(target, updated)
        self._remember(target, text)
        first = text.count("\n", 0, at) + 1
        return (
            f"The file {target.shown} has been edited. "
            + self._snippet(updated, first, first + new.count("\n"), f"a snippet of {target.shown}")
            + "Review the changes and make sure they are as expected. Edit the file again if necessary."
        )

    def _insert(self, target: _Target, arguments: dict[str, Any]) -> str:
        after: int = arguments["insert_line"]
        new: str = arguments["new_str"]
        text = self._read_text(target)
        lines = _split_keep(text)
        count = len(lines)
        if not 0 <= after <= count:
            raise ToolError(
                f"Invalid `insert_line` parameter: {after}. It should be within the range of allowed values: "
                f"{[0, count]}"
            )
        block = new if new.endswith("\n") else new + "\n"
        if after == count and text and not text.endswith("\n"):
            # Appending after a last line without a newline: end that line, keep the file's style.
            updated = text + "\n" + new
        else:
            updated = "".join(lines[:after]) + block + "".join(lines[after:])
        self._write_text(target, updated)
        self._remember(target, text)
        added = len(_lines(block))
        return (
            f"The file {target.shown} has been edited. "
            + self._snippet(updated, after + 1, after + added, "a snippet of the edited file")
            + "Review the changes and make sure they are as expected (correct indentation, no duplicate "
            "lines, etc). Edit the file again if necessary."
        )

    def _undo_edit(self, target: _Target, arguments: dict[str, Any]) -> str:
        versions = self._history.get(target.real)
        if not versions:
            raise ToolError(f"No edit history found for {target.shown}.")
        _require_file_or_missing(target)
        previous = versions[-1]
        if previous is None:
            result = self._sandbox.exec(f"rm -f -- {shlex.quote(target.real)}", timeout=30)
            if not result.ok:
                raise ToolError(f"Could not delete {target.shown}: {result.output.strip()[-500:]}")
            versions.pop()
            return (
                f"Last edit to {target.shown} undone successfully: the file was created by `create` and "
                "has been removed."
            )
        self._write_text(target, previous)
        versions.pop()
        listing = self._listing(_lines(previous), 1, target.shown) if previous else "(the file is now empty)\n"
        return f"Last edit to {target.shown} undone successfully. {listing}"

    # -- rendering ----------------------------------------------------------------------------

    def _listing(self, lines: list[str], start: int, description: str) -> str:
        """``cat -n``-style lines (number right-aligned in 6, a tab, the text with tabs expanded),
        clipped at a line boundary so the model never sees half a line number."""
        numbered = "\n".join(f"{number:6}\t{line.expandtabs()}" for number, line in enumerate(lines, start))
        return (
            f"Here's the result of running `cat -n` on {description}:\n"
            + _clip(numbered, self._max_output_chars, FILE_CLIPPED)
            + "\n"
        )

    def _snippet(self, text: str, first: int, last: int, description: str) -> str:
        """The edited lines ``first``..``last`` of ``text`` with a few lines of context each side."""
        lines = _lines(text)
        if not lines:
            return "The file is now empty. "
        start = max(1, first - SNIPPET_LINES)
        end = min(len(lines), max(last, first) + SNIPPET_LINES)
        return self._listing(lines[start - 1:end], start, description)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _lines(text: str) -> list[str]:
    """The lines ``cat -n`` would number: split on ``\\n`` only, no phantom line after a final
    newline (``str.splitlines`` would also split on form feeds and other separators)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _split_keep(text: str) -> list[str]:
    """Lines with their ``\\n`` kept, splitting on ``\\n`` only (a ``\\r`` stays in its line)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _occurrences(text: str, needle: str) -> list[int]:
    """Every start of ``needle`` in ``text``, overlapping ones included: "aa" in "aaa" is
    ambiguous even though ``str.count`` finds it once."""
    found: list[int] = []
    at = text.find(needle)
    while at != -1:
        found.append(at)
        at = text.find(needle, at + 1)
    return found


def _clip(text: str, limit: int, marker: str) -> str:
    """``text`` cut to ``limit`` characters at a line end where possible, then ``marker``."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit + 1)
    return (text[:cut] if cut > 0 else text[:limit]) + "\n" + marker


def _echo(value: str) -> str:
    """A string of the model's, echoed back in full unless it would swamp the message."""
    if len(value) <= ECHO_CHARS:
        return value
    return value[:ECHO_CHARS] + f"... ({len(value) - ECHO_CHARS} more characters)"


def _whitespace_hint(text: str, old: str) -> str:
    """Why a string the model copied from a listing may not match: the listing expands tabs, and
    CRLF files hide their ``\\r``."""
    hints = []
    if "\t" in text and "\t" not in old and " " in old:
        hints.append("the file contains tab characters, which `view` displays as spaces")
    if "\r\n" in text and "\n" in old and "\r" not in old:
        hints.append("the file has Windows line endings (\\r\\n)")
    return f" Note: {'; '.join(hints)}." if hints else ""


def _require_file_or_missing(target: _Target) -> None:
    if target.kind == "dir":
        raise ToolError(
            f"The path {target.shown} is a directory and only the `view` command can be used on directories."
        )
    if target.kind == "other":
        raise ToolError(_not_regular(target.shown))


def _not_regular(shown: str) -> str:
    return (
        f"The path {shown} is not a regular file (it is a FIFO, socket or device); the editor only works "
        "on text files."
    )
