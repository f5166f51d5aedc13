"""Verify time of two installs of patchgym, A and B: gold on the first N bundled tasks, each round
one child process per install (alternating which goes first), medians of the rounds' totals.

    python bench/verify_ab.py --a A_VENV/bin/python --b B_VENV/bin/python [--rounds 5] [--tasks 6]
        [--home-a DIR --home-b DIR]

A and B are interpreters each with a checkout installed (``A_VENV/bin/pip install -e MAIN_TREE``).
Each child imports its patchgym and asserts every gold resolves with no tampering; the
environments come from the shared caches, so both sides grade the same way, unless
``--home-a``/``--home-b`` give a side a PATCHGYM_HOME of its own (needed when the two checkouts lay
their caches out differently, e.g. a tree from before environment attempts against one after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r'''
import json, sys, time
import patchgym
from patchgym import Verifier, load_task_set
ts = load_task_set()
ids = sorted(t.instance_id for t in ts)[:int(sys.argv[1])]
v = Verifier()
v.verify(ts.get(ids[0]), ts.get(ids[0]).patch)  # warm
out = {}
for i in ids:
    t = ts.get(i)
    s = time.perf_counter(); r = v.verify(t, t.patch); out[i] = time.perf_counter() - s
    assert r.resolved and not r.tampering_detected, (i, r.error, r.tampering_reason)
print(json.dumps({"file": patchgym.__file__, "times": out}))
'''

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="the interpreter of install A")
    p.add_argument("--b", required=True, help="the interpreter of install B")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--home-a", help="PATCHGYM_HOME for A's children (default: the inherited one)")
    p.add_argument("--home-b", help="PATCHGYM_HOME for B's children (default: the inherited one)")
    args = p.parse_args()
    totals: dict[str, list[float]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for side in (("a", "b") if r % 2 == 0 else ("b", "a")):
            env = dict(os.environ)
            if getattr(args, f"home_{side}"):
                env["PATCHGYM_HOME"] = os.path.abspath(getattr(args, f"home_{side}"))
            proc = subprocess.run([getattr(args, side), "-c", CHILD, str(args.tasks)], capture_output=True,
                                  text=True, env=env, cwd=tempfile.gettempdir())
            if proc.returncode:
                sys.exit(proc.stderr[-3000:])
            data = json.loads(proc.stdout.strip().splitlines()[-1])
            totals[side].append(sum(data["times"].values()))
            print(side, round(totals[side][-1], 2), flush=True)
    ma, mb = statistics.median(totals["a"]), statistics.median(totals["b"])
    print(json.dumps({"median_a_s": round(ma, 2), "median_b_s": round(mb, 2), "b_over_a": round(mb / ma, 3),
                      "a": totals["a"], "b": totals["b"]}))


if __name__ == "__main__":
    main()
