"""Local sandbox timings: fresh sandbox, reset(), exec("true"), and verify against a bare pytest run.

The bare run is the physical limit of grading: the same FAIL_TO_PASS + PASS_TO_PASS tests, in the
same venv, in an already-patched checkout, with no sandbox and no patch application. Every figure
is the median of several repetitions, measured in this one process run so the ratios compare like
with like on a noisy machine.

    python bench/local_sandbox.py [--task ID] [--repeat N] [--exec-repeat N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from patchgym import Verifier, load_task_set  # noqa: E402
from patchgym.tasks.backends import make_sandbox  # noqa: E402


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {"median_ms": round(statistics.median(ms), 3), "p10_ms": round(ms[len(ms) // 10], 3),
            "p90_ms": round(ms[(len(ms) * 9) // 10], 3), "n": len(ms)}


def print_results(results: dict[str, object], json_path: Path | None) -> None:
    """One aligned line per figure (timings as median, p10, p90, n); the whole dict as JSON too."""
    width = max(len(k) for k in results)
    for key, value in results.items():
        shown = value
        if isinstance(value, dict):
            shown = (f"median {value['median_ms']:.2f} ms "
                     f"(p10 {value['p10_ms']:.2f}, p90 {value['p90_ms']:.2f}, n={value['n']})")
        print(f"{key:<{width}}  {shown}")
    if json_path:
        json_path.write_text(json.dumps(results, indent=2) + "\n")


def bare_pytest(task, sandbox) -> callable:
    """A host checkout with gold + test patch applied, and a function running the tests in it."""
    work = Path(tempfile.mkdtemp(prefix="pg-bench-"))
    # the sandbox's pristine checkout (its own workspace is mounted in its namespace only)
    shutil.copytree(sandbox._template, work / "repo", symlinks=True)
    repo = work / "repo"
    for patch in (task.patch, task.test_patch):
        subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=repo, check=True)
    tests = list(dict.fromkeys(task.FAIL_TO_PASS + task.PASS_TO_PASS))
    cmd = (f"{task.test_spec.command} -q --junitxml=/dev/null " + " ".join(shlex.quote(t) for t in tests))
    env = {"PATH": f"{sandbox.env.bin_dir}:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(work)}

    def run() -> None:
        proc = subprocess.run(["bash", "-c", cmd], cwd=repo, env=env, capture_output=True)
        if proc.returncode != 0:
            raise RuntimeError(proc.stdout.decode()[-2000:])

    return run, work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="patchgym__semverkit-1")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--exec-repeat", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    task = load_task_set().get(args.task)
    make_sandbox(task).close()  # warm the caches (venv, checkout): we measure the cached path
    results: dict[str, object] = {"task": task.instance_id, "python": sys.version.split()[0]}

    results["fresh_sandbox"] = summary(timed(lambda: make_sandbox(task).close(), args.repeat))
    sb = make_sandbox(task)
    results["isolated"] = sb.isolated
    try:
        results["exec_true"] = summary(timed(lambda: sb.exec("true"), args.exec_repeat))
        results["plain_subprocess_true"] = summary(timed(
            lambda: subprocess.run(["bash", "-c", "true"], stdin=subprocess.DEVNULL, capture_output=True),
            args.exec_repeat))

        def dirty_reset() -> None:
            sb.exec("echo x >> README.md; rm -rf tests; touch newfile")
            start = time.perf_counter()
            sb.reset()
            reset_times.append(time.perf_counter() - start)

        reset_times: list[float] = []
        for _ in range(args.repeat):
            dirty_reset()
        results["reset"] = summary(reset_times)
        run_bare, work = bare_pytest(task, sb)
    finally:
        sb.close()
    try:
        verifier = Verifier()
        verify_times, bare_times = [], []
        for _ in range(args.repeat):  # interleaved, so drift hits both alike
            start = time.perf_counter()
            report = verifier.verify(task, task.patch)
            verify_times.append(time.perf_counter() - start)
            if not report.resolved:
                raise SystemExit(f"gold did not resolve: {report.error}")
            bare_times.append(timed(run_bare, 1)[0])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["verify_gold"] = summary(verify_times)
    results["bare_pytest_same_tests"] = summary(bare_times)
    results["verify_over_bare"] = round(statistics.median(verify_times) / statistics.median(bare_times), 2)
    results["exec_over_plain_subprocess"] = round(
        results["exec_true"]["median_ms"] / results["plain_subprocess_true"]["median_ms"], 2)

    print_results(results, args.json)


if __name__ == "__main__":
    main()
