"""Every bundled task through every harness on every backend, driven by the scripted endpoint of the
tests (tests/fake_openai.py; each harness's script in tests/harness_cases.py): its oracle (the gold
patch through the harness's shell, then the harness's own ending) must resolve every task and its
no-op none, with every model call's token ids recorded, and beside it, patchgym's own loop on the
same tasks (the peer: what a harness costs per episode).

    python bench/harnesses.py --output DIR [--backends local,docker] [--harnesses mini-swe-agent,cmd,codex,patchgym]
                              [--workers 2] [--tasks N]

Each (harness, backend, script) is a ``patchgym run`` directory under DIR: a run killed or stopped
(Ctrl-C) resumes where it stopped when started again with the same DIR. A line per finished episode;
a table at the end (resolved / scored, masked, calls with token ids, seconds per episode).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from patchgym.rollouts.model import ModelConfig  # noqa: E402
from patchgym.rollouts.run import RunOptions, run_model  # noqa: E402
from patchgym.tasks.catalog import load_task_set  # noqa: E402
from tests.fake_openai import FakeModel  # noqa: E402
from tests.harness_cases import make_harness, script_tasks  # noqa: E402
from tests.serving import serve  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--backends", default="local,docker")
    parser.add_argument("--harnesses", default="mini-swe-agent,cmd,codex,patchgym")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=None, help="the first N bundled tasks (default: all)")
    args = parser.parse_args()
    tasks = load_task_set(None)
    if args.tasks:
        tasks = tasks.select(list(tasks.ids)[:args.tasks])
    rows = []
    model = FakeModel()
    try:
        with serve(model.app) as url:
            config = ModelConfig(name="scripted", base_url=f"{url}/v1", backoff=0.01, timeout=60, retries=1)
            for name in args.harnesses.split(","):
                harness = None if name == "patchgym" else make_harness(name)
                for backend in args.backends.split(","):
                    for fix in (True, False):
                        script_tasks(model, tasks, name, fix=fix)
                        out = args.output / f"{name}-{backend}-{'oracle' if fix else 'noop'}"
                        started = time.monotonic()

                        def done(line, state, label=out.name):
                            print(f"{label}: {line['instance_id']} {line['outcome']} ({line['end_reason']}) "
                                  f"{line['wall_seconds']:.1f}s [{state.done}/{state.total}]", flush=True)

                        report = run_model(tasks, config, RunOptions(
                            output=out, workers=args.workers, backend=backend, harness=harness, time_limit=600,
                            max_steps=10), on_episode=done)
                        lines = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines() if x]
                        calls = [c for t in lines for c in t.get("model_calls") or []]
                        rows.append({"run": out.name, "resolved": report["resolved"], "scored": report["scored"],
                                     "masked": report["masked"],
                                     "calls_with_token_ids": f"{sum(bool(c.get('token_ids')) for c in calls)}/"
                                                             f"{len(calls)}" if harness else "n/a",
                                     "median_episode_s": round(statistics.median(
                                         t["wall_seconds"] for t in lines), 2),
                                     "run_s": round(time.monotonic() - started, 1)})
    except KeyboardInterrupt:
        print(f"\nstopped; run the same command again to continue in {args.output}", file=sys.stderr)
        return 130
    print(f"\n{'run':36} {'resolved':>9} {'masked':>7} {'token ids':>10} {'median s':>9} {'run s':>7}")
    for r in rows:
        print(f"{r['run']:36} {r['resolved']:>4}/{r['scored']:<4} {r['masked']:>7} {r['calls_with_token_ids']:>10} "
              f"{r['median_episode_s']:>9} {r['run_s']:>7}")
    (args.output / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
