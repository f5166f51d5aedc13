"""The HTML report of a ``patchgym run`` directory: one self-contained file, ``DIR/report.html``.

Reads ``run.json``, ``report.json`` (required), ``predictions.jsonl`` and ``trajectories.jsonl``
and renders a summary, a sortable per-task table, two inline SVG bar charts (steps and wall time
per task) and a collapsible trajectory viewer (assistant turns, tool calls, tool outputs, the final
diff, the test results).

Jinja2 templates (``templates/``, package data) with autoescape on: everything read from the run
directory is escaped by default (model output is hostile) and never goes into the ``<script>`` or
``<style>`` blocks, whose text is this package's ``report.js`` and ``report.css``; a hash-source CSP
lets only that script run. No network: the CSS and the little JS are inline, the charts are SVG
text. Every number of the summary, the table and the charts is the one in ``report.json``; the key
ones carry stable ids (``resolved-rate``, ``cost``, ...) and their raw value as ``data-value``.

The table sorts on a click on a header (again: the other direction). A URL fragment
``#sort=KEY[,KEY...]`` clicks those headers in order once the page has loaded (``#sort=steps,steps``:
steps descending), which is how the tests drive the sorting in headless Chromium.

Python builds plain values (``reading``, ``summary``, ``charts``, ``trajectory``, ``text``: what to
show, cut to the page's text budget) and the templates say how they look (``page`` renders).
"""

from patchgym.rollouts.html_report.formats import fmt_cost, fmt_cpu, fmt_int, fmt_mib, fmt_rate, fmt_seconds
from patchgym.rollouts.html_report.page import render_report, write_report
from patchgym.rollouts.html_report.reading import RunReportMissing
from patchgym.rollouts.html_report.text import MAX_DIFF_CHARS, MAX_OUTPUT_CHARS, MAX_PAGE_CHARS, SMALL_OUTPUT_CHARS

__all__ = ["MAX_OUTPUT_CHARS", "MAX_DIFF_CHARS", "MAX_PAGE_CHARS", "SMALL_OUTPUT_CHARS", "RunReportMissing",
           "render_report", "write_report", "fmt_rate", "fmt_int", "fmt_cost", "fmt_seconds", "fmt_cpu", "fmt_mib"]
