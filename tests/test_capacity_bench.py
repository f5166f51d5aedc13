"""bench/capacity.py's climb: the levels it tries, what it calls a failure and in which order, its
chart, and the gold patch step its scripted agent sends (the bench itself runs in bench/, not here)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # capacity.py imports server_load and procmem as the bench runs them
_spec = importlib.util.spec_from_file_location("capacity", BENCH / "capacity.py")
capacity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(capacity)

HELD = {"errors": 0, "errors_by_kind": {}, "min_mem_available_mib": 20000.0, "bash_p99_ms": 400.0}


def test_levels_double_from_the_start_and_end_at_the_bound():
    assert capacity.levels(4, 128) == [4, 8, 16, 32, 64, 128]
    assert capacity.levels(4, 100) == [4, 8, 16, 32, 64, 100]
    assert capacity.levels(8, 8) == [8]
    assert capacity.levels(16, 4) == [4]


def test_a_level_fails_on_errors_first_then_memory_then_p99():
    assert capacity.failure(HELD, 1.0, 1024) is None
    slow_and_short = {**HELD, "bash_p99_ms": 1500.0, "min_mem_available_mib": 500.0}
    assert capacity.failure(slow_and_short, 1.0, 1024).startswith("memory:")
    erring = {**slow_and_short, "errors": 3, "errors_by_kind": {"step:exit_code": 2, "create:http_503": 1}}
    assert capacity.failure(erring, 1.0, 1024) == "errors: create:http_503 x1, step:exit_code x2"
    assert capacity.failure({**HELD, "bash_p99_ms": 1000.0}, 1.0, 1024).startswith("p99:")
    assert capacity.failure({**HELD, "bash_p99_ms": None}, 1.0, 1024) == "no bash step was measured"


def test_the_chart_scales_bars_to_the_largest_value():
    lines = capacity.bar_chart([("local 4", 20.0, ""), ("local 8", 40.0, "(p99)"), ("local 16", 0.0, "")], width=10)
    assert [line.count("#") for line in lines] == [5, 10, 0]
    assert lines[1].endswith("40.0 (p99)")


def test_the_gold_step_applies_the_patch_in_the_workspace(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    (tmp_path / "a.py").write_text("x = 2\n'EOF' $HOME `true`\n")
    patch = subprocess.run([*git, "diff"], check=True, capture_output=True, text=True).stdout
    subprocess.run([*git, "checkout", "-q", "a.py"], check=True)
    from server_load import apply_command

    subprocess.run(["bash", "-c", apply_command(patch)], cwd=tmp_path, check=True)
    assert (tmp_path / "a.py").read_text() == "x = 2\n'EOF' $HOME `true`\n"
