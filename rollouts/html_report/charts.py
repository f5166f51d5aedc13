"""The report's charts as geometry for ``templates/chart.html.j2`` (inline SVG): histograms of a
per-task number, stacked by outcome, and resolved rates by repository with their 95% intervals.
Both read at 500 tasks as well as at 5: a bar per bin or per repository, never per task."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from patchgym.rollouts.html_report.formats import OUTCOMES, fmt_rate, num, outcome_class
from patchgym.rollouts.stats import wilson

BINS = 20  # about this many bars per histogram
MAX_REPOS = 25  # repositories shown by name; the rest are one row


def ticks(vmax: float, integer: bool, count: int = 4) -> tuple[float, int]:
    """(step, n): axis ticks 0, step, ..., n*step covering ``vmax`` in about ``count`` steps
    (1/2/2.5/5 x 10^k steps, whole numbers only for counts)."""
    if vmax <= 0:
        return 1.0, 1
    rough = vmax / count
    mag = 10 ** math.floor(math.log10(rough))
    for m in ((1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)):
        step = m * mag
        if step >= rough and (not integer or step >= 1):
            break
    if integer:
        step = max(1, round(step))
    return step, max(1, math.ceil(vmax / step - 1e-9))


@dataclass(slots=True)
class Histogram:
    """``bars``: (outcome class, x, y, width, height, count, title) per stacked segment; ``grid``:
    (y, label y, label) per count tick; ``xlabels``: (x, label) under the bin edges. ``bars`` is
    None when no task has the number. Coordinates are text, as written in the SVG."""

    chart_id: str
    title: str
    shown: int = 0
    missing: int = 0
    width: int = 460
    height: int = 210
    left: int = 40
    top: int = 10
    plot_w: int = 400
    plot_h: int = 150
    grid: list[tuple[str, str, str]] = field(default_factory=list)
    xlabels: list[tuple[str, str]] = field(default_factory=list)
    bars: list[tuple[str, str, str, str, str, int, str]] | None = None
    summary: str = ""


def histogram(chart_id: str, title: str, rows: Sequence[dict], value: Callable[[dict], Any],
              fmt: Callable[[Any], str], *, integer: bool = False) -> Histogram:
    """The distribution of ``value(row)`` over ``rows`` (tasks without a number are counted apart),
    in about :data:`BINS` bins from 0, each bar stacked by outcome."""
    chart = Histogram(chart_id, title)
    values = [(num(value(r)), r.get("outcome")) for r in rows]
    known = [(v, o) for v, o in values if v is not None and v >= 0]
    chart.missing = len(values) - len(known)
    if not known:
        return chart
    chart.shown = len(known)
    ordered = sorted(v for v, _ in known)
    vmax = ordered[-1]
    # A long tail (one episode 10x the rest) would squeeze every other bar into the first few:
    # past the 98th percentile, values share the last bin ("≥ edge").
    p98 = ordered[min(len(ordered) - 1, math.ceil(0.98 * len(ordered)) - 1)]
    span = p98 if p98 > 0 and vmax > 2 * p98 else vmax
    step, nbins = ticks(span, integer, BINS)
    if integer and span < BINS:
        step, nbins = 1, int(span) + 1  # one bar per value
    elif span >= step * nbins:
        nbins += 1  # the largest value is an edge: a bin of its own
    tail = vmax >= step * nbins
    counts = [Counter() for _ in range(nbins)]
    for v, outcome in known:
        counts[min(nbins - 1, int(v // step))][outcome if outcome in OUTCOMES else "other"] += 1
    tallest = max(sum(c.values()) for c in counts)
    ystep, yn = ticks(tallest, True)
    ymax = ystep * yn
    left, top, plot_w, plot_h = chart.left, chart.top, chart.plot_w, chart.plot_h
    for i in range(yn + 1):
        y = top + plot_h - plot_h * i / yn
        chart.grid.append((f"{y:.1f}", f"{y + 4:.1f}", f"{int(ystep * i):,}"))
    bw = plot_w / nbins
    chart.bars = []
    for i, c in enumerate(counts):
        base = 0
        lo, hi = step * i, step * (i + 1)
        where = (f"≥ {fmt(lo)}" if tail and i == nbins - 1 else fmt(lo) if integer and step == 1
                 else f"{fmt(lo)} – {fmt(hi)}")
        split = ", ".join(f"{o} {c[o]:,}" for o in (*OUTCOMES, "other") if c[o])
        for outcome in (*OUTCOMES, "other"):
            n = c[outcome]
            if not n:
                continue
            h = plot_h * n / ymax
            y = top + plot_h - plot_h * (base + n) / ymax
            chart.bars.append((outcome_class(outcome), f"{left + i * bw + 0.5:.1f}", f"{y:.1f}",
                               f"{max(1.0, bw - 1):.1f}", f"{h:.1f}", n,
                               f"{where}: {sum(c.values()):,} task(s) ({split})"))
            base += n
    for i in range(0, nbins + 1, max(1, math.ceil(nbins / 5))):
        chart.xlabels.append((f"{left + i * bw:.1f}", fmt(step * i)))
    if tail:
        chart.xlabels.append((f"{left + plot_w:.1f}", "…"))
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    median = statistics.median(ordered)
    median = int(median) if integer and float(median).is_integer() else median
    chart.summary = f"median {fmt(median)} · p90 {fmt(p90)} · max {fmt(vmax)}"
    return chart


@dataclass(slots=True)
class RepoRate:
    """One repository's tasks: ``resolved`` of ``scored`` (masked ones apart), with Wilson's 95% interval."""

    repo: str
    resolved: int = 0
    scored: int = 0
    masked: int = 0

    @property
    def rate(self) -> float | None:
        return self.resolved / self.scored if self.scored else None

    @property
    def ci(self) -> tuple[float, float] | None:
        return wilson(self.resolved, self.scored) if self.scored else None

    @property
    def text(self) -> str:
        return (f"{self.resolved:,}/{self.scored:,} = {fmt_rate(self.rate)}" if self.scored else "none scored") + (
            f" · {self.masked:,} masked" if self.masked else "")


def repo_of(row: dict) -> str:
    """The row's repository; rows written before runs recorded it: from a SWE-bench-style instance
    id (``owner__name-123`` is ``owner/name``)."""
    repo = row.get("repo")
    if isinstance(repo, str) and repo:
        return repo
    iid = str(row.get("instance_id") or "?")
    return iid.rsplit("-", 1)[0].replace("__", "/", 1) if "-" in iid else iid


def repo_rates(rows: Sequence[dict]) -> list[RepoRate]:
    """Resolved rates by repository, most tasks first; past :data:`MAX_REPOS`, one ``other`` row."""
    by: dict[str, RepoRate] = {}
    for row in rows:
        rate = by.setdefault(repo_of(row), RepoRate(repo_of(row)))
        if row.get("outcome") == "masked":
            rate.masked += 1
        else:
            rate.scored += 1
            rate.resolved += row.get("outcome") == "resolved"
    ordered = sorted(by.values(), key=lambda r: (-(r.scored + r.masked), r.repo))
    if len(ordered) <= MAX_REPOS:
        return ordered
    rest = RepoRate(f"{len(ordered) - MAX_REPOS + 1:,} other repositories")
    for r in ordered[MAX_REPOS - 1:]:
        rest.resolved, rest.scored, rest.masked = rest.resolved + r.resolved, rest.scored + r.scored, \
            rest.masked + r.masked
    return [*ordered[:MAX_REPOS - 1], rest]


@dataclass(slots=True)
class RateBars:
    """Horizontal bars of resolved rates, a row per repository and a bar per run in it
    (``series``: the runs' names and CSS classes). ``rows``: (label, label y, bars) with each bar
    (class, y, width, rate raw, whisker x1, x2, title); geometry as text."""

    chart_id: str
    title: str
    series: list[tuple[str, str]]
    width: int = 720
    height: int = 0
    label_w: int = 190
    plot_w: int = 300
    rows: list[tuple[str, str, str, list[tuple[str, ...]]]] = field(default_factory=list)
    grid: list[tuple[str, str]] = field(default_factory=list)


def rate_bars(chart_id: str, title: str, series: list[tuple[str, str]],
              rates: Sequence[Sequence[RepoRate | None]]) -> RateBars:
    """``rates[i][j]``: repository i's rate in run j (None: the run has no task of it)."""
    chart = RateBars(chart_id, title, series)
    bar_h, gap, top = 12, 8, 18
    per_row = bar_h * len(series) + gap
    chart.height = top + per_row * len(rates) + 6
    x0 = chart.label_w
    chart.grid = [(f"{x0 + chart.plot_w * f:.1f}", fmt_rate(f)) for f in (0, 0.25, 0.5, 0.75, 1.0)]
    for i, row in enumerate(rates):
        y0 = top + i * per_row
        name = next(r.repo for r in row if r is not None)
        bars = []
        for j, (rate, (run, cls)) in enumerate(zip(row, series, strict=True)):
            y = y0 + j * bar_h
            if rate is None or rate.rate is None:
                text = rate.text if rate else "no tasks"
                bars.append((cls, f"{y:.1f}", "0", "null", "", "", f"{run}: {text}", text))
                continue
            low, high = rate.ci or (0.0, 0.0)
            bars.append((cls, f"{y:.1f}", f"{chart.plot_w * rate.rate:.1f}", repr(round(rate.rate, 4)),
                         f"{x0 + chart.plot_w * low:.1f}", f"{x0 + chart.plot_w * high:.1f}",
                         f"{run}: {rate.text} (95% CI {fmt_rate(low)} – {fmt_rate(high)})", rate.text))
        label = name if len(name) <= 28 else name[:27] + "…"
        chart.rows.append((label, name, f"{y0 + bar_h * len(series) / 2 + 4:.1f}", bars))
    return chart
