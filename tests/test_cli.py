"""The command line as a user runs it: eval with reports and resume, tasks list/show/validate, bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from patchgym.cli import app
from patchgym.cli import common as cli_common

runner = CliRunner()
cli_common.out.width = cli_common.console.width = 300  # no wrapping inside table cells


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_eval_gold_writes_swebench_reports_and_resumes(calc_tasks_file, tmp_path):
    out = tmp_path / "gold"
    result = run("eval", "--predictions", "gold", "--tasks", str(calc_tasks_file), "--output", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["total_instances"] == report["resolved_instances"] == 1
    assert report["resolved_ids"] == ["fixture__calc-1"]
    for key in ("submitted", "completed", "unresolved", "empty_patch", "error"):
        assert f"{key}_instances" in report and f"{key}_ids" in report
    instance = json.loads((out / "fixture__calc-1" / "report.json").read_text())["fixture__calc-1"]
    assert instance["resolved"] and instance["patch_successfully_applied"]
    assert "PASSED" in (out / "fixture__calc-1" / "test_output.txt").read_text()
    assert "resolved" in result.output

    again = run("eval", "--predictions", "gold", "--tasks", str(calc_tasks_file), "--output", str(out))
    assert "resumed" in again.output
    assert json.loads((out / "report.json").read_text())["resumed_ids"] == ["fixture__calc-1"]
    forced = run("eval", "--predictions", "gold", "--tasks", str(calc_tasks_file), "--output", str(out), "--force")
    assert json.loads((out / "report.json").read_text())["resumed_ids"] == []
    assert forced.exit_code == 0
    preds = tmp_path / "gold.jsonl"  # the same patch from a file: other predictions, refused
    preds.write_text(json.dumps({"instance_id": "fixture__calc-1", "model_name_or_path": "m",
                                 "model_patch": instance_patch(out)}) + "\n")
    other = run("eval", "--predictions", str(preds), "--tasks", str(calc_tasks_file), "--output", str(out))
    assert other.exit_code == 2 and "holds an evaluation with other settings" in other.output


def instance_patch(out, instance_id="fixture__calc-1") -> str:
    return (out / instance_id / "patch.diff").read_text()


def test_eval_refuses_a_directory_of_other_predictions(calc_repo, tmp_path):
    """The issue's case: gold on two tasks, then the empty patches on one of them into the same
    directory used to leave a report of one task beside the other's stale gold result."""
    from conftest import calc_task_row

    repo, info = calc_repo
    tasks = tmp_path / "two.jsonl"
    tasks.write_text("".join(json.dumps(calc_task_row(repo, info, instance_id=i)) + "\n" for i in ("c-1", "c-2")))
    out = tmp_path / "D"
    first = run("eval", "--predictions", "gold", "--tasks", str(tasks), "--instance-ids", "c-1,c-2", "--output", str(out))
    assert first.exit_code == 0, first.output
    (out / "notes.txt").write_text("mine")  # the user's own file: never removed
    refused = run("eval", "--predictions", "empty", "--tasks", str(tasks), "--instance-ids", "c-1", "--output", str(out))
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
    assert "other settings" in refused.output and "--force" in refused.output
    assert json.loads((out / "report.json").read_text())["resolved_ids"] == ["c-1", "c-2"], "left as it was"
    forced = run("eval", "--predictions", "empty", "--tasks", str(tasks), "--instance-ids", "c-1", "--output", str(out),
                 "--force")
    assert forced.exit_code == 0, forced.output
    report = json.loads((out / "report.json").read_text())
    assert report["total_ids"] == ["c-1"] and report["empty_patch_ids"] == ["c-1"]
    assert not (out / "c-2").exists(), "the replaced evaluation's results are gone"
    assert (out / "notes.txt").read_text() == "mine"
    # the same predictions and settings resume, whatever the selection
    again = run("eval", "--predictions", "empty", "--tasks", str(tasks), "--output", str(out))
    assert again.exit_code == 0 and json.loads((out / "report.json").read_text())["resumed_ids"] == ["c-1"]
    # a directory of a run, or of an evaluation that recorded no settings, is not taken over either
    (out / "eval.json").unlink()
    unknown = run("eval", "--predictions", "empty", "--tasks", str(tasks), "--output", str(out))
    assert unknown.exit_code == 2 and "did not record its settings" in unknown.output


def test_eval_empty_and_a_predictions_file(calc_tasks_file, tmp_path):
    out = tmp_path / "empty"
    result = run("eval", "--predictions", "empty", "--tasks", str(calc_tasks_file), "--output", str(out))
    report = json.loads((out / "report.json").read_text())
    assert result.exit_code == 0
    assert report["resolved_instances"] == 0 and report["empty_patch_instances"] == 1

    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"instance_id": "fixture__calc-1", "model_name_or_path": "m",
                                 "model_patch": "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"}) + "\n")
    out2 = tmp_path / "m"
    run("eval", "--predictions", str(preds), "--tasks", str(calc_tasks_file), "--output", str(out2))
    report = json.loads((out2 / "report.json").read_text())
    assert report["completed_instances"] == 1 and report["unresolved_ids"] == ["fixture__calc-1"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"instance_id": "nope", "model_patch": ""}\n', "unknown instance id 'nope'"),
        ("{broken\n", "line 1: invalid JSON"),
        ('{"model_patch": ""}\n', "field 'instance_id'"),
    ],
)
def test_eval_rejects_bad_predictions(calc_tasks_file, tmp_path, content, message):
    preds = tmp_path / "p.jsonl"
    preds.write_text(content)
    result = run("eval", "--predictions", str(preds), "--tasks", str(calc_tasks_file), "--output", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_instance_ids_select_from_a_larger_predictions_file(calc_repo, tmp_path):
    from conftest import calc_task_row

    repo, info = calc_repo
    tasks = tmp_path / "two.jsonl"
    tasks.write_text("".join(json.dumps(calc_task_row(repo, info, instance_id=i)) + "\n" for i in ("c-1", "c-2")))
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps({"instance_id": i, "model_patch": ""}) + "\n" for i in ("c-1", "c-2")))
    out = tmp_path / "o"
    result = run("eval", "--predictions", str(preds), "--tasks", str(tasks), "--instance-ids", "c-2", "--output", str(out))
    assert result.exit_code == 0, result.output
    # SWE-bench's model_name_or_path is missing: said, not silently "unknown"
    assert "1 prediction(s) have no model_name_or_path (SWE-bench's field), e.g. c-2" in " ".join(result.output.split())
    report = json.loads((out / "report.json").read_text())
    assert report["total_ids"] == ["c-2"] and report["submitted_ids"] == ["c-2"]


def test_unknown_ids_backend_and_task_files_are_clear_errors(calc_tasks_file, tmp_path):
    result = run("eval", "--predictions", "gold", "--tasks", str(calc_tasks_file), "--instance-ids", "nope")
    assert result.exit_code == 2 and "unknown instance id 'nope'" in result.output
    result = run("eval", "--predictions", "gold", "--tasks", str(calc_tasks_file), "--backend", "cloud")
    assert result.exit_code == 2 and "unknown backend 'cloud'" in result.output
    # error text is printed as it is, never read as rich markup (test ids, pip extras: "x[param]")
    result = run("eval", "--predictions", "gold", "--tasks", str(calc_tasks_file), "--instance-ids", "test_x[ray]")
    assert result.exit_code == 2 and "unknown instance id 'test_x[ray]'" in result.output, result.output
    result = run("tasks", "list", "--tasks", str(tmp_path / "missing.jsonl"))
    assert result.exit_code == 2 and "no such task file" in result.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "x"}\n')
    result = run("tasks", "show", "x", "--tasks", str(bad))
    assert result.exit_code == 2 and "bad.jsonl:line 1: field 'repo'" in " ".join(result.output.split())


def test_tasks_list_show_and_validate(calc_tasks_file):
    listed = run("tasks", "list", "--tasks", str(calc_tasks_file))
    assert listed.exit_code == 0 and "fixture__calc-1" in listed.output
    shown = run("tasks", "show", "fixture__calc-1", "--tasks", str(calc_tasks_file))
    assert "ZeroDivisionError" in shown.output and "test_mean_empty" in shown.output
    as_json = run("tasks", "show", "fixture__calc-1", "--tasks", str(calc_tasks_file), "--json")
    assert json.loads(as_json.output)["instance_id"] == "fixture__calc-1"
    validated = run("tasks", "validate", "--tasks", str(calc_tasks_file), "--runs", "2")
    assert validated.exit_code == 0, validated.output
    assert "1/1 tasks valid" in validated.output


def test_tasks_list_as_json_and_a_filter_that_matches_nothing(calc_tasks_file):
    listed = run("tasks", "list", "--tasks", str(calc_tasks_file), "--json")
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.stdout)
    assert row["instance_id"] == "fixture__calc-1" and row["repo"] and row["broken_tests"] == 1 and row["title"]
    assert set(row) >= {"kind", "changed_lines", "changed_files", "passing_tests"}
    none = run("tasks", "list", "--tasks", str(calc_tasks_file), "--where", "broken_tests>5")
    assert none.exit_code == 1 and "no task of" in none.output and "matches --where 'broken_tests>5'" in none.output
    assert "┃" not in none.output, "no empty table"
    assert json.loads(run("tasks", "list", "--tasks", str(calc_tasks_file), "--json", "--where",
                          "broken_tests>5").stdout) == []


def test_validate_flags_a_broken_task(calc_repo, tmp_path):
    from conftest import calc_task_row

    repo, info = calc_repo
    path = tmp_path / "broken.jsonl"
    # The empty patch resolves this one: its FAIL_TO_PASS test already passes at the base commit.
    row = calc_task_row(repo, info, instance_id="fixture__calc-broken", FAIL_TO_PASS=["tests/test_calc.py::test_mean"],
                        PASS_TO_PASS=["tests/test_calc.py::test_clamp_inside"])
    path.write_text(json.dumps(row) + "\n")
    result = run("tasks", "validate", "--tasks", str(path), "--runs", "1")
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "resolved with no change" in text and "0/1 tasks valid" in text


def test_the_readme_quick_start_makes_a_venv_and_its_table_names_every_command():
    """The quick start works on a stock Debian/Ubuntu Python (PEP 668 refuses pip outside a venv),
    and the command table lists every command the command line has."""
    import re
    from pathlib import Path

    import typer

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    first = re.search(r"```bash\n(.*?)```", quick, re.S).group(1)
    assert "python3-venv" in first and "python3 -m venv" in first and ". .venv/bin/activate" in first
    assert first.index("python3 -m venv") < first.index("pip install")
    table = readme.split("## What is here", 1)[1].split("\n\n", 2)[1]
    cells = [line.split(" | ", 1)[0] for line in table.splitlines() if line.startswith("| `patchgym")]

    def listed(words: list[str]) -> bool:
        head, last = " ".join(["patchgym", *words[:-1]]), words[-1]
        return any(re.search(rf"`{re.escape(head)} [^`]*\b{re.escape(last)}\b", cell) for cell in cells)

    tree = typer.main.get_command(app)
    commands = [[name] if not hasattr(cmd, "commands") else [name, sub]
                for name, cmd in tree.commands.items() for sub in (getattr(cmd, "commands", None) or [None])]
    missing = [" ".join(c) for c in commands if not listed(c)]
    assert len(commands) > 20 and missing == []
