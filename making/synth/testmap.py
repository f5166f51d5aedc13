"""Which tests reach which function, from one traced run of the suite per revision.

``tasks synth`` checks a mutant of function *f* with only the tests whose run called *f* (its
code object: matched by file and first line, decorators included, as Python numbers it), in a
warm sandbox, instead of the whole suite in a fresh one. The map is a filter, never the verdict:
a mutant it keeps is run again with the whole suite in a fresh sandbox, and that run decides
FAIL_TO_PASS/PASS_TO_PASS. A function reached only from a session fixture is credited to the
test that set the fixture up, so a few bugs are missed, never wrongly kept.

The traced run is the repository's own pytest, with the plugin in :mod:`.reach_plugin`; no map
(and the whole suite per mutant) when the test command is not pytest, the traced ids do not match
the baseline's, or no test reaches a source file (a package installed as a copy).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from patchgym.grading.testrun import pytest_invocation
from patchgym.making.synth.mutations import Function
from patchgym.sandboxes import SandboxError
from patchgym.tasks.backends import SandboxFactory
from patchgym.tasks.model import Task

PLUGIN = Path(__file__).with_name("reach_plugin.py")
MIN_MATCHED = 0.95  # of the baseline's test ids the traced run must report


@dataclass
class TestMap:
    """(path, qualified name) → the ids of the tests whose run called that function."""

    __test__ = False

    by_function: dict[tuple[str, str], frozenset[str]]
    seconds: float

    def tests(self, path: str, function: str) -> frozenset[str]:
        return self.by_function.get((path, function), frozenset())


def _name(test_id: str) -> tuple[str, str]:
    parts = test_id.split("::")
    return parts[0], parts[-1]


def build_map(task: Task, factory: SandboxFactory, functions: dict[str, list[Function]],
              baseline_ids: set[str]) -> tuple[TestMap | None, str]:
    """The map for ``task.base_commit`` (the repository at the revision), else None and why."""
    invocation = pytest_invocation(task.test_spec.command)
    if task.test_spec.format != "pytest" or invocation is None:
        return None, "the test command is not pytest"
    env, python, args = invocation
    nonce = uuid.uuid4().hex[:12]
    script, out = f".patchgym-reach-{nonce}.py", f".patchgym-reach-{nonce}.json"
    started = time.monotonic()
    try:
        sandbox = factory(task)
    except SandboxError as exc:
        return None, f"no sandbox for the traced run: {exc}"
    try:
        sandbox.write_file(script, PLUGIN.read_text())
        result = sandbox.exec(f"{env}{python} -B {script} {out} {args} -q -p no:cacheprovider",
                              timeout=task.test_spec.timeout)
        if result.timed_out:
            return None, "the traced run timed out"
        traced = json.loads(sandbox.read_file(out))["tests"]
    except (SandboxError, OSError, ValueError, KeyError) as exc:
        return None, f"the traced run failed: {exc}"
    finally:
        try:
            sandbox.close()
        except SandboxError:
            pass
    # The baseline's ids come from junit, which can drop a test's class (a test directory without
    # __init__.py); both sides are matched on (file, test name with its parameters), and a name two
    # classes of a file share reaches both: more tests run, none is missed.
    by_name: dict[tuple[str, str], set[str]] = defaultdict(set)
    for test in baseline_ids:
        by_name[_name(test)].add(test)
    named = {_name(test) for test in traced}
    matched = sum(len(ids) for key, ids in by_name.items() if key in named) / max(1, len(baseline_ids))
    if matched < MIN_MATCHED:
        return None, f"the traced run's test ids match only {matched:.0%} of the baseline's"
    lines = {(path, f.lines[0]): (path, f.qualname) for path, found in functions.items() for f in found}
    reached: dict[tuple[str, str], set[str]] = defaultdict(set)
    for test, calls in traced.items():
        ids = by_name.get(_name(test), set())
        for path, line in calls:
            if ids and (key := lines.get((path, line))) is not None:
                reached[key] |= ids
    if not reached:
        return None, "no test reaches a source file in the workspace (a package installed as a copy?)"
    return TestMap({k: frozenset(v) for k, v in reached.items()}, time.monotonic() - started), ""
