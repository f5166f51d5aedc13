"""Mining tasks from history: a small repository whose one fix commit with a test becomes a task."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import PYTEST_PIN, git
from typer.testing import CliRunner

from patchgym import load_tasks
from patchgym.cli import app
from patchgym.cli import common as cli_common
from patchgym.grading.verifier import Verifier
from patchgym.making.mining import (
    Dropped,
    DropReason,
    MiningError,
    candidate_commits,
    cloned_history,
    load_issue_texts,
    mine,
    mine_commit,
    path_kind,
    resolve_issue_texts,
    resolve_tip,
)
from patchgym.making.registry import RepoRecord, save_repo
from patchgym.tasks.model import EnvironmentConfig, TestSpec, save_tasks

cli_common.out.width = cli_common.console.width = 300

LIB_V1 = '''\
def add(a, b):
    return a + b


def div(a, b):
    return a / b
'''
LIB_FIX = LIB_V1.replace("    return a / b", '    if b == 0:\n        raise ValueError("division by zero")\n    return a / b')
LIB_REFACTOR = LIB_FIX.replace("    return a + b", "    total = a + b\n    return total")
LIB_TIDY = "# minelib: tiny arithmetic\n" + LIB_REFACTOR
TESTS_V1 = '''\
from minelib import add, div


def test_add():
    assert add(2, 3) == 5


def test_div():
    assert div(6, 3) == 2
'''
TESTS_FIX = TESTS_V1.replace("from minelib import add, div", "import pytest\n\nfrom minelib import add, div") + '''

def test_div_by_zero():
    with pytest.raises(ValueError):
        div(1, 0)
'''
TESTS_MORE = TESTS_FIX + '''

def test_add_negatives():
    assert add(-2, -3) == -5
'''
FIX_MESSAGE = "Raise ValueError on division by zero\n\ndiv(1, 0) raised ZeroDivisionError."

HISTORY = [  # (message, files) — oldest first
    ("Add minelib and its tests", {"minelib/__init__.py": LIB_V1, "tests/test_minelib.py": TESTS_V1}),
    (FIX_MESSAGE, {"minelib/__init__.py": LIB_FIX, "tests/test_minelib.py": TESTS_FIX,
                   "CHANGELOG.md": "- div(x, 0) raises ValueError\n"}),
    ("Document usage", {"README.md": "# minelib\n\nadd() and div().\n"}),
    ("Refactor add", {"minelib/__init__.py": LIB_REFACTOR}),
    ("Test negatives, tidy", {"minelib/__init__.py": LIB_TIDY, "tests/test_minelib.py": TESTS_MORE}),
]


@pytest.fixture(scope="module")
def minelib(tmp_path_factory) -> tuple[Path, list[str]]:
    """The repository and its commits, oldest first: root, fix, docs-only, source-only, no-F2P."""
    repo = tmp_path_factory.mktemp("mining") / "minelib"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas = []
    for day, (message, files) in enumerate(HISTORY, 1):
        for name, text in files.items():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)
        date = f"2026-02-0{day}T10:00:00Z"
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", message, date=date)
        shas.append(git(repo, "rev-parse", "HEAD").strip())
    return repo, shas


def record_for(repo: Path, name: str = "minelib") -> RepoRecord:
    return RepoRecord(name=name, repo="fixture/minelib", source=str(repo),
                      environment=EnvironmentConfig(python=">=3.9", packages=[PYTEST_PIN]),
                      test_spec=TestSpec(timeout=120))


def test_path_kinds_follow_the_grader_for_tests():
    assert path_kind("tests/test_x.py") == path_kind("pkg/test_y.py") == path_kind("conftest.py") == "test"
    assert path_kind("pyproject.toml") == path_kind("tests/data/input.json") == "test"
    assert path_kind("README.md") == path_kind("docs/conf.py") == path_kind("LICENSE") == "docs"
    assert path_kind("CHANGES.txt") == "docs" and path_kind("history.py") == "source"
    assert path_kind(".github/workflows/ci.yml") == path_kind(".gitignore") == "meta"
    assert path_kind("pkg/core.py") == path_kind("requirements.txt") == "source"


def test_candidates_are_commits_changing_source_and_a_test_module(minelib):
    repo, shas = minelib
    root, fix, docs, source_only, no_f2p = shas
    with cloned_history(str(repo)) as git_dir:
        tip = resolve_tip(git_dir)
        assert tip == no_f2p
        scan = candidate_commits(git_dir, tip)
        assert scan.scanned == 5
        assert [c.sha for c in scan.candidates] == [fix, no_f2p]
        assert {d.sha: d.reason for d in scan.dropped} == {
            root: DropReason.ROOT, docs: DropReason.NO_SOURCE_CHANGE, source_only: DropReason.NO_TEST_CHANGE}
        candidate = scan.candidates[0]
        assert candidate.parent == root and candidate.test_files == ("tests/test_minelib.py",)
        assert "minelib/__init__.py" in candidate.patch and "CHANGELOG" not in candidate.patch
        assert "tests/test_minelib.py" in candidate.test_patch and "minelib/__init__.py" not in candidate.test_patch
        assert candidate.message == FIX_MESSAGE + "\n" and candidate.created_at.startswith("2026-02-02T10:00:00")

        limited = candidate_commits(git_dir, tip, max_candidates=1)
        assert [c.sha for c in limited.candidates] == [fix] and limited.scanned == 2
        after = candidate_commits(git_dir, tip, since=fix)
        assert [c.sha for c in after.candidates] == [no_f2p] and after.scanned == 3
        assert candidate_commits(git_dir, tip, since=fix[:10], max_candidates=5).scanned == 3
        with pytest.raises(MiningError, match="unknown revision"):
            candidate_commits(git_dir, tip, since="no-such-rev")


def test_a_clone_without_head_is_mined_from_the_registered_commit(minelib, tmp_path):
    """A clone of a bundle with no HEAD has no local branch, only origin/main (what ``repos add
    --rev origin/main`` names): mining goes back from the commit registered."""
    repo, shas = minelib
    bundle = tmp_path / "minelib.bundle"
    git(repo, "bundle", "create", str(bundle), "main")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(bundle), str(clone)], check=True, capture_output=True)
    with cloned_history(str(clone)) as git_dir:
        with pytest.raises(MiningError, match="no HEAD; branches: none"):
            resolve_tip(git_dir)
        assert resolve_tip(git_dir, registered=shas[-1]) == shas[-1]


def test_issue_texts(minelib, tmp_path):
    repo, shas = minelib
    fix = shas[1]
    (tmp_path / "map.json").write_text(json.dumps({fix[:8]: "div by zero is wrong"}))
    (tmp_path / "rows.jsonl").write_text(json.dumps({"commit": fix, "text": "from jsonl"}) + "\n")
    (tmp_path / "one.txt").write_text("one issue\n")
    (tmp_path / "bad.json").write_text(json.dumps([1]))
    assert load_issue_texts(tmp_path / "one.txt") == "one issue\n"
    with pytest.raises(MiningError, match="JSON object"):
        load_issue_texts(tmp_path / "bad.json")
    with cloned_history(str(repo)) as git_dir:
        scan = candidate_commits(git_dir, resolve_tip(git_dir))
        assert resolve_issue_texts(git_dir, load_issue_texts(tmp_path / "map.json"), scan.candidates) == {
            fix: "div by zero is wrong"}
        assert resolve_issue_texts(git_dir, load_issue_texts(tmp_path / "rows.jsonl"), []) == {fix: "from jsonl"}
        with pytest.raises(MiningError, match="single commit"):
            resolve_issue_texts(git_dir, "one issue", scan.candidates)
        assert resolve_issue_texts(git_dir, "one issue", scan.candidates[:1]) == {shas[1]: "one issue"}
        with pytest.raises(MiningError, match="unknown commit"):
            resolve_issue_texts(git_dir, {"deadbeef": "x"}, scan.candidates)


def test_mine_keeps_exactly_the_fix_and_the_task_resolves(minelib, tmp_path):
    repo, shas = minelib
    root, fix, docs, source_only, no_f2p = shas
    record = record_for(repo)
    stages: list[tuple[str, int]] = []
    result = mine(record, workers=2, on_stage=lambda name, total: stages.append((name, total)))
    assert stages == [("mining", 2)]
    assert result.scanned == 5 and len(result.candidates) == 2
    [task] = result.tasks
    assert task.instance_id == f"fixture__minelib-{fix[:7]}" and task.base_commit == root
    assert task.FAIL_TO_PASS == ["tests/test_minelib.py::test_div_by_zero"]
    assert task.PASS_TO_PASS == ["tests/test_minelib.py::test_add", "tests/test_minelib.py::test_div"]
    assert task.problem_statement == FIX_MESSAGE + "\n" and task.created_at.startswith("2026-02-02")
    assert task.repo == "fixture/minelib" and task.repo_path == str(repo) and task.version == ""
    assert [v.ok for v in result.validations] == [True]
    assert {d.sha: d.reason for d in result.dropped} == {
        root: DropReason.ROOT, docs: DropReason.NO_SOURCE_CHANGE, source_only: DropReason.NO_TEST_CHANGE,
        no_f2p: DropReason.NO_FAIL_TO_PASS}
    assert result.drop_counts()[DropReason.NO_FAIL_TO_PASS] == 1

    path = tmp_path / "mined.jsonl"
    save_tasks(result.tasks, path)
    [loaded] = load_tasks(path)
    report = Verifier().verify(loaded, loaded.patch)
    assert report.resolved, report.error


def test_mine_commit_reports_a_patch_that_does_not_apply(minelib):
    repo, shas = minelib
    with cloned_history(str(repo)) as git_dir:
        candidate = candidate_commits(git_dir, resolve_tip(git_dir), max_candidates=1).candidates[0]
    # The context line changes too, so the test patch no longer applies to the parent.
    broken = replace(candidate, test_patch=candidate.test_patch.replace("from minelib import add, div",
                                                                        "from minelib import nothing_like_this"))
    outcome = mine_commit(record_for(repo), broken)
    assert isinstance(outcome, Dropped) and outcome.reason is DropReason.PATCH_DOES_NOT_APPLY


def test_cli_mine_then_eval_gold(minelib, tmp_path):
    repo, shas = minelib
    save_repo(record_for(repo, name="minelib-cli"))
    issues = tmp_path / "issues.json"
    issues.write_text(json.dumps({shas[1]: "div(1, 0) should raise ValueError"}))
    out = tmp_path / "out" / "mined.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["tasks", "mine", "--repo", "minelib-cli", "--output", str(out), "--workers", "2",
                                 "--issue-text", str(issues)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    for text in ("scanned", "candidates", "kept", "no FAIL_TO_PASS test", "root commit", f"fixture__minelib-{shas[1][:7]}"):
        assert text in result.output
    [task] = load_tasks(out)
    assert task.problem_statement == "div(1, 0) should raise ValueError"
    summary = json.loads((out.parent / "mined.summary.json").read_text())
    assert summary["candidates"] == 2 and summary["validated"] == 1 and not summary["interrupted"]
    assert summary["dropped"] == {"root commit": 1, "no source change": 1, "no test change": 1,
                                  "no FAIL_TO_PASS test": 1}

    # A torn line from a crash is cut off; the same command again has nothing left to run.
    written = out.read_bytes()
    out.write_bytes(written + written[:40])
    again = runner.invoke(app, ["tasks", "mine", "--repo", "minelib-cli", "--output", str(out), "--workers", "2",
                                "--issue-text", str(issues)], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert "torn last line" in again.output and "2 of 2 candidates done" in again.output
    assert out.read_bytes() == written

    evaluated = runner.invoke(app, ["eval", "--predictions", "gold", "--tasks", str(out), "--output",
                                    str(tmp_path / "gold")], catch_exceptions=False)
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads((tmp_path / "gold" / "report.json").read_text())["resolved_ids"] == [task.instance_id]

    since = runner.invoke(app, ["tasks", "mine", "--repo", "minelib-cli", "--output", str(out), "--since", shas[1],
                                "--no-validate"], catch_exceptions=False)
    assert since.exit_code == 0 and load_tasks(out) == []
    missing = runner.invoke(app, ["tasks", "mine", "--repo", "nope", "--output", str(out)])
    assert missing.exit_code == 2 and "unknown repository" in missing.output
