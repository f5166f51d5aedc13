"""Start-up: how long a fresh ``patchgym`` process takes to reach its work, beside its peers, in one run.

Columns, each a fresh process, measured round-robin (one of each per round, the order rotating
every round, so drift hits all alike), one uncounted warm-up round first:

* ``python_pass`` — ``python -c pass`` with patchgym's interpreter: the floor (interpreter, site);
* ``import_patchgym`` — ``python -c "import patchgym"`` (the package: none of its floors);
* ``import_gym_envs`` — ``python -c "import patchgym.gym_envs"`` (Gymnasium and the environments);
* ``patchgym_help`` — ``patchgym --help`` (the console script);
* ``mini_help`` — mini-swe-agent's ``mini --help`` from its own venv (``--mini``, default
  ``$MINI_VENV/bin/mini``; skipped with a message when missing: it is no dependency of
  patchgym: ``python -m venv V && V/bin/pip install mini-swe-agent``);
* ``eval_first_sandbox_requested`` / ``eval_first_sandbox_ready`` — ``patchgym eval --predictions
  gold --instance-ids TASK``, from the parent's spawn to the first ``make_sandbox`` call (the
  harness's own start-up: imports, flags, the task catalog, predictions, reaping leftovers) and to
  its return (the first sandbox ready for a command, environment cached). The child is patchgym's
  console script with an import hook that wraps the functions of the eval's path as their modules
  load (``PHASES``: the same figure phase by phase) and ``patchgym.tasks.backends.make_sandbox``; it closes
  that sandbox and exits, so grading is not in the figure.

Times are wall-clock from just before the parent spawns the child (``time.monotonic`` is one clock
for every process on Linux) to the moment measured, or to the child's exit.

Warm caches include Python's bytecode: the children run without ``PYTHONDONTWRITEBYTECODE``, so the
warm-up round writes ``__pycache__`` as any first run of a checkout does (an installed patchgym
has it from ``pip install``). With it set, every process compiles patchgym's modules from source.

    python bench/startup.py [--task ID] [--rounds 7] [--mini PATH] [--json FILE]

It measures the patchgym installed for the interpreter that runs it: to compare two trees, install
each in a venv of its own (``VENV/bin/pip install -e TREE``) and run ``VENV/bin/python
bench/startup.py`` for each, interleaved, the script of each tree with its own venv.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run in the child: patchgym's console script, plus a hook that times where the time goes and
# reports the first sandbox. It wraps functions of the eval path when their modules finish importing
# (importing them up front would move import time out of the figures), and at the first sandbox
# prints every moment and leaves.
CHILD = r"""
import functools, importlib.util, json, os, sys, time
from importlib.abc import MetaPathFinder

moments = [("child", time.monotonic())]
WATCH = {"patchgym.cli.common": ("load_selection", "make_verifier", "reap"),
         "patchgym.tasks.predictions": ("load_predictions",),
         "patchgym.grading.evaluation": ("evaluate",), "patchgym.tasks.backends": ("make_sandbox",)}

def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        moments.append((name + ":start", time.monotonic()))
        try:
            result = fn(*args, **kwargs)
        finally:
            moments.append((name + ":end", time.monotonic()))
        if name == "make_sandbox":
            sys.stderr.write("\nPATCHGYM-BENCH " + json.dumps(moments) + "\n")
            sys.stderr.flush()
            result.close()
            os._exit(0)
        return result
    return wrapper

class Hook(MetaPathFinder):
    looking = False

    def find_spec(self, name, path=None, target=None):
        if name not in WATCH or self.looking:
            return None
        self.looking = True  # the finders after this one find the module
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.looking = False
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            for attr in WATCH[name]:
                setattr(module, attr, timed(attr, getattr(module, attr)))
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Hook())
sys.argv = ["patchgym", *sys.argv[1:]]
from patchgym.cli import main
moments.append(("cli imported", time.monotonic()))
sys.exit(main())
"""

#: The eval's start-up, phase by phase: (name, from moment, to moment) in the child's moments.
PHASES = (
    ("interpreter", "spawn", "child"),
    ("import cli (typer, rich, command modules)", "child", "cli imported"),
    ("parse flags, the eval's imports (grading, task model)", "cli imported", "load_selection:start"),
    ("load the task catalog", "load_selection:start", "load_selection:end"),
    ("predictions", "load_predictions:start", "load_predictions:end"),
    ("the grader (verifier, sandbox factory)", "make_verifier:start", "reap:start"),
    ("reap what dead processes left", "reap:start", "reap:end"),
    ("to the first make_sandbox (resume check, worker pool)", "make_verifier:end", "make_sandbox:start"),
    ("make_sandbox (the sandbox ready)", "make_sandbox:start", "make_sandbox:end"),
)


def spawn(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, str]:
    """Run ``argv`` to its end; the spawn time (monotonic) and its stderr."""
    started = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return started, proc.stderr


def timed(argv: list[str], env: dict[str, str], cwd: str) -> float:
    started = time.monotonic()
    spawn(argv, env, cwd)
    return time.monotonic() - started


def first_sandbox(task: str, env: dict[str, str], cwd: str, output: str) -> dict[str, float]:
    """One ``patchgym eval`` to its first sandbox: each moment the child recorded, in seconds after
    the spawn (``spawn`` itself is 0)."""
    argv = [sys.executable, "-c", CHILD, "eval", "--predictions", "gold", "--instance-ids", task,
            "--output", output, "--force", "--workers", "1"]
    started, stderr = spawn(argv, env, cwd)
    for line in stderr.splitlines():
        if line.startswith("PATCHGYM-BENCH "):
            moments = {"spawn": 0.0}
            for name, at in json.loads(line.removeprefix("PATCHGYM-BENCH ")):
                moments.setdefault(name, at - started)  # the first make_sandbox, the first reap...
            return moments
    raise SystemExit(f"patchgym eval never made a sandbox:\n{stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="patchgym__semverkit-1")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mini", default=os.path.join(os.environ.get("MINI_VENV", "mini-venv"), "bin", "mini"),
                        help="mini-swe-agent's mini (default: $MINI_VENV/bin/mini)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="pg-bench-startup-")
    env = dict(os.environ)
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        print("PYTHONDONTWRITEBYTECODE is set here: the children run without it (warm caches include bytecode)",
              file=sys.stderr)
    mini_env = {**env, "MSWEA_SILENT_STARTUP": "1", "MSWEA_GLOBAL_CONFIG_DIR": work}
    patchgym = Path(sys.executable).with_name("patchgym")  # the console script of this interpreter's install
    help_argv = [str(patchgym), "--help"] if patchgym.exists() else [sys.executable, "-m", "patchgym", "--help"]
    mini = args.mini if os.access(args.mini, os.X_OK) else None
    if mini is None:
        print(f"mini-swe-agent's mini not found at {args.mini}: its column is skipped", file=sys.stderr)

    columns = {
        "python_pass": lambda: timed([sys.executable, "-c", "pass"], env, work),
        "import_patchgym": lambda: timed([sys.executable, "-c", "import patchgym"], env, work),
        "import_gym_envs": lambda: timed([sys.executable, "-c", "import patchgym.gym_envs"], env, work),
        "patchgym_help": lambda: timed(help_argv, env, work),
        **({"mini_help": lambda: timed([mini, "--help"], mini_env, work)} if mini else {}),
        "eval_first_sandbox": lambda: first_sandbox(args.task, env, work, str(Path(work) / "runs")),
    }
    names = list(columns)
    samples: dict[str, list[float]] = {}
    breakdown: dict[str, list[float]] = {}
    for round_ in range(args.rounds + 1):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            value = columns[name]()
            if round_ == 0:
                continue  # warm-up: caches, the environment, page cache
            if name == "eval_first_sandbox":
                samples.setdefault("eval_first_sandbox_requested", []).append(value["make_sandbox:start"])
                samples.setdefault("eval_first_sandbox_ready", []).append(value["make_sandbox:end"])
                for phase, begin, end in PHASES:
                    if begin in value and end in value:
                        breakdown.setdefault(phase, []).append(value[end] - value[begin])
            else:
                samples.setdefault(name, []).append(value)
    shutil.rmtree(work, ignore_errors=True)

    result = {name: {"median_ms": round(statistics.median(v) * 1000, 1),
                     "min_ms": round(min(v) * 1000, 1), "max_ms": round(max(v) * 1000, 1), "n": len(v)}
              for name, v in samples.items()}
    width = max(map(len, result))
    for name, r in result.items():
        print(f"{name:<{width}}  median {r['median_ms']:7.1f} ms  (min {r['min_ms']:.1f}, max {r['max_ms']:.1f}, "
              f"n={r['n']})")
    print("eval_first_sandbox_ready, phase by phase (medians):")
    phases = {phase: round(statistics.median(v) * 1000, 1) for phase, v in breakdown.items()}
    for phase, ms in phases.items():
        print(f"  {phase:<{max(map(len, phases))}}  {ms:7.1f} ms")
    if args.json:
        args.json.write_text(json.dumps({"task": args.task, "python": sys.executable, "results": result,
                                         "eval_phases_median_ms": phases}, indent=2))


if __name__ == "__main__":
    main()
