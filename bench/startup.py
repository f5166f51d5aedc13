"""Start-up: how long a fresh ``patchgym`` process takes to reach its work, beside its peers, in one run.

Columns, each a fresh process, measured round-robin (one of each per round, the order rotating
every round, so drift hits all alike), one uncounted warm-up round first:

* ``python_pass`` — ``python -c pass`` with patchgym's interpreter: the floor (interpreter, site);
* ``import_gym_envs`` — ``python -c "import gym_envs"``;
* ``patchgym_help`` — ``patchgym --help`` (the console script);
* ``mini_help`` — mini-swe-agent's ``mini --help`` from its own venv (``--mini``, default
  ``$MINI_VENV/bin/mini``; skipped with a message when missing: it is no dependency of
  patchgym: ``python -m venv V && V/bin/pip install mini-swe-agent``);
* ``eval_first_sandbox_requested`` / ``eval_first_sandbox_ready`` — ``patchgym eval --predictions
  gold --instance-ids TASK``, from the parent's spawn to the first ``make_sandbox`` call (the
  harness's own start-up: imports, flags, the task catalog, predictions, reaping leftovers) and to
  its return (the first sandbox ready for a command, environment cached). The child is patchgym's
  console script with a one-shot import hook that wraps ``tasks.backends.make_sandbox``; it closes
  that sandbox and exits, so grading is not in the figure.

Times are wall-clock from just before the parent spawns the child (``time.monotonic`` is one clock
for every process on Linux) to the moment measured, or to the child's exit.

    python bench/startup.py [--task ID] [--rounds 7] [--mini PATH] [--pythonpath DIR] [--json FILE]

``--pythonpath`` runs another checkout of patchgym (e.g. ``git archive COMMIT | tar -x -C DIR``)
with the same interpreter: its packages come before the installed ones on ``sys.path``.
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

# Run in the child: patchgym's console script, plus a hook that reports the first sandbox. The hook
# wraps make_sandbox when tasks.backends finishes importing (importing it up front would move
# import time out of the figure), then prints both moments and leaves.
CHILD = r"""
import importlib.util, os, sys, time
from importlib.abc import MetaPathFinder

class Hook(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "tasks.backends":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            make = module.make_sandbox

            def first(*args, **kwargs):
                requested = time.monotonic()
                sandbox = make(*args, **kwargs)
                ready = time.monotonic()
                sys.stderr.write(f"\nPATCHGYM-BENCH {requested!r} {ready!r}\n")
                sys.stderr.flush()
                sandbox.close()
                os._exit(0)
            module.make_sandbox = first
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Hook())
sys.argv = ["patchgym", *sys.argv[1:]]
try:
    from cli import main
except ImportError:  # a checkout from before the command line moved to cli/
    from gym_envs.cli import main
sys.exit(main())
"""


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


def first_sandbox(task: str, env: dict[str, str], cwd: str, output: str) -> tuple[float, float]:
    argv = [sys.executable, "-c", CHILD, "eval", "--predictions", "gold", "--instance-ids", task,
            "--output", output, "--force", "--workers", "1"]
    started, stderr = spawn(argv, env, cwd)
    for line in stderr.splitlines():
        if line.startswith("PATCHGYM-BENCH "):
            requested, ready = map(float, line.split()[1:])
            return requested - started, ready - started
    raise SystemExit(f"patchgym eval never made a sandbox:\n{stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="patchgym__semverkit-1")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mini", default=os.path.join(os.environ.get("MINI_VENV", "mini-venv"), "bin", "mini"),
                        help="mini-swe-agent's mini (default: $MINI_VENV/bin/mini)")
    parser.add_argument("--pythonpath", help="another checkout of patchgym to measure")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="pg-bench-startup-")
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(args.pythonpath).resolve()),
                                                          env.get("PYTHONPATH")]))
    mini_env = {**env, "MSWEA_SILENT_STARTUP": "1", "MSWEA_GLOBAL_CONFIG_DIR": work}
    patchgym = shutil.which("patchgym")
    module = "cli" if not args.pythonpath or (Path(args.pythonpath) / "cli").is_dir() else "gym_envs.cli"
    help_argv = [patchgym, "--help"] if patchgym and not args.pythonpath else [sys.executable, "-m", module, "--help"]
    mini = args.mini if os.access(args.mini, os.X_OK) else None
    if mini is None:
        print(f"mini-swe-agent's mini not found at {args.mini}: its column is skipped", file=sys.stderr)

    columns = {
        "python_pass": lambda: timed([sys.executable, "-c", "pass"], env, work),
        "import_gym_envs": lambda: timed([sys.executable, "-c", "import gym_envs"], env, work),
        "patchgym_help": lambda: timed(help_argv, env, work),
        **({"mini_help": lambda: timed([mini, "--help"], mini_env, work)} if mini else {}),
        "eval_first_sandbox": lambda: first_sandbox(args.task, env, work, str(Path(work) / "runs")),
    }
    names = list(columns)
    samples: dict[str, list[float]] = {}
    for round_ in range(args.rounds + 1):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            value = columns[name]()
            if round_ == 0:
                continue  # warm-up: caches, the environment, page cache
            if name == "eval_first_sandbox":
                samples.setdefault("eval_first_sandbox_requested", []).append(value[0])
                samples.setdefault("eval_first_sandbox_ready", []).append(value[1])
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
    if args.json:
        args.json.write_text(json.dumps({"task": args.task, "pythonpath": args.pythonpath, "results": result},
                                        indent=2))


if __name__ == "__main__":
    main()
