"""Render a `Diff` or a `CheckResult` as terminal text (rich), JSON, Markdown for a PR, or
one self-contained HTML page (`traceq.reports.html`: plotly inline, tables under charts).

Text, Markdown and HTML are drawn from the same sections (a title, a header, rows of
strings), so they never disagree; HTML adds a chart of the changes. JSON is the objects'
`to_dict()`, with every number exact. Names from the traces are clipped where a section
is built (`safe_text.clip`) and escaped for each format where it is drawn.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceq.regression.check import TOO_FEW, CheckResult, Metric
from traceq.regression.diff import Diff, basis_label
from traceq.regression.dispatch import IMPL_SEP
from traceq.regression.stats import Change
from traceq.reports.safe_text import LINE_CHARS, clip, markdown, terminal

FORMATS = ("text", "json", "markdown", "html")
TOP = 25


@dataclass
class Section:
    title: str
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # free text under the title


def render_diff(diff: Diff, fmt: str = "text", top: int = TOP, width: int | None = None) -> str:
    if fmt == "json":
        return _json(diff.to_dict())
    if fmt == "html":
        return _html(
            f"traceq diff: {diff.new_source}", _diff_sections(diff, top), _diff_chart(diff, top)
        )
    return _render(_diff_sections(diff, top), fmt, width)


def render_check(result: CheckResult, fmt: str = "text", width: int | None = None) -> str:
    if fmt == "json":
        return _json(result.to_dict())
    if fmt == "html":
        return _html(
            f"traceq check: {result.new_source}", _check_sections(result), _check_chart(result)
        )
    return _render(_check_sections(result), fmt, width)


# -- numbers ----------------------------------------------------------------------------
def fmt_ns(ns: float | None) -> str:
    if ns is None or (isinstance(ns, float) and not math.isfinite(ns)):
        return "—"
    size = abs(ns)
    if size >= 1e9:
        return f"{ns / 1e9:.3g} s"
    if size >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if size >= 1e3:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns:.0f} ns"


def fmt_delta_ns(ns: float) -> str:
    return ("+" if ns > 0 else "") + fmt_ns(ns) if ns else "0"


def fmt_pct(rel: float | None) -> str:
    if rel is None or not math.isfinite(rel):
        return "new" if rel is None else "—"
    return f"{rel:+.1%}"


def fmt_count(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def fmt_noise(change: Change) -> str:
    """'[+18.9%, +21.2%] p=0.002' — the interval and test a reader can weigh."""
    if change.one_sample:
        return "one sample"
    if change.ci_low is None or change.ci_high is None:
        return "—"
    text = f"[{change.ci_low:+.1%}, {change.ci_high:+.1%}]"
    if change.p_value is not None:
        text += f" p={change.p_value:.2g}"
    return text


# -- sections ---------------------------------------------------------------------------
def _diff_sections(diff: Diff, top: int) -> list[Section]:
    unit = "per step" if diff.per_step else "whole trace"
    head = Section(
        f"traceq diff by {diff.by} — {basis_label(diff.basis.split('/')[0])}, {unit}",
        lines=[
            clip(line, LINE_CHARS)
            for line in (f"base: {diff.base_source}", f"new:  {diff.new_source}", *diff.notes)
        ],
    )
    totals = Section("Totals", ["metric", "base", "new", "change", "95% interval, test", "verdict"])
    for total in diff.totals:
        c = total.change
        totals.rows.append(
            [total.label, fmt_ns(c.base), fmt_ns(c.new), fmt_pct(c.rel), fmt_noise(c), c.judgement]
        )
    if diff.totals and diff.totals[0].change.one_sample:
        totals.lines.append("one sample on a side: the decision rests on one measurement")
    sections = [head, totals]
    if diff.fusions:
        fused = Section("Fused", ["became one", "from", "time before → after", "calls"])
        for f in diff.fusions:
            kind = "fused kernel" if f.dim == "kernel" else "fused op"
            fused.rows.append(
                [
                    f"{clip(f.fused)} ({kind})",
                    " + ".join(clip(p) for p in f.parts),
                    f"{fmt_ns(f.base_ns)} → {fmt_ns(f.new_ns)}",
                    f"{fmt_count(f.base_calls)} → {fmt_count(f.new_calls)}",
                ]
            )
        sections.append(fused)
    groups = Section(
        f"By {diff.by} (top {top} by impact of {diff.groups.height})",
        [diff.by, "status", "calls", "base", "new", "Δ time", "Δ %", "noise"],
    )
    for row in diff.groups.head(top).iter_rows(named=True):
        noise = _row_noise(row)
        groups.rows.append(
            [
                short_name(row["group"]),
                _status(row),
                f"{fmt_count(row['base_count'])} → {fmt_count(row['new_count'])}",
                fmt_ns(row["base_ns"]),
                fmt_ns(row["new_ns"]),
                fmt_delta_ns(row["delta_ns"]),
                fmt_pct(row["rel"]) if row["status"] != "appeared" else "new",
                noise,
            ]
        )
    sections.append(groups)
    if diff.dispatch.height:
        dispatch = Section(
            f"Dispatch changes ({diff.dispatch.height}): same op and input shapes, other "
            + ("kernels" if diff.basis == "gpu" else "child ops"),
            ["op", "input shapes", "base → new", "what changed", "per call"],
        )
        for row in diff.dispatch.head(top).iter_rows(named=True):
            dispatch.rows.append(
                [
                    clip(row["op"]),
                    clip(row["shapes"] or "—")
                    + (f" (call {row['call'] + 1} in a step)" if row["call"] is not None else ""),
                    f"{_impl(row['base_impl'])} → {_impl(row['new_impl'])}",
                    clip(
                        row["change"]
                        + (
                            f"; inputs {row['base_types']} → {row['new_types']}"
                            if row["base_types"] != row["new_types"]
                            else ""
                        ),
                        LINE_CHARS,
                    ),
                    f"{fmt_ns(row['base_ns_per_call'])} → {fmt_ns(row['new_ns_per_call'])}",
                ]
            )
        sections.append(dispatch)
    if diff.findings is not None:
        found = diff.findings
        sections.append(_findings_section(found["appeared"], found["disappeared"], top))
    return sections


def _status(row: dict[str, Any]) -> str:
    """appeared / gone / slower / faster, or '~ same' when the change is inside the noise."""
    status = row["status"]
    if status in ("appeared", "same"):
        return status
    if status == "disappeared":
        return "gone"
    if row["significant"] is False:
        return "~ same"
    return "slower" if row["delta_ns"] > 0 else "faster"


def _row_noise(row: dict[str, Any]) -> str:
    if row["status"] in ("appeared", "disappeared") or row["ci_low"] is None:
        return "—" if row["p_value"] is None else f"p={row['p_value']:.2g}"
    return f"[{row['ci_low']:+.1%}, {row['ci_high']:+.1%}]"


def _impl(names: list[str]) -> str:
    short = [short_name(n, 48) for n in names if n]
    return " + ".join(short) if len(short) <= 3 else f"{' + '.join(short[:3])} + {len(short) - 3}"


def short_name(name: str, limit: int = 56) -> str:
    """A kernel name a reader can scan: no `void`, no parameter list, at most `limit` chars
    (the full names are in the JSON output)."""
    name = name.split(IMPL_SEP)[0].removeprefix("void ")
    if name.endswith(")") and "(" in name and " (" not in name:
        depth = 0
        # strip the trailing, balanced "(...)", looked for in the last 10,000 characters
        for i in range(len(name) - 1, max(len(name) - 10_000, 0) - 1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i].rstrip() or name
                break
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _findings_section(
    appeared: list[dict[str, Any]], gone: list[dict[str, Any]], top: int = TOP
) -> Section:
    """New and gone findings, largest estimated saving first, `top` of each."""
    section = Section("Findings", ["", "rule", "where", "count", "message"])
    for mark, items in (("+ new", appeared), ("- gone", gone)):
        ranked = sorted(items, key=lambda f: -(f.get("est_saving_us") or 0.0))
        for item in ranked[:top]:
            section.rows.append(
                [
                    mark,
                    f"{item.get('rule')} {clip(item.get('name'))}",
                    clip(item.get("module") or "—"),
                    str(item.get("count")),
                    clip(item.get("message") or item.get("key") or "", LINE_CHARS),
                ]
            )
        if len(ranked) > top:
            section.lines.append(f"{mark}: {len(ranked) - top} more not shown (see --format json)")
    if not section.rows:
        section.lines.append("no finding appeared or disappeared")
    return section


def _check_sections(result: CheckResult) -> list[Section]:
    regressed = result.regressions
    if result.failed:
        shown = [_metric_label(m) for m in regressed[:6]]
        more = f" and {len(regressed) - 6} more" if len(regressed) > 6 else ""
        names = ", ".join(shown) + more
        status = f"FAIL: {len(regressed)} regressed beyond {result.max_regress:.1%}" + (
            f" ({names})" if names else ""
        )
        if result.fail_on_new_findings and result.new_findings:
            status += f"; {len(result.new_findings)} new finding(s)"
    elif result.too_few:
        status = (
            f"PASS: {result.too_few}; nothing slower by more than {result.max_regress:.1%} "
            "on every step pair"
        )
    else:
        status = f"PASS: nothing regressed beyond {result.max_regress:.1%}"
    unit = "per-step samples" if result.per_step else "whole traces (no per-step samples)"
    head = Section(
        f"traceq check — {status}",
        lines=[
            clip(line, LINE_CHARS)
            for line in (
                f"baseline: {result.base_source}",
                f"trace:    {result.new_source}",
                f"compared: {unit}",
                *result.notes,
            )
        ],
    )
    table = Section("Metrics", ["metric", "base", "new", "change", "95% interval, test", "verdict"])
    order = {"regressed": 0, "improved": 2, "within limit": 3, TOO_FEW: 3, "no change": 4}
    for metric in sorted(result.metrics, key=lambda m: order.get(m.verdict, 1)):
        table.rows.append(_metric_row(metric))
    decided = {m.change.basis for m in result.metrics}
    table.lines.extend(f"decided on {d}" for d in sorted(decided))
    sections = [head, table]
    if result.new_findings or result.resolved_findings:
        sections.append(_findings_section(result.new_findings, result.resolved_findings))
    return sections


def _metric_row(metric: Metric) -> list[str]:
    c = metric.change
    mark = {"regressed": "✗ regressed", "improved": "✓ improved"}.get(
        metric.verdict, metric.verdict
    )
    if metric.verdict == TOO_FEW:
        mark = c.too_few_text
    elif c.too_few and metric.verdict in ("regressed", "improved"):
        mark = f"{mark} on every step pair; {c.too_few_text}"
    return [
        _metric_label(metric),
        fmt_ns(c.base),
        fmt_ns(c.new),
        fmt_pct(c.rel),
        fmt_noise(c),
        mark,
    ]


def _metric_label(metric: Metric) -> str:
    """Kernel metrics by their short name (the full one is in the JSON)."""
    if metric.spec.startswith("kernel:") and len(metric.groups) == 1:
        return f"kernel {short_name(metric.groups[0])}"
    return clip(metric.label)


# -- output -----------------------------------------------------------------------------
def _render(sections: list[Section], fmt: str, width: int | None) -> str:
    if fmt == "markdown":
        return _markdown(sections)
    if fmt != "text":
        raise ValueError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return _text(sections, width)


def _text(sections: list[Section], width: int | None) -> str:
    from rich.console import Console
    from rich.table import Table

    buffer = io.StringIO()
    if not width and not sys.stdout.isatty():  # a pipe, a CI log: whole rows, not folded
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) > 0 else LINE_CHARS
    width = width or max(100, shutil.get_terminal_size((120, 24)).columns)
    console = Console(file=buffer, width=width, force_terminal=False, no_color=True)
    for i, section in enumerate(sections):
        console.print(terminal(section.title, LINE_CHARS, "bold"), highlight=False)
        for line in section.lines:
            console.print(terminal(f"  {line}", LINE_CHARS), highlight=False)
        if section.header:
            table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
            for column in section.header:
                table.add_column(column, overflow="fold")
            for row in section.rows:
                table.add_row(*(terminal(cell, LINE_CHARS) for cell in row))
            console.print(table)
        if i < len(sections) - 1:
            console.print()
    return buffer.getvalue().rstrip() + "\n"


def _markdown(sections: list[Section]) -> str:
    out: list[str] = []
    for i, section in enumerate(sections):
        out.append(f"{'###' if i else '##'} {_md(section.title)}")
        out.append("")
        for line in section.lines:
            out.append(f"- {_md(line)}")
        if section.lines:
            out.append("")
        if section.header and section.rows:
            out.append("| " + " | ".join(_md(h) for h in section.header) + " |")
            out.append("|" + "---|" * len(section.header))
            for row in section.rows:
                out.append("| " + " | ".join(_md(cell) for cell in row) + " |")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


Chart = tuple[str, Any] | None
"""(the title of the section the chart goes over, a plotly figure), or no chart."""


def _html(title: str, sections: list[Section], chart: Chart) -> str:
    """The sections as one HTML page, the chart above the table of the section it shows."""
    from traceq.reports.html import Figures, esc, page, table

    figures = Figures()
    parts = []
    for i, section in enumerate(sections):
        tag = "h1" if i == 0 else "h2"
        parts.append(f"<section><{tag}>{esc(section.title)}</{tag}>")
        parts += [f"<p>{esc(line)}</p>" for line in section.lines]
        if chart is not None and section.title == chart[0]:
            parts.append(figures.add(chart[1], section.title))
        if section.header and section.rows:
            parts.append(table(section.header, section.rows))
        parts.append("</section>")
    return page(title, "\n".join(parts), figures)


def _check_chart(result: CheckResult) -> Chart:
    """Each metric's relative change with its 95% interval, and the allowed regression."""
    from traceq.reports import figures

    metrics = [m for m in result.metrics if m.change.rel is not None]
    if not metrics:
        return None
    color = {"regressed": "#d62728", "improved": "#2ca02c"}
    return (
        "Metrics",
        figures.change_bars(
            [_metric_label(m) for m in metrics],
            [m.change.rel for m in metrics],  # type: ignore[misc]
            [m.change.ci_low for m in metrics],
            [m.change.ci_high for m in metrics],
            [color.get(m.verdict, "#9d9da0") for m in metrics],
            limit=result.max_regress,
        ),
    )


def _diff_chart(diff: Diff, top: int) -> Chart:
    """The groups that changed most (by impact): their time change per step, in ms."""
    from traceq.reports import figures

    changed = diff.groups.filter(pl.col("delta_ns") != 0).head(top)
    if changed.height == 0:
        return None
    title = f"By {diff.by} (top {top} by impact of {diff.groups.height})"
    labels = [f"{i}. {short_name(g, 60)}" for i, g in enumerate(changed["group"].to_list(), 1)]
    return title, figures.delta_bars(labels, (changed["delta_ns"] / 1e6).to_list())


def _md(text: str) -> str:
    """Text for Markdown, shown as it is: never a link, an image or HTML (`safe_text`)."""
    return markdown(text, LINE_CHARS)


def _json(data: dict[str, Any]) -> str:
    return json.dumps(_finite(data), indent=2, default=str, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    """NaN and infinities become null: strict JSON that every consumer can read."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
