"""A graded test run that imports a big pure-Python package, with and without the environment's
bytecode prefix (sandboxes/bytecode.py): the run's wall time, fresh sandbox each time, interleaved.

    python bench/bytecode_prefix.py [--package sympy] [--module sympy] [--rounds 5]
    python bench/bytecode_prefix.py --bundled 6 [--rounds 7]

A throwaway repository (one module and one test that imports ``--module``) in a local environment
with ``--package`` and pytest installed from the index (built once, cached). "old" hides the prefix
from the runtime (``PATCHGYM_BYTECODE_PREFIX`` empty: the ``/dev/null`` fallback, so everything
imported after pytest compiles from source), "new" uses it. Medians of the rounds and their ratio.
With ``--bundled N``: the hidden tests of the first N bundled tasks instead, gold and test patch
applied (each round's time is the sum over the tasks).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from patchgym.grading.patch_apply import apply_patch
from patchgym.grading.patches import parse_patch
from patchgym.grading.testrun import probe_task, run_tests
from patchgym.sandboxes.bytecode import PREFIX_ENV
from patchgym.tasks.backends import make_sandbox
from patchgym.tasks.model import EnvironmentConfig, TestSpec


class _NoPrefix:
    """A sandbox whose commands get an empty prefix name (the runtime then uses /dev/null)."""

    def __init__(self, sandbox) -> None:
        self._sandbox = sandbox

    def exec(self, command, timeout=60.0, cwd=None, env=None, output_limit=None):
        return self._sandbox.exec(command, timeout=timeout, cwd=cwd, env={**(env or {}), PREFIX_ENV: ""},
                                  output_limit=output_limit)

    def __getattr__(self, name):
        return getattr(self._sandbox, name)


def _repo(root: Path, module: str) -> str:
    root.mkdir(parents=True)
    (root / "calc.py").write_text("def double(x):\n    return 2 * x\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(
        f"import {module}\nfrom calc import double\n\n\ndef test_double():\n    assert double(2) == 4\n")
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "bench"], cwd=root, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True,
                          text=True).stdout.strip()


def _cases(args, tmp: str) -> list[tuple]:
    """(task, test ids, patches to apply) for each graded run of a round."""
    if args.bundled:
        from patchgym import load_task_set

        tasks = load_task_set()
        picked = [tasks.get(i) for i in sorted(t.instance_id for t in tasks)[:args.bundled]]
        return [(t, t.FAIL_TO_PASS + t.PASS_TO_PASS, [t.patch, t.test_patch]) for t in picked]
    repo = Path(tmp) / "repo"
    commit = _repo(repo, args.module)
    task = probe_task(repo="bench/bytecode-prefix", repo_path=str(repo), base_commit=commit,
                      environment=EnvironmentConfig(packages=[args.package, "pytest"]),
                      test_spec=TestSpec(command="python -m pytest"))
    return [(task, ["tests/test_calc.py::test_double"], [])]


def _graded(task, tests: list[str], patches: list[str], side: str) -> float:
    sandbox = make_sandbox(task)
    try:
        for patch in patches:
            assert apply_patch(sandbox, parse_patch(patch), fuzzy=False), task.instance_id
        graded = _NoPrefix(sandbox) if side == "old" else sandbox
        start = time.perf_counter()
        run = run_tests(graded, task.test_spec, tests)
        took = time.perf_counter() - start
        assert run.passed >= set(tests), run.output[-2000:]
        return took
    finally:
        sandbox.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--package", default="sympy")
    p.add_argument("--module", default="sympy")
    p.add_argument("--bundled", type=int, default=0, help="the first N bundled tasks instead")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = _cases(args, tmp)
        for task, _, _ in cases:
            make_sandbox(task).close()  # builds the environment (and its prefix) once
        times: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(args.rounds):
            for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                times[side].append(sum(_graded(task, tests, patches, side) for task, tests, patches in cases))
                print(side, round(times[side][-1], 2), flush=True)
    old, new = statistics.median(times["old"]), statistics.median(times["new"])
    print(json.dumps({"package": None if args.bundled else args.package, "bundled": args.bundled,
                      "median_old_s": round(old, 2), "median_new_s": round(new, 2),
                      "new_over_old": round(new / old, 3), "old": [round(t, 2) for t in times["old"]],
                      "new": [round(t, 2) for t in times["new"]],
                      "round_ratios": [round(n / o, 3) for o, n in zip(times["old"], times["new"], strict=True)]}))


if __name__ == "__main__":
    main()
