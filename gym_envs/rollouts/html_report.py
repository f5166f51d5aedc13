"""The HTML report of a ``patchgym run`` directory: one self-contained file, ``DIR/report.html``.

Reads ``run.json``, ``report.json`` (required), ``predictions.jsonl`` and ``trajectories.jsonl``
and renders a summary, a sortable per-task table, two inline SVG bar charts (steps and wall time
per task) and a collapsible trajectory viewer (assistant turns, tool calls, tool outputs, the final
diff, the test results).

Standard library only; no network: the CSS and the little JS are inline, the charts are SVG text.
Everything read from the run directory is escaped (model output is hostile) and never goes into
the ``<script>`` or ``<style>`` blocks. Every number of the summary, the table and the charts is
the one in ``report.json``; the key ones carry stable ids (``resolved-rate``, ``cost``, ...) and
their raw value as ``data-value``.

The table sorts on a click on a header (again: the other direction). A URL fragment
``#sort=KEY[,KEY...]`` clicks those headers in order once the page has loaded (``#sort=steps,steps``:
steps descending), which is how the tests drive the sorting in headless Chromium.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import math
from html import escape
from pathlib import Path
from typing import Any

__all__ = ["MAX_OUTPUT_CHARS", "MAX_DIFF_CHARS", "MAX_PAGE_CHARS", "SMALL_OUTPUT_CHARS", "RunReportMissing",
           "render_report", "write_report", "fmt_rate", "fmt_int", "fmt_cost", "fmt_seconds"]

MAX_OUTPUT_CHARS = 20_000  # each message / tool output shown at most this long (head and tail)
MAX_DIFF_CHARS = 200_000   # the final diff of an episode
MAX_TEST_IDS = 2_000       # test ids listed per list (PASS_TO_PASS can hold thousands)
# The whole page: once this many characters of messages, outputs and diffs are shown, every later
# one is cut to SMALL_OUTPUT_CHARS (a 500 x 50-step run of 20,000-char outputs would be ~700 MB).
MAX_PAGE_CHARS = 20_000_000
SMALL_OUTPUT_CHARS = 1_000

OUTCOMES = ("resolved", "unresolved", "masked")


class RunReportMissing(FileNotFoundError):
    """The run directory has no ``report.json`` (not a run directory, or the run has not finished)."""


# ---------------------------------------------------------------------------------------------
# Number formats: one per kind of number, used everywhere (the tests use them too).


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def fmt_rate(value: Any) -> str:
    """A fraction as a percentage with one decimal: 0.5 -> ``50.0%``."""
    v = _num(value)
    return "—" if v is None else f"{v * 100:.1f}%"


def fmt_int(value: Any) -> str:
    """A count with thousands separators: 1234 -> ``1,234``."""
    v = _num(value)
    if v is None:
        return "—"
    return f"{v:,}" if isinstance(v, int) else f"{v:,.1f}"


def fmt_cost(value: Any) -> str:
    """US dollars with four decimals: 0.0123 -> ``$0.0123``."""
    v = _num(value)
    return "—" if v is None else f"${v:,.4f}"


def fmt_seconds(value: Any) -> str:
    """Seconds with one decimal: 12.34 -> ``12.3``."""
    v = _num(value)
    return "—" if v is None else f"{v:,.1f}"


def fmt_cpu(value: Any) -> str:
    """CPU seconds with three decimals (an environment's are often under 0.1 s): 0.0812 -> ``0.081``."""
    v = _num(value)
    return "—" if v is None else f"{v:,.3f}"


def fmt_mib(value: Any) -> str:
    """Bytes in MiB, whole: 33951744 -> ``32 MiB``."""
    v = _num(value)
    return "—" if v is None else f"{v / 2**20:,.0f} MiB"


def fmt_ci(value: Any) -> str:
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_num(x) is not None for x in value):
        return f"{fmt_rate(value[0])} – {fmt_rate(value[1])}"
    return "—"


def _raw(value: Any) -> str:
    """The raw JSON value for a ``data-value`` attribute."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return "null"


# ---------------------------------------------------------------------------------------------
# Reading the run directory.


def _read_json(path: Path, notes: list[str], *, required: bool = False) -> Any:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        if required:
            raise RunReportMissing(f"{path}: no such file (not a run directory, or the run has not "
                                   f"written its report yet)") from None
        notes.append(f"{path.name} is missing" + (": no run parameters to show." if path.name == "run.json" else "."))
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if required:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        notes.append(f"{path.name} is not valid JSON ({exc}); ignored.")
        return None


def _read_jsonl(path: Path, notes: list[str]) -> list[dict] | None:
    try:
        fh = path.open(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    rows, bad = [], 0
    with fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1  # e.g. the last line of a file still being written
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                bad += 1
    if bad:
        notes.append(f"{path.name}: {bad} unreadable line{'s' if bad != 1 else ''} skipped.")
    return rows


# ---------------------------------------------------------------------------------------------
# HTML pieces.


def _e(value: Any) -> str:
    return escape(value if isinstance(value, str) else str(value), quote=True)


def _outcome_class(outcome: Any) -> str:
    return f"o-{outcome}" if outcome in OUTCOMES else "o-other"


def _clip(text: str, limit: int) -> tuple[str, str, int]:
    """(head, tail, hidden): the text cut to ``limit`` characters, 3/4 head and 1/4 tail."""
    if len(text) <= limit:
        return text, "", 0
    head_len = limit * 3 // 4
    tail_len = limit - head_len
    return text[:head_len], text[len(text) - tail_len:] if tail_len else "", len(text) - limit


class _Budget:
    """How much text the page shows: ``per`` characters per block until ``total`` is spent, then
    ``small``."""

    def __init__(self, per: int, total: int, small: int = SMALL_OUTPUT_CHARS):
        self.per, self.left, self.small = per, total, small
        self.exhausted_at: str | None = None  # the instance id whose text spent the budget

        self.current = ""  # the instance id being rendered

    def take(self, length: int, per: int | None = None) -> int:
        cap = (per or self.per) if self.left > 0 else min(self.small, per or self.per)
        self.left -= min(length, cap)
        if self.left <= 0 and self.exhausted_at is None:
            self.exhausted_at = self.current
        return cap


def _pre(text: Any, cls: str, budget: _Budget) -> str:
    if text is None:
        return '<p class="note">(no content)</p>'
    if not isinstance(text, str):
        text = _content_text(text)
    head, tail, hidden = _clip(text, budget.take(len(text)))
    if not hidden:
        return f'<pre class="{cls}">{_e(text)}</pre>'
    return (f'<p class="note truncated">truncated: {hidden:,} of {len(text):,} characters not shown '
            f'(first {len(head):,} and last {len(tail):,} shown)</p>'
            f'<pre class="{cls}">{_e(head)}<span class="cut">\n… [{hidden:,} characters not shown] …\n'
            f'</span>{_e(tail)}</pre>')


def _content_text(content: Any) -> str:
    """A message's content as text: a string, or OpenAI content parts, or anything as JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(json.dumps(part, ensure_ascii=False, default=str))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, indent=2, default=str)


def _arguments(arguments: Any, limit: _Budget) -> str:
    """Tool-call arguments pretty-printed: one entry per key, strings verbatim (a multi-line
    command or a replaced block reads as itself), other values as indented JSON."""
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return ('<p class="note">arguments are not valid JSON; shown as sent:</p>'
                    + _pre(arguments, "args", limit))
    if not isinstance(parsed, dict):
        return _pre(json.dumps(parsed, ensure_ascii=False, indent=2, default=str), "args", limit)
    if not parsed:
        return '<p class="note">(no arguments)</p>'
    out = ['<dl class="args">']
    for key, value in parsed.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2, default=str)
        out.append(f"<dt>{_e(key)}</dt><dd>{_pre(text, 'arg', limit)}</dd>")
    out.append("</dl>")
    return "".join(out)


def _diff(patch: Any, budget: _Budget) -> str:
    if not isinstance(patch, str) or not patch.strip():
        return '<p class="note">empty diff (no change to the workspace)</p>'
    head, tail, hidden = _clip(patch, budget.take(len(patch), per=MAX_DIFF_CHARS))

    def lines(text: str) -> str:
        out = []
        for line in text.splitlines(keepends=True):
            if line.startswith(("+++", "---", "diff ", "index ", "new file", "deleted file", "rename ",
                                "similarity ", "old mode", "new mode")):
                cls = "dm"
            elif line.startswith("@@"):
                cls = "dh"
            elif line.startswith("+"):
                cls = "da"
            elif line.startswith("-"):
                cls = "dd"
            else:
                cls = ""
            out.append(f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line))
        return "".join(out)

    if not hidden:
        return f'<pre class="diff">{lines(patch)}</pre>'
    return (f'<p class="note truncated">truncated: {hidden:,} of {len(patch):,} characters of the diff not '
            f'shown</p><pre class="diff">{lines(head)}<span class="cut">\n… [{hidden:,} characters not shown] …\n'
            f'</span>{lines(tail)}</pre>')


def _test_list(label: str, names: Any, cls: str, *, open_: bool) -> str:
    if not isinstance(names, list):
        return f'<div class="tl"><span class="{cls}">{_e(label)}</span>: <span class="note">n/a</span></div>'
    shown = names[:MAX_TEST_IDS]
    more = (f'<li class="note">… and {len(names) - len(shown):,} more</li>'
            if len(names) > len(shown) else "")
    items = "".join(f"<li><code>{_e(n)}</code></li>" for n in shown)
    return (f'<details class="tl"{" open" if open_ and names else ""}><summary><span class="{cls}">{_e(label)}'
            f'</span>: {len(names):,}</summary><ul>{items}{more}</ul></details>')


def _tests(traj: dict, iid: str) -> str:
    report = traj.get("report")
    if isinstance(report, dict) and iid in report and isinstance(report[iid], dict):
        inst = report[iid]
    elif isinstance(report, dict) and "tests_status" in report:
        inst = report
    elif isinstance(report, dict) and len(report) == 1 and isinstance(next(iter(report.values())), dict):
        inst = next(iter(report.values()))
    else:
        reason = traj.get("mask_reason")
        why = f" (masked: {_e(reason)})" if reason else ""
        return f'<p class="note">no test results: the episode was not graded{why}.</p>'
    out = []
    flags = [(k, v) for k, v in inst.items() if isinstance(v, (bool, int, float, str)) and k != "tests_status"]
    if flags:
        out.append('<p class="flags">' + " · ".join(
            f"{_e(k)}: <b>{_e(json.dumps(v) if not isinstance(v, str) else v)}</b>" for k, v in flags[:12]) + "</p>")
    status = inst.get("tests_status")
    if not isinstance(status, dict):
        out.append('<p class="note">the grading report has no tests_status.</p>')
        return "".join(out)
    out.append('<div class="tests">')
    for group in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        g = status.get(group)
        out.append(f'<div class="tg"><h5>{group}</h5>')
        if not isinstance(g, dict):
            out.append('<p class="note">not reported</p>')
        else:
            out.append(_test_list("failure", g.get("failure"), "t-fail", open_=True))
            out.append(_test_list("success", g.get("success"), "t-ok", open_=group == "FAIL_TO_PASS"))
        out.append("</div>")
    out.append("</div>")
    return "".join(out)


def _messages(messages: Any, limit: _Budget) -> str:
    if not isinstance(messages, list) or not messages:
        return '<p class="note">no messages recorded.</p>'
    out = []
    call_names: dict[str, str] = {}
    turn = 0
    for msg in messages:
        if not isinstance(msg, dict):
            out.append(f'<div class="msg m-other">{_pre(msg, "text", limit)}</div>')
            continue
        role = msg.get("role")
        if role == "system":
            out.append(f'<details class="msg m-system"><summary>system prompt</summary>'
                       f'{_pre(_content_text(msg.get("content")), "text", limit)}</details>')
        elif role == "user":
            out.append(f'<div class="msg m-user"><div class="who">user</div>'
                       f'{_pre(_content_text(msg.get("content")), "text", limit)}</div>')
        elif role == "assistant":
            turn += 1
            parts = [f'<div class="msg m-assistant"><div class="who">assistant · turn {turn}</div>']
            content = msg.get("content")
            if content not in (None, ""):
                parts.append(_pre(_content_text(content), "text", limit))
            calls = msg.get("tool_calls") or []
            if not isinstance(calls, list):
                calls = []
            if not calls and content in (None, ""):
                parts.append('<p class="note">(empty turn: no text, no tool call)</p>')
            for call in calls:
                if not isinstance(call, dict):
                    continue
                fn = call.get("function") if isinstance(call.get("function"), dict) else {}
                name = fn.get("name", "?")
                if isinstance(call.get("id"), str):
                    call_names[call["id"]] = str(name)
                parts.append(f'<div class="call"><div class="cn">→ tool call <code>{_e(name)}</code>'
                             f'<span class="cid">{_e(call.get("id", ""))}</span></div>'
                             f'{_arguments(fn.get("arguments"), limit)}</div>')
            parts.append("</div>")
            out.append("".join(parts))
        elif role == "tool":
            cid = msg.get("tool_call_id", "")
            name = call_names.get(cid, "") if isinstance(cid, str) else ""
            out.append(f'<div class="msg m-tool"><div class="who">tool output'
                       f'{" · <code>" + _e(name) + "</code>" if name else ""}'
                       f'<span class="cid">{_e(cid)}</span></div>'
                       f'{_pre(_content_text(msg.get("content")), "out", limit)}</div>')
        else:
            out.append(f'<div class="msg m-other"><div class="who">{_e(role)}</div>'
                       f'{_pre(_content_text(msg.get("content", msg)), "text", limit)}</div>')
    return "".join(out)


def _ticks(vmax: float, integer: bool) -> tuple[float, int]:
    """(step, count): axis ticks 0, step, ..., count*step covering ``vmax`` (1/2/2.5/5 x 10^k steps,
    whole numbers only for counts)."""
    if vmax <= 0:
        return 1.0, 1
    raw = vmax / 4
    mag = 10 ** math.floor(math.log10(raw))
    for m in ((1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)):
        step = m * mag
        if step >= raw and (not integer or step >= 1):
            break
    if integer:
        step = max(1, round(step))
    return step, max(1, math.ceil(vmax / step - 1e-9))


def _bar_chart(chart_id: str, title: str, rows: list[dict], key: str, fmt, unit: str) -> str:
    if not rows:
        return f'<figure class="chart"><figcaption>{_e(title)}</figcaption><p class="note">no tasks</p></figure>'
    n = len(rows)
    bw = max(3, min(40, 900 // n))
    gap = 1 if bw < 8 else 2
    left, right, top, bottom, plot_h = 56, 10, 10, 24, 170
    width, height = max(300, left + n * bw + right), top + plot_h + bottom
    values = [_num(r.get(key)) for r in rows]
    step, count = _ticks(max((v for v in values if v is not None), default=0), integer=fmt is fmt_int)
    vmax = step * count
    out = [f'<figure class="chart"><figcaption>{_e(title)}</figcaption><div class="scroll">'
           f'<svg id="{chart_id}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">']
    for i in range(count + 1):
        gv = step * i
        y = top + plot_h - plot_h * i / count
        out.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="axis" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{_e(fmt(gv))}</text>')
    for i, (row, v) in enumerate(zip(rows, values, strict=True)):
        h = 0.0 if v is None else plot_h * v / vmax
        x = left + i * bw
        label = f"{row.get('instance_id', '?')}: {fmt(v)}{unit if v is not None else ''}"
        out.append(f'<rect class="bar {_outcome_class(row.get("outcome"))}" x="{x}" y="{top + plot_h - h:.1f}" '
                   f'width="{max(1, bw - gap)}" height="{h:.1f}" data-value="{_e(_raw(row.get(key)))}">'
                   f'<title>{_e(label)}</title></rect>')
    out.append(f'<text class="axis" x="{left}" y="{height - 6}">tasks, in table order ({n:,})</text>')
    out.append("</svg></div></figure>")
    return "".join(out)


# ---------------------------------------------------------------------------------------------

CSS = """
:root{--ok:#1a7f37;--bad:#cf222e;--mask:#6e7781;--fg:#1f2328;--mute:#656d76;--line:#d0d7de;--bg2:#f6f8fa}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);margin:0 auto;
 padding:16px 24px 48px;max-width:1400px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid var(--line)}
h5{margin:4px 0;font-size:13px}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:var(--bg2);border:1px solid var(--line);border-radius:4px;padding:6px 8px;margin:4px 0;
 white-space:pre-wrap;overflow-wrap:anywhere;max-height:480px;overflow:auto}
.note{color:var(--mute);font-style:italic;margin:4px 0}.truncated{color:#9a6700;font-style:normal;font-weight:600}
.notes li{color:#9a6700}
.cards{display:flex;flex-wrap:wrap;gap:8px;margin:12px 0}
.card{border:1px solid var(--line);border-radius:6px;padding:8px 12px;min-width:120px}
.card .k{color:var(--mute);font-size:12px}.card .v{font-size:18px;font-weight:600}
.card .s{color:var(--mute);font-size:12px}
.meta{color:var(--mute);font-size:12px}.meta code{color:var(--fg)}
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
#tasks th{cursor:pointer;user-select:none;background:var(--bg2);position:sticky;top:0}
#tasks th[aria-sort=ascending]::after{content:" ▲"}#tasks th[aria-sort=descending]::after{content:" ▼"}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;color:#fff;background:var(--mask)}
.badge.o-resolved{background:var(--ok)}.badge.o-unresolved{background:var(--bad)}
.charts{display:flex;flex-wrap:wrap;gap:16px}.chart{margin:0;flex:1 1 520px;min-width:0}
.chart figcaption{font-weight:600;margin-bottom:4px}.scroll{overflow-x:auto}
svg .grid{stroke:#eaeef2}svg .axis{font-size:10px;fill:var(--mute)}
svg .bar.o-resolved{fill:var(--ok)}svg .bar.o-unresolved{fill:var(--bad)}
svg .bar.o-masked,svg .bar.o-other{fill:var(--mask)}
.legend span{margin-right:12px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
details.traj{border:1px solid var(--line);border-radius:6px;margin:6px 0;padding:0 10px}
details.traj>summary{cursor:pointer;padding:6px 0;font-weight:600}
details.traj[open]>summary{border-bottom:1px solid var(--line);margin-bottom:6px}
.msg{margin:8px 0;padding-left:8px;border-left:3px solid var(--line)}
.m-assistant{border-left-color:#0969da}.m-tool{border-left-color:#8250df}.m-user{border-left-color:#9a6700}
.who{font-size:12px;color:var(--mute);font-weight:600}.cid{margin-left:8px;color:var(--mute);font-size:11px}
.call{margin:4px 0 4px 8px}.cn{font-size:12px}dl.args{margin:2px 0 2px 12px}dl.args dt{font-size:12px;color:var(--mute)}
dl.args dd{margin:0}
pre.diff .da{color:var(--ok);background:#dafbe1}pre.diff .dd{color:var(--bad);background:#ffebe9}
pre.diff .dh{color:#0969da}pre.diff .dm{color:var(--mute);font-weight:600}.cut{color:#9a6700;font-weight:600}
.tests{display:flex;gap:24px;flex-wrap:wrap}.tg{min-width:280px}.t-ok{color:var(--ok);font-weight:600}
.t-fail{color:var(--bad);font-weight:600}.tl ul{margin:2px 0;padding-left:20px;max-height:240px;overflow:auto}
.flags{font-size:12px;color:var(--mute)}
"""

# No data from the run directory ever goes in here.
JS = r"""
(function () {
  "use strict";
  var table = document.getElementById("tasks");
  if (table && table.tHead && table.tBodies.length) {
    var body = table.tBodies[0];
    var heads = table.tHead.rows[0].cells;
    var keyOf = function (td, num) {
      var v = td ? td.getAttribute("data-sort") : null;
      if (!num) { return v === null ? "" : v; }
      var x = parseFloat(v);
      return isNaN(x) ? null : x;
    };
    var sortBy = function (col) {
      var th = heads[col];
      var num = th.getAttribute("data-type") === "num";
      var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
      for (var i = 0; i < heads.length; i++) { heads[i].removeAttribute("aria-sort"); }
      th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = keyOf(a.cells[col], num), y = keyOf(b.cells[col], num), c;
        if (num) {
          if (x === null || y === null) { c = (x === null) - (y === null); }  // blanks last, both ways
          else { c = dir * (x < y ? -1 : x > y ? 1 : 0); }
        } else { c = dir * x.localeCompare(y); }
        return c || (+a.getAttribute("data-index") - +b.getAttribute("data-index"));
      });
      var frag = document.createDocumentFragment();
      rows.forEach(function (r) { frag.appendChild(r); });
      body.appendChild(frag);
    };
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener("click", function () { sortBy(col); });
      th.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); sortBy(col); }
      });
    });
    var m = /^#sort=([A-Za-z0-9_.,-]+)$/.exec(location.hash);
    if (m) {
      m[1].split(",").forEach(function (key) {
        var th = table.tHead.querySelector('th[data-key="' + key + '"]');
        if (th) { th.click(); }
      });
    }
  }
  document.documentElement.setAttribute("data-report-ready", "1");
})();
"""

# Only this script may run (a hash-source CSP): even an escaping bug could not run model output.
_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-"
        + base64.b64encode(hashlib.sha256(JS.encode("utf-8")).digest()).decode("ascii") + "'")

COLUMNS = [  # (key, header, numeric, format)
    ("instance_id", "instance", False, None),
    ("outcome", "outcome", False, None),
    ("end_reason", "end reason", False, None),
    ("steps", "steps", True, fmt_int),
    ("wall_seconds", "wall s", True, fmt_seconds),
    ("tokens_in", "tokens in", True, fmt_int),
    ("tokens_out", "tokens out", True, fmt_int),
    ("cost_usd", "cost", True, fmt_cost),
    ("cost.env_cpu_seconds", "env CPU s", True, fmt_cpu),
    ("cost.test_cpu_seconds", "test CPU s", True, fmt_cpu),
]


def _field(row: dict, key: str) -> Any:
    """``row[key]``, or for ``a.b`` the ``b`` of ``row["a"]`` (the episode's environment cost)."""
    head, _, rest = key.partition(".")
    value = row.get(head)
    return (value.get(rest) if isinstance(value, dict) else None) if rest else value


def _card(elem_id: str, label: str, value: Any, text: str, sub: str = "") -> str:
    return (f'<div class="card"><div class="k">{_e(label)}</div>'
            f'<div class="v" id="{elem_id}" data-value="{_e(_raw(value))}">{_e(text)}</div>'
            f'{f"<div class=s>{sub}</div>" if sub else ""}</div>')


def _summary(report: dict) -> str:
    resolved, masked, scored = report.get("resolved"), report.get("masked"), report.get("scored")
    unresolved = report.get("unresolved")
    if unresolved is None and _num(scored) is not None and _num(resolved) is not None:
        unresolved = scored - resolved
    ci = report.get("ci95")
    cards = [
        _card("resolved-rate", "resolved rate (of scored)", report.get("resolved_rate"),
              fmt_rate(report.get("resolved_rate")),
              f'95% CI <span id="ci95" data-value="{_e(_raw(ci))}">{_e(fmt_ci(ci))}</span>'),
        _card("resolved", "resolved", resolved, fmt_int(resolved)),
        _card("unresolved", "unresolved", unresolved, fmt_int(unresolved)),
        _card("masked", "masked", masked, fmt_int(masked)),
        _card("scored", "scored", scored, fmt_int(scored)),
        _card("completed", "completed / total", report.get("completed"), fmt_int(report.get("completed")),
              f'of <span id="total" data-value="{_e(_raw(report.get("total")))}">'
              f'{_e(fmt_int(report.get("total")))}</span>'),
        _card("tokens-in", "tokens in", report.get("tokens_in"), fmt_int(report.get("tokens_in"))),
        _card("tokens-out", "tokens out", report.get("tokens_out"), fmt_int(report.get("tokens_out"))),
        _card("cost", "cost (USD)", report.get("cost_usd"), fmt_cost(report.get("cost_usd"))),
        _card("wall-seconds", "wall time (s)", report.get("wall_seconds"), fmt_seconds(report.get("wall_seconds"))),
        *_cost_cards(report.get("cost") if isinstance(report.get("cost"), dict) else {}),
        _card("steps-total", "steps", report.get("steps_total"), fmt_int(report.get("steps_total"))),
    ]
    return '<div class="cards">' + "".join(cards) + "</div>"


def _cost_cards(cost: dict) -> list[str]:
    """What the environment spent per episode (report.json's ``cost``, gym_envs.grading.cost)."""
    cards = [("env-cpu-seconds", "env CPU per episode (s)", "env_cpu_seconds_mean", fmt_cpu),
             ("test-cpu-seconds", "test CPU per episode (s)", "test_cpu_seconds_mean", fmt_cpu),
             ("peak-memory", "peak memory (largest)", "peak_memory_bytes_max", fmt_mib),
             ("env-usd-per-1k", "environment $ per 1,000 episodes", "usd_per_1k_episodes", fmt_cost)]
    return [_card(elem_id, label, cost.get(key), fmt(cost.get(key))) for elem_id, label, key, fmt in cards]


def _run_meta(run: Any, report: dict) -> str:
    if not isinstance(run, dict):
        return ""  # the notes say why
    bits = []
    if run.get("base_url"):
        bits.append(f"endpoint <code>{_e(run['base_url'])}</code>")
    started = _num(run.get("started_at"))
    if started is not None:
        try:
            when = _dt.datetime.fromtimestamp(started, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            bits.append(f'started <span id="started-at" data-value="{_e(_raw(started))}">{when}</span>')
        except (OverflowError, OSError, ValueError):
            pass
    price = run.get("price")
    if isinstance(price, dict):
        bits.append(f"price <code>${_e(price.get('input_per_mtok', '?'))}</code> / Mtok in, "
                    f"<code>${_e(price.get('output_per_mtok', '?'))}</code> / Mtok out")
    params = run.get("params")
    if isinstance(params, dict) and params:
        bits.append("params " + ", ".join(
            f"{_e(k)}=<code>{_e(json.dumps(v, ensure_ascii=False, default=str))}</code>" for k, v in params.items()))
    tasks = run.get("tasks")
    if isinstance(tasks, list):
        bits.append(f"{len(tasks):,} task{'s' if len(tasks) != 1 else ''} requested")
    return '<p class="meta">' + " · ".join(bits) + "</p>" if bits else ""


def _table(rows: list[dict]) -> str:
    head = "".join(
        f'<th data-key="{key}" data-type="{"num" if num else "str"}" tabindex="0"'
        f'{" class=n" if num else ""} title="sort by {label}">{label}</th>'
        for key, label, num, _ in COLUMNS)
    body = []
    for i, row in enumerate(rows):
        cells = []
        for key, _label, num, fmt in COLUMNS:
            value = _field(row, key)
            if key == "instance_id":
                cells.append(f'<td data-sort="{_e(value if value is not None else "")}">'
                             f'<a href="#traj-{i}">{_e(value if value is not None else "?")}</a></td>')
            elif key == "outcome":
                cells.append(f'<td data-sort="{_e(value or "")}"><span class="badge {_outcome_class(value)}">'
                             f'{_e(value or "—")}</span></td>')
            elif num:
                v = _num(value)
                cells.append(f'<td class="n" data-sort="{"" if v is None else _e(repr(v))}">{_e(fmt(value))}</td>')
            else:
                cells.append(f'<td data-sort="{_e(value or "")}">{_e(value or "—")}</td>')
        body.append(f'<tr data-index="{i}" data-instance-id="{_e(row.get("instance_id", ""))}">{"".join(cells)}</tr>')
    return f'<table id="tasks"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _trajectory(i: int, row: dict, traj: dict | None, prediction: dict | None, limit: _Budget,
                extra: bool = False) -> str:
    iid = str(row.get("instance_id", "?"))
    outcome = row.get("outcome")
    summary = (f'<summary><code>{_e(iid)}</code> <span class="badge {_outcome_class(outcome)}">{_e(outcome or "—")}'
               f'</span> {_e(row.get("end_reason") or "")} · {fmt_int(row.get("steps"))} '
               f'step{"" if row.get("steps") == 1 else "s"} · '
               f'{fmt_seconds(row.get("wall_seconds"))} s{" · not in report.json" if extra else ""}</summary>')
    parts = [f'<details class="traj" id="traj-{i}" data-instance-id="{_e(iid)}">', summary]
    if row.get("mask_reason"):
        parts.append(f'<p class="note">masked: {_e(row["mask_reason"])}</p>')
    if traj is None:
        parts.append('<p class="note">no trajectory recorded for this task (trajectories.jsonl has no line '
                     'for it).</p>')
        if prediction is not None:
            parts.append("<h4>predicted patch (predictions.jsonl)</h4>"
                         + _diff(prediction.get("model_patch"), limit))
        parts.append("</details>")
        return "".join(parts)
    parts.append("<h4>conversation</h4>")
    parts.append(_messages(traj.get("messages"), limit))
    parts.append("<h4>final diff</h4>")
    patch = traj.get("patch")
    if patch is None and prediction is not None:
        patch = prediction.get("model_patch")
    parts.append(_diff(patch, limit))
    parts.append("<h4>tests</h4>")
    parts.append(_tests(traj, iid))
    parts.append("</details>")
    return "".join(parts)


def render_report(run_dir: Path, *, max_output_chars: int = MAX_OUTPUT_CHARS,
                  max_page_chars: int = MAX_PAGE_CHARS) -> str:
    """The HTML report of the run directory ``run_dir`` (a self-contained page, as text).

    Each message, tool output and argument is shown up to ``max_output_chars`` (head and tail, with
    a visible "truncated" note), each diff up to ``MAX_DIFF_CHARS``; once ``max_page_chars`` of such
    text are on the page, later ones are cut to ``SMALL_OUTPUT_CHARS`` (noted at the top).

    Raises ``RunReportMissing`` (a ``FileNotFoundError``) naming ``report.json`` when it is missing,
    ``ValueError`` when it is not valid JSON; every other file may be missing or partial (noted).
    """
    run_dir = Path(run_dir)
    notes: list[str] = []
    report = _read_json(run_dir / "report.json", notes, required=True)
    if not isinstance(report, dict):
        raise ValueError(f"{run_dir / 'report.json'}: not a JSON object")
    run = _read_json(run_dir / "run.json", notes)
    trajectories = _read_jsonl(run_dir / "trajectories.jsonl", notes)
    if trajectories is None:
        notes.append("trajectories.jsonl is missing (no episode finished yet?): no trajectories to show.")
    predictions = _read_jsonl(run_dir / "predictions.jsonl", notes)
    if predictions is None:
        notes.append("predictions.jsonl is missing.")

    rows = [r for r in (report.get("instances") or []) if isinstance(r, dict)]
    if not isinstance(report.get("instances"), list):
        notes.append("report.json has no instances list: no per-task rows.")
    by_traj: dict[str, dict] = {}
    for t in trajectories or []:
        by_traj[str(t.get("instance_id"))] = t  # the last line of an instance wins (a resumed run)
    by_pred = {str(p.get("instance_id")): p for p in predictions or []}
    if isinstance(run, dict) and isinstance(run.get("tasks"), list):
        done = {str(r.get("instance_id")) for r in rows}
        pending = [t for t in run["tasks"] if str(t) not in done]
        if pending:
            notes.append(f"{len(pending):,} of {len(run['tasks']):,} requested tasks are not in report.json "
                         f"(not finished): " + ", ".join(str(t) for t in pending[:20])
                         + (" …" if len(pending) > 20 else ""))

    model = report.get("model") or (run.get("model") if isinstance(run, dict) else None) or "?"
    out = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
           '<meta name="viewport" content="width=device-width,initial-scale=1">'
           f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
           f"<title>patchgym run · {_e(model)}</title><style>{CSS}</style></head><body>"]
    out.append(f'<h1>patchgym run · <span id="model">{_e(model)}</span></h1>')
    out.append(_run_meta(run, report))
    notes_at = len(out)
    out.append("")  # the notes, once the trajectories have added theirs
    out.append(_summary(report))

    out.append("<h2>Tasks</h2>")
    out.append(_table(rows) if rows else '<p class="note">no tasks in report.json.</p>')

    out.append("<h2>Charts</h2>")
    out.append('<div class="legend"><span><i style="background:#1a7f37"></i>resolved</span>'
               '<span><i style="background:#cf222e"></i>unresolved</span>'
               '<span><i style="background:#6e7781"></i>masked</span></div>')
    out.append('<div class="charts">')
    out.append(_bar_chart("chart-steps", "steps per task", rows, "steps", fmt_int, " steps"))
    out.append(_bar_chart("chart-wall", "wall time per task (s)", rows, "wall_seconds", fmt_seconds, " s"))
    out.append("</div>")

    out.append('<h2>Trajectories</h2><div id="trajectories">')
    if trajectories is None:
        out.append('<p class="note">trajectories.jsonl is missing: no trajectories to show.</p>')
    budget = _Budget(max_output_chars, max_page_chars)
    seen = set()
    for i, row in enumerate(rows):
        iid = str(row.get("instance_id"))
        seen.add(iid)
        if trajectories is None and iid not in by_pred:
            continue
        budget.current = iid
        out.append(_trajectory(i, row, by_traj.get(iid), by_pred.get(iid), budget))
    for j, (iid, traj) in enumerate((k, v) for k, v in by_traj.items() if k not in seen):
        budget.current = iid
        out.append(_trajectory(len(rows) + j, traj, traj, by_pred.get(iid), budget, extra=True))
    out.append("</div>")
    if budget.exhausted_at is not None:
        notes.append(f"The page shows at most {max_page_chars:,} characters of trajectory text: from "
                     f"{budget.exhausted_at} on, each output is cut to {budget.small:,} characters.")
    if notes:
        out[notes_at] = '<ul class="notes" id="notes">' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>"
    out.append(f"<script>{JS}</script></body></html>")
    text = "".join(out)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from JSON escapes in model output
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def write_report(run_dir: Path, **kwargs: Any) -> Path:
    """Render the report of ``run_dir`` and write it to ``run_dir/report.html``; returns that path."""
    run_dir = Path(run_dir)
    path = run_dir / "report.html"
    text = render_report(run_dir, **kwargs)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
