"""The report's plotly figures, one function each, from the frames of `timeline`.

plotly is imported here and only here, when a report is rendered (`import traceq` never
loads it). Figures carry no colors for text or grid: the page themes them for light, dark
and print (see `html.SCRIPT`), so a figure is data and layout only.

plotly draws a subset of HTML in every label, tick, legend entry and hover text (`<a href>`,
`<b>`, `<br>`), so each function here passes the strings it is given, which may be a
trace's names, through `safe_text.plotly_text`: a name is drawn as it is, never as markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from traceq.errors import TraceError
from traceq.reports.safe_text import plotly_template, plotly_text

if TYPE_CHECKING:
    import polars as pl

COLORS = {
    "compute": "#4c78a8",
    "communication": "#f58518",
    "memcpy": "#54a24b",
    "cpu_bound": "#e45756",
    "idle": "#9d9da0",
}
LABELS = {
    "compute": "compute",
    "communication": "communication (exposed)",
    "memcpy": "memcpy / memset",
    "cpu_bound": "CPU-bound (GPU waits for the host)",
    "idle": "idle",
}
SEVERITY_COLORS = {"error": "#d62728", "warning": "#ff9f1c", "info": "#1f77b4"}
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"


class PlotlyMissing(TraceError):
    """HTML output was asked for without plotly installed (the CLI: one line, exit 2)."""


def go() -> Any:
    """`plotly.graph_objects`, or one clear error naming the extra that installs it."""
    try:
        import plotly.graph_objects as graph_objects
    except ImportError as error:
        raise PlotlyMissing(
            f"HTML reports need plotly: pip install 'traceq[report]' ({error})"
        ) from error
    return graph_objects


def layout(height: int, **extra: Any) -> dict[str, Any]:
    base = {
        "height": height,
        "margin": {"l": 10, "r": 20, "t": 30, "b": 40},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "font": {"family": FONT, "size": 12},
        "legend": {"orientation": "h", "y": -0.2},
        "hoverlabel": {"namelength": -1},
    }
    return {**base, **extra}


def savings_bars(
    labels: list[str],
    saving_us: list[float],
    severities: list[str],
    anchors: list[str],
    hover: list[str],
) -> Any:
    """Estimated saving per finding group, largest on top; a click jumps to its section.
    In µs when every saving is under a millisecond, else in ms."""
    scale, unit = (1.0, "µs") if max(saving_us, default=0) < 1e3 else (1e3, "ms")
    figure = go().Figure(
        go().Bar(
            x=[us / scale for us in saving_us],
            y=_texts(labels),
            orientation="h",
            marker_color=[SEVERITY_COLORS.get(s, "#888") for s in severities],
            customdata=anchors,
            hovertext=_texts(hover),
            hovertemplate=f"%{{y}}<br>saves ~%{{x:.3f}} {unit}<br>%{{hovertext}}<extra></extra>",
            text=[_ms(us) for us in saving_us],
            textposition="auto",
        )
    )
    figure.update_layout(
        layout(
            max(160, 26 * len(labels) + 60),
            xaxis={"title": f"estimated saving ({unit})"},
            yaxis={"autorange": "reversed", "automargin": True},
        )
    )
    return figure


def step_bars(breakdown: pl.DataFrame, x: list[str], *, title: str = "step") -> Any:
    """Stacked bars, one per step (or rank): wall time split by what the GPU did."""
    graph = go()
    figure = graph.Figure(
        [
            graph.Bar(
                name=LABELS[cat],
                x=_texts(x),
                y=(breakdown[cat] / 1e6).to_list(),
                marker_color=COLORS[cat],
                hovertemplate=f"%{{x}}<br>{LABELS[cat]}: %{{y:.3f}} ms<extra></extra>",
            )
            for cat in COLORS
        ]
    )
    figure.update_layout(
        layout(
            360,
            barmode="stack",
            legend={"orientation": "h", "y": -0.2, "traceorder": "normal"},
            xaxis={"title": title, "type": "category"},
            yaxis={"title": "ms", "automargin": True},
        )
    )
    return figure


def utilization_lines(starts_ms: list[float], lanes: list[tuple[str, list[float]]]) -> Any:
    """Busy % per stream over time (one step-shaped line per stream)."""
    graph = go()
    figure = graph.Figure(
        [
            graph.Scatter(
                name=plotly_text(name),
                x=starts_ms,
                y=busy,
                mode="lines",
                line={"shape": "hv", "width": 1.5},
                hovertemplate=f"{plotly_template(name)}<br>%{{x:.3f}} ms: %{{y:.0f}}% busy"
                "<extra></extra>",
            )
            for name, busy in lanes
        ]
    )
    figure.update_layout(
        layout(
            320,
            xaxis={"title": "ms since the first GPU activity"},
            yaxis={"title": "busy %", "range": [0, 105], "automargin": True},
        )
    )
    return figure


def hbars(
    labels: list[str],
    values: list[float],
    unit: str,
    *,
    color: str = "#4c78a8",
    hover: list[str] | None = None,
) -> Any:
    """Horizontal bars, first label on top."""
    figure = go().Figure(
        go().Bar(
            x=values,
            y=_texts(labels),
            orientation="h",
            marker_color=color,
            hovertext=_texts(hover or labels),
            hovertemplate=f"%{{hovertext}}<br>%{{x:.3f}} {unit}<extra></extra>",
        )
    )
    figure.update_layout(
        layout(
            max(160, 24 * len(labels) + 60),
            xaxis={"title": unit},
            yaxis={"autorange": "reversed", "automargin": True},
        )
    )
    return figure


def grouped_hbars(labels: list[str], series: dict[str, list[float]], unit: str) -> Any:
    graph = go()
    palette = ["#4c78a8", "#f58518", "#54a24b", "#e45756"]
    figure = graph.Figure(
        [
            graph.Bar(
                name=plotly_text(name),
                x=values,
                y=_texts(labels),
                orientation="h",
                marker_color=color,
            )
            for (name, values), color in zip(series.items(), palette, strict=False)
        ]
    )
    figure.update_layout(
        layout(
            max(180, 30 * len(labels) + 80),
            barmode="group",
            xaxis={"title": unit},
            yaxis={"autorange": "reversed", "automargin": True},
        )
    )
    return figure


def treemap(tree: pl.DataFrame, basis: str) -> Any:
    """Module time as nested boxes; a box's own time is what ran in the module itself."""
    figure = go().Figure(
        go().Treemap(
            ids=_texts(tree["id"].to_list()),
            labels=_texts(tree["label"].to_list()),
            parents=_texts(tree["parent"].to_list()),
            values=(tree["own_ns"] / 1e6).to_list(),
            branchvalues="remainder",
            hovertemplate=f"%{{id}}<br>{basis} %{{value:.3f}} ms<extra></extra>",
            maxdepth=4,
        )
    )
    figure.update_layout(layout(480, margin={"l": 5, "r": 5, "t": 30, "b": 5}))
    return figure


def lines(x: list[Any], series: dict[str, list[float]], xtitle: str, ytitle: str) -> Any:
    graph = go()
    figure = graph.Figure(
        [
            graph.Scatter(name=plotly_text(name), x=_texts(x), y=ys, mode="lines+markers")
            for name, ys in series.items()
        ]
    )
    figure.update_layout(
        layout(320, xaxis={"title": xtitle, "type": "category"}, yaxis={"title": ytitle})
    )
    return figure


RANK_PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2",
                "#ff9da6", "#9d755d", "#bab0ac"]  # fmt: skip


def stacked_bars(
    x: list[str],
    series: dict[str, list[float]],
    xtitle: str,
    ytitle: str,
    *,
    ranks: list[int] | None = None,
) -> Any:
    """Stacked bars: one bar per `x`, one part per series (the breakdown's colors for its
    categories, or with `ranks` one color per rank, the same rank the same color)."""
    graph = go()
    palette = ranks is not None
    colors = [
        RANK_PALETTE[ranks[i] % len(RANK_PALETTE)] if ranks is not None else COLORS.get(n, "#888")
        for i, n in enumerate(series)
    ]
    figure = graph.Figure(
        [
            graph.Bar(
                name=plotly_text(name if palette else LABELS.get(name, name)),
                x=_texts(x),
                y=values,
                marker_color=color,
                hovertemplate=f"%{{x}}<br>{plotly_template(name)}: %{{y:.3f}} ms<extra></extra>",
            )
            for (name, values), color in zip(series.items(), colors, strict=True)
        ]
    )
    figure.update_layout(
        layout(
            340,
            barmode="stack",
            showlegend=True,  # one rank alone still says its name
            legend={"orientation": "h", "y": -0.2, "traceorder": "normal"},
            xaxis={"title": xtitle, "type": "category"},
            yaxis={"title": ytitle, "automargin": True},
        )
    )
    return figure


def heatmap(x: list[str], y: list[str], z: list[list[float | None]], unit: str) -> Any:
    """A grid of `y` (ranks) × `x` (collectives); gaps where a rank has no call."""
    figure = go().Figure(
        go().Heatmap(
            x=_texts(x),
            y=_texts(y),
            z=z,
            colorscale="Viridis",
            colorbar={"title": {"text": unit, "side": "right"}},
            hovertemplate=f"%{{y}} · %{{x}}<br>%{{z:.3f}} {unit}<extra></extra>",
            hoverongaps=False,
        )
    )
    figure.update_layout(
        layout(
            max(180, 28 * len(y) + 110),
            xaxis={"type": "category", "showticklabels": len(x) <= 40, "title": "collective"},
            yaxis={"type": "category", "autorange": "reversed", "automargin": True},
        )
    )
    return figure


def markers(series: dict[str, tuple[list[str], list[float], list[str]]], xt: str, yt: str) -> Any:
    """One marker per call (x: its label, in order), a color per series (collective)."""
    graph = go()
    order = [plotly_text(label) for xs, _, _ in series.values() for label in xs]
    figure = graph.Figure(
        [
            graph.Scatter(
                name=plotly_text(name),
                x=_texts(xs),
                y=ys,
                mode="markers",
                hovertext=_texts(hover),
                hovertemplate="%{x}<br>%{y:.2f} GB/s · %{hovertext}<extra></extra>",
            )
            for name, (xs, ys, hover) in series.items()
        ]
    )
    figure.update_layout(
        layout(
            320,
            xaxis={
                "title": xt,
                "type": "category",
                "categoryorder": "array",
                "categoryarray": sorted(order, key=lambda s: int(s[1:].split()[0])),
                "showticklabels": len(order) <= 40,
            },
            yaxis={"title": yt, "rangemode": "tozero", "automargin": True},
        )
    )
    return figure


def change_bars(
    labels: list[str],
    rel: list[float],
    low: list[float | None],
    high: list[float | None],
    colors: list[str],
    limit: float | None = None,
) -> Any:
    """Relative change per metric or group (%), with its interval as error bars and the
    allowed regression as a dashed line."""
    plus = [None if h is None else 100 * (h - r) for r, h in zip(rel, high, strict=True)]
    minus = [None if lo is None else 100 * (r - lo) for r, lo in zip(rel, low, strict=True)]
    figure = go().Figure(
        go().Bar(
            x=[100 * r for r in rel],
            y=_texts(labels),
            orientation="h",
            marker_color=colors,
            error_x={"type": "data", "array": plus, "arrayminus": minus, "visible": True},
            hovertemplate="%{y}<br>%{x:+.1f}%<extra></extra>",
        )
    )
    shapes = []
    if limit is not None:
        shapes = [
            {
                "type": "line",
                "x0": 100 * limit,
                "x1": 100 * limit,
                "yref": "paper",
                "y0": 0,
                "y1": 1,
                "line": {"dash": "dash", "color": "#d62728"},
            }
        ]
    figure.update_layout(
        layout(
            max(160, 26 * len(labels) + 60),
            xaxis={"title": "change (%)", "zeroline": True},
            yaxis={"autorange": "reversed", "automargin": True},
            shapes=shapes,
        )
    )
    return figure


def delta_bars(labels: list[str], delta_ms: list[float]) -> Any:
    """Time change per group (ms): slower red, faster green."""
    colors = ["#d62728" if d > 0 else "#2ca02c" for d in delta_ms]
    return hbars(labels, delta_ms, "Δ ms", color=colors)  # type: ignore[arg-type]


def _texts(values: list[Any]) -> list[Any]:
    """Each string of `values` as plotly text (`safe_text.plotly_text`); numbers as they are."""
    return [plotly_text(v) if isinstance(v, str) else v for v in values]


def _ms(us: float) -> str:
    return f"{us / 1e3:.3g} ms" if us >= 1000 else f"{us:.3g} µs"
