"""The bundled catalog: enough genuine tasks, each pointing at a real commit of a bundled repo."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest

import patchgym.tasks as bundled
from patchgym import UnknownTaskError, load_task_set
from patchgym.grading.patches import is_test_or_config, touched_paths
from patchgym.tasks.catalog import repo_source


@pytest.fixture(scope="module")
def catalog():
    return load_task_set()


def test_catalog_has_at_least_15_tasks_over_3_libraries(catalog):
    assert len(catalog) >= 15
    per_repo = Counter(t.repo for t in catalog)
    assert len(per_repo) >= 3
    assert any(any(not p.startswith("pytest") for p in t.environment.packages) for t in catalog), \
        "at least one library must depend on a PyPI package"


def test_every_task_points_at_a_real_commit_with_history(catalog):
    for repo in {t.repo for t in catalog}:
        tasks = [t for t in catalog if t.repo == repo]
        source = repo_source(tasks[0])
        assert source.endswith(".bundle") and source.startswith(str(bundled.REPOS_DIR))
        log = subprocess.run(["git", "bundle", "list-heads", source], capture_output=True, text=True, check=True)
        assert "refs/heads/main" in log.stdout
    for task in catalog:
        assert task.patch and task.test_patch and task.problem_statement.strip()
        assert not any(is_test_or_config(p) for p in touched_paths(task.patch)), task.instance_id
        assert all(p.startswith("tests/") for p in touched_paths(task.test_patch)), task.instance_id
        assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)
        assert not any(t.split("::")[-1] in task.problem_statement for t in task.FAIL_TO_PASS), \
            f"{task.instance_id}: the problem statement names a hidden test"


def test_unknown_instance_id_is_a_clear_error(catalog):
    with pytest.raises(UnknownTaskError, match="unknown instance id 'nope'"):
        catalog.select(["nope"])


@pytest.mark.slow
def test_every_bundled_task_validates(catalog):
    """Gold resolves, no change does not (tests really run), two gold runs agree."""
    from patchgym import Verifier
    from patchgym.making.validation import validate_tasks

    results = validate_tasks(catalog, Verifier(), runs=2, workers=2)
    problems = {r.instance_id: r.problems for r in results if not r.ok}
    assert not problems
    assert all(r.gold_resolved == [True, True] and r.empty_resolved is False for r in results)


def test_difficulty_filters_and_samples_for_a_curriculum(tmp_path):
    from typer.testing import CliRunner

    from patchgym.cli import app
    from patchgym.tasks.catalog import difficulty, filter_tasks, load_task_set
    from patchgym.tasks.model import save_tasks

    bundled = list(load_task_set())
    synth = bundled[0].model_copy(update={"instance_id": "x.synth-1"})
    synth = type(synth).model_validate({**synth.to_row(), "synth": {"kind": "operator"},
                                        "difficulty": {"kind": "operator", "changed_lines": 2, "changed_files": 1,
                                                       "broken_tests": 1, "passing_tests": 9}})
    task_set = load_task_set().__class__([*bundled, synth], "test")
    assert difficulty(synth) == {"kind": "operator", "changed_lines": 2, "changed_files": 1, "broken_tests": 1,
                                 "passing_tests": 9, "repo": synth.repo}
    measured = difficulty(bundled[0])  # not recorded: measured from the task itself
    assert measured["kind"] == "swebench" and measured["broken_tests"] == len(bundled[0].FAIL_TO_PASS)
    assert measured["changed_lines"] > 0 and measured["changed_files"] >= 1
    assert filter_tasks(task_set, ["kind=operator"]).ids == ["x.synth-1"]
    assert "x.synth-1" not in filter_tasks(task_set, ["kind!=operator,comparison"])
    few = filter_tasks(task_set, [f"broken_tests<={measured['broken_tests']}", f"repo={bundled[0].repo}"])
    assert bundled[0].instance_id in few and all(t.repo == bundled[0].repo for t in few)
    drawn = filter_tasks(task_set, sample=3, seed=7).ids
    assert len(drawn) == 3 and drawn == filter_tasks(task_set, sample=3, seed=7).ids
    assert drawn != filter_tasks(task_set, sample=3, seed=8).ids or len(task_set) <= 3
    for bad in ("nope=1", "broken_tests<=many", "kind<3", "kind"):
        with pytest.raises(ValueError):
            filter_tasks(task_set, [bad])

    path = tmp_path / "t.jsonl"
    save_tasks(task_set, path)
    listed = CliRunner().invoke(app, ["tasks", "list", "--tasks", str(path), "--where", "kind=operator"])
    assert listed.exit_code == 0 and "1 tasks" in listed.output and "x.synth-1" in listed.output
    out = tmp_path / "drawn.jsonl"
    exported = CliRunner().invoke(app, ["tasks", "export", "--tasks", str(path), "--output", str(out),
                                        "--sample", "2", "--seed", "1", "--where", "kind=swebench"])
    assert exported.exit_code == 0 and "wrote 2 SWE-bench rows" in exported.output
    bad = CliRunner().invoke(app, ["tasks", "list", "--tasks", str(path), "--where", "size=3"])
    assert bad.exit_code == 2 and "unknown field" in bad.output
