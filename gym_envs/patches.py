"""Reading unified diffs file by file, and deciding which files an agent may not change.

An agent's diff is filtered before grading: changes to tests and to test configuration are dropped
(a patch that only added a conftest.py scored as resolved in SWE-bench #631), as are changes to any
file the test patch touches. What was dropped is reported.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

_GIT_HEADER = re.compile(r"^diff --git (?:\"?a/(.+?)\"?) (?:\"?b/(.+?)\"?)$")

# Files whose change could alter how tests are collected, run or reported.
TEST_CONFIG_NAMES = {
    "conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", ".pytest.ini",
    "noxfile.py", "pytest.py", "sitecustomize.py", "usercustomize.py", ".coveragerc",
}
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py", "tests.py")
TEST_DIR_NAMES = {"tests", "test", "testing"}


@dataclass
class FileDiff:
    """One file's section of a diff."""

    old_path: str | None
    new_path: str | None
    text: str

    @property
    def paths(self) -> set[str]:
        return {p for p in (self.old_path, self.new_path) if p}


def _strip_prefix(path: str) -> str | None:
    path = path.strip().split("\t", 1)[0].strip('"')
    if path == "/dev/null":
        return None
    return path[2:] if path[:2] in ("a/", "b/") else path


def split_diff(diff: str) -> list[FileDiff]:
    """Split a unified diff (git or plain) into per-file sections, in order."""
    lines = diff.splitlines(keepends=True)
    starts: list[int] = []
    git_format = any(line.startswith("diff --git ") for line in lines)
    for i, line in enumerate(lines):
        if git_format and line.startswith("diff --git "):
            starts.append(i)
        elif not git_format and line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            starts.append(i)
    sections: list[FileDiff] = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        chunk = lines[start:end]
        old = new = None
        header = _GIT_HEADER.match(chunk[0].rstrip("\n"))
        if header:
            old, new = header.group(1), header.group(2)
        for line in chunk:
            if line.startswith("--- "):
                old = _strip_prefix(line[4:])
            elif line.startswith("+++ "):
                new = _strip_prefix(line[4:])
                break
            elif line.startswith("rename from "):
                old = line[len("rename from "):].strip()
            elif line.startswith("rename to "):
                new = line[len("rename to "):].strip()
        if header and "deleted file mode" in "".join(chunk[:4]):
            new = None
        if header and "new file mode" in "".join(chunk[:4]):
            old = None
        sections.append(FileDiff(old, new, "".join(chunk)))
    return sections


def is_test_or_config(path: str) -> bool:
    """True for test files, test directories' contents and test-run configuration."""
    p = PurePosixPath(path)
    if p.name in TEST_CONFIG_NAMES or p.suffix == ".pth":
        return True
    if any(part in TEST_DIR_NAMES for part in p.parts[:-1]):
        return True
    if "_pytest" in p.parts:
        return True
    return any(fnmatch.fnmatch(p.name, pat) for pat in TEST_FILE_PATTERNS)


def touched_paths(diff: str) -> set[str]:
    return {path for section in split_diff(diff) for path in section.paths}


def filter_agent_patch(diff: str, protected: set[str]) -> tuple[str, list[str]]:
    """Drop sections that touch tests, test config or ``protected`` paths.

    Returns the patch to apply and the sorted list of dropped paths.
    """
    kept: list[str] = []
    dropped: set[str] = set()
    for section in split_diff(diff):
        if any(is_test_or_config(p) or p in protected for p in section.paths):
            dropped.update(section.paths)
        else:
            kept.append(section.text)
    text = "".join(kept)
    if text and not text.endswith("\n"):
        text += "\n"
    return text, sorted(dropped)
