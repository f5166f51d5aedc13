"""The HTML report of a run directory (rollouts/html_report/).

The sample run directory (tests/fixtures/run_dir_sample: three tasks, resolved / unresolved /
masked, a tool output carrying ``<script>`` and ``<img onerror>``) is rendered, then loaded in
headless Chromium (``/usr/bin/chromium``, Debian's ``chromium``): ``--dump-dom`` gives the DOM
after the page's script ran, ``--enable-logging=stderr`` prints every console message (errors,
uncaught exceptions, CSP violations) as a ``CONSOLE`` line. Without Chromium those tests skip,
unless ``PATCHGYM_REQUIRE_CHROMIUM=1``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from patchgym.rollouts.html_report import (
    MAX_OUTPUT_CHARS,
    fmt_cost,
    fmt_cpu,
    fmt_int,
    fmt_mib,
    fmt_rate,
    fmt_seconds,
    render_report,
    write_report,
)
from patchgym.rollouts.html_report import page as report_page

SAMPLE = Path(__file__).parent / "fixtures" / "run_dir_sample"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--enable-logging=stderr", "--v=0",
]
# Chromium prints console messages as `INFO:CONSOLE(12)] "..."` (older) or `INFO:CONSOLE:12] "..."`.
CONSOLE_LINE = re.compile(r":CONSOLE[(:]")
HOSTILE_ID = 'evil__"><img src=x onerror="console.error(\'id-xss\')"><script>console.error(1)</script>-1'


def sample_copy(tmp_path: Path, name: str = "run") -> Path:
    dest = tmp_path / name
    shutil.copytree(SAMPLE, dest)
    return dest


def report_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())


# --- a small DOM from Chromium's serialized output ---------------------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Node:
    def __init__(self, tag: str, attrs: dict, parent: Node | None):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self):
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def find_all(self, tag: str | None = None, **attrs) -> list[Node]:
        return [n for n in self.iter() if (tag is None or n.tag == tag)
                and all(n.attrs.get(k.rstrip("_").replace("_", "-")) == v for k, v in attrs.items())]

    def by_id(self, elem_id: str) -> Node:
        found = [n for n in self.iter() if n.attrs.get("id") == elem_id]
        assert len(found) == 1, f"{len(found)} elements with id={elem_id!r}"
        return found[0]


class TreeBuilder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.cur = Node("#document", {}, None)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: (v if v is not None else "") for k, v in attrs}, self.cur)
        self.cur.children.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, {k: (v if v is not None else "") for k, v in attrs}, self.cur))

    def handle_endtag(self, tag):
        node = self.cur
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.cur = node.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def parse(html_text: str) -> Node:
    builder = TreeBuilder()
    builder.feed(html_text)
    builder.close()
    return builder.root


# --- Chromium -----------------------------------------------------------------------------------


def need_chromium() -> None:
    if not CHROMIUM.exists():
        if os.environ.get("PATCHGYM_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"{CHROMIUM} is missing and PATCHGYM_REQUIRE_CHROMIUM=1 (apt-get install chromium)")
        pytest.skip(f"{CHROMIUM} is missing (Debian: apt-get install --no-install-recommends chromium)")


def load_pages(pages: dict[str, str], tmp: Path) -> dict[str, tuple[Node, str, list[str]]]:
    """Load each URL in its own headless Chromium, all at once: name -> (DOM, DOM text, console lines)."""
    procs = {}
    for name, url in pages.items():
        cmd = [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={tmp / ('profile-' + name)}", "--dump-dom", url]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       errors="replace", env={**os.environ, "HOME": str(tmp)})
    out = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=60)
            assert proc.returncode == 0, f"chromium failed on {name} ({proc.returncode}):\n{stderr[-3000:]}"
            assert "<html" in stdout, f"no DOM dumped for {name}:\n{stderr[-3000:]}"
            out[name] = (parse(stdout), stdout, [line for line in stderr.splitlines() if CONSOLE_LINE.search(line)])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The sample report in Chromium: as loaded, sorted by steps (two clicks: descending) and by
    instance id (one click); the sample with a hostile instance id; a page that logs a console
    error and one whose inline script a CSP blocks (the console check's positive controls)."""
    need_chromium()
    tmp = tmp_path_factory.mktemp("html")
    run = sample_copy(tmp)
    page = write_report(run).resolve().as_uri()
    evil = sample_copy(tmp, "evil")
    rep = report_json(evil)
    rep["instances"][1]["instance_id"] = HOSTILE_ID
    (evil / "report.json").write_text(json.dumps(rep))
    injected = inject_markup(sample_copy(tmp, "injected"))
    (tmp / "control.html").write_text('<!DOCTYPE html><html><body><script>console.error("control-error")</script>'
                                      "</body></html>")
    (tmp / "csp.html").write_text("<!DOCTYPE html><html><head><meta http-equiv=\"Content-Security-Policy\" "
                                  "content=\"script-src 'sha256-AAAA'\"></head><body><script>1</script></body></html>")
    started = time.monotonic()
    loaded = load_pages({
        "plain": page,
        "by_steps_desc": page + "#sort=steps,steps",
        "by_id": page + "#sort=instance_id",
        "by_cost_asc": page + "#sort=cost_usd",
        "evil": write_report(evil).resolve().as_uri(),
        "injected": write_report(injected).resolve().as_uri(),
        "control": (tmp / "control.html").resolve().as_uri(),
        "csp": (tmp / "csp.html").resolve().as_uri(),
    }, tmp)
    loaded["seconds"] = time.monotonic() - started
    loaded["report"] = report_json(run)
    return loaded


def row_ids(dom: Node) -> list[str]:
    return [tr.attrs["data-instance-id"] for tr in dom.by_id("tasks").find_all("tbody")[0].find_all("tr")]


def test_console_check_sees_errors_and_csp_violations(pages):
    """The positive controls: the CONSOLE lines this test reads do catch errors and blocked scripts."""
    assert any("control-error" in line for line in pages["control"][2]), pages["control"][2]
    assert any("Content Security Policy" in line for line in pages["csp"][2]), pages["csp"][2]


def test_renders_in_chromium_without_console_messages(pages):
    dom, text, console = pages["plain"]
    assert console == [], console
    assert dom.find_all("html")[0].attrs.get("data-report-ready") == "1", "the page's script did not finish"
    assert row_ids(dom) == [r["instance_id"] for r in pages["report"]["instances"]]
    assert len(dom.find_all("details", class_="traj")) == 3
    assert len(dom.by_id("chart-steps").find_all("rect")) == 3
    assert len(dom.by_id("chart-wall").find_all("rect")) == 3
    assert pages["seconds"] < 30, f"chromium took {pages['seconds']:.1f}s"


def test_numbers_in_the_dom_are_report_json(pages):
    dom, rep = pages["plain"][0], pages["report"]
    ids = {  # element id -> (report.json key, format)
        "resolved-rate": ("resolved_rate", fmt_rate), "resolved": ("resolved", fmt_int),
        "masked": ("masked", fmt_int), "scored": ("scored", fmt_int), "completed": ("completed", fmt_int),
        "total": ("total", fmt_int), "tokens-in": ("tokens_in", fmt_int), "tokens-out": ("tokens_out", fmt_int),
        "cost": ("cost_usd", fmt_cost), "wall-seconds": ("wall_seconds", fmt_seconds),
        "steps-total": ("steps_total", fmt_int),
    }
    for elem_id, (key, fmt) in ids.items():
        node = dom.by_id(elem_id)
        assert json.loads(node.attrs["data-value"]) == rep[key], elem_id
        assert node.text().strip() == fmt(rep[key]), elem_id
    cost_ids = {"env-cpu-seconds": ("env_cpu_seconds_mean", fmt_cpu), "test-cpu-seconds": ("test_cpu_seconds_mean", fmt_cpu),
                "peak-memory": ("peak_memory_bytes_max", fmt_mib), "env-usd-per-1k": ("usd_per_1k_episodes", fmt_cost)}
    for elem_id, (key, fmt) in cost_ids.items():
        node = dom.by_id(elem_id)
        assert json.loads(node.attrs["data-value"]) == rep["cost"][key], elem_id
        assert node.text().strip() == fmt(rep["cost"][key]), elem_id
    assert dom.by_id("model").text() == rep["model"]
    assert dom.by_id("unresolved").text() == fmt_int(rep["scored"] - rep["resolved"])
    ci = dom.by_id("ci95")
    assert json.loads(ci.attrs["data-value"]) == rep["ci95"]
    assert ci.text() == f"{fmt_rate(rep['ci95'][0])} – {fmt_rate(rep['ci95'][1])}"
    # the sample's own numbers, so a formatting change is seen too
    assert (dom.by_id("resolved-rate").text(), ci.text(), dom.by_id("cost").text()) == ("50.0%", "9.0% – 91.0%",
                                                                                        "$0.0123")
    columns = [("instance_id", str), ("outcome", str), ("end_reason", str), ("steps", fmt_int),
               ("wall_seconds", fmt_seconds), ("tokens_in", fmt_int), ("tokens_out", fmt_int),
               ("cost_usd", fmt_cost), ("cost.env_cpu_seconds", fmt_cpu), ("cost.test_cpu_seconds", fmt_cpu)]
    heads = [th.attrs["data-key"] for th in dom.by_id("tasks").find_all("th")]
    assert heads == [c for c, _ in columns]
    rows = dom.by_id("tasks").find_all("tbody")[0].find_all("tr")
    for tr, inst in zip(rows, rep["instances"], strict=True):
        cells = [td.text().strip() for td in tr.find_all("td")]
        values = [inst["cost"][key[5:]] if key.startswith("cost.") else inst[key] for key, _ in columns]
        assert cells == [fmt(v) for v, (_, fmt) in zip(values, columns, strict=True)], inst["instance_id"]
    for chart, key in (("chart-steps", "steps"), ("chart-wall", "wall_seconds")):
        bars = [json.loads(r.attrs["data-value"]) for r in dom.by_id(chart).find_all("rect")]
        assert bars == [inst[key] for inst in rep["instances"]]


def test_hostile_model_output_is_text(pages):
    for name in ("plain", "evil"):
        dom, text, console = pages[name]
        assert console == [], (name, console)
        assert len(dom.find_all("script")) == 1, name  # the report's own script only
        assert dom.find_all("img") == [], name
        assert [n for n in dom.iter() if n.attrs.get("id") == "injected"] == [], name
        assert "pwned" not in dom.find_all("title")[0].text()
        assert dom.find_all("html")[0].attrs.get("data-report-ready") == "1"
    outputs = [pre.text() for pre in pages["plain"][0].find_all("pre", class_="out")]
    assert any('<script>console.error("xss-script-ran")' in o and "<img src=x onerror=" in o for o in outputs)
    assert any('</pre></details><b id="injected">bold?</b> &amp; &lt;tag&gt;' in o for o in outputs)
    evil = pages["evil"][0]
    assert HOSTILE_ID in row_ids(evil)
    assert any(a.text() == HOSTILE_ID for a in evil.by_id("tasks").find_all("a"))


# Appended to every string of a run directory: it closes a quoted attribute and opens elements; a
# report that let any of it through as markup would show an element with the data-injected attribute.
MARKUP = """'"><b data-injected="1">&amp;</b><script data-injected="1">console.error("injected")</script>"""


def _inject(value, key: str = ""):
    """``value`` with MARKUP appended to every string in it; tool-call arguments (JSON in a string)
    are injected inside, keys too, so they still parse; run parameters and grading flags get it in
    their keys as well (the page shows those keys). Messages keep their roles (else every message
    would be one of an unknown role, and the assistant's and tools' parts of the page not reached)."""
    if isinstance(value, str) and key == "role":
        return value
    if isinstance(value, str):
        if key == "arguments":
            try:
                return json.dumps(_inject(json.loads(value), "free"))
            except json.JSONDecodeError:
                pass
        return value + MARKUP
    if isinstance(value, list):
        return [_inject(v) for v in value]
    if isinstance(value, dict):
        free = key in ("free", "params") or "tests_status" in value
        return {(k + MARKUP if free and k != "tests_status" else k): _inject(v, "free" if key == "free" else k)
                for k, v in value.items()}
    return value


def inject_markup(run: Path) -> Path:
    """Every string of ``run``'s four files with MARKUP appended."""
    for name in ("report.json", "run.json"):
        (run / name).write_text(json.dumps(_inject(json.loads((run / name).read_text()))))
    for name in ("trajectories.jsonl", "predictions.jsonl"):
        lines = (run / name).read_text().splitlines()
        (run / name).write_text("".join(json.dumps(_inject(json.loads(line))) + "\n" for line in lines if line.strip()))
    return run


def injected_elements(dom: Node) -> list[Node]:
    return [n for n in dom.iter() if "data-injected" in n.attrs]


@pytest.mark.parametrize("autoescape", [True, False], ids=["autoescape", "control-autoescape-off"])
def test_markup_in_every_string_stays_text(tmp_path, monkeypatch, autoescape):
    """Every string of the run directory carries markup: none of it becomes an element, all of it is
    text on the page. With autoescape off (the positive control) the same check sees the markup."""
    monkeypatch.setattr(report_page, "environment", functools.partial(report_page.environment, autoescape))
    run = inject_markup(sample_copy(tmp_path))
    html_text = render_report(run)
    dom = parse(html_text)
    shown = dom.text().count('<b data-injected="1">&amp;</b>')
    if not autoescape:
        assert len(injected_elements(dom)) > 50
        return
    assert injected_elements(dom) == []
    assert len(dom.find_all("script")) == 1
    assert shown > 50, shown  # the strings are on the page, as text
    assert MARKUP in dom.by_id("model").text()
    assert MARKUP in dom.by_id("tasks").find_all("a")[0].text()  # instance ids
    assert MARKUP in dom.find_all("p", class_="meta")[0].text()  # run parameters, their keys too
    assert MARKUP in dom.find_all("p", class_="flags")[0].text()  # grading flags' keys
    assert MARKUP in dom.find_all("dl", class_="args")[0].find_all("dt")[0].text()  # tool-call argument keys


def test_markup_in_every_string_stays_text_in_chromium(pages):
    dom, text, console = pages["injected"]
    assert console == [], console
    assert injected_elements(dom) == []
    assert len(dom.find_all("script")) == 1
    assert dom.find_all("html")[0].attrs.get("data-report-ready") == "1"
    assert dom.text().count('<b data-injected="1">&amp;</b>') > 50


def test_sorting_by_clicking_headers(pages):
    rep = pages["report"]
    by_steps = sorted(rep["instances"], key=lambda r: -r["steps"])
    assert row_ids(pages["by_steps_desc"][0]) == [r["instance_id"] for r in by_steps]
    assert row_ids(pages["by_id"][0]) == sorted(r["instance_id"] for r in rep["instances"])
    assert row_ids(pages["by_cost_asc"][0]) == [r["instance_id"] for r in sorted(rep["instances"],
                                                                                   key=lambda r: r["cost_usd"])]
    heads = {th.attrs["data-key"]: th.attrs.get("aria-sort") for th in pages["by_steps_desc"][0].find_all("th")}
    assert heads["steps"] == "descending" and heads["instance_id"] is None
    for name in ("by_steps_desc", "by_id", "by_cost_asc"):
        assert pages[name][2] == [], pages[name][2]
    # the plain page is not sorted: report.json order
    assert row_ids(pages["plain"][0]) == [r["instance_id"] for r in rep["instances"]]


# --- without a browser --------------------------------------------------------------------------


def test_escaped_in_the_html_text(tmp_path):
    run = sample_copy(tmp_path)
    html_text = render_report(run)
    assert html_text.count("<script") == 1 and "<img" not in html_text
    assert "&lt;script&gt;console.error(&#34;xss-script-ran&#34;)" in html_text  # markupsafe's spelling of "
    assert "Content-Security-Policy" in html_text and "http://" not in html_text.replace(
        "http://127.0.0.1:8000/v1", "").replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_write_report(tmp_path):
    run = sample_copy(tmp_path)
    path = write_report(run)
    assert path == run / "report.html" and path.read_text(encoding="utf-8") == render_report(run)


def test_missing_report_json_names_the_file(tmp_path):
    run = sample_copy(tmp_path)
    (run / "report.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"report\.json"):
        render_report(run)
    (run / "report.json").write_text('{"model": ')
    with pytest.raises(ValueError, match=r"report\.json"):
        render_report(run)


def test_missing_and_partial_files_are_noted(tmp_path):
    run = sample_copy(tmp_path)
    for name in ("trajectories.jsonl", "predictions.jsonl", "run.json"):
        (run / name).unlink()
    dom = parse(render_report(run))
    notes = dom.by_id("notes").text()
    assert "trajectories.jsonl is missing" in notes and "run.json is missing" in notes
    assert len(dom.by_id("tasks").find_all("tr")) == 1 + 3  # the table is still there

    run = sample_copy(tmp_path, "partial")
    lines = (run / "trajectories.jsonl").read_text().splitlines()
    (run / "trajectories.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:50])  # being written
    rep = report_json(run)
    rep["instances"].append({"instance_id": "late-1", "outcome": "unresolved"})  # numbers missing
    (run / "report.json").write_text(json.dumps(rep))
    dom = parse(render_report(run))
    assert "1 unreadable line skipped" in dom.by_id("notes").text()
    late = dom.find_all("details", data_instance_id="late-1")[0].text()
    assert "no trajectory recorded" in late
    masked = dom.find_all("details", data_instance_id="patchgym__tomlette-3")[0].text()
    assert "masked" in masked  # its line was cut: no trajectory, but the mask reason from report.json
    cells = [td.text() for td in dom.find_all("tr", data_instance_id="late-1")[0].find_all("td")]
    assert cells[3:] == ["—"] * 7  # steps, wall, tokens, cost, env and test CPU

    run = sample_copy(tmp_path, "ungraded")
    dom = parse(render_report(run))
    masked = dom.find_all("details", data_instance_id="patchgym__tomlette-3")[0].text()
    assert "no test results" in masked and "environment build failed" in masked


def test_big_tool_outputs_are_truncated(tmp_path):
    run = sample_copy(tmp_path)
    lines = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    huge = "HEAD" + "x" * 2_000_000 + "TAIL-END"
    lines[0]["messages"][3]["content"] = huge
    (run / "trajectories.jsonl").write_text("".join(json.dumps(t) + "\n" for t in lines))
    html_text = render_report(run)
    assert len(html_text) < 200_000
    pre = [p for p in parse(html_text).find_all("pre", class_="out") if "HEAD" in p.text()][0]
    assert pre.text().startswith("HEAD") and pre.text().endswith("TAIL-END")
    assert MAX_OUTPUT_CHARS <= len(pre.text()) < MAX_OUTPUT_CHARS + 200
    assert f"truncated: {len(huge) - MAX_OUTPUT_CHARS:,} of {len(huge):,} characters not shown" in html_text


def synthetic_run(run_dir: Path, tasks: int, steps: int, output_chars: int = 1500) -> None:
    """A run of ``tasks`` episodes of ``steps`` tool calls each (bash, then a ~``output_chars`` output)."""
    run_dir.mkdir()
    rows, out = [], []
    body = ("tests/test_mod.py::test_case PASSED <b>&</b>\n" * (output_chars // 44 + 1))[:output_chars]
    for t in range(tasks):
        iid = f"synth__repo-{t}"
        outcome = ("resolved", "unresolved", "masked")[t % 3]
        row = {"instance_id": iid, "outcome": outcome, "end_reason": "submitted", "reward": float(t % 3 == 0),
               "steps": steps, "wall_seconds": 10.0 + t % 17, "tokens_in": 1000 * steps, "tokens_out": 100 * steps,
               "cost_usd": 0.001 * steps, "cost": {"env_cpu_seconds": 1.5, "test_cpu_seconds": 2.0},
               "mask_reason": None}
        rows.append(row)
        msgs = [{"role": "system", "content": "You are an agent." * 20}, {"role": "user", "content": "issue " * 200}]
        for s in range(steps):
            msgs.append({"role": "assistant", "content": f"step {s}: let me look", "tool_calls": [
                {"id": f"c{s}", "type": "function",
                 "function": {"name": "bash", "arguments": json.dumps({"command": f"grep -rn thing src | head -{s}"})}}]})
            msgs.append({"role": "tool", "tool_call_id": f"c{s}", "content": body})
        out.append(json.dumps({**row, "model": "m", "messages": msgs, "patch": "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
                               "report": {iid: {"resolved": outcome == "resolved", "tests_status": {
                                   "FAIL_TO_PASS": {"success": ["t::a"], "failure": []},
                                   "PASS_TO_PASS": {"success": [f"t::p{i}" for i in range(50)], "failure": []}}}}}))
    (run_dir / "trajectories.jsonl").write_text("\n".join(out) + "\n")
    (run_dir / "report.json").write_text(json.dumps({
        "model": "m", "total": tasks, "completed": tasks, "resolved": tasks // 3, "masked": tasks // 3,
        "scored": tasks - tasks // 3, "resolved_rate": 0.5, "ci95": [0.45, 0.55], "tokens_in": 1, "tokens_out": 1,
        "cost_usd": 1.0, "wall_seconds": 1.0, "cost": {"env_cpu_seconds_mean": 1.0}, "steps_total": tasks * steps,
        "instances": rows}))


def test_a_big_run_renders_quickly(tmp_path):
    """500 tasks x 50 steps (1.5 kB per tool output): well under 10 s of CPU (2.5-5 s measured on a
    loaded 2-core machine; CPU time, so that other processes' load does not count)."""
    synthetic_run(tmp_path / "big", 500, 50)
    started = time.process_time()
    html_text = render_report(tmp_path / "big")
    seconds = time.process_time() - started
    assert seconds < 10, f"{seconds:.1f}s"
    dom_rows = html_text.count('<tr data-index="')
    assert dom_rows == 500


def test_the_page_has_a_text_budget(tmp_path):
    """After ``max_page_chars`` of shown text, later outputs are cut short, and the page says so."""
    synthetic_run(tmp_path / "run", 20, 10, output_chars=5_000)
    full = render_report(tmp_path / "run")
    small = render_report(tmp_path / "run", max_page_chars=100_000)
    assert "characters of trajectory text" not in full
    assert len(small) < len(full) / 2
    notes = parse(small).by_id("notes").text()
    assert "at most 100,000 characters of trajectory text: from synth__repo-" in notes
    assert "truncated: 4,000 of 5,000 characters not shown" in small
