"""What long commands print when their output is a log or a pipe, not a terminal: whole lines
(rich wraps at 80 columns there by default), a line as the work starts, the steps of an
environment build as they start, an honest rate, and one line on Ctrl-C saying how to resume."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console

from patchgym.cli import common
from patchgym.sandboxes import phases

PROGRESS = re.compile(r"^evaluating  \d+/\d+  \d+s(  \d+\.\d/min)?(  ETA \d+s)?(  \d+ resumed)?(  \S.*)?$")
BUILD = re.compile(r"^building environment \w{12} \(python [\d.]+\): step \d+/\d+: ")


def patchgym(*args: str, env: dict[str, str]) -> subprocess.Popen:
    """``python -m patchgym ARGS`` with stdout and stderr pipes, in a process group of its own (a
    terminal's Ctrl-C signals the whole foreground group)."""
    return subprocess.Popen([sys.executable, "-m", "patchgym", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def read_until(proc: subprocess.Popen, pattern: re.Pattern, seconds: float) -> list[str]:
    """stderr's lines up to the first that matches ``pattern``."""
    lines: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if pattern.search(lines[-1]):
            return lines
    raise AssertionError(f"no line matching {pattern.pattern} in {seconds:.0f}s:\n" + "\n".join(lines))


def whole_lines(text: str) -> list[str]:
    """stderr's lines that are none of the kinds eval prints: fragments of a broken line would be."""
    known = (PROGRESS, BUILD, re.compile(r"^  \S+: (sandbox start|tests \(\d+\)): \d+s so far$"),
             re.compile(r"^environment \w+ built"), re.compile(r"^interrupted: "))
    return [line for line in text.splitlines() if line.strip() and not any(k.search(line) for k in known)]


def test_a_piped_eval_builds_says_its_steps_and_resumes_after_ctrl_c(calc_tasks_file, tmp_path):
    """A fresh PATCHGYM_HOME, so the environment is built: its steps are lines as they start; Ctrl-C
    (SIGINT to the process group) says at once how to resume and exits 130; the rerun finishes, every
    line whole (a report path longer than 80 columns included); a third run resumes everything, with
    no made-up rate."""
    env = {**os.environ, "PATCHGYM_HOME": str(tmp_path / "home"), "COLUMNS": "80"}
    env.pop("PATCHGYM_LOG", None)
    out = tmp_path / ("an-output-directory-whose-name-is-long-enough-to-pass-eighty-columns" * 2)
    args = ("eval", "--predictions", "gold", "--tasks", str(calc_tasks_file), "--output", str(out))
    first = patchgym(*args, env=env)
    try:
        started = read_until(first, re.compile(r"^evaluating "), 60)
        assert PROGRESS.match(started[-1]) and started[-1].startswith("evaluating  0/1  "), started
        before = read_until(first, BUILD, 180)
        assert "step 1/" in before[-1] and before[-1].endswith(": venv"), before
        interrupted = time.monotonic()
        os.killpg(first.pid, signal.SIGINT)
        _, rest = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    stderr = "\n".join(started + before) + "\n" + rest
    assert first.returncode == 130, stderr
    said = [line for line in stderr.splitlines() if line.startswith("interrupted")]
    assert said == [f"interrupted: finishing the instances under way; rerun the same command to resume (graded "
                    f"instances are kept in {out})"], stderr
    assert time.monotonic() - interrupted < 180
    print(stderr)

    second = subprocess.run([sys.executable, "-m", "patchgym", *args], capture_output=True, text=True, env=env,
                            timeout=600)
    assert second.returncode == 0, second.stderr
    assert whole_lines(second.stderr) == [], second.stderr
    assert f"report: {out / 'report.json'}" in second.stdout.splitlines(), second.stdout
    assert "evaluating  1/1  " in second.stderr and "resolved 1 unresolved 0 empty 0 error 0" in second.stderr

    third = subprocess.run([sys.executable, "-m", "patchgym", *args], capture_output=True, text=True, env=env,
                           timeout=600)
    assert third.returncode == 0, third.stderr
    last = third.stderr.strip().splitlines()[-1]
    assert PROGRESS.match(last) and "  1 resumed" in last and "/min" not in last, third.stderr


def test_progress_lines_count_only_this_commands_work(monkeypatch):
    """Items found done on disk (``resumed``) are not in the rate; a line says the work started."""
    buf = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buf, width=common.PIPE_WIDTH, soft_wrap=True))
    clock = iter([100.0, 160.0, 220.0]).__next__
    monkeypatch.setattr(common.time, "monotonic", clock)
    progress = common.LineProgress(interval=0)
    bar = progress.add_task("evaluating", total=500, status="")
    progress.update(bar, advance=480, resumed=480, status="resolved 480")  # 480 resumed, read in no time
    progress.update(bar, advance=10, resumed=480, status="resolved 490")  # 10 graded in 120 s
    first, resumed, graded = buf.getvalue().splitlines()
    assert first == "evaluating  0/500  0s"
    assert resumed == "evaluating  480/500  60s  480 resumed  resolved 480"
    assert graded == "evaluating  490/500  120s  5.0/min  ETA 120s  480 resumed  resolved 490"


def test_consoles_do_not_wrap_in_a_log():
    piped = common._console(stderr=True)  # pytest captures stderr: not a terminal
    assert not piped.is_terminal and piped.width == common.PIPE_WIDTH and piped.soft_wrap
    buf = io.StringIO()
    piped.file = buf
    line = "x" * 300
    piped.print(line)
    assert buf.getvalue() == line + "\n"


def test_long_steps_are_said_once_they_take_long(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(phases.time, "monotonic", lambda: now[0])
    with phases.phase("a-1: tests (3)"), phases.phase("build: step 1/3: venv", announce=True):
        assert phases.overdue(10, 60) == []
        now[0] = 11.0
        assert phases.overdue(10, 60) == [("a-1: tests (3)", 11.0)]
        assert phases.overdue(10, 60) == []  # said once, then every 60 s
        now[0] = 61.0
        assert phases.overdue(10, 60) == [("build: step 1/3: venv", 61.0)]
        now[0] = 72.0
        assert phases.overdue(10, 60) == [("a-1: tests (3)", 72.0)]
    assert phases._active == {}


@pytest.fixture(autouse=True)
def _no_leftover_phases():
    yield
    phases._active.clear()
    phases._stopping.clear()  # main()'s Ctrl-C (test_ctrl_c_says_...): later builds in this process go on


def _interrupt(*args: object, **kwargs: object) -> None:
    """Ctrl-C where the command's long work starts (SIGINT to this process, as a terminal sends it)."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)  # the handler raises in here
    raise AssertionError("SIGINT was not handled")


def _no_endpoint_check(config: object) -> None:
    return None


LONG_COMMANDS = {  # args, what to replace (the last one is where the work starts), what Ctrl-C says
    "run": (["run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--output", "{out}", "--tasks", "{tasks}"],
            {"patchgym.rollouts.model.check_endpoint": _no_endpoint_check, "patchgym.rollouts.run.run_model": _interrupt},
            "finishing the episodes under way; rerun the same command to resume (finished episodes are kept in {out})"),
    "tasks validate": (["tasks", "validate", "--tasks", "{tasks}"],
                       {"patchgym.cli.tasks.validate_with_progress": _interrupt},
                       "a validation keeps no partial results: rerun the same command to start it again "
                       "(environments built so far are cached)"),
    "tasks import-swebench": (["tasks", "import-swebench", "{tasks}", "--repos", "{out}", "--output", "{out}/t.jsonl"],
                              {"patchgym.tasks.swebench_io.import_swebench": _interrupt},
                              "nothing is written to {out}/t.jsonl before the end: rerun the same command to start "
                              "again (environments built so far are cached)"),
    "images build": (["images", "build", "--tasks", "{tasks}"],
                     {"patchgym.cli.images._images": lambda: None, "patchgym.cli.images.progress_bar": _interrupt},
                     "images built so far are kept: rerun the same command to go on"),
    "images bootstrap": (["images", "bootstrap"],
                         {"patchgym.cli.images._images": lambda: _FakeImages()},
                         "nothing half-built is kept: rerun the same command to start again"),
}


class _FakeImages:
    base_tag = staticmethod(lambda release: f"patchgym/base:{release}")
    bootstrap_base = staticmethod(_interrupt)


@pytest.mark.parametrize("command", LONG_COMMANDS)
def test_ctrl_c_says_how_to_go_on_for_every_long_command(command, calc_tasks_file, tmp_path, monkeypatch, capsys):
    """The console script's SIGINT handler says, in one line and at once, what the command keeps
    and how to go on; exit status 130. (The piped eval above does it for real; mine and synth say
    their own line.)"""
    from patchgym.cli.app import main

    args, replaced, hint = LONG_COMMANDS[command]
    fill = {"out": str(tmp_path / "out"), "tasks": str(calc_tasks_file)}
    (tmp_path / "out").mkdir()
    for target, value in replaced.items():
        monkeypatch.setattr(target, value)
    monkeypatch.setattr(sys, "argv", ["patchgym", *(a.format(**fill) for a in args)])
    handler, phase_log = signal.getsignal(signal.SIGINT), logging.getLogger("patchgym.phase")
    saved = phase_log.handlers[:], phase_log.propagate, phase_log.level
    try:
        with pytest.raises(SystemExit) as exited:
            main()
    finally:  # main() set these up for the process it expects to be
        signal.signal(signal.SIGINT, handler)
        common._interrupt_hint.clear()
        phase_log.handlers[:], phase_log.propagate, phase_log.level = saved
    err = capsys.readouterr().err
    assert exited.value.code == 130 and phases.stopping(), err  # and builds start no further step
    assert [line for line in err.splitlines() if line.startswith("interrupted")] == [
        f"interrupted: {hint.format(**fill)}"], err
