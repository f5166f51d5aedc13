"""The HTML report of a ``patchgym run`` directory, or of a ``patchgym eval`` one: one
self-contained file, ``DIR/report.html``; and two of them side by side (:mod:`.compare`).

Reads ``run.json``, ``report.json`` (required), ``predictions.jsonl`` and ``trajectories.jsonl``
(an evaluation's: ``report.json``, ``eval.json`` and each instance's report and patch,
:mod:`.sources`) and renders a summary, the resolved rate by repository with 95% intervals,
histograms of what episodes took (steps, tokens, wall time, cost) stacked by outcome, a sortable
per-task table (with the model's invalid tool calls and format errors, and why a masked episode
was masked) and a collapsible trajectory viewer (assistant turns, tool calls, tool outputs, the
final diff, the test results). Charts have a bar per bin or per repository, never per task, so
they read at 500 tasks as at 5. Without token prices, dollars are "no price given", not $0.

Jinja2 templates (``templates/``, package data) with autoescape on: everything read from the run
directory is escaped by default (model output is hostile) and never goes into the ``<script>`` or
``<style>`` blocks, whose text is this package's ``report.js`` and ``report.css``; a hash-source CSP
lets only that script run. No network: the CSS and the little JS are inline, the charts are SVG
text. Every number of the summary, the table and the charts is the one in ``report.json``; the key
ones carry stable ids (``resolved-rate``, ``cost``, ...) and their raw value as ``data-value``.

The table sorts on a click on a header (again: the other direction). A URL fragment
``#sort=KEY[,KEY...]`` clicks those headers in order once the page has loaded (``#sort=steps,steps``:
steps descending), which is how the tests drive the sorting in headless Chromium.

Python builds plain values (``sources``, ``reading``, ``summary``, ``charts``, ``compare``,
``trajectory``, ``text``: what to show, cut to the page's text budget) and the templates say how
they look (``page`` renders).
"""

from patchgym.rollouts.html_report.formats import fmt_cost, fmt_cpu, fmt_int, fmt_mib, fmt_rate, fmt_seconds
from patchgym.rollouts.html_report.page import render_comparison, render_report, write_comparison, write_report
from patchgym.rollouts.html_report.reading import RunReportMissing
from patchgym.rollouts.html_report.text import MAX_DIFF_CHARS, MAX_OUTPUT_CHARS, MAX_PAGE_CHARS, SMALL_OUTPUT_CHARS

__all__ = ["MAX_OUTPUT_CHARS", "MAX_DIFF_CHARS", "MAX_PAGE_CHARS", "SMALL_OUTPUT_CHARS", "RunReportMissing",
           "render_comparison", "render_report", "write_comparison", "write_report", "fmt_rate", "fmt_int",
           "fmt_cost", "fmt_seconds", "fmt_cpu", "fmt_mib"]
