"""The HTML reports in a real browser: Debian's Chromium, driven by Playwright's Python API
pointed at that executable (Playwright downloads no browser here), every request outside
the page's own file refused and recorded.

Each page must: log no console error and raise no script error; draw every chart (each
figure's div holds plotly's SVG with data marks: bars, line paths, treemap slices); hold
every finding section; make no network request; follow `prefers-color-scheme`; print to a
multi-page PDF. Skipped with the reason when Playwright or Chromium is missing (`.ci/run`
installs Chromium with apt when it can).

Real traces: TraceLens's Qwen1.5-0.5B prefill on H100 (AMD-AGI/TraceLens, MIT) and HTA's
two-rank `trace_filter` directory (facebookresearch/HolisticTraceAnalysis, MIT).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

import traceq
from traceq.reports.html import MAX_GROUPS
from traceq.reports.model import group_findings

pytest.importorskip("plotly", reason="HTML reports need plotly (the report extra)")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("TRACEQ_CHROMIUM") or next(
    filter(None, (shutil.which(n) for n in ("chromium", "chromium-browser"))), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium (apt-get install chromium, or set TRACEQ_CHROMIUM)"
)

CPU = ROOT / "fixtures" / "geglu_mlp-eager.pt.trace.json.gz"
QWEN = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
# Bundled in fixtures/gpu (HTA's test data, MIT): runs on every machine.
ALEXNET = "hta/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
JOB = "hta/tests/data/trace_filter"

CHARTS = """() => Array.from(document.querySelectorAll('script.figure')).map(block => {
  const div = document.getElementById(block.dataset.target);
  return {
    id: block.dataset.target,
    plotted: div.classList.contains('js-plotly-plot'),
    svg: div.querySelectorAll('svg.main-svg').length,
    marks: div.querySelectorAll('.point path, path.js-line, g.slice path, g.hm image').length,
    values: (div.data || []).reduce((n, t) => n + (t.x || t.values || []).length, 0),
  };
})"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()


class Visit:
    """One page opened offline: what it logged, raised and asked the network for."""

    def __init__(self, browser: Any, path: Path, scheme: str = "light") -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.context = browser.new_context(
            viewport={"width": 1280, "height": 900}, color_scheme=scheme
        )
        self.page = self.context.new_page()
        url = path.resolve().as_uri()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: r.url != url and self.requests.append(r.url))
        self.page.route(
            "**/*", lambda route: route.continue_() if route.request.url == url else route.abort()
        )
        self.page.goto(url, wait_until="load")
        self.page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length > 0")

    def charts(self) -> list[dict[str, Any]]:
        return self.page.evaluate(CHARTS)

    def close(self) -> None:
        self.context.close()


def check_page(browser: Any, path: Path, min_charts: int) -> Visit:
    visit = Visit(browser, path)
    charts = visit.charts()
    assert len(charts) >= min_charts
    for chart in charts:
        assert chart["plotted"] and chart["svg"] > 0, chart
        assert chart["marks"] > 0 and chart["values"] > 0, chart
    assert visit.errors == []
    assert visit.requests == []
    return visit


def check_findings(visit: Visit, trace: traceq.Trace) -> None:
    groups = group_findings(traceq.analyze(trace))[:MAX_GROUPS]
    found = visit.page.evaluate(
        "() => Array.from(document.querySelectorAll('article.finding'))"
        ".map(a => [a.id, a.querySelector('h3 code').textContent,"
        " a.querySelectorAll('tbody tr').length])"
    )
    assert [f[:2] for f in found] == [[f"finding-{n}", g.rule] for n, g in enumerate(groups, 1)]
    assert all(rows >= 1 for _, _, rows in found)  # each has its evidence table
    bars = visit.page.locator("#fig-1 .point path")
    assert bars.count() == len(groups)


def test_cpu_fixture_in_chromium(browser, tmp_path):
    out = traceq.report(CPU, tmp_path / "cpu.html")
    visit = check_page(browser, out, min_charts=4)  # savings, steps, ops, modules
    check_findings(visit, traceq.load(CPU))
    # a click on the largest saving's bar jumps to its section (a real mouse click: plotly
    # takes clicks on its drag layer above the bars)
    bar = visit.page.locator("#fig-1 .point path").first
    bar.evaluate("e => e.scrollIntoView({block: 'center'})")
    box = bar.bounding_box()
    visit.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    visit.page.wait_for_function("location.hash === '#finding-1'", timeout=5000)
    assert visit.page.evaluate("location.hash") == "#finding-1"
    pdf = visit.page.pdf(format="A4")
    assert pdf.startswith(b"%PDF") and len(re.findall(rb"/Type\s*/Page\b", pdf)) >= 2
    visit.close()


def test_without_scripts_every_chart_has_its_table(browser, tmp_path):
    """The page reads without JavaScript: each chart's figure is followed by a table."""
    out = traceq.report(CPU, tmp_path / "cpu.html")
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.goto(out.resolve().as_uri())
    pairs = page.evaluate(
        "() => Array.from(document.querySelectorAll('figure.chart')).map(f => "
        "f.nextElementSibling && f.nextElementSibling.querySelector('table') !== null)"
    )
    assert len(pairs) >= 4 and all(pairs)
    assert page.locator(".js-plotly-plot").count() == 0  # nothing drew: scripts were off
    context.close()


def test_dark_scheme(browser, tmp_path):
    out = traceq.report(CPU, tmp_path / "cpu.html")
    visit = Visit(browser, out, scheme="dark")
    background = visit.page.evaluate("getComputedStyle(document.body).backgroundColor")
    font = visit.page.evaluate("document.getElementById('fig-1').layout.font.color")
    assert background == "rgb(22, 23, 26)" and font == "#e8e8ea"
    assert visit.errors == []
    visit.close()


@pytest.mark.parametrize(
    ("name", "kinds"),
    [
        (QWEN, {"bar", "scatter", "treemap"}),
        (ALEXNET, {"bar", "scatter"}),  # no nn.Module records: no module treemap
    ],
)
def test_gpu_trace_in_chromium(name, kinds, browser, shared_trace, tmp_path):
    path = shared_trace(name)
    out = traceq.report(path, tmp_path / "gpu.html")
    visit = check_page(browser, out, min_charts=len(kinds) + 4)
    check_findings(visit, traceq.load(path))
    drawn = visit.page.evaluate(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => d.data[0].type)"
    )
    assert kinds <= set(drawn)
    visit.close()


def test_job_directory_in_chromium(browser, shared_traces, tmp_path):
    directory = shared_traces / JOB
    if not directory.is_dir():
        pytest.skip(f"{directory} is absent")
    out = traceq.report(directory, tmp_path / "job.html")
    visit = check_page(browser, out, min_charts=4)
    ranks = visit.page.evaluate("() => document.querySelector('#job .js-plotly-plot').data[0].x")
    assert ranks == ["rank 0", "rank 1"]
    visit.close()


def test_recorded_job_in_chromium(browser, tmp_path):
    """The gloo job with rank 2 slowed: every job chart drew (per-rank breakdown, step
    times, stragglers, the ranks × collectives heatmap), TQ401 has its section, no error,
    no request."""
    job = traceq.load_job(ROOT / "fixtures" / "jobs" / "ddp_gloo_slow2", engine="serial")
    out = traceq.report(job, tmp_path / "job.html")
    visit = check_page(browser, out, min_charts=8)
    kinds = visit.page.evaluate(
        "() => Array.from(document.querySelectorAll('#job .js-plotly-plot'))"
        ".map(d => d.data[0].type)"
    )
    assert kinds == ["bar", "scatter", "bar", "heatmap"]
    heat = visit.page.locator("#job g.hm image")
    assert heat.count() == 1 and heat.bounding_box()["width"] > 200
    codes = visit.page.evaluate(
        "() => Array.from(document.querySelectorAll('article.finding h3 code'))"
        ".map(c => c.textContent)"
    )
    assert "TQ401" in codes
    visit.close()


def test_check_and_diff_pages_in_chromium(browser, tmp_path):
    eager = str(ROOT / "fixtures" / "mlp_gelu-eager.pt.trace.json.gz")
    compiled = str(ROOT / "fixtures" / "mlp_gelu-compiled.pt.trace.json.gz")
    runner = CliRunner()
    base = tmp_path / "base.json"
    assert runner.invoke(main, ["baseline", "save", eager, "-o", str(base)]).exit_code == 0
    pages = {
        "diff": runner.invoke(main, ["diff", eager, compiled, "--format", "html"]).output,
        "check": runner.invoke(
            main, ["check", compiled, "--baseline", str(base), "--format", "html"]
        ).output,
    }
    for name, text in pages.items():
        path = tmp_path / f"{name}.html"
        path.write_text(text)
        visit = check_page(browser, path, min_charts=1)
        assert visit.page.locator("table").count() >= 2
        visit.close()


def test_roofline_chart_in_chromium(browser, tmp_path):
    """The roofline section of a GPU trace with shapes (SGLang's Qwen3-8B decode on MI300X,
    bundled from AMD-AGI/TraceLens, MIT): its chart drew on log axes, roofs and points."""
    path = ROOT / "fixtures" / "serving" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.gz"
    out = traceq.report(path, tmp_path / "roofline.html")
    visit = check_page(browser, out, min_charts=5)
    drawn = visit.page.evaluate(
        "() => { const d = document.querySelector('#roofline .js-plotly-plot');"
        " return d && {x: d.layout.xaxis.type, y: d.layout.yaxis.type,"
        " lines: d.querySelectorAll('path.js-line').length,"
        " points: d.querySelectorAll('path.point').length}; }"
    )
    assert drawn is not None and drawn["x"] == drawn["y"] == "log"
    assert drawn["lines"] >= 2 and drawn["points"] >= 1
    visit.close()
