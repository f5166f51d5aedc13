"""A failed environment build names its failing command and its real error first, the log by path."""

from __future__ import annotations

import pytest

from patchgym.sandboxes import EnvironmentBuildError
from patchgym.sandboxes.build_errors import error_lines, step_failed
from patchgym.sandboxes.environments import run_logged

# What pip printed for sqlfluff's requirements_dev.txt with SWE-bench's specs before its rewrite:
# a long line of versions ignored for their Python, then the two lines that matter.
PIP_OUTPUT = (
    "Collecting flake8\n  Using cached flake8-7.1.1-py2.py3-none-any.whl (57 kB)\n"
    "ERROR: Ignored the following versions that require a different python version: "
    + " ".join(f"{n}.0 Requires-Python >=3.{n % 5 + 9}" for n in range(200)) + "\n"
    "ERROR: Could not find a version that satisfies the requirement types-pkg_resources (from versions: none)\n"
    "ERROR: No matching distribution found for types-pkg_resources\n"
    "\n[notice] A new release of pip is available: 24.0 -> 25.0\n"
)
UV_OUTPUT = (
    "Using Python 3.11.2 environment at: venv\n"
    "  × No solution found when resolving dependencies:\n"
    "  ╰─▶ Because types-pkg-resources was not found in the package registry and you require\n"
    "      types-pkg-resources, we can conclude that your requirements are unsatisfiable.\n"
)


def test_pips_real_error_not_its_noise():
    lines = error_lines(PIP_OUTPUT)
    assert lines == ["ERROR: Could not find a version that satisfies the requirement types-pkg_resources "
                     "(from versions: none)", "ERROR: No matching distribution found for types-pkg_resources"]


def test_uvs_reason():
    assert error_lines(UV_OUTPUT) == ["  × No solution found when resolving dependencies:",
                                      "  ╰─▶ Because types-pkg-resources was not found in the package registry "
                                      "and you require"]


def test_output_without_an_error_line_gives_its_last_lines():
    assert error_lines("one\ntwo\nthree\n", limit=2) == ["two", "three"]


def test_a_failed_step_says_its_command_and_error_first_and_the_log_by_path(tmp_path):
    log = tmp_path / "build.log"
    run_logged(["bash", "-c", "echo 'ERROR: an earlier step that worked'"], log, cwd=tmp_path)
    script = tmp_path / "pip.txt"
    script.write_text(PIP_OUTPUT)
    with pytest.raises(EnvironmentBuildError) as caught:
        run_logged(["bash", "-c", f"cat {script}; exit 1"], log, cwd=tmp_path)
    message = str(caught.value)
    first, *rest = message.splitlines()
    assert first == f"environment step failed (exit 1): bash -c cat {script}; exit 1"
    assert rest == ["  ERROR: Could not find a version that satisfies the requirement types-pkg_resources "
                    "(from versions: none)", "  ERROR: No matching distribution found for types-pkg_resources",
                    f"log: {log}"]
    assert "Ignored the following versions" in log.read_text()  # the whole log keeps everything


def test_a_timed_out_step(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("$ sleep\nslept too long\n")
    assert step_failed("building x", "sleep 99", log, since=len("$ sleep\n"), timed_out=True) == (
        f"building x timed out: sleep 99\n  slept too long\nlog: {log}")
