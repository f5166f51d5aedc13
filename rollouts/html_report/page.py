"""The page: a run's or an evaluation's directory read (:mod:`.sources`), turned into the
templates' values, rendered by Jinja2 with autoescape on (so escaping is the default, not a
discipline), written atomically."""

from __future__ import annotations

import base64
import functools
import gc
import hashlib
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from patchgym.rollouts.html_report.charts import Histogram, histogram, rate_bars, repo_rates
from patchgym.rollouts.html_report.compare import compare
from patchgym.rollouts.html_report.formats import fmt_cost, fmt_cpu, fmt_int, fmt_seconds, num
from patchgym.rollouts.html_report.reading import RunReportMissing
from patchgym.rollouts.html_report.sources import Source, read_source
from patchgym.rollouts.html_report.summary import cards, columns, field, priced, run_meta, table
from patchgym.rollouts.html_report.text import MAX_OUTPUT_CHARS, MAX_PAGE_CHARS, Budget
from patchgym.rollouts.html_report.trajectory import trajectory

__all__ = ["RunReportMissing", "environment", "render_comparison", "render_report", "write_comparison",
           "write_report"]


@functools.lru_cache(maxsize=2)
def environment(autoescape: bool = True) -> jinja2.Environment:
    """The templates of ``templates/`` (package data). ``autoescape=False`` exists only for the test
    that shows what autoescape prevents (it swaps this function for one that turns it off)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader(__package__, "templates"), autoescape=autoescape,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["thousands"] = lambda n: f"{n:,}"
    return env


@functools.lru_cache(maxsize=1)
def _assets() -> tuple[str, str, str]:
    """(CSS, JS, Content-Security-Policy): only this script may run (a hash-source CSP), so even an
    escaping bug could not run model output."""
    folder = resources.files(__package__) / "templates"
    css = (folder / "report.css").read_text(encoding="utf-8")
    js = (folder / "report.js").read_text(encoding="utf-8")
    csp = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-"
           + base64.b64encode(hashlib.sha256(js.encode("utf-8")).digest()).decode("ascii") + "'")
    return css, js, csp


def distributions(source: Source, has_price: bool) -> list[Histogram]:
    """The histograms of a page: what each task took (a run's steps, tokens, wall time and, when
    priced, dollars; an evaluation's grading time and test CPU)."""
    rows = source.rows
    if source.kind == "eval":
        return [histogram("hist-wall", "grading wall time (s)", rows, lambda r: r.get("wall_seconds"), fmt_seconds),
                histogram("hist-test-cpu", "test CPU (s)", rows, lambda r: field(r, "cost.test_cpu_seconds"),
                          fmt_cpu)]
    charts = [histogram("hist-steps", "steps per episode", rows, lambda r: r.get("steps"), fmt_int, integer=True),
              histogram("hist-tokens", "tokens per episode (in + out)", rows, _tokens, fmt_int, integer=True),
              histogram("hist-wall", "wall time per episode (s)", rows, lambda r: r.get("wall_seconds"), fmt_seconds)]
    if has_price:
        charts.append(histogram("hist-cost", "model cost per episode (USD)", rows, lambda r: r.get("cost_usd"),
                                fmt_cost))
    return charts


def _tokens(row: dict) -> float | None:
    ins, outs = num(row.get("tokens_in")), num(row.get("tokens_out"))
    return None if ins is None and outs is None else (ins or 0) + (outs or 0)


def _context(run_dir: Path, max_output_chars: int, max_page_chars: int) -> dict[str, Any]:
    source = read_source(run_dir)
    report, run, trajectories, predictions, notes = (source.report, source.run, source.trajectories,
                                                     source.predictions, source.notes)
    rows = source.rows
    by_traj: dict[str, dict] = {}
    for t in trajectories or []:
        by_traj[str(t.get("instance_id"))] = t  # the last line of an instance wins (a resumed run)
    by_pred = {str(p.get("instance_id")): p for p in predictions or []}
    if source.kind == "run" and isinstance(run, dict) and isinstance(run.get("tasks"), list):
        done = {str(r.get("instance_id")) for r in rows}
        pending = [t for t in run["tasks"] if str(t) not in done]
        if pending:
            notes.append(f"{len(pending):,} of {len(run['tasks']):,} requested tasks are not in report.json "
                         f"(not finished): " + ", ".join(str(t) for t in pending[:20])
                         + (" …" if len(pending) > 20 else ""))

    budget = Budget(max_output_chars, max_page_chars)
    views, seen = [], set()
    for i, row in enumerate(rows):
        iid = str(row.get("instance_id"))
        seen.add(iid)
        if trajectories is None and iid not in by_pred:
            continue
        budget.current = iid
        views.append(trajectory(i, row, by_traj.get(iid), by_pred.get(iid), budget))
    for j, (iid, traj) in enumerate((k, v) for k, v in by_traj.items() if k not in seen):
        budget.current = iid
        views.append(trajectory(len(rows) + j, traj, traj, by_pred.get(iid), budget, extra=True))
    if budget.exhausted_at is not None:
        notes.append(f"The page shows at most {max_page_chars:,} characters of trajectory text: from "
                     f"{budget.exhausted_at} on, each output is cut to {budget.small:,} characters.")
    has_price = priced(report, run)
    cols = columns(source.kind, has_price)
    css, js, csp = _assets()
    return {
        "kind": source.kind, "model": source.name,
        "css": css, "js": js, "csp": csp, "meta": run_meta(run), "notes": notes,
        "cards": cards(report, kind=source.kind, has_price=has_price),
        "columns": cols, "rows": table(rows, cols),
        "repos": rate_bars("chart-repos", "resolved rate by repository", [(source.name, "s-a")],
                           [[r] for r in repo_rates(rows)]) if rows else None,
        "charts": distributions(source, has_price),
        "has_trajectories": trajectories is not None, "trajectories": views,
    }


def render_report(run_dir: Path, *, max_output_chars: int = MAX_OUTPUT_CHARS,
                  max_page_chars: int = MAX_PAGE_CHARS) -> str:
    """The HTML report of the run directory ``run_dir`` (a self-contained page, as text).

    Each message, tool output and argument is shown up to ``max_output_chars`` (head and tail, with
    a visible "truncated" note), each diff up to ``MAX_DIFF_CHARS``; once ``max_page_chars`` of such
    text are on the page, later ones are cut to ``SMALL_OUTPUT_CHARS`` (noted at the top).

    Raises ``RunReportMissing`` (a ``FileNotFoundError``) naming ``report.json`` when it is missing,
    ``ValueError`` when it is not valid JSON; every other file may be missing or partial (noted).
    """
    # A big run makes millions of small objects that all live until the page is done: the cyclic
    # GC would walk them again and again for nothing (bench/README.md: html_report.py).
    paused = gc.isenabled()
    gc.disable()
    try:
        context = _context(Path(run_dir), max_output_chars, max_page_chars)
        text = environment().get_template("report.html.j2").render(context)
    finally:
        if paused:
            gc.enable()
    return _utf8(text)


def render_comparison(dir_a: Path, dir_b: Path) -> str:
    """The page of two runs side by side (:mod:`.compare`): each may be a run's directory or an
    evaluation's; raises as :func:`render_report` does for either."""
    css, js, csp = _assets()
    return _utf8(environment().get_template("compare.html.j2").render(
        {"c": compare(Path(dir_a), Path(dir_b)), "css": css, "js": js, "csp": csp}))


def write_comparison(dir_a: Path, dir_b: Path, output: Path) -> Path:
    """Write :func:`render_comparison` to ``output`` (atomically); returns it."""
    return _write(Path(output), render_comparison(dir_a, dir_b))


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from JSON escapes in model output
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def write_report(run_dir: Path, output: Path | None = None, **kwargs: Any) -> Path:
    """Render the report of ``run_dir`` and write it to ``output`` (default ``run_dir/report.html``);
    returns that path."""
    return _write(Path(output) if output else Path(run_dir) / "report.html", render_report(run_dir, **kwargs))
