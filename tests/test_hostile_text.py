"""A trace's names are input: every output shows them as text, never acts on them.

Names here carry rich markup (`[/x]`, `[link=…]`), terminal control sequences (`ESC]0;…`,
`ESC[2J`, `ESC[31m`), Markdown (`[click](…)`, `![x](…)`), HTML (`<img onerror>`,
`<a href>`, `<!--<script>`, `</script>`), U+2028 and a 4 MB name. Text output must print
them literally with control characters escaped (`\\x1b`), Markdown must hold no live link,
image or HTML, the HTML report must keep its scripts closed and its chart labels plain,
and a long name costs a table no more than `safe_text.NAME_CHARS` characters of it.
JSON output is data: it keeps the names exactly.

Two traces: a small synthetic GPU trace whose kernels, ops, module and device carry the
names (the loader refuses control characters in event names, so those sit in the device
name and in a baseline file), and the recorded GeGLU MLP with its module renamed, so the
names reach findings too.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

from traceq.reports import safe_text

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GEGLU = FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"

MARKUP = ["[/x]", "[link=https://evil.example/]x[/link]"]
MARKDOWN = ["[click](https://evil.example/)", "![x](https://evil.example/y.png)"]
HTML = [
    "<img src=x onerror=alert(1)>",
    "<!--<script>",
    "</script><script>window.__pwned=1</script>",
    '<a href="https://evil.example/">x</a>',
]
HOSTILE = [*MARKUP, *MARKDOWN, *HTML, "line\u2028sep\u2029para"]
CONTROL = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"
DEVICE = f"GPU {CONTROL} [link=https://evil.example/]x[/link] <b>b</b> [/x]"
MODULE = "Evil<!--<script>[/x]<img src=x onerror=alert(1)>[click](https://evil.example/)"
LONG = 4_000_000


def kineto(names: list[str], *, device: str = DEVICE, module: str = MODULE) -> dict[str, Any]:
    """Three `ProfilerStep`s, each one module call launching one kernel per name, the op
    and the kernel both named after it."""
    events: list[dict[str, Any]] = []
    correlation = 1
    for step in range(3):
        start = 1000 + step * 100_000
        events.append(_event("user_annotation", f"ProfilerStep#{step}", start, 90_000))
        events.append(_event("python_function", f"nn.Module: {module}_0", start + 1, 80_000))
        at = start + 5
        for i, name in enumerate(names):
            ids = {"correlation": correlation, "External id": correlation}
            events.append(
                _event("cpu_op", f"aten::op{i}_{name}", at, 50, {"External id": correlation})
            )
            events.append(_event("cuda_runtime", "cudaLaunchKernel", at + 10, 20, ids))
            kernel = {**ids, "device": 0, "stream": 7}
            events.append(
                {
                    **_event("kernel", f"k{i}_{name}", at + 40, 100 + 10 * i, kernel),
                    "pid": 0,
                    "tid": 7,
                }
            )
            correlation += 1
            at += 300
    properties = [{"id": 0, "name": device, "totalGlobalMem": 1}]
    return {"schemaVersion": 1, "deviceProperties": properties, "traceEvents": events}


def _event(cat: str, name: str, ts: int, dur: int, args: dict[str, Any] | None = None) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args or {}}  # fmt: skip


def run(*args: Any, color: bool = False) -> Any:
    """The command's result; it must end by its own exit, never by an exception (which
    CliRunner would catch and report as exit status 1)."""
    env = {"FORCE_COLOR": "1", "TRACEQ_CACHE": "0"} if color else {"TRACEQ_CACHE": "0"}
    result = CliRunner().invoke(main, [str(a) for a in args], color=color, env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceq {args[0]} raised {result.exception!r}")
    return result


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(scope="module")
def gpu_trace(folder: Path) -> Path:
    path = folder / "hostile.json"
    path.write_text(json.dumps(kineto(HOSTILE)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def gpu_baseline(folder: Path, gpu_trace: Path) -> Path:
    """The trace's baseline with one op and one kernel renamed to hold control characters
    (a baseline is a file anyone can hand to `check`; the loader's checks never see it)."""
    out = folder / "hostile-base.json"
    result = run("baseline", "save", gpu_trace, "-o", out, "--no-findings")
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text(encoding="utf-8"))
    for dim in ("op", "kernel"):
        groups = document["groups"][dim]
        name = max(groups)
        groups[f"{name}{CONTROL}"] = groups.pop(name)
    out.write_text(json.dumps(document), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def findings_trace(folder: Path) -> Path:
    """The GeGLU MLP (a gelu + mul fusion finding), its model module renamed."""
    with gzip.open(GEGLU, "rt", encoding="utf-8") as f:
        document = json.load(f)
    for event in document["traceEvents"]:
        if event.get("name") == "nn.Module: GegluMlp_0":
            event["name"] = f"nn.Module: {MODULE}_0"
    path = folder / "geglu-hostile.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def long_trace(folder: Path) -> Path:
    path = folder / "long.json"
    names = [f"plain{i}" for i in range(6)]
    document = kineto(names, device="G" * LONG, module="Model")
    for event in document["traceEvents"]:
        if event["name"] == "aten::op5_plain5":
            event["name"] = "aten::" + "B" * LONG
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


# -- what every terminal output must hold --------------------------------------------------
SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own colors under FORCE_COLOR
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def assert_terminal_safe(output: str) -> None:
    """No control character but rich's own colors and newlines; no OSC (title, hyperlink)."""
    assert "\x1b]" not in output  # OSC: a window title or an OSC-8 hyperlink
    assert "\x1b[2J" not in output
    leftover = UNSAFE.findall(SGR.sub("", output))
    assert not leftover, f"control characters reach the terminal: {sorted(set(leftover))}"
    assert "Traceback" not in output


# -- item 6: markup is printed, not parsed -------------------------------------------------
@pytest.mark.parametrize("command", ["info", "analyze"])
def test_markup_in_names_prints_literally(command: str, gpu_trace: Path) -> None:
    result = run(command, gpu_trace)
    assert result.exit_code == 0, result.output
    assert "[/x]" in result.output
    assert "[link=https://evil.example/]x[/link]" in result.output


def test_markup_in_a_baseline_prints_literally_in_check(
    gpu_trace: Path, gpu_baseline: Path
) -> None:
    result = run("check", gpu_trace, "--baseline", gpu_baseline)
    assert result.exit_code in (0, 1), result.output
    assert "Traceback" not in result.output and "[/x]" in result.output


def test_markup_in_findings_prints_literally_in_analyze(findings_trace: Path) -> None:
    result = run("analyze", findings_trace)
    assert result.exit_code == 0, result.output
    assert f"{MODULE}" in result.output.replace("\n", "")


# -- item 8: control characters are shown, never sent --------------------------------------
@pytest.mark.parametrize("command", ["info", "analyze"])
def test_control_characters_in_a_device_name_reach_no_terminal(
    command: str, gpu_trace: Path
) -> None:
    result = run(command, gpu_trace, color=True)
    assert result.exit_code == 0, result.output
    assert_terminal_safe(result.output)
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31m" in result.output  # shown as escapes


def test_analyze_text_in_color_escapes_names(gpu_trace: Path, findings_trace: Path) -> None:
    import traceq
    from traceq.analyze import analysis
    from traceq.reports import build_report, render

    for path in (gpu_trace, findings_trace):
        trace = traceq.load(path, cache=False)
        text = render(build_report(analysis(trace), trace), "text", color=True)
        assert_terminal_safe(text)
        assert "\x1b]8;" not in text  # no OSC-8 hyperlink from `[link=…]`


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_control_characters_in_a_baseline_reach_no_output(
    fmt: str, gpu_trace: Path, gpu_baseline: Path
) -> None:
    for args in (
        ("check", gpu_trace, "--baseline", gpu_baseline),
        ("diff", gpu_baseline, gpu_trace, "--by", "kernel", "--no-findings"),
    ):
        result = run(*args, "--format", fmt, color=True)
        assert result.exit_code in (0, 1), result.output
        assert_terminal_safe(result.output)


def test_json_output_keeps_names_exactly(gpu_trace: Path, gpu_baseline: Path) -> None:
    info = json.loads(run("info", gpu_trace, "--format", "json").output)
    assert info["devices"][0]["name"] == DEVICE
    check = run("check", gpu_trace, "--baseline", gpu_baseline, "--format", "json")
    assert CONTROL in "".join(m["metric"] for m in json.loads(check.stdout)["metrics"])


def test_an_error_message_is_one_printable_line(folder: Path) -> None:
    path = folder / f"missing{CONTROL}\nsecond line.json"
    result = run("info", path)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("traceq: error:")
    assert_terminal_safe(result.output)


# -- item 9: Markdown holds no live link, image or HTML ------------------------------------
def markdown_html(text: str) -> str:
    """The Markdown as GitHub-like HTML (CommonMark, tables, raw HTML allowed)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).enable("table").render(text)


def assert_markdown_inert(text: str) -> None:
    rendered = markdown_html(text)
    for tag in ("<a ", "<img", "<script", "<b>"):
        assert tag not in rendered, f"{tag} in the rendered Markdown"
    assert "evil.example" in rendered  # the names are there, as text


def test_analyze_markdown_shows_names_as_text(findings_trace: Path, gpu_trace: Path) -> None:
    for path in (findings_trace, gpu_trace):
        result = run("analyze", path, "--format", "markdown")
        assert result.exit_code == 0, result.output
        assert_markdown_inert(result.output)
        assert "\x1b" not in result.output


def test_check_and_diff_markdown_show_names_as_text(gpu_trace: Path, gpu_baseline: Path) -> None:
    for args in (
        ("check", gpu_trace, "--baseline", gpu_baseline),
        ("diff", gpu_baseline, gpu_trace, "--by", "kernel", "--no-findings"),
    ):
        result = run(*args, "--format", "markdown")
        assert result.exit_code in (0, 1), result.output
        assert_markdown_inert(result.output)
        assert "\x1b" not in result.output
        if args[0] == "check":  # op names, whole
            assert "[click](https://evil.example/)" in markdown_html(result.output)


def test_markdown_escapes_every_character_markdown_acts_on() -> None:
    entities = {"&lt;": "<", "&gt;": ">", "&amp;": "&", "&quot;": '"'}
    for name in [*HOSTILE, "a|b", "`code`", "**bold**", "\\[x]", "_x_", "~~x~~"]:
        rendered = markdown_html(f"| a |\n|---|\n| {safe_text.markdown(name)} |\n")
        cell = re.search("<td>(.*)</td>", rendered, re.S)
        assert cell is not None and "<" not in cell.group(1), name
        shown = re.sub("&lt;|&gt;|&amp;|&quot;", lambda m: entities[m.group()], cell.group(1))
        assert shown == safe_text.printable(name), name


# -- item 10: the HTML keeps its scripts closed and its chart labels plain -----------------
class Scripts(HTMLParser):
    """The page's script elements (type, text) and the ids of its chart divs."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[list[str]] = []
        self.charts: list[str] = []
        self._open: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "script":
            self._open = [found.get("type") or "", ""]
        elif tag == "div" and "plot" in (found.get("class") or "").split():
            self.charts.append(found.get("id") or "")
        elif tag in ("img", "a") and self._open is None:
            href = found.get("href") or ""
            assert tag == "a" and href.startswith("#"), f"<{tag} {found}> in the page"

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open[1] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._open is not None:
            self.scripts.append(self._open)
            self._open = None


def figure_specs(page: str) -> list[dict[str, Any]]:
    """Every chart's JSON, after checking that it cannot leave or bend its script block."""
    parser = Scripts()
    parser.feed(page)
    blocks = [text for kind, text in parser.scripts if kind == "application/json"]
    assert len(blocks) == len(parser.charts) > 0
    for text in blocks:
        assert not re.search("[<>&\u2028\u2029]", text), "raw < > & or U+2028/9 in a figure"
    return [json.loads(text) for text in blocks]


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def assert_labels_plain(specs: list[dict[str, Any]]) -> None:
    shown = [s for spec in specs for s in strings(spec["data"])]
    assert any("evil.example" in s for s in shown)  # the names are in the charts
    for text in shown:
        for tag in ("<a ", "<img", "<script", "<!--", "<b>"):
            assert tag not in text, f"{tag} in a chart label: {text[:120]!r}"


def test_report_html_keeps_scripts_closed_and_labels_plain(
    folder: Path, gpu_trace: Path, findings_trace: Path
) -> None:
    pytest.importorskip("plotly")
    for path in (gpu_trace, findings_trace):
        out = folder / f"{path.stem}.html"
        result = run("report", path, "-o", out)
        assert result.exit_code == 0, result.output
        page = out.read_text(encoding="utf-8")
        assert_labels_plain(figure_specs(page))
        assert "\x1b" not in page


def test_check_html_keeps_scripts_closed_and_labels_plain(
    gpu_trace: Path, gpu_baseline: Path
) -> None:
    pytest.importorskip("plotly")
    result = run("check", gpu_trace, "--baseline", gpu_baseline, "--format", "html")
    assert result.exit_code in (0, 1), result.output
    specs = figure_specs(result.output)
    assert_labels_plain(specs)
    assert "\x1b" not in result.output


def test_plotly_text_reads_back_as_the_name() -> None:
    """plotly decodes `&lt;`, `&gt;` and `&amp;` (and numeric entities) when it draws."""
    entities = {"&lt;": "<", "&gt;": ">", "&amp;": "&", "&#37;": "%"}
    for name in [*HOSTILE, "a & b", "%{x}"]:
        text = safe_text.plotly_template(name)
        assert "<" not in text and "%{" not in text
        shown = re.sub("&lt;|&gt;|&amp;|&#37;", lambda m: entities[m.group()], text)
        assert shown == safe_text.printable(name)


def test_script_json_reads_back_the_same() -> None:
    document = {"names": [*HOSTILE, "a & b > c"]}
    text = safe_text.script_json(json.dumps(document))
    assert not re.search("[<>&\u2028\u2029]", text)
    assert json.loads(text) == document


# -- item 5: a long name costs a table no more than a short one ----------------------------
def test_a_4mb_name_prints_capped_and_fast(long_trace: Path, folder: Path) -> None:
    from traceq.regression.check import check
    from traceq.regression.render import render_check

    baseline = folder / "long-base.json"
    assert run("baseline", "save", long_trace, "-o", baseline, "--no-findings").exit_code == 0
    result = check(long_trace, baseline, cache=False)
    for fmt in ("text", "markdown", "html"):
        start = time.perf_counter()
        shown = render_check(result, fmt)
        seconds = time.perf_counter() - start
        assert seconds < (2.0 if fmt != "html" else 10.0), fmt  # html: 4.8 MB of plotly.js
        text = markdown_html(shown) if fmt == "markdown" else shown
        assert f"… ({LONG + len('op aten::'):,} chars)" in text, fmt
        assert len(shown) < (5e6 if fmt == "html" else 50_000), fmt  # plotly.js is ~4.8 MB
        assert "B" * (safe_text.NAME_CHARS + 1) not in shown, fmt


def test_a_4mb_device_name_in_info_and_analyze_is_capped(long_trace: Path) -> None:
    for command in ("info", "analyze"):
        result = run(command, long_trace)
        assert result.exit_code == 0, result.output
        unwrapped = re.sub(r"[\s│]", "", result.output)  # the table may wrap the cell
        assert f"…({LONG:,}chars)" in unwrapped
        assert len(result.output) < 50_000


def test_clip_states_the_length() -> None:
    assert safe_text.clip("x" * 10) == "x" * 10
    assert safe_text.clip("x" * 250) == "x" * 200 + "… (250 chars)"


# -- item 10 in a browser (skipped without Playwright and Chromium) ------------------------
def test_a_hostile_report_draws_every_chart_and_runs_no_script_of_the_trace(
    folder: Path, gpu_trace: Path
) -> None:
    """Every chart draws (a `<!--<script>` in a name would leave its JSON block open), no
    chart holds a link (`<a href>` in a kernel name), no `<img>` or script of the names
    runs, and a label reads as the name."""
    import os
    import shutil

    pytest.importorskip("plotly")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    chromium = os.environ.get("TRACEQ_CHROMIUM") or next(
        filter(None, (shutil.which(n) for n in ("chromium", "chromium-browser"))), None
    )
    if chromium is None:
        pytest.skip("no Chromium (apt-get install chromium, or set TRACEQ_CHROMIUM)")
    out = folder / "browser.html"
    assert run("report", gpu_trace, "-o", out).exit_code == 0
    requests: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page()
            page.route(
                "**/*",
                lambda route: (
                    route.continue_()
                    if route.request.url.startswith("file:")
                    else (requests.append(route.request.url), route.abort())
                ),
            )
            page.goto(out.as_uri())
            page.wait_for_load_state("load")
            seen = page.evaluate(
                """() => ({
                  plots: document.querySelectorAll('div.plot').length,
                  drawn: Array.from(document.querySelectorAll('div.plot'))
                    .filter(d => d.querySelector('svg.main-svg')).length,
                  links: document.querySelectorAll('div.plot a').length,
                  images: document.querySelectorAll('img').length,
                  pwned: window.__pwned !== undefined,
                  texts: Array.from(document.querySelectorAll('div.plot text'))
                    .map(t => t.textContent),
                })"""
            )
        finally:
            browser.close()
    assert seen["drawn"] == seen["plots"] > 0
    assert seen["links"] == seen["images"] == 0 and not seen["pwned"]
    assert any('<a href="https://evil.example/">x</a>' in t for t in seen["texts"])
    assert requests == []
