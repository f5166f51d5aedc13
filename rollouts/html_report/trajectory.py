"""One task's trajectory as the page shows it: its conversation turn by turn, its final diff and
its test results, as plain values for ``templates/trajectory.html.j2``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from patchgym.rollouts.html_report.formats import fmt_int, fmt_seconds, outcome_class
from patchgym.rollouts.html_report.text import Arguments, Budget, Diff, Shown, arguments, block, content_text, diff

MAX_TEST_IDS = 2_000  # test ids listed per list (PASS_TO_PASS can hold thousands)


@dataclass(slots=True)
class Call:
    name: Any
    call_id: Any
    arguments: Arguments


@dataclass(slots=True)
class Message:
    """``kind``: system, user, assistant, tool, other (a role patchgym does not know: ``who`` is
    it), or raw (not a JSON object)."""

    kind: str
    text: Shown | None = None
    who: Any = ""  # the role of an unknown one, the tool's name of a tool output
    turn: int = 0
    calls: list[Call] = field(default_factory=list)
    call_id: Any = ""
    empty: bool = False  # an assistant turn with no text and no tool call


def messages(msgs: Any, budget: Budget) -> list[Message] | None:
    """The conversation (None: no messages recorded)."""
    if not isinstance(msgs, list) or not msgs:
        return None
    out: list[Message] = []
    call_names: dict[str, str] = {}
    turn = 0
    for msg in msgs:
        if not isinstance(msg, dict):
            out.append(Message("raw", block(msg, budget)))
            continue
        role = msg.get("role")
        if role in ("system", "user"):
            out.append(Message(role, block(content_text(msg.get("content")), budget)))
        elif role == "assistant":
            turn += 1
            content = msg.get("content")
            text = block(content_text(content), budget) if content not in (None, "") else None
            calls = msg.get("tool_calls") or []
            if not isinstance(calls, list):
                calls = []
            m = Message("assistant", text, turn=turn, empty=not calls and content in (None, ""))
            for call in calls:
                if not isinstance(call, dict):
                    continue
                fn = call.get("function") if isinstance(call.get("function"), dict) else {}
                name = fn.get("name", "?")
                if isinstance(call.get("id"), str):
                    call_names[call["id"]] = str(name)
                m.calls.append(Call(name, call.get("id", ""), arguments(fn.get("arguments"), budget)))
            out.append(m)
        elif role == "tool":
            cid = msg.get("tool_call_id", "")
            name = call_names.get(cid, "") if isinstance(cid, str) else ""
            out.append(Message("tool", block(content_text(msg.get("content")), budget), who=name, call_id=cid))
        else:
            out.append(Message("other", block(content_text(msg.get("content", msg)), budget), who=role))
    return out


@dataclass(slots=True)
class TestList:
    label: str
    cls: str
    names: list | None  # None: the report has no list here
    total: int = 0
    more: int = 0
    open: bool = False


def _test_list(label: str, names: Any, cls: str, *, open_: bool) -> TestList:
    if not isinstance(names, list):
        return TestList(label, cls, None)
    shown = names[:MAX_TEST_IDS]
    return TestList(label, cls, shown, len(names), len(names) - len(shown), bool(open_ and names))


@dataclass(slots=True)
class Tests:
    """The grading report of an episode: ``flags`` (key, value as text) and ``groups`` (FAIL_TO_PASS
    and PASS_TO_PASS: their failure and success lists, or None when not reported). ``graded`` is
    False when there is no report (``mask_reason`` then says why, if known); ``status`` False when
    the report has no tests_status."""

    graded: bool
    mask_reason: Any = None
    flags: list[tuple[str, str]] = field(default_factory=list)
    status: bool = True
    groups: list[tuple[str, list[TestList] | None]] = field(default_factory=list)


def tests(traj: dict, iid: str) -> Tests:
    report = traj.get("report")
    if isinstance(report, dict) and iid in report and isinstance(report[iid], dict):
        inst = report[iid]
    elif isinstance(report, dict) and "tests_status" in report:
        inst = report
    elif isinstance(report, dict) and len(report) == 1 and isinstance(next(iter(report.values())), dict):
        inst = next(iter(report.values()))
    else:
        return Tests(False, traj.get("mask_reason"))
    flags = [(str(k), v if isinstance(v, str) else json.dumps(v)) for k, v in inst.items()
             if isinstance(v, (bool, int, float, str)) and k != "tests_status"][:12]
    status = inst.get("tests_status")
    if not isinstance(status, dict):
        return Tests(True, flags=flags, status=False)
    groups = []
    for group in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        g = status.get(group)
        groups.append((group, None if not isinstance(g, dict) else [
            _test_list("failure", g.get("failure"), "t-fail", open_=True),
            _test_list("success", g.get("success"), "t-ok", open_=group == "FAIL_TO_PASS")]))
    return Tests(True, flags=flags, groups=groups)


@dataclass(slots=True)
class Trajectory:
    """One ``<details class="traj">``: ``conversation`` is None when trajectories.jsonl has no line
    for the task (then only ``diff`` of predictions.jsonl, if ``has_prediction``)."""

    index: int
    iid: str
    outcome: Any
    outcome_class: str
    end_reason: Any
    steps: str
    plural: bool
    wall: str
    extra: bool
    mask_reason: Any
    recorded: bool
    conversation: list[Message] | None = None
    diff: Diff | None = None
    has_prediction: bool = False
    tests: Tests | None = None
    slips: str = ""  # the model's invalid tool calls and format errors, when it made any


def trajectory(i: int, row: dict, traj: dict | None, prediction: dict | None, budget: Budget,
               extra: bool = False) -> Trajectory:
    """Task ``i`` (``row`` from report.json, or its trajectory when ``extra``: not in report.json)."""
    iid = str(row.get("instance_id", "?"))
    outcome = row.get("outcome")
    view = Trajectory(i, iid, outcome, outcome_class(outcome), row.get("end_reason") or "",
                      fmt_int(row.get("steps")), row.get("steps") != 1, fmt_seconds(row.get("wall_seconds")),
                      extra, row.get("mask_reason"), traj is not None)
    view.slips = ", ".join(f"{n:,} {what}{'s' if n != 1 else ''}" for what, n in (
        ("invalid tool call", row.get("invalid_calls")), ("format error", row.get("format_errors")))
        if isinstance(n, int) and not isinstance(n, bool) and n > 0)
    if traj is None:
        if prediction is not None:
            view.has_prediction = True
            view.diff = diff(prediction.get("model_patch"), budget)
        return view
    view.conversation = messages(traj.get("messages"), budget)
    patch = traj.get("patch")
    if patch is None and prediction is not None:
        patch = prediction.get("model_patch")
    view.diff = diff(patch, budget)
    view.tests = tests(traj, iid)
    return view
