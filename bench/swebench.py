"""SWE-bench rows end to end: import, build, grade gold and empty, and time grading against a bare run.

    python bench/swebench.py ROWS --repos DIR [--backend docker] [--instance-ids ID ...]
                             [--per-repo N] [--repeat 3] [--json FILE] [--no-timing]

``ROWS`` is anything ``patchgym tasks import-swebench`` reads (JSON/JSONL/parquet, a Hugging Face
dataset); ``--repos`` a directory of clones/mirrors/bundles or a clone URL. No ``--specs``: the
environments come from patchgym's built-in specs of SWE-bench's repositories.

For each instance: the environment is built (the time is reported apart: it is paid once per
spec, not per episode); the gold patch is graded ``--repeat`` times and the empty patch once;
between gold gradings, the same FAIL_TO_PASS + PASS_TO_PASS tests run bare in a sandbox where the
gold and test patches are already applied (the same environment; the test command as the task
states it, without patchgym's runtime, canaries or result checks): the floor that grading can
approach. Printed: per repository, instances, environments built, gold resolved, empty not
resolved, and the medians of verify and bare wall time, of their per-instance ratios, and of the
grading sandbox's start (inside verify: a fresh sandbox per grading is the isolation rule, and its
start is the backend's cost, not the runner's) and of patchgym's runner alone in the prepared
sandbox (``warm``: runtime, canaries, junit and its file round trips, beside ``bare``); every
failure with its reason.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from patchgym.grading.patch_apply import apply_patch  # noqa: E402
from patchgym.grading.patches import parse_patch  # noqa: E402
from patchgym.grading.runners import build_command, changed_test_files, pytest_selectors  # noqa: E402
from patchgym.grading.testrun import run_tests  # noqa: E402
from patchgym.grading.verifier import InstanceReport, Verifier  # noqa: E402
from patchgym.sandboxes import SandboxError  # noqa: E402
from patchgym.tasks.backends import sandbox_factory  # noqa: E402
from patchgym.tasks.swebench_io import import_swebench  # noqa: E402


def explain(report: InstanceReport) -> str:
    """Why a grade is not what validation wants, in one line."""
    if report.infrastructure_failure:
        return (report.infrastructure_failure_reason or "infrastructure failure").strip().splitlines()[0][:300]
    if report.tampering_detected:
        return f"tampering: {report.tampering_reason}"
    if report.error:
        return report.error.splitlines()[0][:300]
    status = report.tests_status
    f2p = status.get("FAIL_TO_PASS", {}).get("failure", [])
    p2p = status.get("PASS_TO_PASS", {}).get("failure", [])
    parts = [f"{len(f2p)} FAIL_TO_PASS failing ({', '.join(f2p[:3])})" if f2p else "",
             f"{len(p2p)} PASS_TO_PASS failing ({', '.join(p2p[:3])})" if p2p else "",
             f"{len(report.missing_tests)} tests missing from the results" if report.missing_tests else ""]
    return "; ".join(p for p in parts if p) or "resolved"


def bare_command(task) -> str:
    """The task's test command on its FAIL_TO_PASS + PASS_TO_PASS tests, as a user would type it:
    pytest's ids or their files (as the task's ``selection`` says) appended (no runtime, junit file or
    canaries), the other runners' labels or files."""
    tests = list(dict.fromkeys(task.FAIL_TO_PASS + task.PASS_TO_PASS))
    if task.test_spec.format == "pytest":
        selectors = pytest_selectors(tests, task.test_spec.selection)
        return f"{task.test_spec.command} {' '.join(shlex.quote(t) for t in selectors)}"
    return build_command(task.test_spec.format, task.test_spec.command, tests, changed_test_files(task.test_patch))


def bare_runner(task, factory):
    """A sandbox with gold and test patches applied (as the verifier applies them), and a function
    timing one bare test run."""
    sandbox = factory(task)
    for name, patch in (("gold", task.patch), ("test", task.test_patch)):
        if apply_patch(sandbox, parse_patch(patch), fuzzy=True) is None:
            sandbox.close()
            raise SandboxError(f"the {name} patch does not apply for the bare run")
    command = bare_command(task)

    def run() -> float:
        started = time.monotonic()
        sandbox.exec(command, timeout=task.test_spec.timeout)
        return time.monotonic() - started

    return sandbox, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows")
    parser.add_argument("--repos", required=True)
    parser.add_argument("--backend", default="docker", choices=["local", "docker"])
    parser.add_argument("--instance-ids", nargs="*")
    parser.add_argument("--per-repo", type=int, default=0, help="at most this many instances per repository")
    parser.add_argument("--repeat", type=int, default=3, help="gold gradings and bare runs per instance")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-timing", action="store_true",
                        help="validation only (gold --repeat times, empty once): no bare or warm runs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="pg-swebench-"))
    started = time.monotonic()
    imported = import_swebench(args.rows, repos=args.repos, output=work / "tasks.jsonl")
    tasks = imported.tasks
    if args.instance_ids:
        tasks = [t for t in tasks if t.instance_id in set(args.instance_ids)]
    if args.per_repo:
        counts: dict[str, int] = defaultdict(int)
        kept = []
        for task in tasks:
            if counts[task.repo] < args.per_repo:
                counts[task.repo] += 1
                kept.append(task)
        tasks = kept
    print(f"imported {len(imported.tasks)} tasks ({len(imported.dropped)} rows dropped) in "
          f"{time.monotonic() - started:.1f}s; grading {len(tasks)}", flush=True)
    for dropped in imported.dropped:
        print(f"  dropped {dropped.instance_id or dropped.where}: {dropped.reason}")

    factory = sandbox_factory(args.backend)
    starts: list[float] = []  # sandbox starts of the verifier, apart: they are paid per grading

    def timed_factory(task):
        began = time.monotonic()
        sandbox = factory(task)
        starts.append(time.monotonic() - began)
        return sandbox

    verifier = Verifier(timed_factory)
    results = []
    for n, task in enumerate(tasks, 1):
        row = {"instance_id": task.instance_id, "repo": task.repo, "version": task.version}
        build_started = time.monotonic()
        try:
            if args.no_timing:
                factory(task).close()  # builds the environment, timed apart as below
                bare_box, bare = None, None
            else:
                bare_box, bare = bare_runner(task, factory)
        except SandboxError as exc:
            row |= {"built": False, "reason": str(exc).strip().splitlines()[0][:300],
                    "build_seconds": round(time.monotonic() - build_started, 1)}
            results.append(row)
            print(f"[{n}/{len(tasks)}] {task.instance_id}: environment failed: {row['reason']}", flush=True)
            continue
        row |= {"built": True, "build_seconds": round(time.monotonic() - build_started, 1)}
        verify_times, bare_times, warm_times, gold = [], [], [], []
        tests = list(dict.fromkeys(task.FAIL_TO_PASS + task.PASS_TO_PASS))
        files = changed_test_files(task.test_patch) if task.test_spec.format != "pytest" else ()
        try:
            if bare is not None:
                bare()  # warm: the first run also compiles bytecode
            starts.clear()
            for _ in range(args.repeat):
                report = verifier.verify(task, task.patch)
                gold.append(report)
                verify_times.append(report.duration_seconds)
                if bare is None:
                    continue
                bare_times.append(bare())
                # patchgym's runner (runtime, canaries, junit, file round trips) in the prepared sandbox:
                # verify less the sandbox's start and the patches
                began = time.monotonic()
                run_tests(bare_box, task.test_spec, tests, files=files)
                warm_times.append(time.monotonic() - began)
        except SandboxError as exc:  # the bare sandbox failed: this instance is not measured, the rest are
            row |= {"built": False, "reason": f"bare run: {str(exc).strip().splitlines()[0][:300]}"}
            results.append(row)
            print(f"[{n}/{len(tasks)}] {task.instance_id}: infrastructure failure: {row['reason']}", flush=True)
            continue
        finally:
            if bare_box is not None:
                bare_box.close()
        empty = verifier.verify(task, "", run_empty=True)
        row |= {"gold_resolved": all(r.resolved for r in gold), "gold_runs_resolved": sum(r.resolved for r in gold),
                "empty_resolved": empty.resolved, "gold_reason": explain(gold[-1]), "empty_reason": explain(empty),
                "verify_seconds": round(statistics.median(verify_times), 3),
                "start_seconds": round(statistics.median(starts), 3) if starts else None,
                "bare_seconds": round(statistics.median(bare_times), 3) if bare_times else None,
                "warm_seconds": round(statistics.median(warm_times), 3) if warm_times else None}
        row["ratio"] = round(row["verify_seconds"] / row["bare_seconds"], 2) if row["bare_seconds"] else None
        results.append(row)
        verdict = "ok" if row["gold_resolved"] and not row["empty_resolved"] else "FAILED"
        timing = ("" if bare is None else f" bare {row['bare_seconds']}s (x{row['ratio']}; sandbox start "
                  f"{row['start_seconds']}s; runner in the prepared sandbox {row['warm_seconds']}s)")
        print(f"[{n}/{len(tasks)}] {task.instance_id}: {verdict} gold {row['gold_runs_resolved']}/{args.repeat} "
              f"empty {'resolved' if row['empty_resolved'] else 'not resolved'}; verify {row['verify_seconds']}s"
              f"{timing}; build {row['build_seconds']}s"
              + ("" if verdict == "ok" else f"; gold: {row['gold_reason']}; empty: {row['empty_reason']}"),
              flush=True)

    print(f"\n{'repository':28} {'rows':>4} {'built':>5} {'gold ok':>7} {'empty ok':>8} {'verify':>7} "
          f"{'bare':>7} {'ratio':>6} {'start':>6} {'warm':>6}")
    by_repo: dict[str, list[dict]] = defaultdict(list)
    for row in results:
        by_repo[row["repo"]].append(row)
    for repo, rows in sorted(by_repo.items()):
        built = [r for r in rows if r["built"]]
        gold_ok = sum(r["gold_resolved"] for r in built)
        empty_ok = sum(not r["empty_resolved"] for r in built)

        def med(key: str, group: list[dict] = built) -> str:
            values = [r[key] for r in group if r.get(key) is not None]
            return f"{statistics.median(values):.2f}" if values else "-"

        print(f"{repo:28} {len(rows):>4} {len(built):>5} {gold_ok:>7} {empty_ok:>8} {med('verify_seconds'):>7} "
              f"{med('bare_seconds'):>7} {med('ratio'):>6} {med('start_seconds'):>6} {med('warm_seconds'):>6}")
    built = [r for r in results if r["built"]]
    good = sum(r["gold_resolved"] and not r["empty_resolved"] for r in built)
    print(f"\n{good}/{len(built)} built instances validate (gold resolves, empty does not); "
          f"{len(results) - len(built)} environments failed; wall {time.monotonic() - started:.0f}s")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "dropped": [d.__dict__ for d in imported.dropped]},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
