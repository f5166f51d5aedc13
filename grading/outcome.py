"""Per-test outcomes from pytest's junit XML, and SWE-bench's grading rules on top of them.

Outcomes come from a structured file, never from grepping the log (printing ``PASSED`` fooled
log parsers, SWE-bench #601) — except for Django's and SymPy's runners, which write none: their
verbose output is parsed in :mod:`.runners`, and a run is only trusted when its exit code agrees.
Rules, as in SWE-bench 5.x: PASSED and XFAIL pass; FAILED, ERROR and a missing test fail; a SKIPPED
FAIL_TO_PASS test fails while a SKIPPED PASS_TO_PASS test is kept.
"""

from __future__ import annotations

import enum
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field


class TestStatus(str, enum.Enum):
    __test__ = False  # not a pytest test class

    PASSED = "PASSED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"


class JunitError(ValueError):
    """The junit file is missing or not junit XML."""


_TEST_MODULE = re.compile(r"test_.*|.*_test")  # pytest's default python_files, without ".py"


def _collecting_module(classname: str) -> tuple[str, list[str]]:
    """Split ``classname`` (the collecting module's dotted path, then its classes) into the
    module's file and the classes. Nothing says where the module ends, so: at its last part named
    like a test module (pytest's default ``python_files``), else before the trailing parts that
    start with a capital (classes, pytest's default ``python_classes`` is ``Test*``)."""
    parts = classname.split(".")
    ends = [i for i, part in enumerate(parts) if _TEST_MODULE.fullmatch(part)]
    end = ends[-1] + 1 if ends else len(parts)
    if not ends:
        while end > 1 and parts[end - 1][:1].isupper():
            end -= 1
    return "/".join(parts[:end]) + ".py", parts[end:]


def _node_id(case: ET.Element) -> str:
    """Rebuild pytest's node id from a ``<testcase>`` written with ``junit_family=xunit1``.

    ``classname`` is the node id's path (dotted, without ``.py``) and classes; ``file`` is the
    file that *defines* the test, which tells ``/`` from ``.`` in that path. They differ for a
    test defined in another file than the module that collects it (a class inheriting test
    methods from a base class in another test file, itsdangerous; a test function imported from
    one): the id pytest prints is the collecting module's, read from ``classname`` alone."""
    name = case.get("name", "")
    file = case.get("file")
    classname = case.get("classname", "")
    if not file:
        return f"{classname}::{name}" if classname else name
    module = file[:-3].replace("/", ".") if file.endswith(".py") else file.replace("/", ".")
    if classname == module or classname.startswith(module + "."):
        rest = classname[len(module):].lstrip(".")
        return "::".join([file, *[p for p in rest.split(".") if p], name])
    if not classname or not file.endswith(".py"):
        return f"{file}::{name}"
    path, classes = _collecting_module(classname)
    return "::".join([path, *classes, name])


def parse_junit(xml_text: str | bytes) -> dict[str, TestStatus]:
    """Map each test's node id to its status. Later entries for an id (reruns) win."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise JunitError(f"unreadable junit XML: {exc}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise JunitError(f"not a junit document (root element <{root.tag}>)")
    statuses: dict[str, TestStatus] = {}
    for case in root.iter("testcase"):
        node = _node_id(case)
        children = {child.tag: child for child in case}
        if "failure" in children:
            status = TestStatus.FAILED
        elif "error" in children:
            status = TestStatus.ERROR
        elif "skipped" in children:
            kind = children["skipped"].get("type", "")
            status = TestStatus.XFAIL if kind == "pytest.xfail" else TestStatus.SKIPPED
        else:
            status = TestStatus.PASSED
        # A test that failed in call and errored in teardown must not end up PASSED.
        previous = statuses.get(node)
        if previous in (TestStatus.FAILED, TestStatus.ERROR) and status is TestStatus.PASSED:
            continue
        statuses[node] = status
    return statuses


# Worst first: the status a group of tests that share one id is graded by.
_SEVERITY = {TestStatus.ERROR: 0, TestStatus.FAILED: 1, TestStatus.SKIPPED: 2, TestStatus.XFAIL: 3,
             TestStatus.PASSED: 4}
_OPTION = re.compile(r"(.*?)\[(.*)\]")


def swebench_id(node_id: str) -> str:
    """The id SWE-bench's log parsers record for a pytest node id: cut at its first space, and a
    parameter that is an absolute path kept as ``/`` plus its last component (its options parser:
    ``test_x[/testbed/tests/m.py]`` becomes ``test_x[/m.py]``)."""
    cut = node_id.split(" ", 1)[0]
    match = _OPTION.fullmatch(cut)
    if match:
        head, option = match.groups()
        if option.startswith("/") and not option.startswith("//") and "*" not in option:
            return f"{head}[/{option.split('/')[-1]}]"
    return cut


def lookup_key(test_id: str, statuses: dict[str, TestStatus]) -> str | None:
    """The key of ``test_id`` in ``statuses``; tolerates ids that SWE-bench recorded shortened.

    SWE-bench's log parsers cut an id at its first space and shorten an absolute-path parameter
    (:func:`swebench_id`), so one published id can stand for several tests: it takes the key whose
    status is worst among every key recorded so (all must pass). Otherwise an id matches by
    unique prefix (ids truncated by length)."""
    if test_id in statuses:
        return test_id
    recorded = [k for k in statuses if k != test_id and ("[" in k or " " in k) and swebench_id(k) == test_id]
    if recorded:
        return min(recorded, key=lambda k: _SEVERITY.get(statuses[k], 0))
    if "[" in test_id:
        matches = [k for k in statuses if k.startswith(test_id) or test_id.startswith(k)]
        if len(matches) == 1:
            return matches[0]
    return None


def lookup(test_id: str, statuses: dict[str, TestStatus]) -> TestStatus | None:
    """The status of ``test_id`` (see :func:`lookup_key`)."""
    key = lookup_key(test_id, statuses)
    return None if key is None else statuses[key]


def _f2p_passes(status: TestStatus | None) -> bool:
    return status in (TestStatus.PASSED, TestStatus.XFAIL)


def _p2p_kept(status: TestStatus | None) -> bool:
    return status in (TestStatus.PASSED, TestStatus.XFAIL, TestStatus.SKIPPED)


@dataclass
class Grade:
    """SWE-bench's ``tests_status`` and the resolved verdict."""

    tests_status: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    resolved: bool = False
    missing: list[str] = field(default_factory=list)


def grade(fail_to_pass: list[str], pass_to_pass: list[str], statuses: dict[str, TestStatus],
          undeclared_xfail: set[str] = frozenset(), undeclared_skip: set[str] = frozenset()) -> Grade:
    """Apply the grading rules to the observed ``statuses``.

    An XFAIL test (FAIL_TO_PASS or PASS_TO_PASS) passes only when its file declares the expected
    failure (:mod:`.declared`): ``undeclared_xfail`` are tests that xfailed without saying so, e.g.
    because a plugin the code under test registered added the marker at run time, or the code
    under test called ``pytest.xfail()``; they are failures. Likewise a PASS_TO_PASS test in
    ``undeclared_skip`` (skipped from inside its call, by code its file does not declare a skip in)
    is a failure, not kept.

    FAIL_TO_FAIL and PASS_TO_FAIL are empty: like SWE-bench, this harness runs only the
    FAIL_TO_PASS and PASS_TO_PASS tests, so nothing is known about the others.
    """
    out = Grade()
    sections = {"FAIL_TO_PASS": (fail_to_pass, _f2p_passes), "PASS_TO_PASS": (pass_to_pass, _p2p_kept)}
    for section, (ids, ok) in sections.items():
        success, failure = [], []
        for test_id in ids:
            key = lookup_key(test_id, statuses)
            status = None if key is None else statuses[key]
            if key is None:
                out.missing.append(test_id)
            elif (status is TestStatus.XFAIL and key in undeclared_xfail) or (
                    status is TestStatus.SKIPPED and key in undeclared_skip):
                status = TestStatus.FAILED
            (success if ok(status) else failure).append(test_id)
        out.tests_status[section] = {"success": success, "failure": failure}
    out.tests_status["FAIL_TO_FAIL"] = {"success": [], "failure": []}
    out.tests_status["PASS_TO_FAIL"] = {"success": [], "failure": []}
    out.resolved = not out.tests_status["FAIL_TO_PASS"]["failure"] and not out.tests_status["PASS_TO_PASS"]["failure"]
    return out
