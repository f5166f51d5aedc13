"""Per-step overhead of RepoEnv: a ``bash`` tool call running ``true``, beside its peers, in one run.

Columns, measured round-robin (one call of each per round, the order rotating every round, so
drift and caching hit all alike), after warm-up rounds that are not counted:

* ``repoenv_step_bash_true`` — ``env.step({"name": "bash", "arguments": {"command": "true"}})`` on
  ``patchgym/RepoEnv-v0`` made with ``gym.make`` (local backend), what an agent pays per tool call;
* ``sandbox_exec_true`` — the same episode's sandbox ``exec("true")`` without the env around it;
* ``minisweagent_local_true`` — mini-swe-agent's ``LocalEnvironment`` executing ``true`` (no
  isolation: ``subprocess`` with ``shell=True``); skipped, with a message, when mini-swe-agent
  is not installed (it is no dependency of patchgym: ``pip install mini-swe-agent``);
* ``plain_subprocess_true`` — ``subprocess.run(["bash", "-c", "true"])``, the floor.

    python bench/step_overhead.py [--task ID] [--steps 200] [--warmup 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_sandbox import print_results, summary  # noqa: E402  (also puts the repository on sys.path)

import patchgym.gym_envs  # noqa: E402, F401  (registers the environments)

BASH_TRUE = {"name": "bash", "arguments": {"command": "true"}}


def repoenv_step(env: gym.Env) -> Callable[[], None]:
    def step() -> None:
        _, _, terminated, truncated, info = env.step(BASH_TRUE)
        if info["invalid_action"] or info["exit_code"] != 0 or terminated or truncated:
            raise SystemExit(f"RepoEnv step failed: {info}")
    return step


def sandbox_exec(env: gym.Env) -> Callable[[], None]:
    sandbox = env.unwrapped.sandbox

    def run() -> None:
        if sandbox.exec("true").exit_code != 0:
            raise SystemExit("sandbox exec('true') failed")
    return run


def minisweagent_local() -> tuple[Callable[[], None] | None, str]:
    """mini-swe-agent's LocalEnvironment running ``true``, or None and why not."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")  # no banner; no config dir in the user's home
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="pg-bench-mswea-"))
    try:
        import minisweagent
        from minisweagent.environments.local import LocalEnvironment
    except ImportError as exc:
        return None, f"mini-swe-agent is not installed ({exc}); pip install mini-swe-agent to add this column"
    local = LocalEnvironment()
    # mini-swe-agent 2.x takes an action dict, 1.x a command string; both return {"output", "returncode", ...}
    for action in ({"command": "true"}, "true"):
        try:
            if local.execute(action)["returncode"] == 0:
                break
        except (AttributeError, TypeError):
            continue
    else:
        return None, "mini-swe-agent's LocalEnvironment.execute('true') did not return returncode 0"

    def run() -> None:
        if local.execute(action)["returncode"] != 0:
            raise SystemExit("mini-swe-agent LocalEnvironment.execute('true') failed")
    return run, f"mini-swe-agent {minisweagent.__version__}"


def plain_subprocess() -> None:
    subprocess.run(["bash", "-c", "true"], stdin=subprocess.DEVNULL, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="patchgym__semverkit-1")
    parser.add_argument("--steps", type=int, default=200, help="measured calls per column")
    parser.add_argument("--warmup", type=int, default=20, help="uncounted rounds first")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    env = gym.make("patchgym/RepoEnv-v0", backend="local", max_steps=2 * (args.steps + args.warmup) + 10)
    env.reset(options={"task_id": args.task})  # builds/caches the task environment on first use
    results: dict[str, object] = {"task": args.task, "python": sys.version.split()[0],
                                  "isolated": env.unwrapped.sandbox.isolated}
    columns: dict[str, Callable[[], None]] = {
        "repoenv_step_bash_true": repoenv_step(env),
        "sandbox_exec_true": sandbox_exec(env),
    }
    mswea, note = minisweagent_local()
    if mswea is None:
        print(f"skipping the mini-swe-agent column: {note}", file=sys.stderr)
    else:
        columns["minisweagent_local_true"] = mswea
    columns["plain_subprocess_true"] = plain_subprocess
    results["minisweagent"] = note

    samples: dict[str, list[float]] = {name: [] for name in columns}
    names = list(columns)
    try:
        for round_ in range(args.warmup + args.steps):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                columns[name]()
                elapsed = time.perf_counter() - start
                if round_ >= args.warmup:
                    samples[name].append(elapsed)
    finally:
        env.close()

    for name, values in samples.items():
        results[name] = summary(values)
    median = {name: statistics.median(values) for name, values in samples.items()}
    step, floor = median["repoenv_step_bash_true"], median["plain_subprocess_true"]
    results["step_over_plain_subprocess"] = round(step / floor, 2)
    results["step_minus_sandbox_exec_ms"] = round((step - median["sandbox_exec_true"]) * 1000, 3)
    if "minisweagent_local_true" in median:
        results["step_over_minisweagent"] = round(step / median["minisweagent_local_true"], 2)
        results["minisweagent_over_plain_subprocess"] = round(median["minisweagent_local_true"] / floor, 2)

    print_results(results, args.json)


if __name__ == "__main__":
    main()
