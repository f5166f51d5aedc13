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
    write_comparison,
    write_report,
)
from patchgym.rollouts.html_report import page as report_page
from patchgym.rollouts.stats import wilson

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


@pytest.fixture(scope="module")
def scale_pages(tmp_path_factory):
    """A run of 500 episodes over a dozen repositories (sorted by invalid tool calls, descending),
    and it beside a second run of the same tasks (sorted by A's steps), in Chromium."""
    need_chromium()
    tmp = tmp_path_factory.mktemp("scale")
    synthetic_run(tmp / "big", 500, 4, output_chars=200, varied=True, seed=1)
    synthetic_run(tmp / "big-b", 500, 4, output_chars=200, varied=True, seed=2)
    compared = write_comparison(tmp / "big", tmp / "big-b", tmp / "compare.html").resolve().as_uri()
    loaded = load_pages({"big": write_report(tmp / "big").resolve().as_uri() + "#sort=invalid_calls,invalid_calls",
                         "compare": compared + "#sort=steps_a"}, tmp)
    loaded["big_dir"] = tmp / "big"
    return loaded


def test_500_episodes_read_as_distributions(scale_pages):
    """500 episodes over a dozen repositories: a row per repository with its interval, histograms
    whose bars count every task, the slips per episode in the table (sorted by them, descending),
    and every number the one in report.json."""
    pages = scale_pages
    dom, text, console = pages["big"]
    assert console == [] and dom.find_all("html")[0].attrs.get("data-report-ready") == "1"
    rep = json.loads((pages["big_dir"] / "report.json").read_text())
    rows = rep["instances"]
    assert len(row_ids(dom)) == 500
    repos = dom.by_id("chart-repos").find_all("g")
    assert len(repos) == len({r["repo"] for r in rows}) == 12
    django = [g for g in repos if g.attrs["data-repo"] == "django/django"][0]
    scored = [r for r in rows if r["repo"] == "django/django" and r["outcome"] != "masked"]
    resolved = sum(r["outcome"] == "resolved" for r in scored)
    assert json.loads(django.find_all("rect")[0].attrs["data-value"]) == round(resolved / len(scored), 4)
    assert f"{resolved}/{len(scored)} = {fmt_rate(resolved / len(scored))}" in django.text()
    for chart in ("hist-steps", "hist-tokens", "hist-wall", "hist-cost"):
        bars = dom.by_id(chart).find_all("rect")
        assert sum(int(b.attrs["data-count"]) for b in bars) == 500, chart
        resolved_bars = [b for b in bars if "o-resolved" in b.attrs["class"]]
        assert sum(int(b.attrs["data-count"]) for b in resolved_bars) == rep["resolved"], chart
    slips = [int(tr.find_all("td")[5].text()) for tr in dom.by_id("tasks").find_all("tbody")[0].find_all("tr")]
    assert slips == sorted((r["invalid_calls"] for r in rows), reverse=True)
    assert dom.by_id("invalid-calls").text() == fmt_int(rep["invalid_calls_total"]) and rep["invalid_calls_total"] > 0
    assert dom.by_id("format-errors").text() == fmt_int(rep["format_errors_total"])
    masked = [r for r in rows if r["outcome"] == "masked"]
    assert masked and all(r["mask_reason"] in text for r in masked[:1])


def test_two_runs_side_by_side(scale_pages):
    """The comparison of two runs of the same 500 tasks: the paired difference and its interval
    (Newcombe's, from rollouts.stats), a row per task, the changed ones first."""
    from patchgym.rollouts.stats import paired_difference

    pages = scale_pages
    dom, text, console = pages["compare"]
    assert console == [] and dom.find_all("html")[0].attrs.get("data-report-ready") == "1"
    a = {r["instance_id"]: r for r in json.loads((pages["big_dir"] / "report.json").read_text())["instances"]}
    b = {r["instance_id"]: r for r in json.loads((pages["big_dir"].parent / "big-b" / "report.json").read_text()
                                                 )["instances"]}
    paired = [i for i in a if a[i]["outcome"] != "masked" and b[i]["outcome"] != "masked"]
    p = paired_difference([a[i]["outcome"] == "resolved" for i in paired],
                          [b[i]["outcome"] == "resolved" for i in paired])
    assert json.loads(dom.by_id("paired").attrs["data-value"]) == p.n == len(paired)
    assert json.loads(dom.by_id("difference").attrs["data-value"]) == round(p.difference, 6)
    assert json.loads(dom.by_id("difference-ci").attrs["data-value"]) == [round(x, 6) for x in p.ci95]
    assert dom.by_id("only-a").text() == str(p.only_a) and dom.by_id("only-b").text() == str(p.only_b)
    assert len(dom.by_id("tasks").find_all("tbody")[0].find_all("tr")) == 500
    steps = [tr.find_all("td")[5].attrs["data-sort"] for tr in dom.by_id("tasks").find_all("tbody")[0].find_all("tr")]
    assert [int(x) for x in steps] == sorted(int(x) for x in steps), "sorted by A's steps (#sort=steps_a)"
    assert len(dom.by_id("chart-repos").find_all("g")) == 2 * 12  # a bar per run per repository


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
    for chart in ("hist-steps", "hist-tokens", "hist-wall", "hist-cost"):
        assert sum(int(r.attrs["data-count"]) for r in dom.by_id(chart).find_all("rect")) == 3, chart
    assert len(dom.by_id("chart-repos").find_all("g")) == 3  # three repositories, a bar each
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
    text = str
    columns = [("instance_id", text), ("repo", text), ("outcome", text), ("end_reason", text), ("steps", fmt_int),
               ("invalid_calls", fmt_int), ("format_errors", fmt_int), ("wall_seconds", fmt_seconds),
               ("tokens_in", fmt_int), ("tokens_out", fmt_int), ("cost_usd", fmt_cost),
               ("cost.env_cpu_seconds", fmt_cpu), ("cost.test_cpu_seconds", fmt_cpu), ("mask_reason", text)]
    heads = [th.attrs["data-key"] for th in dom.by_id("tasks").find_all("th")]
    assert heads == [c for c, _ in columns]
    rows = dom.by_id("tasks").find_all("tbody")[0].find_all("tr")
    repos = {"patchgym__semverkit-1": "patchgym/semverkit", "patchgym__calc-2": "patchgym/calc",
             "patchgym__tomlette-3": "patchgym/tomlette"}  # the sample's rows predate "repo": from their ids
    for tr, inst in zip(rows, rep["instances"], strict=True):
        cells = [td.text().strip() for td in tr.find_all("td")]
        row = {**inst, "repo": repos[inst["instance_id"]]}
        values = [row["cost"][key[5:]] if key.startswith("cost.") else row.get(key) for key, _ in columns]
        expected = [("" if v is None else v) if fmt is text else fmt(v) for v, (_, fmt) in zip(values, columns,
                                                                                               strict=True)]
        assert cells == expected, inst["instance_id"]
    assert rows[2].find_all("td", class_="why")[0].text() == rep["instances"][2]["mask_reason"]


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
    assert cells[4:] == ["—"] * 9 + [""]  # steps, slips, wall, tokens, cost, env and test CPU; no mask reason

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


REPOS = ("django/django", "sympy/sympy", "scikit-learn/scikit-learn", "sphinx-doc/sphinx", "pytest-dev/pytest",
         "matplotlib/matplotlib", "astropy/astropy", "pydata/xarray", "pylint-dev/pylint", "psf/requests",
         "pallets/flask", "mwaskom/seaborn")


def synthetic_run(run_dir: Path, tasks: int, steps: int, output_chars: int = 1500, *, varied: bool = False,
                  seed: int = 0) -> None:
    """A run of ``tasks`` episodes of ``steps`` tool calls each (bash, then a ~``output_chars`` output).
    ``varied``: as a real run looks, tasks over a dozen repositories of uneven size and skill,
    1..``steps`` tool calls each, tokens, wall time and cost to match, some refused tool calls and
    format errors, masked episodes with their reasons (``seed`` picks them: two seeds are two runs
    of the same tasks)."""
    import random

    rng = random.Random(seed)
    run_dir.mkdir()
    rows, out = [], []
    body = ("tests/test_mod.py::test_case PASSED <b>&</b>\n" * (output_chars // 44 + 1))[:output_chars]
    for t in range(tasks):
        # the same task (and repository) under every seed, so that two seeds are two runs of one task set
        repo = REPOS[min(len(REPOS) - 1, int(random.Random(t).expovariate(0.35)))] if varied else "synth/repo"
        iid = f"{repo.replace('/', '__')}-{t}"
        if varied:
            skill = 0.25 + 0.5 * REPOS.index(repo) / len(REPOS)
            outcome = "masked" if rng.random() < 0.04 else "resolved" if rng.random() < skill else "unresolved"
            n = max(1, min(steps, int(rng.lognormvariate(2.8, 0.5))))
        else:
            outcome, n = ("resolved", "unresolved", "masked")[t % 3], steps
        tokens_in = 1000 * n + (rng.randrange(20_000) if varied else 0)
        row = {"instance_id": iid, "repo": repo, "outcome": outcome,
               "end_reason": "model_error" if outcome == "masked" and varied else "submitted",
               "reward": float(outcome == "resolved"), "steps": n, "turns": n,
               "invalid_calls": rng.choice((0, 0, 0, 1, 2)) if varied else 0,
               "format_errors": rng.choice((0, 0, 0, 0, 1)) if varied else 0,
               "wall_seconds": round(rng.lognormvariate(4.5, 0.6), 1) if varied else 10.0 + t % 17,
               "tokens_in": tokens_in, "tokens_out": 100 * n, "cost_usd": round((tokens_in * 3 + 100 * n * 15) / 1e6, 6),
               "cost": {"env_cpu_seconds": 1.5, "test_cpu_seconds": 2.0},
               "mask_reason": ("the model answered 503: {'error': 'overloaded'} (after 5 attempts)"
                               if outcome == "masked" and varied else None)}
        rows.append(row)
        msgs = [{"role": "system", "content": "You are an agent." * 20}, {"role": "user", "content": "issue " * 200}]
        for s in range(n):
            msgs.append({"role": "assistant", "content": f"step {s}: let me look", "tool_calls": [
                {"id": f"c{s}", "type": "function",
                 "function": {"name": "bash", "arguments": json.dumps({"command": f"grep -rn thing src | head -{s}"})}}]})
            msgs.append({"role": "tool", "tool_call_id": f"c{s}", "content": body})
        out.append(json.dumps({**row, "model": "m", "messages": msgs, "patch": "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
                               "report": {iid: {"resolved": outcome == "resolved", "tests_status": {
                                   "FAIL_TO_PASS": {"success": ["t::a"], "failure": []},
                                   "PASS_TO_PASS": {"success": [f"t::p{i}" for i in range(50)], "failure": []}}}}}))
    (run_dir / "trajectories.jsonl").write_text("\n".join(out) + "\n")
    scored = [r for r in rows if r["outcome"] != "masked"]
    resolved = sum(r["outcome"] == "resolved" for r in scored)
    (run_dir / "report.json").write_text(json.dumps({
        "model": "m", "total": tasks, "completed": tasks, "resolved": resolved, "masked": tasks - len(scored),
        "scored": len(scored), "resolved_rate": round(resolved / len(scored), 4) if scored else None,
        "ci95": [round(x, 4) for x in wilson(resolved, len(scored))], "tokens_in": sum(r["tokens_in"] for r in rows),
        "tokens_out": sum(r["tokens_out"] for r in rows), "cost_usd": round(sum(r["cost_usd"] for r in rows), 4),
        "price": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
        "wall_seconds": round(sum(r["wall_seconds"] for r in rows), 1), "cost": {"env_cpu_seconds_mean": 1.0},
        "steps_total": sum(r["steps"] for r in rows), "invalid_calls_total": sum(r["invalid_calls"] for r in rows),
        "format_errors_total": sum(r["format_errors"] for r in rows), "instances": rows}))


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


def test_without_prices_dollars_are_not_zero_but_unknown(tmp_path):
    run = sample_copy(tmp_path)
    for name in ("run.json", "report.json"):
        data = json.loads((run / name).read_text())
        data["price"] = {"input_per_mtok": 0.0, "output_per_mtok": 0.0}
        if name == "report.json":
            data["cost_usd"] = 0.0
            for inst in data["instances"]:
                inst["cost_usd"] = 0.0
        (run / name).write_text(json.dumps(data))
    dom = parse(render_report(run))
    assert dom.by_id("cost").text() == "no price given"
    assert "cost_usd" not in [th.attrs["data-key"] for th in dom.by_id("tasks").find_all("th")]
    assert [n for n in dom.iter() if n.attrs.get("id") == "hist-cost"] == [] and "$0.0000" not in dom.text()


def test_report_of_an_evaluation_and_of_two_side_by_side(calc_tasks_file, tmp_path):
    """`patchgym report` on the output directory of `patchgym eval` (before: a page titled
    "patchgym run · ?" with dashes everywhere), on it beside another, and on what is neither."""
    from typer.testing import CliRunner

    from patchgym.cli import app

    runner = CliRunner()
    gold, empty = tmp_path / "gold", tmp_path / "empty"
    for name, out in (("gold", gold), ("empty", empty)):
        graded = runner.invoke(app, ["eval", "--predictions", name, "--tasks", str(calc_tasks_file), "--output",
                                     str(out)])
        assert graded.exit_code == 0, graded.output
    made = runner.invoke(app, ["report", str(gold)])
    assert made.exit_code == 0 and made.output.strip() == f"wrote {gold / 'report.html'}", made.output
    dom = parse((gold / "report.html").read_text())
    assert dom.find_all("title")[0].text() == "patchgym evaluation · gold"
    assert row_ids(dom) == ["fixture__calc-1"]
    assert dom.by_id("resolved-rate").text() == "100.0%" and dom.by_id("masked").text() == "0"
    heads = [th.attrs["data-key"] for th in dom.by_id("tasks").find_all("th")]
    assert heads == ["instance_id", "repo", "outcome", "end_reason", "wall_seconds", "cost.env_cpu_seconds",
                     "cost.test_cpu_seconds", "mask_reason"]
    cells = [td.text() for td in dom.by_id("tasks").find_all("tr", data_instance_id="fixture__calc-1")[0]
             .find_all("td")]
    assert cells[:4] == ["fixture__calc-1", "fixture/calc", "resolved", "resolved"] and cells[4] != "—"
    shown = dom.by_id("trajectories").text()
    assert "raise ValueError" in shown and "test_mean_empty" in shown and "conversation" not in shown
    assert [n for n in dom.iter() if n.attrs.get("id") in ("tokens-in", "steps-total")] == []
    assert "params predictions=" in " ".join(dom.find_all("p", class_="meta")[0].text().split())

    side = runner.invoke(app, ["report", str(gold), str(empty), "--output", str(tmp_path / "cmp.html")])
    assert side.exit_code == 0, side.output
    cmp = parse((tmp_path / "cmp.html").read_text())
    assert json.loads(cmp.by_id("difference").attrs["data-value"]) == 1.0 and cmp.by_id("only-a").text() == "1"
    assert [td.text() for td in cmp.by_id("tasks").find_all("td")][:5] == [
        "fixture__calc-1", "fixture/calc", "resolved", "unresolved", "only A resolved"]

    for neither in (tmp_path, tmp_path / "no-such-dir"):
        refused = runner.invoke(app, ["report", str(neither)])
        assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
        assert "takes the directory of a `patchgym run` or of a `patchgym eval`" in refused.output


def test_histograms_bin_every_task_and_keep_a_long_tail_in_the_last_bin():
    from patchgym.rollouts.html_report.charts import histogram

    rows = [{"outcome": "resolved", "v": v} for v in range(100)] + [{"outcome": "masked", "v": 10_000},
                                                                    {"outcome": "unresolved", "v": None}]
    h = histogram("h", "t", rows, lambda r: r["v"], fmt_int, integer=True)
    assert sum(b[5] for b in h.bars) == 101 and h.shown == 101 and h.missing == 1
    edge = max(float(b[1]) for b in h.bars)
    last = [b for b in h.bars if float(b[1]) == edge]  # the last bin's segments, by outcome
    assert [b[0] for b in last] == ["o-resolved", "o-masked"] and last[0][6] == "≥ 95: 6 task(s) (resolved 5, masked 1)"
    assert edge < h.left + h.plot_w, "the outlier did not stretch the axis"
    assert h.summary == "median 50 · p90 90 · max 10,000"
    assert histogram("h", "t", [{"v": None}], lambda r: r["v"], fmt_int).bars is None
