"""Two runs side by side (``patchgym report RUN_A RUN_B``): on the tasks both scored, each run's
resolved rate, the difference with a paired 95% interval (:func:`patchgym.rollouts.stats.paired_difference`),
the tasks one run resolved and the other did not, by repository and task by task. Either side may
be a run's directory or an evaluation's (:mod:`.sources`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchgym.rollouts.html_report.charts import RateBars, rate_bars, repo_of, repo_rates
from patchgym.rollouts.html_report.formats import fmt_cost, fmt_int, fmt_rate, fmt_seconds, num, outcome_class, raw
from patchgym.rollouts.html_report.sources import Source, read_source
from patchgym.rollouts.html_report.summary import Card, Row, priced
from patchgym.rollouts.stats import PairedDifference, paired_difference, wilson

# How a task's outcome changed from B to A: (text, CSS class, sort key: changes first).
CHANGES = {(True, False): ("only A resolved", "up", 0), (False, True): ("only B resolved", "down", 1),
           (True, True): ("both resolved", "", 2), (False, False): ("neither", "", 3)}


@dataclass(slots=True)
class Comparison:
    """What the page shows: the two runs, the pairing, the cards, the table and the chart."""

    a: Source
    b: Source
    paired: PairedDifference
    cards: list[Card]
    columns: list[tuple[str, str, bool, Any]]
    rows: list[Row]
    repos: RateBars | None
    notes: list[str]


def compare(dir_a: Path, dir_b: Path) -> Comparison:
    """Read both directories and pair their tasks (raises as :func:`.sources.read_source` does)."""
    a, b = read_source(dir_a), read_source(dir_b)
    rows_a = {str(r.get("instance_id")): r for r in a.rows}
    rows_b = {str(r.get("instance_id")): r for r in b.rows}
    shared = [i for i in rows_a if i in rows_b]
    scored = [i for i in shared if _scored(rows_a[i]) and _scored(rows_b[i])]
    paired = paired_difference([rows_a[i]["outcome"] == "resolved" for i in scored],
                               [rows_b[i]["outcome"] == "resolved" for i in scored])
    notes = [f"A: {note}" for note in a.notes if "trajectories" not in note] + [
        f"B: {note}" for note in b.notes if "trajectories" not in note]
    only_a, only_b = len(rows_a) - len(shared), len(rows_b) - len(shared)
    if only_a or only_b:
        notes.append(f"{only_a:,} task(s) only in A and {only_b:,} only in B are left out of the comparison.")
    if len(shared) > len(scored):
        notes.append(f"{len(shared) - len(scored):,} task(s) of both are masked (or not finished) in one of them: "
                     f"left out of the comparison.")
    columns, table = _table(a, b, rows_a, rows_b, shared)
    by_repo: dict[str, list] = {}
    for side, rows in ((0, rows_a), (1, rows_b)):
        for rate in repo_rates([rows[i] for i in scored]):
            by_repo.setdefault(rate.repo, [None, None])[side] = rate
    repos = rate_bars("chart-repos", f"resolved rate by repository (the {len(scored):,} tasks both scored)",
                      [(f"A: {a.name}", "s-a"), (f"B: {b.name}", "s-b")], list(by_repo.values())) if scored else None
    return Comparison(a, b, paired, _cards(paired, len(shared)), columns, table, repos, notes)


def _scored(row: dict) -> bool:
    return row.get("outcome") in ("resolved", "unresolved")


def _cards(p: PairedDifference, shared: int) -> list[Card]:
    rate_a = (p.both + p.only_a) / p.n if p.n else None
    rate_b = (p.both + p.only_b) / p.n if p.n else None
    ci_a = wilson(p.both + p.only_a, p.n) if p.n else None
    ci_b = wilson(p.both + p.only_b, p.n) if p.n else None
    low, high = p.ci95

    def ci(v: tuple[float, float] | None) -> tuple[str, str, str]:
        return ("ci", raw(list(v) if v else None), f"{fmt_rate(v[0])} – {fmt_rate(v[1])}" if v else "—")

    diff = f"{p.difference * 100:+.1f} pts" if p.n else "—"
    return [
        Card("rate-a", "A: resolved rate", raw(rate_a), fmt_rate(rate_a), ci(ci_a)),
        Card("rate-b", "B: resolved rate", raw(rate_b), fmt_rate(rate_b), ci(ci_b)),
        Card("difference", "A − B (paired)", raw(round(p.difference, 6) if p.n else None), diff,
             ("ci", raw([round(low, 6), round(high, 6)] if p.n else None),
              f"{low * 100:+.1f} to {high * 100:+.1f} pts" if p.n else "—")),
        Card("paired", "tasks both scored", raw(p.n), fmt_int(p.n), ("total", raw(shared), fmt_int(shared))),
        Card("only-a", "only A resolved", raw(p.only_a), fmt_int(p.only_a)),
        Card("only-b", "only B resolved", raw(p.only_b), fmt_int(p.only_b)),
        Card("both", "both resolved", raw(p.both), fmt_int(p.both)),
        Card("neither", "neither", raw(p.neither), fmt_int(p.neither)),
    ]


def _table(a: Source, b: Source, rows_a: dict[str, dict], rows_b: dict[str, dict],
           shared: list[str]) -> tuple[list[tuple[str, str, bool, Any]], list[Row]]:
    """A row per task both runs have: its outcome in each, the change, and what each spent."""
    numbers: list[tuple[str, str, Any, Any]] = []  # (key, label, value of a row, format)
    if a.kind == b.kind == "run":
        numbers.append(("steps", "steps", lambda r: r.get("steps"), fmt_int))
        numbers.append(("tokens", "tokens", lambda r: _sum(r.get("tokens_in"), r.get("tokens_out")), fmt_int))
    numbers.append(("wall_seconds", "wall s", lambda r: r.get("wall_seconds"), fmt_seconds))
    if a.kind == b.kind == "run" and priced(a.report, a.run) and priced(b.report, b.run):
        numbers.append(("cost_usd", "cost", lambda r: r.get("cost_usd"), fmt_cost))
    columns = [("instance_id", "instance", False, None), ("repo", "repository", False, None),
               ("outcome_a", "A", False, None), ("outcome_b", "B", False, None), ("change", "change", False, None)]
    for key, label, _, fmt in numbers:
        columns += [(f"{key}_a", f"A {label}", True, fmt), (f"{key}_b", f"B {label}", True, fmt)]
    out = []
    order = sorted(shared, key=lambda i: (_change(rows_a[i], rows_b[i])[2], repo_of(rows_a[i]), i))
    for n, iid in enumerate(order):
        ra, rb = rows_a[iid], rows_b[iid]
        text, cls, rank = _change(ra, rb)
        cells = [("text", iid, iid, ""), ("text", repo_of(ra), repo_of(ra), "")]
        for r in (ra, rb):
            outcome = r.get("outcome")
            cells.append(("outcome", outcome or "", outcome or "—", outcome_class(outcome)))
        cells.append(("change", f"{rank}{text}", text, cls))
        for _, _, value, fmt in numbers:
            for r in (ra, rb):
                v = num(value(r))
                cells.append(("num", "" if v is None else repr(v), fmt(v), ""))
        out.append(Row(n, iid, cells))
    return columns, out


def _change(a: dict, b: dict) -> tuple[str, str, int]:
    if not (_scored(a) and _scored(b)):
        return "not paired (masked)", "", 4
    return CHANGES[(a["outcome"] == "resolved", b["outcome"] == "resolved")]


def _sum(*values: Any) -> float | None:
    known = [num(v) for v in values if num(v) is not None]
    return sum(known) if known else None
