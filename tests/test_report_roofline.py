"""The report's roofline section: the heaviest modelled ops on log–log axes under the
device's datasheet roofs, and their numbers in a table under the chart; one line instead
where there is no roof (a CPU trace) or no cost model (no recorded shapes).

Real traces: TraceLens's Qwen1.5-0.5B prefill on H100 (AMD-AGI/TraceLens, MIT; shared,
skipped when absent) and its SGLang Qwen3-8B decode on MI300X (bundled in
`fixtures/serving`, MIT); HTA's AlexNet on A100 (bundled, MIT), recorded without shapes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from conftest import FIXTURES, GPU_FIXTURES, SHARED_TRACES

import traceq
from traceq.analyze import analysis
from traceq.perf.roofline import summed, trace_spec
from traceq.reports import roofline_figure as rf
from traceq.reports.html import render_trace
from traceq.reports.model import build_report

pytest.importorskip("plotly", reason="HTML reports need plotly (the report extra)")

QWEN = SHARED_TRACES / "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
SGLANG = FIXTURES / "serving/sglang_decode/sglang_Qwen3-8B_decode.json.gz"
ALEXNET = GPU_FIXTURES / "hta-alexnet-a100.json.gz"
CPU = FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"


def page(path: Path) -> tuple[str, traceq.Trace]:
    trace = traceq.load(path, cache=False)
    return render_trace(trace, build_report(analysis(trace), trace)), trace


def section(text: str) -> str:
    found = re.search(r'<section id="roofline">(.*?)</section>', text, re.S)
    assert found, "the page has a roofline section"
    return found.group(1)


def roofline_spec(text: str) -> dict:
    """The JSON of the chart inside the roofline section."""
    target = re.search(r'<div id="(fig-\d+)"', section(text)).group(1)
    block = re.search(
        rf'<script type="application/json" class="figure" data-target="{target}">(.*?)</script>',
        text,
        re.S,
    ).group(1)
    return json.loads(block)


def table_rows(text: str) -> list[list[str]]:
    body = re.search(r"<tbody>(.*?)</tbody>", section(text), re.S).group(1)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body)]


@pytest.fixture(scope="module")
def qwen_page() -> tuple[str, traceq.Trace]:
    if not QWEN.exists():
        pytest.skip(f"{QWEN} is absent")
    return page(QWEN)


@pytest.mark.shared
def test_h100_page_draws_the_heaviest_ops_under_the_h100_roofs(qwen_page) -> None:
    text, trace = qwen_page
    spec = roofline_spec(text)
    assert spec["layout"]["xaxis"]["type"] == "log" and spec["layout"]["yaxis"]["type"] == "log"
    roofs = [d for d in spec["data"] if d["mode"] == "lines"]
    points = [d for d in spec["data"] if d["mode"] == "markers"]
    # bf16 GEMMs take most of the matrix time: its roof (989.5 TFLOP/s) and the vector one
    assert [r["name"].split(" (")[0] for r in roofs] == ["bf16 matrix roof", "fp32 vector roof"]
    for roof, peak in zip(roofs, (989.5, 67.0), strict=True):
        for x, y in zip(roof["x"], roof["y"], strict=True):
            assert y == pytest.approx(min(peak, x * 3350 / 1000))
    # every point is one op signature: its FLOPs over its bytes, over its kernels' time
    ops = summed(trace.roofline).filter(pl.col("modelled") & (pl.col("flops") > 0))
    by_name = {}
    for row in ops.iter_rows(named=True):
        by_name.setdefault(row["family"], set()).add((row["intensity"], row["tflops"]))
    drawn = 0
    for trace_points in points:
        family = trace_points["name"]
        for x, y in zip(trace_points["x"], trace_points["y"], strict=True):
            assert any(x == pytest.approx(i) and y == pytest.approx(t) for i, t in by_name[family])
            roof = 989.5 if family in ("gemm", "attention", "conv") else 67.0
            assert y <= min(roof, x * 3350 / 1000) * 1.05  # nothing above its roof
            drawn += 1
    assert drawn == ops.height  # under POINTS: every op with FLOPs is drawn
    assert {"gemm", "attention", "elementwise"} <= {p["name"] for p in points}


@pytest.mark.shared
def test_h100_table_lists_the_top_ops_as_traceq_roofline_does(qwen_page) -> None:
    text, trace = qwen_page
    rows = table_rows(text)
    assert len(rows) == rf.ROWS
    heaviest = rf.signatures(trace.roofline).head(rf.ROWS)
    assert [r[0] for r in rows] == heaviest["name"].to_list()
    times = [float(r[5].replace(",", "")) for r in rows]
    assert times == sorted(times, reverse=True)
    first = heaviest.row(0, named=True)  # the 16×559×2816 bf16 GEMM: compute bound
    assert rows[0][1:4] == ["gemm", "16×559×2816", "bf16"]
    assert rows[0][8] == f"{first['pct_roof_datasheet']:.0f}%" and rows[0][9] == "compute"
    assert "H100 SXM" in section(text)


def test_bundled_mi300x_decode_has_the_section_with_the_mi300x_roofs() -> None:
    text, trace = page(SGLANG)
    assert trace_spec(trace).name == "MI300X"
    spec = roofline_spec(text)
    assert any("5300 GB/s" in d["name"] for d in spec["data"] if d["mode"] == "lines")
    assert sum(len(d["x"]) for d in spec["data"] if d["mode"] == "markers") >= 1
    assert table_rows(text)


def test_cpu_trace_has_a_one_line_note_and_no_chart() -> None:
    text, _ = page(CPU)
    body = section(text)
    assert "No roofline" in body and "<figure" not in body and "<table" not in body


def test_trace_without_shapes_has_a_one_line_note() -> None:
    text, _ = page(ALEXNET)
    body = section(text)
    assert "record_shapes=True" in body and "<figure" not in body


def test_hover_text_shows_names_as_text() -> None:
    hostile = {
        "name": "<img src=x onerror=alert(1)>&",
        "family": "gemm",
        "shape": [2, 3],
        "dtype": "bf16",
        "calls": 1,
        "time_us": 1.0,
        "tflops": 1.0,
        "gbs": 1.0,
        "pct_roof_datasheet": 1.0,
        "bound": "latency",
    }
    text = rf.hover(hostile)
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;&amp;" in text
    assert text.count("<br>") == 2
