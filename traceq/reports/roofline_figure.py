"""The report's roofline: the heaviest modelled ops on log–log axes (arithmetic intensity,
achieved TFLOP/s) under the device's datasheet roofs, and the table of the top ones.

An op's point says which roof binds it (left of the ridge: memory; right: compute) and how
far below that roof it ran; the table under the chart gives the same numbers for the
heaviest ones. Ops that compute nothing (copies, views) have no place on log axes: they
stay in `traceq roofline`'s table. Points are op signatures (`perf.roofline.summed`: one
name, shape and dtype, its calls summed), so a layer repeated 24 times is one point with
24 times the time.

Figures here follow `figures.py`: data and layout only, every string from the trace passed
through `safe_text.plotly_text`; the page themes the colors of text and grid.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import polars as pl

from traceq.perf.roofline import MATRIX_FAMILIES, summed
from traceq.reports.figures import go, layout
from traceq.reports.safe_text import plotly_text

if TYPE_CHECKING:
    from traceq.perf.specs import Spec

POINTS = 200
"""Op signatures drawn: the ones with the most time."""
ROWS = 20
"""Rows of the table under the chart."""

FAMILY_COLORS = {
    "gemm": "#4c78a8",
    "attention": "#f58518",
    "conv": "#72b7b2",
    "norm": "#54a24b",
    "softmax": "#eeca3b",
    "reduction": "#b279a2",
    "embedding": "#ff9da6",
    "copy": "#9d755d",
    "elementwise": "#e45756",
    "fused": "#79706e",
    "other": "#bab0ac",
}


def signatures(frame: pl.DataFrame) -> pl.DataFrame:
    """The per-call roofline (`trace.roofline`) as modelled op signatures with a datasheet
    roof and some work, heaviest first."""
    if frame.height == 0:
        return frame
    return (
        summed(frame)
        .filter(
            pl.col("modelled")
            & pl.col("pct_roof_datasheet").is_not_null()
            & (pl.col("time_us") > 0)
            & ((pl.col("flops") + pl.col("bytes")) > 0)
        )
        .sort(["time_us", "name"], descending=[True, False])
    )


def main_dtype(ops: pl.DataFrame) -> str | None:
    """The roof dtype of the matrix ops (GEMM, attention, conv) with the most time."""
    matrix = ops.filter(
        pl.col("family").is_in(MATRIX_FAMILIES) & pl.col("roof_dtype").is_not_null()
    )
    if matrix.height == 0:
        return None
    by_time = matrix.group_by("roof_dtype").agg(pl.col("time_us").sum())
    return str(by_time.sort(["time_us", "roof_dtype"], descending=[True, False])["roof_dtype"][0])


def roofs(spec: Spec, dtype: str | None) -> list[tuple[str, float]]:
    """(label, peak TFLOP/s) of each roof drawn: the main matrix dtype's and the FP32 vector
    units' (what elementwise, norm and reduction kernels run on)."""
    out = []
    if dtype and spec.peak(dtype):
        out.append((f"{dtype} matrix roof", float(spec.peak(dtype))))  # type: ignore[arg-type]
    if spec.vector_fp32_tflops:
        out.append(("fp32 vector roof", float(spec.vector_fp32_tflops)))
    return out


def figure(ops: pl.DataFrame, spec: Spec) -> Any:
    """Log–log scatter of `ops` (from `signatures`, the top `POINTS` with FLOPs), one trace
    per family, under the roof lines `min(peak, intensity × GB/s / 1000)`."""
    graph = go()
    drawn = ops.filter(pl.col("flops") > 0).head(POINTS)
    lines = roofs(spec, main_dtype(ops))
    low = float(drawn["intensity"].min() or 1.0)
    high = float(drawn["intensity"].max() or 1.0)
    ridges = [peak * 1000 / spec.hbm_gbs for _, peak in lines]
    x0 = max(low / 2, 1e-4)
    x1 = max(high * 2, *(r * 2 for r in ridges), 1.0)
    traces = []
    for n, (label, peak) in enumerate(lines):
        ridge = peak * 1000 / spec.hbm_gbs
        xs = [x0, ridge, x1] if x0 < ridge < x1 else [x0, x1]
        traces.append(
            graph.Scatter(
                name=plotly_text(f"{label} ({peak:g} TFLOP/s, {spec.hbm_gbs:g} GB/s)"),
                x=xs,
                y=[min(peak, x * spec.hbm_gbs / 1000) for x in xs],
                mode="lines",
                line={"color": "#888", "width": 1.5, "dash": "solid" if n == 0 else "dash"},
                hovertemplate=f"{plotly_text(label)}: %{{y:.3g}} TFLOP/s at %{{x:.3g}} "
                "FLOP/byte<extra></extra>",
            )
        )
    for family in drawn["family"].unique(maintain_order=True).to_list():
        rows = drawn.filter(pl.col("family") == family)
        traces.append(
            graph.Scatter(
                name=plotly_text(family),
                x=rows["intensity"].to_list(),
                y=rows["tflops"].to_list(),
                mode="markers",
                marker={
                    "color": FAMILY_COLORS.get(family, "#888"),
                    "size": [_size(t, float(drawn["time_us"].max())) for t in rows["time_us"]],
                    "line": {"width": 0.5, "color": "#fff"},
                    "opacity": 0.85,
                },
                hovertext=[hover(r) for r in rows.iter_rows(named=True)],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    figure = graph.Figure(traces)
    figure.update_layout(
        layout(
            480,
            xaxis={"title": "arithmetic intensity (FLOP/byte)", "type": "log"},
            yaxis={"title": "achieved TFLOP/s", "type": "log", "automargin": True},
            legend={"orientation": "h", "y": -0.18},
        )
    )
    return figure


def hover(row: dict[str, Any]) -> str:
    """One op signature's hover text: each line escaped (`plotly_text`), joined by <br>."""
    lines = [
        f"{row['name']} · {row['family']}",
        f"{shape(row.get('shape'))} {row.get('dtype') or ''} · {row['calls']} calls · "
        f"{row['time_us']:,.1f} µs",
        f"{row['tflops']:.3g} TFLOP/s · {row['gbs']:,.0f} GB/s · "
        f"{row['pct_roof_datasheet']:.0f}% of roof · {row.get('bound') or '—'}",
    ]
    return "<br>".join(plotly_text(line) for line in lines)


HEADER = ("op", "family", "shape", "dtype", "calls", "time µs", "TFLOP/s", "GB/s", "% of roof",
          "bound")  # fmt: skip
NUMERIC = (4, 5, 6, 7, 8)


def rows(ops: pl.DataFrame, top: int = ROWS) -> list[list[str]]:
    """The table under the chart: the `top` op signatures by time (text, not escaped)."""
    return [
        [
            r["name"],
            r["family"],
            shape(r.get("shape")),
            r.get("dtype") or "—",
            f"{r['calls']:,}",
            f"{r['time_us']:,.1f}",
            f"{r['tflops']:,.1f}",
            f"{r['gbs']:,.0f}",
            f"{r['pct_roof_datasheet']:.0f}%",
            r.get("bound") or "—",
        ]
        for r in ops.head(top).iter_rows(named=True)
    ]


def shape(value: list[int] | None) -> str:
    return "×".join(map(str, value)) if value else "—"


def _size(time_us: float, most_us: float) -> float:
    """Marker diameter: area in proportion to time, 5 to 22 px."""
    return 5 + 17 * math.sqrt(time_us / most_us) if most_us > 0 else 8
