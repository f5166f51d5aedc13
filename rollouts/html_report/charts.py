"""The report's two bar charts (steps and wall time per task) as geometry for
``templates/chart.html.j2``: inline SVG, one bar per task in table order, coloured by outcome."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from patchgym.rollouts.html_report.formats import fmt_int, num, outcome_class, raw


def ticks(vmax: float, integer: bool) -> tuple[float, int]:
    """(step, count): axis ticks 0, step, ..., count*step covering ``vmax`` (1/2/2.5/5 x 10^k steps,
    whole numbers only for counts)."""
    if vmax <= 0:
        return 1.0, 1
    rough = vmax / 4
    mag = 10 ** math.floor(math.log10(rough))
    for m in ((1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)):
        step = m * mag
        if step >= rough and (not integer or step >= 1):
            break
    if integer:
        step = max(1, round(step))
    return step, max(1, math.ceil(vmax / step - 1e-9))


@dataclass(slots=True)
class Chart:
    """``grid``: (y of the line, y of its label, label) per tick; ``bars``: (outcome class, x, y,
    width, height, raw value, title). Coordinates are text, as written in the SVG."""

    chart_id: str
    title: str
    count: int = 0
    width: int = 0
    height: int = 0
    left: int = 56
    right_x: int = 0
    grid: list[tuple[str, str, str]] | None = None
    bars: list[tuple[str, int, str, int, str, str, str]] | None = None


def bar_chart(chart_id: str, title: str, rows: list[dict], key: str, fmt: Callable[[Any], str],
              unit: str) -> Chart:
    """The chart of ``rows[i][key]`` (``bars`` None: no tasks)."""
    chart = Chart(chart_id, title)
    if not rows:
        return chart
    n = len(rows)
    bw = max(3, min(40, 900 // n))
    gap = 1 if bw < 8 else 2
    left, right, top, bottom, plot_h = chart.left, 10, 10, 24, 170
    width, height = max(300, left + n * bw + right), top + plot_h + bottom
    values = [num(r.get(key)) for r in rows]
    step, count = ticks(max((v for v in values if v is not None), default=0), integer=fmt is fmt_int)
    vmax = step * count
    chart.count, chart.width, chart.height, chart.right_x = n, width, height, width - right
    chart.grid = []
    for i in range(count + 1):
        y = top + plot_h - plot_h * i / count
        chart.grid.append((f"{y:.1f}", f"{y + 4:.1f}", fmt(step * i)))
    chart.bars = []
    for i, (row, v) in enumerate(zip(rows, values, strict=True)):
        h = 0.0 if v is None else plot_h * v / vmax
        label = f"{row.get('instance_id', '?')}: {fmt(v)}{unit if v is not None else ''}"
        chart.bars.append((outcome_class(row.get("outcome")), left + i * bw, f"{top + plot_h - h:.1f}",
                           max(1, bw - gap), f"{h:.1f}", raw(row.get(key)), label))
    return chart
