"""The patch parser, its canonical rendering, the agent-patch policy and the applier.

Every attack that once earned reward without a fix has a test here showing the parser sees the hidden
path and the filter drops it; round trips use diffs made by real git and GNU diff, and are applied
with real git and GNU patch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from patchgym.grading.patch_apply import apply_patch
from patchgym.grading.patches import (
    MAX_PATCH_BYTES,
    FilePatch,
    PatchError,
    drop_reason,
    filter_agent_patch,
    parse_patch,
    read_agent_patch,
    render_patch,
    split_diff,
    touched_paths,
)
from patchgym.sandboxes import ExecResult, SandboxError

FIX = ("diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n"
       "@@ -1,3 +1,3 @@\n 1\n-2\n+TWO\n 3\n")
CONFTEST = "import pytest\n"  # what an attacker's conftest.py would hold (a hook forcing passes)


def new_file(path: str, content: str = "x\n", mode: str = "100644") -> str:
    body = "".join(f"+{line}\n" for line in content.splitlines())
    return (f"diff --git a/{path} b/{path}\nnew file mode {mode}\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(content.splitlines())} @@\n{body}")


def run(cwd: Path, *args: str, check: bool = True, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t.invalid", "LC_ALL": "C", "TZ": "UTC"}
    return subprocess.run(args, cwd=cwd, env=env, input=stdin, capture_output=True, check=check)


def paths_of(text: str) -> set[str]:
    return {p for f in parse_patch(text) for p in f.paths}


def assert_round_trip(text: str) -> list[FilePatch]:
    files = parse_patch(text)
    assert files
    assert parse_patch(render_patch(files)) == files
    return files


# --- attacks: the parser sees the hidden path and the filter drops it -----------------------------

def test_c_quoted_conftest_is_decoded_and_dropped():
    quoted = ('diff --git "a/con\\146test.py" "b/con\\146test.py"\nnew file mode 100644\n'
              '--- /dev/null\n+++ "b/con\\146test.py"\n@@ -0,0 +1 @@\n+import pytest\n')
    assert paths_of(quoted) == {"conftest.py"}
    filtered = filter_agent_patch(read_agent_patch(FIX + quoted), set())
    assert filtered.dropped == ["conftest.py"] and "test file" in filtered.reasons["conftest.py"]
    assert paths_of(filtered.text) == {"pkg/a.py"}


def test_plain_section_after_a_git_section_is_its_own_section():
    hidden = "--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1 @@\n+import pytest\n"
    files = parse_patch(FIX + hidden)
    assert [(f.status, f.new_path) for f in files] == [("modify", "pkg/a.py"), ("add", "conftest.py")]
    filtered = filter_agent_patch(read_agent_patch(FIX + hidden), set())
    assert filtered.dropped == ["conftest.py"] and "conftest" not in filtered.text


def test_context_diff_creating_conftest_is_read_and_dropped():
    context = ("*** /dev/null\n--- b/conftest.py\n***************\n*** 0 ****\n--- 1,2 ----\n"
               "+ import pytest\n+ collect_ignore = ['tests']\n")
    [f] = parse_patch(context)
    assert (f.status, f.new_path) == ("add", "conftest.py")
    assert f.hunks[0].lines == ("+import pytest\n", "+collect_ignore = ['tests']\n")
    filtered = filter_agent_patch(read_agent_patch(FIX + context), set())
    assert filtered.dropped == ["conftest.py"] and paths_of(filtered.text) == {"pkg/a.py"}


@pytest.mark.parametrize("path", [".git/hooks/post-checkout", ".git/config", ".GIT/config", "sub/.git/config",
                                  "./.git/info/attributes"])
def test_paths_inside_git_are_dropped(path):
    filtered = filter_agent_patch(read_agent_patch(FIX + new_file(path, "#!/bin/sh\n")), set())
    normalized = path.removeprefix("./")
    assert filtered.dropped == [normalized] and ".git" in filtered.reasons[normalized]
    assert paths_of(filtered.text) == {"pkg/a.py"}


def test_symlinks_and_submodules_are_dropped():
    link = new_file("pkg/link", "../tests/conftest.py", mode="120000")
    retarget = ("diff --git a/pkg/old b/pkg/old\nindex 1234567..89abcde 120000\n--- a/pkg/old\n+++ b/pkg/old\n"
                "@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+/etc\n\\ No newline at end of file\n")
    gitlink = "diff --git a/vendor b/vendor\nnew file mode 160000\nindex 0000000..1234567\n"
    filtered = filter_agent_patch(read_agent_patch(FIX + link + retarget + gitlink), set())
    assert filtered.dropped == ["pkg/link", "pkg/old", "vendor"]
    assert filtered.reasons["pkg/link"] == "a symlink" and "submodule" in filtered.reasons["vendor"]


@pytest.mark.parametrize("path", ["x.dist-info/entry_points.txt", "lib/Foo.egg-info/entry_points.txt",
                                  "site/foo.egg-link", "pkg/sub/sitecustomize.py", "usercustomize.py", "foo.pth",
                                  "deep/er/evil.pth", ".gitattributes", "pkg/.gitattributes", ".gitmodules",
                                  "pytest.toml", "tests/helpers.py", "pkg/protected.py"])
def test_policy_drops(path):
    filtered = filter_agent_patch(read_agent_patch(FIX + new_file(path)), {"pkg/protected.py"})
    assert filtered.dropped == [path] and filtered.reasons[path]
    assert paths_of(filtered.text) == {"pkg/a.py"}


def test_either_side_of_a_rename_counts():
    rename = "diff --git a/tests/test_a.py b/pkg/b.py\nsimilarity index 100%\nrename from tests/test_a.py\nrename to pkg/b.py\n"
    [f] = parse_patch(rename)
    assert (f.status, f.paths) == ("rename", {"tests/test_a.py", "pkg/b.py"})
    assert drop_reason(f, set())
    assert filter_agent_patch(read_agent_patch(FIX + rename), set()).dropped == ["pkg/b.py", "tests/test_a.py"]
    assert drop_reason(parse_patch(FIX)[0], set()) is None


@pytest.mark.parametrize("patch", [
    new_file("../escape.py"),
    new_file("pkg/../../escape.py"),
    "--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-root\n+toor\n",
    'diff --git "a//etc/passwd" "b//etc/passwd"\n--- "a//etc/passwd"\n+++ "b//etc/passwd"\n@@ -1 +1 @@\n-a\n+b\n',
    'diff --git "a/x\\000y" "b/x\\000y"\nnew file mode 100644\n--- /dev/null\n+++ "b/x\\000y"\n@@ -0,0 +1 @@\n+x\n',
])
def test_paths_outside_the_tree_are_patch_errors(patch):
    with pytest.raises(PatchError, match=r"line \d+: an? (absolute path|'\.\.' component|NUL)"):
        filter_agent_patch(read_agent_patch(patch), set())


def test_normal_diff_syntax_after_a_section_is_an_error():
    with pytest.raises(PatchError, match="line 9: diff syntax outside a file section"):
        parse_patch(FIX + "3c3\n< a\n---\n> b\n")
    with pytest.raises(PatchError, match="diff syntax"):
        parse_patch(FIX + "some words\n@@ -1 +1 @@\n-x\n+y\n")  # a hunk with no file header
    with pytest.raises(PatchError, match="diff syntax"):
        parse_patch(FIX + "--- a/conftest.py\n")


def test_garbage_and_oversize_are_patch_errors():
    for garbage in ("please fix it yourself", "Binary files a/x and b/x differ\n",
                    "diff --git a/x b/x\n", "diff --git a/x b/x\nindex 1234567..89abcde 100644\n"):
        with pytest.raises(PatchError):
            filter_agent_patch(read_agent_patch(garbage), set())
        assert split_diff(garbage) == [] and touched_paths(garbage) == set()
    assert parse_patch("") == [] and parse_patch("\n \n") == []
    with pytest.raises(PatchError, match="larger than"):
        filter_agent_patch(read_agent_patch("x" * (MAX_PATCH_BYTES + 1)), set())


@pytest.mark.parametrize("patch, message", [
    # the ---/+++ lines name another file than the diff --git line: git would write the --- one
    ("diff --git a/ok.py b/ok.py\n--- a/conftest.py\n+++ b/conftest.py\n@@ -1 +1 @@\n-a\n+b\n", "names disagree"),
    # GNU patch strips trailing whitespace from a name, git keeps it
    ("--- a/conftest.py \t\n+++ b/conftest.py \t\n@@ -1 +1 @@\n-a\n+b\n", "whitespace"),
    # a hunk longer than its header: the next section would be read as hunk lines
    ("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n-a\n+b\n" + new_file("conftest.py"), "unexpected line"),
    ("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n b\n", "changes nothing"),
    ("diff --git a/x b/x\nnew file mode 100644\ndeleted file mode 100644\n", "contradictory"),
    ("diff --git a/x b/x\nnew file mode 100600\n", "unsupported file mode"),
    ("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n\\ No newline at end of file\n-b\n+c\n", "after a last line"),
    ("diff --git a/x b/x\nindex 1234567..89abcde 100644\nGIT binary patch\nliteral 3\nzzz\n\n", "binary patch line"),
    ('diff --git "a/\\q" "b/\\q"\nnew file mode 100644\n', "unknown escape"),
])
def test_ambiguous_or_malformed_patches_are_errors(patch, message):
    with pytest.raises(PatchError, match=message):
        parse_patch(patch)


def test_lines_split_on_newline_only():
    """``\\r``, ``\\v``, ``\\f`` do not end lines for git or patch: a section hidden after them is content."""
    for sep in ("\r", "\x0b", "\x0c", "\x1c", "\u2028"):
        patch = ("diff --git a/pkg/b.py b/pkg/b.py\nnew file mode 100644\n--- /dev/null\n+++ b/pkg/b.py\n"
                 f"@@ -0,0 +1 @@\n+x = 1{sep}diff --git a/conftest.py b/conftest.py\n")
        [f] = parse_patch(patch)
        assert f.paths == {"pkg/b.py"} and f.hunks[0].lines == (f"+x = 1{sep}diff --git a/conftest.py b/conftest.py\n",)


def test_preamble_and_trailer_are_ignored():
    mail = ("From 1234 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] fix\n\n---\n pkg/a.py | 2 +-\n\n"
            + FIX + "-- \n2.39.5\n")
    assert assert_round_trip(mail) == parse_patch(FIX)
    assert parse_patch("Index: pkg/a.py\n===\ndiff -ruN a/pkg/a.py b/pkg/a.py\n" + FIX.split("\n", 1)[1])[0].paths \
        == {"pkg/a.py"}


def test_hunk_details():
    empty_line = "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n\n-b\n+c\n"
    [f] = parse_patch(empty_line)
    assert f.hunks[0].lines == (" a\n", " \n", "-b\n", "+c\n")
    crlf = "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@ def f():\n a\r\n-b\r\n+c\r\n"
    [f] = assert_round_trip(crlf)
    assert f.hunks[0].lines == (" a\r\n", "-b\r\n", "+c\r\n") and f.hunks[0].heading == " def f():"
    assert "\r\n-b\r\n" in render_patch([f])
    no_eol = "--- a/x\n+++ b/x\n@@ -1 +1,2 @@\n-a\n\\ No newline at end of file\n+a\n+b\n\\ No newline at end of file\n"
    [f] = assert_round_trip(no_eol)
    assert f.hunks[0].lines == ("-a", "+a\n", "+b")


def test_names_git_cannot_split_come_from_the_other_lines():
    spaced = ("diff --git a/my file.py b/my file.py\n--- a/my file.py\t\n+++ b/my file.py\t\n"
              "@@ -1 +1 @@\n-a\n+b\n")
    assert paths_of(spaced) == {"my file.py"}
    renamed = ("diff --git a/old name b/new name\nsimilarity index 90%\nrename from old name\nrename to new name\n"
               "--- a/old name\n+++ b/new name\n@@ -1 +1 @@\n-a\n+b\n")
    [f] = assert_round_trip(renamed)
    assert (f.old_path, f.new_path) == ("old name", "new name")
    dated = "--- a/x.py 2024-01-02 03:04:05.000000000 +0000\n+++ b/x.py 2024-01-02 03:04:06 +0000\n@@ -1 +1 @@\n-a\n+b\n"
    assert paths_of(dated) == {"x.py"}


# --- round trips with real git and GNU diff/patch --------------------------------------------------

def tree_of(repo: Path) -> str:
    run(repo, "git", "add", "-A")
    return run(repo, "git", "write-tree").stdout.decode().strip()


def applied_tree(repo: Path, base: str, patch: bytes, tool: str) -> str:
    run(repo, "git", "reset", "-q", "--hard", base)
    run(repo, "git", "clean", "-fdxq")
    cmd = ("git", "apply") if tool == "git" else ("patch", "-p1", "--batch", "--forward", "-s")
    run(repo, *cmd, stdin=patch)
    return tree_of(repo)


@pytest.fixture
def repo(tmp_path):
    """A repository whose second commit modifies, adds, deletes, renames, copies, chmods, changes
    binary files, a file without final newline, a CRLF file and a non-ASCII name with a space."""
    r = tmp_path / "repo"
    r.mkdir()
    run(r, "git", "init", "-q")
    files = {"m.py": b"1\n2\n3\n", "d.py": b"gone\n", "r.py": b"r1\nr2\nr3\nr4\nr5\n", "c.py": b"c1\nc2\nc3\nc4\n",
             "nonl": b"x", "crlf": b"a\r\nb\r\n", "b.bin": b"\x00\x01bin", "exe": b"e\n",
             "caf\u00e9 sp.py": b"q\n", 'q"uote.txt': b"1\n", "big.bin": bytes(range(256)) * 400}
    for name, data in files.items():
        (r / name).write_bytes(data)
    run(r, "git", "add", "-A")
    run(r, "git", "commit", "-qm", "base")
    (r / "m.py").write_bytes(b"1\nTWO\n3\n")
    (r / "d.py").unlink()
    (r / "r.py").rename(r / "r2.py")
    (r / "r2.py").write_bytes(b"r1\nr2\nR3\nr4\nr5\n")
    (r / "c2.py").write_bytes(b"c1\nc2\nc3\nc4\nc5\n")
    (r / "nonl").write_bytes(b"y")
    (r / "crlf").write_bytes(b"a\r\nB\r\n")
    (r / "b.bin").write_bytes(b"\x00\x02bin\xff")
    (r / "n.bin").write_bytes(b"\x00new")
    (r / "big.bin").write_bytes(bytes(range(256)) * 400 + b"\x00tail")  # git writes a delta for it
    (r / "exe").chmod(0o755)
    (r / "caf\u00e9 sp.py").write_bytes(b"Q\n")
    (r / 'q"uote.txt').write_bytes(b"2\n")
    (r / "empty").write_bytes(b"")
    (r / "sub").mkdir()
    (r / "sub" / "new.py").write_bytes(b"n\n")
    run(r, "git", "add", "-A")
    run(r, "git", "commit", "-qm", "change")
    return r


def base_of(repo: Path) -> str:
    return run(repo, "git", "rev-parse", "HEAD~1").stdout.decode().strip()


def test_git_diff_round_trips_through_git_apply(repo):
    diff = run(repo, "git", "diff", "--binary", "-C", "-C", "HEAD~1", "HEAD").stdout
    files = assert_round_trip(diff.decode())
    kinds = {(f.status, f.binary) for f in files}
    assert {("modify", False), ("add", False), ("delete", False), ("rename", False), ("copy", False),
            ("modify", True), ("add", True)} <= kinds
    assert any(f.old_mode == "100644" and f.new_mode == "100755" for f in files)
    assert {block.split()[0] for f in files for block in f.binary_data if block[:1] in ("l", "d")} \
        == {"literal", "delta"}
    assert {"café sp.py", 'q"uote.txt'} <= {p for f in files for p in f.paths}
    rendered = render_patch(files).encode()
    assert rendered == diff.replace(b"similarity index 80%\n", b"")  # git's own text, but for that line
    target = run(repo, "git", "rev-parse", "HEAD^{tree}").stdout.decode().strip()
    assert applied_tree(repo, base_of(repo), rendered, "git") == target


def test_text_git_diff_applies_the_same_with_gnu_patch(repo):
    diff = run(repo, "git", "diff", "-C", "-C", "HEAD~1", "HEAD", "--", ":!*.bin").stdout
    rendered = render_patch(assert_round_trip(diff.decode())).encode()
    base = base_of(repo)
    run(repo, "git", "checkout", "-q", base, "--", "b.bin", "big.bin")
    run(repo, "git", "rm", "-q", "n.bin")
    text_change = tree_of(repo)  # the commit's change but to binary files
    by_git = applied_tree(repo, base, rendered, "git")
    assert by_git == text_change
    assert applied_tree(repo, base, rendered, "patch") == by_git
    assert applied_tree(repo, base, diff, "patch") == by_git


@pytest.mark.parametrize("style", ["-ruN", "-crN"])
def test_gnu_diff_round_trips_through_both_appliers(tmp_path, style):
    old, new = tmp_path / "a", tmp_path / "b"
    for d in (old, new):
        (d / "pkg").mkdir(parents=True)
    (old / "pkg" / "m.py").write_bytes(b"".join(b"%d\n" % i for i in range(1, 21)))
    (new / "pkg" / "m.py").write_bytes(b"".join(b"%d\n" % i for i in range(1, 21) if i != 6)
                                       .replace(b"\n2\n", b"\n2\nX\n").replace(b"15\n", b"fifteen\n"))
    (old / "gone.txt").write_bytes(b"bye\n")
    (new / "pkg" / "new.py").write_bytes(b"hello\nworld")
    (old / "crlf.txt").write_bytes(b"a\r\nb\r\nc\r\n")
    (new / "crlf.txt").write_bytes(b"a\r\nB\r\nc\r\n")
    (old / "caf\u00e9.txt").write_bytes(b"1\n")
    (new / "caf\u00e9.txt").write_bytes(b"2\n")
    diff = run(tmp_path, "diff", style, "a", "b", check=False).stdout
    files = assert_round_trip(diff.decode())
    assert sorted((f.status, f.old_path or f.new_path) for f in files) == [
        ("add", "pkg/new.py"), ("delete", "gone.txt"), ("modify", "café.txt"), ("modify", "crlf.txt"),
        ("modify", "pkg/m.py")]
    rendered = render_patch(files).encode()
    repo = tmp_path / "repo"
    shutil.copytree(old, repo)
    run(repo, "git", "init", "-q")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "a")
    shutil.copytree(new, tmp_path / "expected")
    expected = tree_of_dir(tmp_path / "expected")
    assert applied_tree(repo, "HEAD", rendered, "git") == expected
    assert applied_tree(repo, "HEAD", rendered, "patch") == expected
    assert applied_tree(repo, "HEAD", diff, "patch") == expected


def tree_of_dir(path: Path) -> str:
    run(path, "git", "init", "-q")
    return tree_of(path)


def test_context_hunks_convert_to_unified():
    """diff -c -C0 forms: a side left out, single-number ranges, ``!`` change runs."""
    context = ("*** a/x\t2024-01-01 00:00:00.000000000 +0000\n--- b/x\t2024-01-01 00:00:00.000000000 +0000\n"
               "***************\n*** 2 ****\n--- 3 ----\n+ X\n"
               "***************\n*** 6 ****\n- 6\n--- 6 ----\n"
               "*************** def f\n*** 8,9 ****\n! a\n! b\n--- 8 ----\n! c\n\\ No newline at end of file\n")
    [f] = assert_round_trip(context)
    assert [(h.old_start, h.old_count, h.new_start, h.new_count, h.lines) for h in f.hunks] == [
        (2, 0, 3, 1, ("+X\n",)), (6, 1, 6, 0, ("-6\n",)), (8, 2, 8, 1, ("-a\n", "-b\n", "+c"))]
    assert f.hunks[2].heading == " def f"


# --- the applier ----------------------------------------------------------------------------------

class Shell:
    """Just enough of a sandbox: commands run with bash in a directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.commands: list[str] = []

    def exec(self, command: str, timeout: float = 60.0) -> ExecResult:
        self.commands.append(command)
        proc = subprocess.run(["bash", "-c", command], cwd=self.root, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout)
        return ExecResult(proc.returncode, proc.stdout.decode(errors="replace"), False, 0.0)

    def write_file(self, path: str, data: bytes | str) -> None:
        (self.root / path).write_bytes(data.encode() if isinstance(data, str) else data)


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("1\n2\n3\n")
    (tmp_path / "pkg" / "m.py").write_text("".join(f"{i}\n" for i in range(1, 13)))
    run(tmp_path, "git", "init", "-q")
    run(tmp_path, "git", "add", "-A")
    run(tmp_path, "git", "commit", "-qm", "base")
    return tmp_path


FUZZY = ("diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -3,7 +3,7 @@\n"
         " three\n 4\n 5\n-6\n+SIX\n 7\n 8\n nine\n")  # first and last context lines are wrong


def test_a_hunk_needing_fuzz_applies_with_patch(workdir):
    shell = Shell(workdir)
    assert apply_patch(shell, parse_patch(FUZZY), fuzzy=False) is None
    assert apply_patch(shell, parse_patch(FUZZY)) == "patch --fuzz"
    assert (workdir / "pkg" / "m.py").read_text().splitlines()[5] == "SIX"
    assert not list(workdir.glob("**/*.orig")) + list(workdir.glob("**/*.rej"))
    assert not list(workdir.glob(".patchgym-patch*"))  # the copy it applied is removed
    assert "core.hooksPath=/dev/null" in shell.commands[-1]


def test_the_filtered_patch_never_writes_a_dropped_file(workdir):
    """The reported attack: a fuzz-needing hunk (so git apply fails and patch runs) plus sections
    the filter must drop; patch applies the fix and nothing else."""
    context = ("*** /dev/null\n--- b/conftest.py\n***************\n*** 0 ****\n--- 1 ----\n+ import pytest\n")
    quoted = ('diff --git "a/tests/con\\146test.py" "b/tests/con\\146test.py"\nnew file mode 100644\n'
              '--- /dev/null\n+++ "b/tests/con\\146test.py"\n@@ -0,0 +1 @@\n+x\n')
    hook = new_file(".git/hooks/post-checkout", "#!/bin/sh\ntouch /tmp/pwned\n", mode="100755")
    plain = "--- /dev/null\n+++ b/pkg/sitecustomize.py\n@@ -0,0 +1 @@\n+import os\n"
    filtered = filter_agent_patch(read_agent_patch(FUZZY + context + quoted + hook + plain), set())
    assert filtered.dropped == [".git/hooks/post-checkout", "conftest.py", "pkg/sitecustomize.py",
                                "tests/conftest.py"]
    assert apply_patch(Shell(workdir), filtered.files) == "patch --fuzz"
    assert (workdir / "pkg" / "m.py").read_text().splitlines()[5] == "SIX"
    for path in ("conftest.py", "tests/conftest.py", ".git/hooks/post-checkout", "pkg/sitecustomize.py"):
        assert not (workdir / path).exists(), path


def test_patch_is_not_tried_where_it_differs_from_git(workdir):
    shell = Shell(workdir)
    git_dir = new_file(".git/config", "[core]\n\thooksPath = /tmp\n")  # git refuses; patch would write it
    assert apply_patch(shell, parse_patch(git_dir)) is None
    assert "patch --batch" not in shell.commands[-1] and "hooksPath = /tmp" not in (workdir / ".git/config").read_text()
    rename = ("diff --git a/pkg/a.py b/pkg/b.py\nsimilarity index 50%\nrename from pkg/a.py\nrename to pkg/b.py\n"
              "--- a/pkg/a.py\n+++ b/pkg/b.py\n@@ -1,3 +1,3 @@\n one\n-2\n+TWO\n 3\n")
    assert apply_patch(shell, parse_patch(rename)) is None and "patch --batch" not in shell.commands[-1]
    assert apply_patch(shell, parse_patch(FIX)) == "git apply" and (workdir / "pkg" / "a.py").read_text() == "1\nTWO\n3\n"


def test_apply_patch_errors(workdir):
    with pytest.raises(PatchError):
        apply_patch(Shell(workdir), parse_patch("not a patch"))
    with pytest.raises(TypeError, match="parsed sections"):  # text is a Sequence: refused, not rendered
        apply_patch(Shell(workdir), FIX)

    class Broken(Shell):
        def exec(self, command, timeout=60.0):
            return ExecResult(127, "bash: not found", False, 0.0)

    with pytest.raises(SandboxError, match="did not run"):
        apply_patch(Broken(workdir), parse_patch(FIX))


@pytest.mark.parametrize("header", ["@@ -0,0 +1," + "9" * 5000 + " @@", "@@ -" + "1" * 5000 + ",0 +1 @@"],
                         ids=["count", "start"])
def test_a_number_the_reader_cannot_convert_is_a_patch_error(header):
    """int() of more digits than Python allows raised ValueError out of the parser (issue 34), and
    graders catch PatchError: whatever the text makes the reader raise is unreadable text."""
    with pytest.raises(PatchError, match="unreadable"):
        parse_patch(f"diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n{header}\n+x = 1\n")
