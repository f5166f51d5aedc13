"""Render time of a run's HTML report on a big synthetic run, beside a baseline renderer, in one run.

The run directory is ``tests/test_run_html.py``'s synthetic run (``--tasks`` episodes of ``--steps``
tool calls, 1.5 kB per tool output). Each round renders it with every renderer once, the order
rotating round by round, so a loaded moment hits all alike; medians over the rounds:

* ``jinja`` — ``patchgym.rollouts.html_report.render_report`` (templates, the cyclic GC paused);
* ``jinja_gc_on`` — the same with the cyclic GC left running (what pausing it saves);
* ``baseline`` — ``render_report`` of another module file, e.g. the string-concatenation renderer
  before the templates: ``git show 2b7920d:rollouts/html_report.py > old_report.py``.

    python bench/html_report.py [--tasks 500] [--steps 50] [--rounds 3] [--baseline FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_run_html import synthetic_run  # noqa: E402

from patchgym.rollouts.html_report import render_report  # noqa: E402


def _gc_left_on(run_dir: Path) -> str:
    with mock.patch.object(gc, "disable"):
        return render_report(run_dir)


def _load(path: Path) -> Callable[[Path], str]:
    spec = importlib.util.spec_from_file_location("baseline_html_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="a module file whose render_report(run_dir) to time beside")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    renderers: dict[str, Callable[[Path], str]] = {"jinja": render_report, "jinja_gc_on": _gc_left_on}
    if args.baseline:
        renderers["baseline"] = _load(args.baseline)
    times: dict[str, list[float]] = {name: [] for name in renderers}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        synthetic_run(run_dir, args.tasks, args.steps)
        names = list(renderers)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                started = time.perf_counter()
                sizes[name] = len(renderers[name](run_dir))
                times[name].append(time.perf_counter() - started)
    results: dict[str, object] = {"tasks": args.tasks, "steps": args.steps, "rounds": args.rounds}
    for name, samples in times.items():
        results[f"{name}_s"] = round(statistics.median(samples), 3)
        results[f"{name}_chars"] = sizes[name]
    if "baseline" in times:
        results["jinja_over_baseline"] = round(results["jinja_s"] / results["baseline_s"], 2)
    results["gc_on_over_paused"] = round(results["jinja_gc_on_s"] / results["jinja_s"], 2)
    for key, value in results.items():
        print(f"{key:<22} {value}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
