"""A graded test run that imports a big pure-Python package, with and without the environment's
bytecode prefix (sandboxes/bytecode.py): the run's wall time, fresh sandbox each time, interleaved.

    python bench/bytecode_prefix.py [--package sympy] [--module sympy] [--rounds 5]

A throwaway repository (one module and one test that imports ``--module``) in a local environment
with ``--package`` and pytest installed from the index (built once, cached). "old" hides the prefix
from the runtime (``PATCHGYM_BYTECODE_PREFIX`` empty: the ``/dev/null`` fallback, so everything
imported after pytest compiles from source), "new" uses it. Medians of the rounds and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from gym_envs.grading.testrun import probe_task, run_tests
from sandboxes.bytecode import PREFIX_ENV
from tasks.backends import make_sandbox
from tasks.model import EnvironmentConfig, TestSpec


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--package", default="sympy")
    p.add_argument("--module", default="sympy")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        commit = _repo(repo, args.module)
        task = probe_task(repo="bench/bytecode-prefix", repo_path=str(repo), base_commit=commit,
                          environment=EnvironmentConfig(packages=[args.package, "pytest"]),
                          test_spec=TestSpec(command="python -m pytest"))
        test = ["tests/test_calc.py::test_double"]
        make_sandbox(task).close()  # builds the environment (and its prefix) once
        times: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(args.rounds):
            for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                sandbox = make_sandbox(task)
                try:
                    graded = _NoPrefix(sandbox) if side == "old" else sandbox
                    start = time.perf_counter()
                    run = run_tests(graded, task.test_spec, test)
                    times[side].append(time.perf_counter() - start)
                    assert run.passed == set(test), run.output[-2000:]
                finally:
                    sandbox.close()
                print(side, round(times[side][-1], 2), flush=True)
    old, new = statistics.median(times["old"]), statistics.median(times["new"])
    print(json.dumps({"package": args.package, "median_old_s": round(old, 2), "median_new_s": round(new, 2),
                      "new_over_old": round(new / old, 3), "old": [round(t, 2) for t in times["old"]],
                      "new": [round(t, 2) for t in times["new"]]}))


if __name__ == "__main__":
    main()
