"""Task files: SWE-bench fields, both encodings of the test lists, and errors that say where."""

from __future__ import annotations

import json

import pytest
from conftest import calc_task_row

from patchgym import Task, TaskFileError, load_task_set, load_tasks, save_tasks


def _row(**overrides) -> dict:
    row = {
        "instance_id": "o__r-1", "repo": "o/r", "base_commit": "a" * 40, "problem_statement": "bug",
        "patch": "diff --git a/x b/x\n", "test_patch": "diff --git a/t b/t\n",
        "FAIL_TO_PASS": ["tests/test_x.py::test_a"], "PASS_TO_PASS": [], "version": "1.0",
        "created_at": "2026-01-01T00:00:00Z",
    }
    row.update(overrides)
    return row


def test_swebench_json_strings_and_lists_load_the_same(tmp_path):
    path = tmp_path / "t.jsonl"
    a = _row(instance_id="a", FAIL_TO_PASS=json.dumps(["t::x", "t::y"]), PASS_TO_PASS="[]")
    b = _row(instance_id="b", FAIL_TO_PASS=["t::x", "t::y"], PASS_TO_PASS=[])
    path.write_text(json.dumps(a) + "\n\n" + json.dumps(b) + "\n")
    first, second = load_tasks(path)
    assert first.FAIL_TO_PASS == second.FAIL_TO_PASS == ["t::x", "t::y"]
    assert first.PASS_TO_PASS == []


def test_json_array_file_and_unknown_fields_round_trip(tmp_path):
    row = _row(version=3.1, hints_text="see #12", FAIL_TO_PASS='["t::x"]', extra_field={"k": 1})
    src = tmp_path / "in.json"
    src.write_text(json.dumps([row], indent=2))
    (task,) = load_tasks(src)
    assert task.version == "3.1"
    assert task.model_extra == {"extra_field": {"k": 1}}
    out = tmp_path / "out.json"
    save_tasks([task], out, tests_as_json_strings=True)
    saved = json.loads(out.read_text())[0]
    assert saved["FAIL_TO_PASS"] == '["t::x"]'
    assert saved["extra_field"] == {"k": 1}
    (again,) = load_tasks(out)
    assert again.model_dump() == task.model_dump()


def test_jsonl_round_trip_keeps_environment_and_test_spec(tmp_path, calc_repo):
    repo, info = calc_repo
    src = tmp_path / "a.jsonl"
    src.write_text(json.dumps(calc_task_row(repo, info)) + "\n")
    tasks = load_tasks(src)
    out = tmp_path / "b.jsonl"
    save_tasks(tasks, out)
    (again,) = load_tasks(out)
    assert again.environment.packages == tasks[0].environment.packages
    assert again.test_spec.timeout == 60
    assert again.FAIL_TO_PASS == tasks[0].FAIL_TO_PASS


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_row()) + "\n{not json\n")
    with pytest.raises(TaskFileError, match=r"bad\.jsonl:line 2: invalid JSON"):
        load_tasks(path)


@pytest.mark.parametrize(
    ("overrides", "field", "why"),
    [
        ({"base_commit": "main"}, "base_commit", "pattern"),
        ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS", "not a JSON list"),
        ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS", "at least one"),
        ({"instance_id": ""}, "instance_id", "at least 1 character"),
        ({"environment": {"python": "3.11", "pakages": []}}, "environment.pakages", "Extra inputs"),
    ],
)
def test_bad_field_names_file_line_and_field(tmp_path, overrides, field, why):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_row(instance_id="ok")) + "\n" + json.dumps(_row(**overrides)) + "\n")
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    message = str(err.value)
    assert f"{path}:line 2: field '{field}'" in message
    assert why in message


def test_missing_field_and_non_object_rows(tmp_path):
    row = _row()
    del row["test_patch"]
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(TaskFileError, match=r"line 1: field 'test_patch': Field required"):
        load_tasks(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(TaskFileError, match=r"line 1: expected a JSON object"):
        load_tasks(path)


def test_json_array_errors_point_at_the_entry_line(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("[\n" + json.dumps(_row(instance_id="a")) + ",\n" + json.dumps(_row(base_commit="x")) + "\n]\n")
    with pytest.raises(TaskFileError, match=r"t\.json:line 3: field 'base_commit'"):
        load_tasks(path)


def test_duplicate_ids_and_missing_files(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_row()) + "\n" + json.dumps(_row()) + "\n")
    with pytest.raises(TaskFileError, match="duplicate 'o__r-1'"):
        load_tasks(path)
    with pytest.raises(TaskFileError, match="no such task file"):
        load_task_set(tmp_path / "nope.jsonl")


def test_public_view_hides_the_answers():
    task = Task.model_validate(_row())
    view = json.dumps(task.public_view())
    assert "FAIL_TO_PASS" not in view and "test_patch" not in view and "diff --git" not in view
