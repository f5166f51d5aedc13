"""What a model is told about ``str_replace_editor``: its commands and parameters, its description
and JSON schema, and the notes on clipped output, in the words SWE-agent's and OpenHands' editors
use (models were trained on them). The behaviour is :mod:`.editor`'s."""

from __future__ import annotations

from typing import Any

COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
# Which parameters each command takes (besides ``command`` and ``path``): a parameter given a value
# for a command that ignores it is almost always a confused call, so it is reported, not dropped.
REQUIRED: dict[str, tuple[str, ...]] = {
    "view": (), "create": ("file_text",), "str_replace": ("old_str",),
    "insert": ("insert_line", "new_str"), "undo_edit": (),
}
OPTIONAL: dict[str, tuple[str, ...]] = {
    "view": ("view_range",), "create": (), "str_replace": ("new_str",), "insert": (), "undo_edit": (),
}
PARAMETERS = ("command", "path", "file_text", "old_str", "new_str", "insert_line", "view_range")

FILE_CLIPPED = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. "
    "You should retry `view` with `view_range` after you have searched inside the file with "
    "`grep -n` in order to find the line numbers of what you are looking for.</NOTE>"
)
DIRECTORY_CLIPPED = (
    "<response clipped><NOTE>To save on context only part of this directory has been shown to you. "
    "You should use `ls -la` or `find` instead to view large directories incrementally.</NOTE>"
)

DESCRIPTION = """\
Custom editing tool for viewing, creating and editing files in the repository.
* State is persistent across command calls.
* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a directory, \
`view` lists non-hidden files and directories up to 2 levels deep.
* The `create` command cannot be used if the specified `path` already exists as a file.
* If a command generates a long output, it will be truncated and marked with `<response clipped>`.
* The `undo_edit` command will revert the last edit made to the file at `path`.

Notes for using the `str_replace` command:
* The `old_str` parameter should match EXACTLY one or more consecutive lines from the original file. \
Be mindful of whitespaces!
* If the `old_str` parameter is not unique in the file, the replacement will not be performed. Make \
sure to include enough context in `old_str` to make it unique.
* The `new_str` parameter should contain the edited lines that should replace the `old_str`.
"""

SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "str_replace_editor",
        "description": DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "enum": list(COMMANDS),
                    "description": "The command to run. Allowed options are: `view`, `create`, "
                                   "`str_replace`, `insert`, `undo_edit`.",
                },
                "path": {
                    "type": "string",
                    "description": "Absolute path to a file or directory inside the repository, "
                                   "e.g. `/testbed/file.py` or `/testbed` (a path relative to the "
                                   "repository root is accepted too).",
                },
                "file_text": {
                    "type": "string",
                    "description": "Required parameter of `create` command, with the content of the "
                                   "file to be created.",
                },
                "old_str": {
                    "type": "string",
                    "description": "Required parameter of `str_replace` command containing the "
                                   "string in `path` to replace.",
                },
                "new_str": {
                    "type": "string",
                    "description": "Optional parameter of `str_replace` command containing the new "
                                   "string (if not given, no string will be added). Required "
                                   "parameter of `insert` command containing the string to insert.",
                },
                "insert_line": {
                    "type": "integer",
                    "description": "Required parameter of `insert` command. The `new_str` will be "
                                   "inserted AFTER the line `insert_line` of `path` (0 inserts at "
                                   "the top of the file).",
                },
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "minItems": 2,
                    "maxItems": 2,
                    "description": "Optional parameter of `view` command when `path` points to a "
                                   "file. If none is given, the full file is shown. If provided, the "
                                   "file will be shown in the indicated line number range, e.g. "
                                   "[11, 12] will show lines 11 and 12. Indexing at 1 to start. "
                                   "Setting `[start_line, -1]` shows all lines from `start_line` to "
                                   "the end of the file.",
                },
            },
            "required": ["command", "path"],
        },
    },
}
