"""The top of the report as plain values: the run's parameters, the summary cards (every number
the one in ``report.json``, under a stable id with its raw value) and the per-task table."""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from typing import Any

from patchgym.rollouts.html_report.charts import repo_of
from patchgym.rollouts.html_report.formats import (
    fmt_ci,
    fmt_cost,
    fmt_cpu,
    fmt_int,
    fmt_mib,
    fmt_rate,
    fmt_seconds,
    num,
    outcome_class,
    raw,
)

# (key, header, numeric, format): every column a table may have; ``columns`` picks a page's.
COLUMNS = [
    ("instance_id", "instance", False, None),
    ("repo", "repository", False, None),
    ("outcome", "outcome", False, None),
    ("end_reason", "end reason", False, None),
    ("steps", "steps", True, fmt_int),
    ("invalid_calls", "invalid calls", True, fmt_int),
    ("format_errors", "format errors", True, fmt_int),
    ("wall_seconds", "wall s", True, fmt_seconds),
    ("tokens_in", "tokens in", True, fmt_int),
    ("tokens_out", "tokens out", True, fmt_int),
    ("cost_usd", "cost", True, fmt_cost),
    ("cost.env_cpu_seconds", "env CPU s", True, fmt_cpu),
    ("cost.test_cpu_seconds", "test CPU s", True, fmt_cpu),
    ("mask_reason", "mask reason", False, None),
]
# What an evaluation has no value for: it grades predictions, no model ran (and "end reason" is the
# grading's outcome).
EVAL_ONLY_LACKS = ("steps", "invalid_calls", "format_errors", "tokens_in", "tokens_out", "cost_usd")
MASK_REASON_CHARS = 160  # of a mask reason in the table (the whole one is its title, and in the trajectory)


def columns(kind: str, priced: bool) -> list[tuple[str, str, bool, Any]]:
    """The table's columns for a run (``priced``: the run was given token prices) or an evaluation."""
    drop = set(EVAL_ONLY_LACKS) if kind == "eval" else set() if priced else {"cost_usd"}
    return [(k, ("grading outcome" if k == "end_reason" and kind == "eval" else label), numeric, fmt)
            for k, label, numeric, fmt in COLUMNS if k not in drop]


def priced(report: dict, run: Any) -> bool:
    """Whether the run was given token prices (--price-in/--price-out): else its dollars are not 0 but unknown."""
    for price in (report.get("price"), run.get("price") if isinstance(run, dict) else None):
        if isinstance(price, dict):
            return any(num(price.get(k)) for k in ("input_per_mtok", "output_per_mtok"))
    return num(report.get("cost_usd")) not in (None, 0)


def field(row: dict, key: str) -> Any:
    """``row[key]``, or for ``a.b`` the ``b`` of ``row["a"]`` (the episode's environment cost)."""
    head, _, rest = key.partition(".")
    value = row.get(head)
    return (value.get(rest) if isinstance(value, dict) else None) if rest else value


@dataclass(slots=True)
class Card:
    """A summary number; ``sub`` a second one beneath it: (kind ``ci`` or ``total``, raw, text)."""

    elem_id: str
    label: str
    raw: str
    text: str
    sub: tuple[str, str, str] | None = None


def _card(elem_id: str, label: str, value: Any, text: str, sub: tuple[str, str, str] | None = None) -> Card:
    return Card(elem_id, label, raw(value), text, sub)


def cards(report: dict, *, kind: str = "run", has_price: bool = True) -> list[Card]:
    """The summary numbers: for a run, its tokens, dollars (``has_price``: else "no price given")
    and the model's invalid tool calls and format errors; for an evaluation, none of those."""
    resolved, masked, scored = report.get("resolved"), report.get("masked"), report.get("scored")
    unresolved = report.get("unresolved")
    if unresolved is None and num(scored) is not None and num(resolved) is not None:
        unresolved = scored - resolved
    ci, total = report.get("ci95"), report.get("total")
    cost = report.get("cost") if isinstance(report.get("cost"), dict) else {}
    model = [
        _card("tokens-in", "tokens in", report.get("tokens_in"), fmt_int(report.get("tokens_in"))),
        _card("tokens-out", "tokens out", report.get("tokens_out"), fmt_int(report.get("tokens_out"))),
        _card("cost", "cost (USD)", report.get("cost_usd"),
              fmt_cost(report.get("cost_usd")) if has_price else "no price given"),
        _card("invalid-calls", "invalid tool calls", report.get("invalid_calls_total"),
              fmt_int(report.get("invalid_calls_total"))),
        _card("format-errors", "format errors (turns)", report.get("format_errors_total"),
              fmt_int(report.get("format_errors_total"))),
    ] if kind == "run" else []
    return [
        _card("resolved-rate", "resolved rate (of scored)", report.get("resolved_rate"),
              fmt_rate(report.get("resolved_rate")), ("ci", raw(ci), fmt_ci(ci))),
        _card("resolved", "resolved", resolved, fmt_int(resolved)),
        _card("unresolved", "unresolved", unresolved, fmt_int(unresolved)),
        _card("masked", "masked", masked, fmt_int(masked)),
        _card("scored", "scored", scored, fmt_int(scored)),
        _card("completed", "completed / total", report.get("completed"), fmt_int(report.get("completed")),
              ("total", raw(total), fmt_int(total))),
        *model,
        _card("wall-seconds", "wall time (s)", report.get("wall_seconds"), fmt_seconds(report.get("wall_seconds"))),
        # what the environment spent per episode (report.json's ``cost``, grading.cost)
        _card("env-cpu-seconds", "env CPU per episode (s)", cost.get("env_cpu_seconds_mean"),
              fmt_cpu(cost.get("env_cpu_seconds_mean"))),
        _card("test-cpu-seconds", "test CPU per episode (s)", cost.get("test_cpu_seconds_mean"),
              fmt_cpu(cost.get("test_cpu_seconds_mean"))),
        _card("peak-memory", "peak memory (largest)", cost.get("peak_memory_bytes_max"),
              fmt_mib(cost.get("peak_memory_bytes_max"))),
        _card("env-usd-per-1k", "environment $ per 1,000 episodes", cost.get("usd_per_1k_episodes"),
              fmt_cost(cost.get("usd_per_1k_episodes"))),
        *([_card("steps-total", "steps", report.get("steps_total"), fmt_int(report.get("steps_total")))]
          if kind == "run" else []),
    ]


def run_meta(run: Any) -> list[tuple]:
    """The run's parameters from run.json, each a tuple whose first item names its kind."""
    if not isinstance(run, dict):
        return []  # the notes say why
    bits: list[tuple] = []
    if run.get("base_url"):
        bits.append(("endpoint", run["base_url"]))
    started = num(run.get("started_at"))
    if started is not None:
        try:
            when = _dt.datetime.fromtimestamp(started, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            bits.append(("started", raw(started), when))
        except (OverflowError, OSError, ValueError):
            pass
    price = run.get("price")
    if isinstance(price, dict):
        bits.append(("price", price.get("input_per_mtok", "?"), price.get("output_per_mtok", "?")))
    params = run.get("params")
    harness = params.get("harness") if isinstance(params, dict) else None
    if isinstance(harness, dict):  # the harness that drove the episodes, and its version (rollouts.harnesses)
        bits.append(("harness", str(harness.get("name", "?")), str(harness.get("version", "?"))))
    if isinstance(params, dict) and params:
        bits.append(("params", [(k, json.dumps(v, ensure_ascii=False, default=str)) for k, v in params.items()]))
    tasks = run.get("tasks")
    if isinstance(tasks, list):
        bits.append(("tasks", f"{len(tasks):,} task{'s' if len(tasks) != 1 else ''} requested"))
    return bits


@dataclass(slots=True)
class Row:
    """A row of the table: ``cells`` as (kind of cell, data-sort, text, the outcome badge's CSS class
    or the whole text of a cut one); the kind is the column's key, or ``num`` for numbers."""

    index: int
    iid: Any
    cells: list[tuple[str, Any, Any, str]]


def table(rows: list[dict], cols: list[tuple[str, str, bool, Any]] | None = None) -> list[Row]:
    """The rows' cells, for ``cols`` (default: every column)."""
    out = []
    for i, row in enumerate(rows):
        cells = []
        for key, _label, numeric, fmt in cols or COLUMNS:
            value = field(row, key)
            if key == "instance_id":
                cells.append((key, value if value is not None else "", value if value is not None else "?", ""))
            elif key == "outcome":
                cells.append((key, value or "", value or "—", outcome_class(value)))
            elif key == "repo":
                cells.append((key, repo_of(row), repo_of(row), ""))
            elif key == "mask_reason":
                text = str(value or "")
                shown = text if len(text) <= MASK_REASON_CHARS else text[:MASK_REASON_CHARS - 1] + "…"
                cells.append((key, text, shown or "", text))
            elif numeric:
                v = num(value)
                cells.append(("num", "" if v is None else repr(v), fmt(value), ""))
            else:
                cells.append((key, value or "", value or "—", ""))
        out.append(Row(i, row.get("instance_id", ""), cells))
    return out
