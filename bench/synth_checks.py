"""``tasks synth``: validated tasks per worker-hour, checking mutants the fast way beside the old one.

For each repository (registered or bundled), ``synthesize`` runs ``--rounds`` times in each mode,
the modes alternating (fast first in odd rounds, whole-suite first in even ones), each run into a
fresh output with the same ``--n`` and ``--seed``:

* ``fast`` — one traced run maps tests to the functions they call; each mutant is checked with the
  tests that reach its function in a warm sandbox; a mutant that breaks one is run with the whole
  suite in a fresh sandbox, then validated (the default);
* ``whole`` — every mutant run with the whole suite in a fresh sandbox, then validated
  (``--whole-suite``, the way before).

The rate is per hour of one worker (``--workers 1``, the default: a run keeps about one core busy),
from wall-clock time: ``getrusage`` cannot see the sandboxes' processes (they are not waited for by
this process), so CPU time is not taken. Figures per run: wall seconds, mutants tried, tasks
validated, validated tasks and mutants tried per worker-hour, the median seconds of a mutant's first
check (the warm run of the tests that reach it, or the whole suite in a fresh sandbox), and the
seconds spent on the baseline and on the traced run. The medians over rounds go in the summary lines; both modes
write the same task file when the fast checks miss nothing (printed: ``same tasks``).

    python bench/synth_checks.py --repo NAME [--repo NAME ...] [--n 3] [--seed 1] [--rounds 1]
                                 [--workers 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from patchgym.making.registry import get_repo
from patchgym.making.synth import SynthOptions, synthesize


def run_once(repo: str, fast: bool, n: int, seed: int, workers: int, out_dir: Path) -> dict[str, object]:
    output = out_dir / ("fast" if fast else "whole") / f"{repo}.jsonl"
    wall = time.monotonic()
    report = synthesize(get_repo(repo), output, SynthOptions(n=n, seed=seed, workers=workers, fast=fast))
    if report.interrupted:
        raise KeyboardInterrupt
    wall = time.monotonic() - wall
    hours = wall * workers / 3600
    tried = sum(a.verdict != "not run" for a in report.attempts)
    checks = [a.check_seconds for a in report.attempts if a.check_seconds is not None]
    return {"repo": repo, "mode": "fast" if fast else "whole", "wall_s": round(wall, 1), "tried": tried,
            "validated": len(report.tasks), "per_worker_hour": round(len(report.tasks) / hours, 1),
            "tried_per_worker_hour": round(tried / hours, 1),
            "check_s": round(statistics.median(checks), 2) if checks else None,
            "baseline_s": round(report.seconds.get("baseline", 0.0), 1),
            "map_s": round(report.seconds.get("map", 0.0), 1), "file": output.read_bytes().decode()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", action="append", required=True)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for repo in args.repo:
        for round_ in range(args.rounds):
            for fast in ((True, False) if round_ % 2 == 0 else (False, True)):
                with tempfile.TemporaryDirectory(prefix="synth-bench-") as tmp:
                    row = run_once(repo, fast, args.n, args.seed, args.workers, Path(tmp))
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "file"}), flush=True)
        for mode in ("fast", "whole"):
            mine = [r for r in rows if r["repo"] == repo and r["mode"] == mode]
            print(f"{repo} {mode}: median {statistics.median(r['per_worker_hour'] for r in mine):.1f} validated "
                  f"tasks/worker-hour, {statistics.median(r['tried_per_worker_hour'] for r in mine):.1f} mutants "
                  f"tried/worker-hour, {statistics.median(r['wall_s'] for r in mine):.1f}s wall, "
                  f"{statistics.median(r['check_s'] or 0.0 for r in mine):.2f}s per mutant's first check")
        files = {r["file"] for r in rows if r["repo"] == repo}
        print(f"{repo}: {'same tasks' if len(files) == 1 else 'the modes wrote different task files'}")
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "file"} for r in rows], indent=2))


if __name__ == "__main__":
    main()
