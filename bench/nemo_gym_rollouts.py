"""Rollouts per minute through the real NeMo Gym (``gym env start`` + ``gym eval run --no-serve``;
``--release 0.4.0`` or ``0.7.0``, whose environment server runs each episode) against ``patchgym
serve --backend local``, with the scripted model of tests/nemo_gym_real.py
(oracle rollouts: gold patch through bash, then submit; reward 1.0 each).

Needs root, debootstrap, ip, chroot, unshare, bwrap; the first run builds the cached NeMo Gym root
(0.4.0: ~4 min, 0.7.0: ~8 min; PyPI and the Debian mirror). Everything of the run is in a
loopback-only network namespace.

    python bench/nemo_gym_rollouts.py --rollouts 8 --parallel 4 --max-sessions 2 --runs 3

Each run is one ``gym eval run`` of N rows, ``--parallel`` at once (more than ``--max-sessions``: the
extra rollouts wait for a free session), against one ``gym env start`` that stays up.
Prints the medians over the runs of rollouts/minute and of the wall time per rollout (the run's wall
time over N; a rollout's own latency is not in NeMo Gym's rows), plus each run's figures. Each run's
time includes ``gym eval run``'s own start-up: ``one_noop_collect`` in the setup line is the time
of a collection of a single no-op rollout, i.e. about that fixed cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from tests import nemo_gym_real as ng  # noqa: E402
from tests.nemo_gym_root import RELEASES  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per run (N)")
    parser.add_argument("--release", choices=sorted(RELEASES), default="0.4.0", help="the NeMo Gym release")
    parser.add_argument("--parallel", type=int, default=4, help="gym eval run's --concurrency")
    parser.add_argument("--max-sessions", type=int, default=2, help="patchgym serve --max-sessions")
    parser.add_argument("--runs", type=int, default=3, help="runs to take medians over (>= 3)")
    parser.add_argument("--script", default="oracle", choices=("oracle", "noop"), help="what each rollout does")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()
    if args.parallel <= args.max_sessions:
        print("note: --parallel is not above --max-sessions", file=sys.stderr)
    missing = ng.missing_requirements()
    if missing:
        print(f"needs: {', '.join(missing)}", file=sys.stderr)
        return 2

    runs = []
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    with ng.Stack(release=RELEASES[args.release], max_sessions=args.max_sessions, progress=say) as stack:
        setup = dict(stack.seconds)
        # the fixed cost of one gym eval run (its start-up, the /aggregate_metrics call): one no-op rollout
        probe = stack.collect(["noop"], parallel=1)
        setup["one_noop_collect"] = probe.seconds
        for i in range(args.runs):
            c = stack.collect([args.script] * args.rollouts, parallel=args.parallel)
            ok = c.returncode == 0 and len(c.rows) == args.rollouts
            expected = 1.0 if args.script == "oracle" else 0.0
            good = sum(1 for r in c.rows if r.get("reward") == expected)
            runs.append({"run": i + 1, "seconds": round(c.seconds, 2), "rows": len(c.rows), "failures": len(c.failures),
                         "expected_reward": good, "ok": ok,
                         "rollouts_per_minute": round(60.0 * len(c.rows) / c.seconds, 2) if c.seconds else None,
                         "seconds_per_rollout": round(c.seconds / args.rollouts, 2)})
            print(f"run {i + 1}: {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
            if not ok:
                print(f"run {i + 1} incomplete:\n{c.log[-3000:]}\n{stack.logs()}", file=sys.stderr)
    done = [r for r in runs if r["ok"]]
    result = {
        "rollouts": args.rollouts, "parallel": args.parallel, "max_sessions": args.max_sessions, "runs": len(runs),
        "complete_runs": len(done), "setup_seconds": {k: round(v, 1) for k, v in setup.items()},
        "median_rollouts_per_minute": statistics.median(r["rollouts_per_minute"] for r in done) if done else None,
        "median_seconds_per_rollout": statistics.median(r["seconds_per_rollout"] for r in done) if done else None,
        "per_run": runs,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"NeMo Gym {stack.release.version} -> patchgym serve (local backend): {args.rollouts} rollouts/run, "
              f"{args.parallel} in parallel, --max-sessions {args.max_sessions}, {len(done)}/{len(runs)} complete runs")
        print(f"setup: {result['setup_seconds']}")
        print(f"median rollouts/minute:      {result['median_rollouts_per_minute']}")
        print(f"median seconds per rollout:  {result['median_seconds_per_rollout']}")
    return 0 if len(done) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
