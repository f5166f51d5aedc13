"""``str_replace_editor`` over a real local sandbox: every command, every refusal, file bytes checked."""

from __future__ import annotations

import pytest

from patchgym.gym_envs.tools import StrReplaceEditor, ToolError

CALC = "calc/__init__.py"
CALC_TEXT_START = '"""Small numeric helpers."""\n\n\ndef clamp(x, lo, hi):\n'


@pytest.fixture
def editor(calc_sandbox) -> StrReplaceEditor:
    return StrReplaceEditor(calc_sandbox)


def read(sandbox, path: str) -> str:
    return sandbox.read_file(path).decode("utf-8")


def sh(sandbox, command: str) -> str:
    result = sandbox.exec(command)
    assert result.ok, result.output
    return result.output


def error_of(editor: StrReplaceEditor, **arguments) -> str:
    with pytest.raises(ToolError) as info:
        editor(**arguments)
    return str(info.value)


# -- schema and arguments ---------------------------------------------------------------------


def test_schema_is_an_openai_function_tool():
    schema = StrReplaceEditor.schema
    assert StrReplaceEditor.name == "str_replace_editor"
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "str_replace_editor" and function["description"]
    params = function["parameters"]
    assert params["required"] == ["command", "path"]
    props = params["properties"]
    assert props["command"]["enum"] == ["view", "create", "str_replace", "insert", "undo_edit"]
    assert props["insert_line"]["type"] == "integer"
    assert props["view_range"]["type"] == "array" and props["view_range"]["items"] == {"type": "integer"}
    for name in ("path", "file_text", "old_str", "new_str"):
        assert props[name]["type"] == "string"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"path": CALC}, "Parameter `command` is required"),
        ({"command": "delete", "path": CALC}, "Unrecognized command 'delete'"),
        ({"command": ["view"], "path": CALC}, "Unrecognized command"),
        ({"command": "view"}, "Parameter `path` is required for command: view"),
        ({"command": "view", "path": CALC, "mode": "x"}, "Unexpected parameter(s) `mode`"),
        ({"command": "view", "path": CALC, "file_text": "x"}, "`file_text` cannot be used with command: view"),
        ({"command": "insert", "path": CALC, "insert_line": 1, "new_str": "x", "old_str": "y"},
         "`old_str` cannot be used with command: insert"),
        ({"command": "view", "path": 3}, "Invalid `path` parameter: 3. It should be a string"),
        ({"command": "view", "path": ""}, "Invalid `path` parameter"),
        ({"command": "create", "path": "new.py"}, "Parameter `file_text` is required for command: create"),
        ({"command": "create", "path": "new.py", "file_text": b"x"}, "Invalid `file_text` parameter"),
        ({"command": "str_replace", "path": CALC}, "Parameter `old_str` is required for command: str_replace"),
        ({"command": "str_replace", "path": CALC, "old_str": "x", "new_str": 5}, "Invalid `new_str` parameter"),
        ({"command": "insert", "path": CALC, "new_str": "x"}, "Parameter `insert_line` is required"),
        ({"command": "insert", "path": CALC, "insert_line": 1}, "Parameter `new_str` is required for command: insert"),
        ({"command": "insert", "path": CALC, "insert_line": "1", "new_str": "x"},
         "Invalid `insert_line` parameter: '1'. It should be an integer"),
        ({"command": "insert", "path": CALC, "insert_line": True, "new_str": "x"}, "Invalid `insert_line`"),
        ({"command": "view", "path": CALC, "view_range": [1]}, "It should be a list of two integers"),
        ({"command": "view", "path": CALC, "view_range": ["1", "2"]}, "It should be a list of two integers"),
        ({"command": "view", "path": CALC, "view_range": 3}, "It should be a list of two integers"),
    ],
)
def test_bad_arguments_are_named(editor, calc_sandbox, arguments, expected):
    before = read(calc_sandbox, CALC)
    assert expected in error_of(editor, **arguments)
    assert read(calc_sandbox, CALC) == before


def test_null_parameters_count_as_absent(editor):
    # Agent frameworks often send every schema field, nulling the unused ones.
    out = editor(command="view", path=CALC, file_text=None, old_str=None, new_str=None, insert_line=None,
                 view_range=None)
    assert out.startswith("Here's the result of running `cat -n` on /testbed/calc/__init__.py:")


# -- paths ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/etc/passwd", "../etc/passwd", "/testbed/../etc/passwd", "calc/../../etc",
                                  "/tmp", "/testbedx/file.py"])
def test_paths_outside_the_repository_are_refused(editor, path):
    for arguments in ({"command": "view"}, {"command": "create", "file_text": "x"}):
        assert "is outside the repository /testbed" in error_of(editor, path=path, **arguments)


def test_symlinks_leading_out_are_refused(editor, calc_sandbox):
    sh(calc_sandbox, "ln -s /etc etclink && ln -s /etc/passwd pw && ln -s /tmp tmplink")
    assert "outside the repository" in error_of(editor, command="view", path="etclink")
    assert "outside the repository" in error_of(editor, command="view", path="/testbed/etclink/passwd")
    assert "outside the repository" in error_of(editor, command="view", path="pw")
    assert "outside the repository" in error_of(editor, command="str_replace", path="pw", old_str="root",
                                                new_str="x")
    assert "outside the repository" in error_of(editor, command="create", path="tmplink/escaped.txt",
                                                file_text="x")
    assert "escaped.txt" not in sh(calc_sandbox, "ls -a /tmp")


def test_symlink_inside_the_repository_edits_its_target(editor, calc_sandbox):
    sh(calc_sandbox, "ln -s calc/__init__.py alias.py")
    editor(command="str_replace", path="alias.py", old_str="def mean(values):", new_str="def average(values):")
    assert "def average(values):" in read(calc_sandbox, CALC)
    editor(command="undo_edit", path=CALC)  # one history per real file
    assert "def mean(values):" in read(calc_sandbox, CALC)


def test_relative_and_absolute_paths_name_the_same_file(editor):
    assert editor(command="view", path=CALC) == editor(command="view", path="/testbed/calc/./__init__.py")


def test_missing_paths(editor):
    assert "The path /testbed/nope.py does not exist" in error_of(editor, command="view", path="nope.py")
    assert "does not exist" in error_of(editor, command="str_replace", path="nope.py", old_str="a", new_str="b")
    assert "does not exist" in error_of(editor, command="insert", path="nope.py", insert_line=0, new_str="b")


def test_directories_only_support_view(editor):
    for arguments in (
        {"command": "str_replace", "old_str": "a", "new_str": "b"},
        {"command": "insert", "insert_line": 0, "new_str": "b"},
    ):
        message = error_of(editor, path="calc", **arguments)
        assert "/testbed/calc is a directory and only the `view` command can be used on directories" in message
    assert "is a directory" in error_of(editor, command="create", path="calc", file_text="x")


# -- view -------------------------------------------------------------------------------------


def test_view_file_is_cat_n(editor, calc_sandbox):
    text = read(calc_sandbox, CALC)
    out = editor(command="view", path="/testbed/calc/__init__.py")
    header, _, body = out.partition("\n")
    assert header == "Here's the result of running `cat -n` on /testbed/calc/__init__.py:"
    expected = "\n".join(f"{n:6}\t{line}" for n, line in enumerate(text.splitlines(), 1))
    assert body == expected + "\n"  # no phantom empty line after the final newline
    assert "     1\t\"\"\"Small numeric helpers.\"\"\"" in out


def test_view_range(editor, calc_sandbox):
    lines = read(calc_sandbox, CALC).splitlines()
    out = editor(command="view", path=CALC, view_range=[4, 6])
    assert out.splitlines()[1:] == [f"{n:6}\t{lines[n - 1]}" for n in (4, 5, 6)]
    tail = editor(command="view", path=CALC, view_range=[12, -1])
    assert tail.splitlines()[1:] == [f"{n:6}\t{lines[n - 1]}" for n in range(12, len(lines) + 1)]
    single = editor(command="view", path=CALC, view_range=[len(lines), len(lines)])
    assert single.splitlines()[1:] == [f"{len(lines):6}\t{lines[-1]}"]


def test_view_range_end_past_the_file_is_clamped_with_a_note(editor, calc_sandbox):
    count = len(read(calc_sandbox, CALC).splitlines())
    out = editor(command="view", path=CALC, view_range=[count - 1, count + 10])
    assert out.splitlines()[1].startswith(f"{count - 1:6}\t") and out.splitlines()[2].startswith(f"{count:6}\t")
    assert f"NOTE: We only show up to line {count} since there are only {count} lines" in out


@pytest.mark.parametrize(
    ("view_range", "expected"),
    [
        ([0, 3], "Its first element `0` should be within the range of lines of the file: [1, 14]"),
        ([15, 16], "Its first element `15` should be within the range of lines of the file: [1, 14]"),
        ([-1, 3], "Its first element `-1`"),
        ([5, 3], "Its second element `3` should be -1 or greater than or equal to its first element `5`"),
        ([5, -2], "Its second element `-2`"),
        ([5, 0], "Its second element `0`"),
    ],
)
def test_view_range_errors(editor, calc_sandbox, view_range, expected):
    assert len(read(calc_sandbox, CALC).splitlines()) == 14
    message = error_of(editor, command="view", path=CALC, view_range=view_range)
    assert message.startswith(f"Invalid `view_range` parameter: {view_range}.") and expected in message


def test_view_range_on_an_empty_file(editor, calc_sandbox):
    calc_sandbox.write_file("empty.txt", b"")
    assert "(the file is empty)" in editor(command="view", path="empty.txt")
    assert "is empty" in error_of(editor, command="view", path="empty.txt", view_range=[1, 1])


def test_view_expands_tabs_for_display_only(editor, calc_sandbox):
    calc_sandbox.write_file("Makefile", b"all:\n\techo hi\n")
    out = editor(command="view", path="Makefile")
    assert "     2\t        echo hi" in out
    assert calc_sandbox.read_file("Makefile") == b"all:\n\techo hi\n"


def test_view_file_without_trailing_newline(editor, calc_sandbox):
    calc_sandbox.write_file("notrail.txt", b"one\ntwo")
    assert editor(command="view", path="notrail.txt").splitlines()[1:] == ["     1\tone", "     2\ttwo"]


def test_long_view_is_clipped_at_a_line_with_a_marker(calc_sandbox):
    editor = StrReplaceEditor(calc_sandbox, max_output_chars=300)
    calc_sandbox.write_file("long.txt", "".join(f"line {n}\n" for n in range(1, 201)))
    out = editor(command="view", path="long.txt")
    assert "<response clipped>" in out and "grep -n" in out
    body = out.split("\n<response clipped>")[0].splitlines()[1:]
    assert body[0] == "     1\tline 1" and len("\n".join(body)) <= 300
    assert body[-1] == f"{len(body):6}\tline {len(body)}"  # whole lines only
    ranged = editor(command="view", path="long.txt", view_range=[190, 200])
    assert "<response clipped>" not in ranged and "   200\tline 200" in ranged


def test_view_directory_two_levels_without_hidden_entries(editor, calc_sandbox):
    sh(calc_sandbox, "mkdir -p a/b/c .hidden calc/.cache && touch a/b/c/deep.txt a/b/two.txt .hidden/x "
                     "calc/.secret calc/.cache/y")
    out = editor(command="view", path="/testbed")
    header, *entries = out.rstrip("\n").split("\n")
    assert header == "Here's the files and directories up to 2 levels deep in /testbed, excluding hidden items:"
    listing = entries[:entries.index("")]
    assert listing == [
        "/testbed/a/", "/testbed/a/b/", "/testbed/calc/", "/testbed/calc/__init__.py",
        "/testbed/pyproject.toml", "/testbed/tests/", "/testbed/tests/test_calc.py",
    ]
    assert not any(".git" in e or ".hidden" in e or ".secret" in e or "deep.txt" in e for e in listing)
    assert "2 hidden files/directories in this directory are excluded" in out  # .git and .hidden
    sub = editor(command="view", path="a")
    assert "/testbed/a/b/\n/testbed/a/b/c/\n/testbed/a/b/two.txt\n" in sub and "deep.txt" not in sub
    assert "hidden" not in sub.split("excluding hidden items:")[1]
    inside_hidden = editor(command="view", path=".hidden")  # asked for by name: its contents are shown
    assert "/testbed/.hidden/x" in inside_hidden


def test_view_directory_rejects_view_range(editor):
    message = error_of(editor, command="view", path="calc", view_range=[1, 2])
    assert "The `view_range` parameter is not allowed when `path` points to a directory" in message


def test_view_large_directory_is_clipped(calc_sandbox):
    editor = StrReplaceEditor(calc_sandbox, max_output_chars=200)
    sh(calc_sandbox, "mkdir many && cd many && touch $(seq -f 'file%03g.txt' 1 100)")
    out = editor(command="view", path="many")
    assert "<response clipped>" in out and "ls -la" in out
    entries = out.split("excluding hidden items:\n")[1].split("\n<response clipped>")[0].splitlines()
    assert entries[0] == "/testbed/many/file001.txt"
    assert all(e.startswith("/testbed/many/file") and e.endswith(".txt") for e in entries)  # no cut-off line


# -- create -----------------------------------------------------------------------------------


def test_create_makes_parents_and_keeps_text_exactly(editor, calc_sandbox):
    out = editor(command="create", path="pkg/sub/mod.py", file_text="x = 1\n\ty = 2")
    assert out == "File created successfully at: /testbed/pkg/sub/mod.py"
    assert calc_sandbox.read_file("pkg/sub/mod.py") == b"x = 1\n\ty = 2"
    editor(command="create", path="/testbed/empty.txt", file_text="")
    assert calc_sandbox.read_file("empty.txt") == b""


def test_create_refuses_an_existing_file(editor, calc_sandbox):
    before = read(calc_sandbox, CALC)
    message = error_of(editor, command="create", path=CALC, file_text="oops")
    assert "File already exists at: /testbed/calc/__init__.py" in message and "str_replace" in message
    assert read(calc_sandbox, CALC) == before


def test_create_below_a_file_is_refused(editor, calc_sandbox):
    message = error_of(editor, command="create", path="calc/__init__.py/x.py", file_text="x")
    assert "parent" in message
    assert read(calc_sandbox, CALC).startswith(CALC_TEXT_START)


# -- str_replace ------------------------------------------------------------------------------


def test_str_replace_edits_once_and_shows_a_snippet(editor, calc_sandbox):
    before = read(calc_sandbox, CALC)
    out = editor(
        command="str_replace", path=CALC,
        old_str="    values = list(values)\n",
        new_str="    values = list(values)\n    if not values:\n        raise ValueError('empty')\n",
    )
    after = read(calc_sandbox, CALC)
    assert after == before.replace(
        "    values = list(values)\n",
        "    values = list(values)\n    if not values:\n        raise ValueError('empty')\n",
    )
    lines = after.splitlines()
    assert out.startswith("The file /testbed/calc/__init__.py has been edited. Here's the result of running "
                          "`cat -n` on a snippet of /testbed/calc/__init__.py:\n")
    assert out.endswith("Review the changes and make sure they are as expected. Edit the file again if necessary.")
    snippet = out.split("\n")[1:-1]
    # the edit starts at line 13: four lines of context before it, up to the end of the file after it
    assert snippet == [f"{n:6}\t{lines[n - 1]}" for n in range(9, len(lines) + 1)]


def test_str_replace_snippet_is_a_window(editor, calc_sandbox):
    calc_sandbox.write_file("long.txt", "".join(f"line {n}\n" for n in range(1, 41)))
    out = editor(command="str_replace", path="long.txt", old_str="line 20\n", new_str="LINE 20\nLINE 20b\n")
    snippet = out.split("\n")[1:-1]
    assert snippet[0] == "    16\tline 16" and "    20\tLINE 20" in snippet and "    21\tLINE 20b" in snippet
    assert snippet[-1] == "    26\tline 25"


def test_str_replace_not_found(editor, calc_sandbox):
    before = read(calc_sandbox, CALC)
    message = error_of(editor, command="str_replace", path=CALC, old_str="def median(", new_str="x")
    assert message == ("No replacement was performed, old_str `def median(` did not appear verbatim in "
                       "/testbed/calc/__init__.py.")
    assert read(calc_sandbox, CALC) == before


def test_str_replace_multiple_occurrences_lists_lines(editor, calc_sandbox):
    before = read(calc_sandbox, CALC)
    message = error_of(editor, command="str_replace", path=CALC, old_str='    """', new_str="x")
    assert "No replacement was performed. Multiple occurrences of old_str" in message
    assert "in lines [5, 12]" in message and "appears 2 times" in message and "unique" in message
    overlapping = error_of(editor, command="str_replace", path=CALC, old_str="\n\n", new_str="\n")
    assert "appears 4 times" in overlapping and "[1, 2, 8, 9]" in overlapping  # "\n\n\n" holds two
    assert read(calc_sandbox, CALC) == before


def test_str_replace_without_new_str_deletes(editor, calc_sandbox):
    before = read(calc_sandbox, CALC)
    editor(command="str_replace", path=CALC, old_str='    """Arithmetic mean of a sequence of numbers."""\n')
    assert read(calc_sandbox, CALC) == before.replace('    """Arithmetic mean of a sequence of numbers."""\n', "")


def test_str_replace_refuses_empty_or_identical_strings(editor, calc_sandbox):
    before = read(calc_sandbox, CALC)
    assert "`old_str` is empty" in error_of(editor, command="str_replace", path=CALC, old_str="", new_str="x")
    assert "`new_str` and `old_str` must be different" in error_of(
        editor, command="str_replace", path=CALC, old_str="def mean", new_str="def mean")
    assert read(calc_sandbox, CALC) == before


def test_str_replace_keeps_tabs_crlf_and_missing_final_newline(editor, calc_sandbox):
    calc_sandbox.write_file("win.txt", b"a\r\n\tb\r\nc")
    editor(command="str_replace", path="win.txt", old_str="\tb", new_str="\tB")
    assert calc_sandbox.read_file("win.txt") == b"a\r\n\tB\r\nc"
    editor(command="str_replace", path="win.txt", old_str="c", new_str="C")
    assert calc_sandbox.read_file("win.txt") == b"a\r\n\tB\r\nC"


def test_str_replace_hints_at_tabs_shown_as_spaces(editor, calc_sandbox):
    calc_sandbox.write_file("Makefile", b"all:\n\techo hi\n")
    message = error_of(editor, command="str_replace", path="Makefile", old_str="        echo hi", new_str="x")
    assert "did not appear verbatim" in message and "tab characters" in message
    assert calc_sandbox.read_file("Makefile") == b"all:\n\techo hi\n"


def test_str_replace_to_empty_file(editor, calc_sandbox):
    calc_sandbox.write_file("one.txt", b"only\n")
    out = editor(command="str_replace", path="one.txt", old_str="only\n", new_str="")
    assert "The file is now empty" in out and calc_sandbox.read_file("one.txt") == b""


# -- insert -----------------------------------------------------------------------------------


def test_insert_at_top_middle_and_end(editor, calc_sandbox):
    calc_sandbox.write_file("f.txt", b"a\nb\nc\n")
    out = editor(command="insert", path="f.txt", insert_line=0, new_str="top")
    assert calc_sandbox.read_file("f.txt") == b"top\na\nb\nc\n"
    assert out.startswith("The file /testbed/f.txt has been edited. Here's the result of running `cat -n` on a "
                          "snippet of the edited file:\n     1\ttop\n     2\ta\n")
    assert "correct indentation, no duplicate lines" in out
    editor(command="insert", path="f.txt", insert_line=2, new_str="mid1\nmid2\n")  # a final newline is not doubled
    assert calc_sandbox.read_file("f.txt") == b"top\na\nmid1\nmid2\nb\nc\n"
    editor(command="insert", path="f.txt", insert_line=6, new_str="end")
    assert calc_sandbox.read_file("f.txt") == b"top\na\nmid1\nmid2\nb\nc\nend\n"


def test_insert_snippet_shows_context(editor, calc_sandbox):
    calc_sandbox.write_file("long.txt", "".join(f"line {n}\n" for n in range(1, 21)))
    out = editor(command="insert", path="long.txt", insert_line=10, new_str="new")
    assert out.split("\n")[1:-1] == [
        "     7\tline 7", "     8\tline 8", "     9\tline 9", "    10\tline 10", "    11\tnew",
        "    12\tline 11", "    13\tline 12", "    14\tline 13", "    15\tline 14",
    ]


def test_insert_into_a_file_without_trailing_newline(editor, calc_sandbox):
    calc_sandbox.write_file("nt.txt", b"one\ntwo")
    editor(command="insert", path="nt.txt", insert_line=1, new_str="between")
    assert calc_sandbox.read_file("nt.txt") == b"one\nbetween\ntwo"
    editor(command="insert", path="nt.txt", insert_line=3, new_str="last")
    assert calc_sandbox.read_file("nt.txt") == b"one\nbetween\ntwo\nlast"


def test_insert_into_an_empty_file(editor, calc_sandbox):
    calc_sandbox.write_file("empty.txt", b"")
    editor(command="insert", path="empty.txt", insert_line=0, new_str="first")
    assert calc_sandbox.read_file("empty.txt") == b"first\n"


@pytest.mark.parametrize("line", [-1, 15, 100])
def test_insert_line_out_of_range(editor, calc_sandbox, line):
    before = read(calc_sandbox, CALC)
    message = error_of(editor, command="insert", path=CALC, insert_line=line, new_str="x")
    assert message.startswith(f"Invalid `insert_line` parameter: {line}. It should be within the range of "
                              "allowed values: [0, 14]")
    assert read(calc_sandbox, CALC) == before


# -- undo_edit --------------------------------------------------------------------------------


def test_undo_str_replace_and_insert_in_order(editor, calc_sandbox):
    original = calc_sandbox.read_file(CALC)
    editor(command="str_replace", path=CALC, old_str="def mean(values):", new_str="def average(values):")
    replaced = calc_sandbox.read_file(CALC)
    editor(command="insert", path=CALC, insert_line=0, new_str="# header")
    out = editor(command="undo_edit", path=CALC)
    assert calc_sandbox.read_file(CALC) == replaced
    assert out.startswith("Last edit to /testbed/calc/__init__.py undone successfully. Here's the result of "
                          "running `cat -n` on /testbed/calc/__init__.py:\n     1\t\"\"\"Small numeric helpers.")
    editor(command="undo_edit", path="/testbed/calc/__init__.py")
    assert calc_sandbox.read_file(CALC) == original
    assert error_of(editor, command="undo_edit", path=CALC) == "No edit history found for /testbed/calc/__init__.py."


def test_undo_create_deletes_the_file(editor, calc_sandbox):
    editor(command="create", path="new/mod.py", file_text="a = 1\n")
    editor(command="str_replace", path="new/mod.py", old_str="a = 1", new_str="a = 2")
    editor(command="undo_edit", path="new/mod.py")
    assert calc_sandbox.read_file("new/mod.py") == b"a = 1\n"
    out = editor(command="undo_edit", path="new/mod.py")
    assert "undone successfully" in out and "removed" in out
    with pytest.raises(FileNotFoundError):
        calc_sandbox.read_file("new/mod.py")
    assert "No edit history" in error_of(editor, command="undo_edit", path="new/mod.py")


def test_undo_restores_file_without_trailing_newline_exactly(editor, calc_sandbox):
    calc_sandbox.write_file("nt.txt", b"one\ntwo")
    editor(command="insert", path="nt.txt", insert_line=2, new_str="three")
    editor(command="undo_edit", path="nt.txt")
    assert calc_sandbox.read_file("nt.txt") == b"one\ntwo"


def test_failed_edits_leave_no_history(editor):
    error_of(editor, command="str_replace", path=CALC, old_str="no such text", new_str="x")
    assert "No edit history" in error_of(editor, command="undo_edit", path=CALC)
    assert "No edit history" in error_of(editor, command="undo_edit", path="/testbed")


def test_reset_forgets_history(editor, calc_sandbox):
    editor(command="str_replace", path=CALC, old_str="def mean(values):", new_str="def average(values):")
    calc_sandbox.reset()
    editor.reset()
    assert "No edit history found" in error_of(editor, command="undo_edit", path=CALC)
    assert "def mean(values):" in read(calc_sandbox, CALC)


# -- files the editor cannot handle -----------------------------------------------------------


def test_binary_files_are_refused(editor, calc_sandbox):
    calc_sandbox.write_file("blob.bin", b"\xff\xfe\x00\x01binary")
    calc_sandbox.write_file("nul.txt", b"text\x00more\n")
    for path in ("blob.bin", "nul.txt"):
        for arguments in (
            {"command": "view"},
            {"command": "str_replace", "old_str": "binary", "new_str": "x"},
            {"command": "insert", "insert_line": 0, "new_str": "x"},
        ):
            assert "appears to be binary" in error_of(editor, path=path, **arguments)
    assert calc_sandbox.read_file("blob.bin") == b"\xff\xfe\x00\x01binary"


def test_fifos_are_refused(editor, calc_sandbox):
    sh(calc_sandbox, "mkfifo pipe")
    for arguments in ({"command": "view"}, {"command": "str_replace", "old_str": "a", "new_str": "b"},
                      {"command": "insert", "insert_line": 0, "new_str": "x"}):
        assert "is not a regular file" in error_of(editor, path="pipe", **arguments)
    assert "already exists" in error_of(editor, command="create", path="pipe", file_text="x")


class _FailingReads:
    """The calc sandbox, except that reads fail the way a backend reports a special file."""

    def __init__(self, sandbox, error: Exception) -> None:
        self._sandbox, self._error = sandbox, error
        self.workdir = sandbox.workdir

    def exec(self, *args, **kwargs):
        return self._sandbox.exec(*args, **kwargs)

    def read_file(self, path: str) -> bytes:
        raise self._error

    def write_file(self, path: str, data) -> None:
        self._sandbox.write_file(path, data)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (IsADirectoryError("x is not a regular file"), "is not a regular file"),
        (FileNotFoundError("gone"), "does not exist"),
        (PermissionError(13, "Permission denied"), "Ran into Permission denied"),
    ],
)
def test_sandbox_os_errors_become_tool_errors(calc_sandbox, error, expected):
    editor = StrReplaceEditor(_FailingReads(calc_sandbox, error))
    assert expected in error_of(editor, command="view", path=CALC)


def test_sandbox_path_refusal_becomes_tool_error(calc_sandbox):
    from patchgym.sandboxes import PathOutsideWorkspaceError

    editor = StrReplaceEditor(_FailingReads(calc_sandbox, PathOutsideWorkspaceError("symlink")))
    assert "outside the repository" in error_of(editor, command="view", path=CALC)
