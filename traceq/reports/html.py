"""One self-contained HTML page: what the trace is, its findings, where the time goes.

The page works offline and alone: plotly's JavaScript is inlined once in the head, each
figure is a JSON block drawn by one small script, styles are inline and fonts are the
system's, so it opens from a CI artifact or a pull-request attachment with no network.
Every chart has a table under it with the same numbers (the page reads without scripts
and prints); colors follow `prefers-color-scheme`, and printing switches charts to light.

Timelines are downsampled to a fixed number of bins (`BINS`) whatever the trace's size, and
tables are cut to their top rows, so a 2M-event trace gives a page of the same few MB as
a small one (plotly.js alone is about 4.8 MB).

`render_trace` builds the page for one trace (and, for a job, its ranks); `page`,
`table` and `Figures` are shared with `traceq check/diff --format html`.
"""

from __future__ import annotations

import html
import json
import os
import re
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from traceq import __version__
from traceq.errors import TraceFileError
from traceq.reports import timeline
from traceq.reports.model import FindingGroup, Report, format_fix_check, format_us

if TYPE_CHECKING:
    from collections.abc import Sequence

    from traceq.trace import Trace

BINS = 400
"""Bins of the per-stream utilization timeline (each is the exact busy share of its span)."""
TOP = 15
"""Rows of the top-kernels and top-ops charts."""
MAX_GROUPS = 40
"""Finding groups with a chart bar and a section (the rest are listed, see JSON output)."""
MAX_EVIDENCE = 10
"""Occurrences shown in a group's evidence table."""
CRITICAL_PATH_EVENTS = 500_000
"""Past this many events the critical path is drawn for one typical step, not the trace."""


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


_CODE = re.compile(r"`([^`]+)`")


def prose(text: str | None) -> str:
    """Escaped text with the findings' `code spans` as <code>."""
    return _CODE.sub(r"<code>\1</code>", esc(text))


def dotted(path: str) -> str:
    """A module path that may wrap after each dot."""
    return esc(path).replace(".", ".<wbr>")


def plain(text: str) -> str:
    """Text for a chart label: code spans without their backticks."""
    return _CODE.sub(r"\1", text)


@dataclass
class Figures:
    """The figures of one page: each `add` returns its placeholder and keeps its JSON."""

    specs: list[tuple[str, str]] = field(default_factory=list)

    def add(self, figure: Any, caption: str, *, links: bool = False) -> str:
        target = f"fig-{len(self.specs) + 1}"
        spec = json.loads(figure.to_json())
        spec["links"] = links
        text = json.dumps(spec, separators=(",", ":")).replace("</", "<\\/")
        self.specs.append((target, text))
        return (
            f'<figure class="chart"><div id="{target}" class="plot" role="img" '
            f'aria-label="{esc(caption)}"></div><figcaption>{esc(caption)}</figcaption></figure>'
        )

    def scripts(self) -> str:
        return "\n".join(
            f'<script type="application/json" class="figure" data-target="{t}">{s}</script>'
            for t, s in self.specs
        )


def table(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    numeric: Sequence[int] = (),
    raw: Sequence[int] = (),
    caption: str | None = None,
) -> str:
    """An HTML table; columns in `numeric` align right, cells in `raw` columns are HTML."""
    head = "".join(
        f"<th{' class=num' if i in numeric else ''}>{esc(h)}</th>" for i, h in enumerate(header)
    )
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = str(cell) if i in raw else esc(cell)
            cells.append(f"<td{' class=num' if i in numeric else ''}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return (
        f'<div class="table"><table>{cap}<thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def page(title: str, body: str, figures: Figures) -> str:
    """The whole document: styles, plotly.js once, the body, the figures and their loader."""
    from traceq.reports.figures import go

    go()  # plotly installed, or one clear error
    from plotly.offline import get_plotlyjs

    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="color-scheme" content="light dark">'
        f"<style>{_asset('report.css')}</style>"
        f"<script>{get_plotlyjs()}</script></head>\n<body>\n{body}\n"
        f"<footer>traceq {esc(__version__)} · generated "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} · self-contained: no "
        f"network needed</footer>\n{figures.scripts()}\n<script>{_asset('report.js')}</script>\n"
        "</body></html>\n"
    )


# -- the trace page ----------------------------------------------------------------------


def report(
    source: Trace | str | os.PathLike[str] | Sequence[Trace] | Any,
    path: str | os.PathLike[str],
    **analyze: Any,
) -> Path:
    """Write the HTML report of a trace, a trace file, a directory of rank traces (a job)
    or a sequence of rank traces to `path`; `analyze` goes to `traceq.analyze` (select,
    ignore, config, options, device). Returns the path written.

    A job is for now its rank traces, each loaded with `traceq.load`; any object with a
    `traces` attribute (a sequence of traces) is taken as one, so a `Job` can be passed
    as it is."""
    from traceq.analyze import analysis
    from traceq.reports.figures import go
    from traceq.reports.model import build_report

    go()  # fail before a long load when plotly is missing
    out = Path(path)
    if not out.parent.is_dir():  # and when the page has nowhere to go
        raise TraceFileError(f"cannot write {out}: directory {out.parent} does not exist")
    trace, ranks = _resolve(source)
    found = analysis(trace, **analyze)
    out.write_text(render_trace(trace, build_report(found, trace), ranks=ranks), encoding="utf-8")
    return out


def _resolve(source: Any) -> tuple[Trace, list[Rank]]:
    """(the trace the page is about, the job's ranks or [])."""
    from traceq.pipeline import load
    from traceq.trace import Trace

    if isinstance(source, Trace):
        return source, []
    if isinstance(source, (str, os.PathLike)):
        if Path(source).is_dir():
            ranks = load_ranks(Path(source))
            return ranks[0].trace, ranks
        return load(source), []
    traces = list(getattr(source, "traces", source))
    if not traces or not all(isinstance(t, Trace) for t in traces):
        raise TypeError("report() takes a Trace, a path, or a sequence of rank Traces")
    ranks = _ranked(traces)
    return ranks[0].trace, ranks


TRACE_SUFFIXES = (".json", ".json.gz")


def load_ranks(directory: Path) -> list[Rank]:
    """Every trace file directly in `directory` (`*.json`, `*.json.gz`), loaded, by rank."""
    from traceq.pipeline import load

    files = sorted(
        p for p in directory.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
    )
    if not files:
        raise TraceFileError(f"{directory}: no trace files (*.json, *.json.gz) in this directory")
    return _ranked([load(p) for p in files])


def _ranked(traces: list[Trace]) -> list[Rank]:
    """Ranks from each trace's `distributedInfo`, else its position; lowest first."""
    ranks = [Rank(t.rank if t.rank is not None else i, t) for i, t in enumerate(traces)]
    return sorted(ranks, key=lambda r: r.rank)


@dataclass
class Rank:
    """One rank of a job: its number and its trace."""

    rank: int
    trace: Trace


def render_trace(trace: Trace, report: Report, *, ranks: Sequence[Rank] = ()) -> str:
    """The report page of `trace` with the findings of `report`; `ranks` (a job's other
    rank traces, this one among them) adds the job section."""
    figures = Figures()
    facts = _facts(trace, report, len(ranks))
    parts = [
        f"<header><h1>traceq report</h1><p class=source>{esc(report.source)}</p>{facts}</header>",
        _nav(bool(ranks)),
    ]
    if ranks:
        parts.append(job_section(ranks, figures, shown=trace))
    parts += [
        findings_section(report, figures),
        time_section(trace, figures),
        where_section(trace, figures),
    ]
    if report.problems:
        items = "".join(f"<li>{esc(p)}</li>" for p in report.problems)
        parts.append(f'<section id="problems"><h2>Problems</h2><ul>{items}</ul></section>')
    return page(f"traceq report: {report.source}", "\n".join(parts), figures)


def _facts(trace: Trace, report: Report, n_ranks: int) -> str:
    steps = trace.steps
    duration = trace.duration_ns / 1e3
    util = timeline.utilization(trace)
    device = trace.device_name(0) if trace.kernels.height else None
    if device is None:
        device = "GPU (name not recorded)" if trace.kernels.height else "CPU only (no GPU activity)"
    saving = report.summary()["est_saving_us"]
    profiled = (steps["dur_ns"].sum() / 1e3) if steps.height else duration
    share = f" ({100 * saving / profiled:.1f}% of the profiled time)" if profiled else ""
    rows = [
        ("device", device + f" · model: {report.device.get('name')}"),
        ("steps", _steps_text(steps)),
        ("duration", format_us(duration)),
        ("GPU utilization", "—" if util is None else f"{100 * util:.1f}% of the GPU's active span"),
        (
            "events",
            f"{trace.events.height:,} events · {trace.ops.height:,} ops · "
            f"{trace.kernels.height:,} GPU activities",
        ),
    ]
    if trace.rank is not None or n_ranks:
        world = trace.world_size
        rows.append(("rank", f"{trace.rank}" + (f" of {world}" if world else "")))
    if n_ranks:
        rows.append(("job", f"{n_ranks} rank traces in this directory"))
    rows.append(
        (
            "estimated saving",
            f"<strong>{esc(format_us(saving))}</strong>{esc(share)} from "
            f"{len(report.findings)} findings in {len(report.groups)} groups",
        )
    )
    cells = "".join(
        f"<div><dt>{esc(k)}</dt><dd>{v if k == 'estimated saving' else esc(v)}</dd></div>"
        for k, v in rows
    )
    return f'<dl class="facts">{cells}</dl>'


def _steps_text(steps: pl.DataFrame) -> str:
    if steps.height == 0:
        return "no ProfilerStep (the whole trace is one window)"
    mean = steps["dur_ns"].mean() / 1e3
    first, last = steps["step"].min(), steps["step"].max()
    which = f"step {first}" if first == last else f"steps {first}–{last}"
    return f"{steps.height} ({which}), mean {format_us(mean)} each"


def _nav(job: bool) -> str:
    links = [("findings", "Findings"), ("time", "Time"), ("where", "Where the time goes")]
    if job:
        links.insert(0, ("job", "Ranks"))
    items = "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in links)
    return f"<nav>{items}</nav>"


# -- findings ----------------------------------------------------------------------------


def anchor(number: int) -> str:
    return f"finding-{number}"


def findings_section(report: Report, figures: Figures) -> str:
    groups = report.groups
    out = ['<section id="findings"><h2>Findings</h2>']
    if not groups:
        rules = ", ".join(r.code for r in report.rules)
        out.append(f"<p class=empty>No findings (rules run: {esc(rules)}).</p></section>")
        return "".join(out)
    shown = groups[:MAX_GROUPS]
    summary = report.summary()
    out.append(
        f"<p>{len(report.findings)} findings in {len(groups)} groups; estimated saving "
        f"<strong>{esc(format_us(summary['est_saving_us']))}</strong> in all, each µs counted "
        f"once (the findings' own estimates sum to "
        f"{esc(format_us(summary['est_saving_us_sum']))}; the bars show each group's own). "
        "Click a bar or a row for the group's evidence.</p>"
    )
    from traceq.reports import figures as fig

    labels = [
        plain(f"{n}. {g.rule} {g.name}" + (f" {g.where}" if g.where else ""))
        for n, g in enumerate(shown, 1)
    ]
    out.append(
        figures.add(
            fig.savings_bars(
                [_clip(label, 70) for label in labels],
                [g.est_saving_us for g in shown],
                [g.severity for g in shown],
                [f"#{anchor(n)}" for n in range(1, len(shown) + 1)],
                [_clip(plain(g.first.message), 120) for g in shown],
            ),
            "Estimated saving by finding group, largest first",
            links=True,
        )
    )
    rows = [
        [
            f'<a href="#{anchor(n)}">{n}</a>',
            f"{g.rule} {g.name}",
            f'<span class="sev {g.severity}">{g.severity}</span>',
            g.where or "—",
            format_us(g.time_us),
            format_us(g.est_saving_us),
            g.first.message,
        ]
        for n, g in enumerate(shown, 1)
    ]
    out.append(
        table(
            ["#", "rule", "severity", "where", "time", "est. saving", "message"],
            [
                [r[0], esc(r[1]), r[2], prose(r[3]).replace(".", ".<wbr>"), r[4], r[5], prose(r[6])]
                for r in rows
            ],
            numeric=(0, 4, 5),
            raw=(0, 1, 2, 3, 6),
        )
    )
    if len(groups) > len(shown):
        out.append(
            f"<p>…and {len(groups) - len(shown)} smaller groups "
            "(`traceq analyze --format json` lists them all).</p>"
        )
    out += [group_section(n, g) for n, g in enumerate(shown, 1)]
    out.append("</section>")
    return "\n".join(out)


def group_section(number: int, group: FindingGroup) -> str:
    first = group.first
    facts = [
        ("what", prose(first.message)),
        ("where", prose(group.where or "—")),
        ("steps", esc(", ".join(map(str, group.steps)) or "—")),
        ("time now", esc(format_us(group.time_us))),
        ("estimated saving", f"<strong>{esc(format_us(group.est_saving_us))}</strong>"),
        ("saving model", prose(first.saving_model or "—")),
        ("fix", prose(first.fix or "—")),
    ]
    if first.zoo:
        facts.append(("zoo", ", ".join(f"<code>{esc(z)}</code>" for z in first.zoo)))
    if group.fix_check:
        facts.append(("fix check", esc(format_fix_check(group.fix_check))))
    dl = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in facts)
    return (
        f'<article class="finding" id="{anchor(number)}">'
        f"<h3>{number}. <code>{esc(group.rule)}</code> {esc(group.name)} "
        f'<span class="sev {group.severity}">{group.severity}</span> '
        f"<small>saves ~{esc(format_us(group.est_saving_us))} of "
        f"{esc(format_us(group.time_us))}</small></h3>"
        f'<dl class="group">{dl}</dl>{_evidence(group)}'
        '<p class="top"><a href="#findings">↑ findings</a></p></article>'
    )


def _evidence(group: FindingGroup) -> str:
    from traceq.kernel_names import decode

    ranked = sorted(group.findings, key=lambda f: (-f.est_saving_us, f.step or 0))
    rows = []
    for f in ranked[:MAX_EVIDENCE]:
        ops = list(dict.fromkeys(f.evidence.get("op_names") or []))
        kernels = list(dict.fromkeys(f.evidence.get("kernel_names") or []))
        decoded = [decode(k) for k in kernels[:3]]
        kernel_cell = "<br>".join(
            f'<span title="{esc(k.name)}">{esc(_decoded(k))}</span> '
            f'<small class="kname">{esc(_clip(short_kernel(k.name), 36))}</small>'
            for k in decoded
        ) + (f"<br><small>+{len(kernels) - 3} more</small>" if len(kernels) > 3 else "")
        shapes = " ".join("[" + "×".join(map(str, s)) + "]" for s in f.shapes[:4])
        rows.append(
            [
                esc("—" if f.step is None else f.step),
                dotted(f.module or "—"),
                esc(", ".join(ops[:6]) + (f" +{len(ops) - 6}" if len(ops) > 6 else "")) or "—",
                kernel_cell or "—",
                esc(shapes or "—"),
                esc(f.dtype or "—"),
                esc(format_us(f.time_us)),
                esc(format_us(f.est_saving_us)),
            ]
        )
    more = len(group.findings) - len(rows)
    caption = f"Evidence: {len(group.findings)} occurrence(s)" + (
        f", the {len(rows)} largest shown" if more > 0 else ""
    )
    return table(
        [
            "step",
            "module",
            "ops",
            "kernels (library, dtype, layout)",
            "shapes",
            "dtype",
            "time",
            "saving",
        ],
        rows,
        numeric=(0, 6, 7),
        raw=tuple(range(8)),
        caption=caption,
    )


def _decoded(kernel: Any) -> str:
    parts = [kernel.library or "?", kernel.category, kernel.dtype, kernel.layout, kernel.op]
    return " · ".join(p for p in parts if p)


# -- time --------------------------------------------------------------------------------


def time_section(trace: Trace, figures: Figures) -> str:
    from traceq.reports import figures as fig

    out = ['<section id="time"><h2>Time</h2>', "<h3>Per step</h3>"]
    breakdown = timeline.step_breakdown(trace)
    if breakdown.height == 0:
        out.append("<p class=empty>The trace has no timed events.</p>")
    else:
        x = [("trace" if s is None else f"step {s}") for s in breakdown["step"].to_list()]
        out.append(
            "<p>Each step's wall time (its <code>ProfilerStep</code> window), every instant "
            "counted once: a compute kernel runs; else a collective (exposed communication); "
            "else a memcpy/memset; else the GPU is idle while a host op runs (CPU-bound); else "
            "nothing traced runs (idle). Streams and devices are merged.</p>"
        )
        out.append(figures.add(fig.step_bars(breakdown, x), "Step time by what the GPU did"))
        out.append(_breakdown_table(breakdown, x, "step"))
    out.append("<h3>GPU utilization per stream</h3>")
    out.append(_streams(trace, figures))
    out.append("<h3>Critical path</h3>")
    out.append(_critical_path(trace, figures))
    out.append("</section>")
    return "\n".join(out)


def _breakdown_table(breakdown: pl.DataFrame, x: list[str], first: str) -> str:
    cats = list(timeline.CATEGORIES)
    rows = []
    for label, row in zip(x, breakdown.iter_rows(named=True), strict=True):
        dur = row["dur_ns"] or 1
        rows.append(
            [label, format_us(row["dur_ns"] / 1e3)]
            + [f"{format_us(row[c] / 1e3)} ({100 * row[c] / dur:.0f}%)" for c in cats]
        )
    header = [first, "wall", "compute", "communication", "memcpy", "CPU-bound", "idle"]
    return table(header, rows, numeric=tuple(range(1, len(cats) + 2)))


def _streams(trace: Trace, figures: Figures) -> str:
    from traceq.reports import figures as fig

    starts, lanes = timeline.stream_utilization(trace, BINS)
    if lanes.height == 0:
        return "<p class=empty>No GPU activity in this trace.</p>"
    origin = starts[0]
    width_us = (starts[1] - starts[0]) / 1e3 if starts.size > 1 else 0.0
    series = []
    rows = []
    for (device, stream), lane in lanes.group_by("device", "stream", maintain_order=True):
        name = f"GPU {device} stream {stream}" if stream is not None else f"GPU {device} others"
        busy = (100 * lane["busy"]).round(2).to_list()
        series.append((name, busy))
        rows.append([name, f"{sum(busy) / len(busy):.1f}%", f"{max(busy):.0f}%"])
    lines = fig.utilization_lines(((starts - origin) / 1e6).round(4).tolist(), series)
    caption = (
        f"Busy % per stream in {BINS} bins of {format_us(width_us)} (exact busy share of "
        f"each bin; the {timeline.STREAMS} busiest streams, others merged)"
    )
    return figures.add(lines, caption) + table(
        ["stream", "mean busy", "peak bin"], rows, numeric=(1, 2)
    )


def critical_region(trace: Trace) -> tuple[int | None, str]:
    """The whole trace, or past `CRITICAL_PATH_EVENTS` events its median-length step (a
    typical step: the whole-trace path costs seconds per million events)."""
    steps = trace.steps
    if trace.events.height <= CRITICAL_PATH_EVENTS or steps.height == 0:
        return None, "the whole trace"
    ordered = steps.sort("dur_ns", "step")
    step = int(ordered["step"][(ordered.height - 1) // 2])
    return step, f"step {step}, the median-length step of {steps.height}"


def _critical_path(trace: Trace, figures: Figures) -> str:
    from traceq.errors import TraceError
    from traceq.reports import figures as fig

    region, scope = critical_region(trace)
    try:
        path = trace.critical_path(region)
    except (TraceError, ValueError) as error:
        return f"<p class=empty>No critical path: {esc(error)}</p>"
    if path.length_ns == 0:
        return "<p class=empty>The critical path is empty.</p>"
    causes = sorted(path.breakdown_ns.items(), key=lambda kv: -kv[1])
    causes = [(c, ns) for c, ns in causes if ns > 0]
    chart = figures.add(
        fig.hbars(
            [c.replace("_", " ") for c, _ in causes],
            [ns / 1e6 for _, ns in causes],
            "ms",
            color="#72b7b2",
        ),
        f"Critical path of {scope} ({format_us(path.length_us)}) by cause",
    )
    rows = [
        [c.replace("_", " "), format_us(ns / 1e3), f"{100 * ns / path.length_ns:.1f}%"]
        for c, ns in causes
    ]
    top = [
        [
            _clip(short_kernel(r["name"] or "—"), 90),
            r["kind"],
            format_us(r["time_ns"] / 1e3),
            f"{r['pct']:.1f}%",
        ]
        for r in path.top(10).iter_rows(named=True)
    ]
    return (
        chart
        + table(["cause", "time", "share"], rows, numeric=(1, 2))
        + table(
            ["event on the path", "kind", "time", "share"],
            top,
            numeric=(2, 3),
            caption="Events with the most time on the critical path",
        )
    )


# -- where the time goes ---------------------------------------------------------------------


def where_section(trace: Trace, figures: Figures) -> str:
    from traceq.reports import figures as fig

    out = ['<section id="where"><h2>Where the time goes</h2>', "<h3>Top kernels</h3>"]
    kernels = timeline.top_kernels(trace, TOP)
    if kernels.height == 0:
        out.append("<p class=empty>No GPU activity in this trace.</p>")
    else:
        names = kernels["name"].to_list()
        out.append(
            figures.add(
                fig.hbars(
                    [f"{i}. {_clip(short_kernel(n), 56)}" for i, n in enumerate(names, 1)],
                    (kernels["total_ns"] / 1e6).to_list(),
                    "ms",
                    hover=[_clip(n, 200) for n in names],
                ),
                f"The {kernels.height} kernels with the most GPU time",
            )
        )
        rows = [
            [
                f'<span title="{esc(r["name"])}">{esc(_clip(short_kernel(r["name"]), 70))}</span>',
                esc(r["library"] or "—"),
                esc(r["category"]),
                esc(r["dtype"] or "—"),
                esc(r["layout"] or "—"),
                esc(r["tile"] or "—"),
                f"{r['count']:,}",
                esc(format_us(r["total_ns"] / 1e3)),
                esc(format_us(r["mean_ns"] / 1e3)),
                f"{r['pct']:.1f}%",
            ]
            for r in kernels.iter_rows(named=True)
        ]
        out.append(
            table(
                [
                    "kernel",
                    "library",
                    "category",
                    "dtype",
                    "layout",
                    "tile",
                    "calls",
                    "total",
                    "mean",
                    "share",
                ],
                rows,
                numeric=(6, 7, 8, 9),
                raw=tuple(range(10)),
            )
        )
    out.append("<h3>Top ops</h3>")
    ops = timeline.top_ops(trace, TOP)
    if ops.height == 0:
        out.append("<p class=empty>No CPU ops in this trace.</p>")
    else:
        names = ops["name"].to_list()
        series = {"self CPU time": (ops["self_ns"] / 1e6).to_list()}
        if trace.kernels.height:
            series["GPU time launched"] = (ops["gpu_ns"] / 1e6).to_list()
        basis = "GPU time launched" if trace.kernels.height else "self CPU time"
        out.append(
            figures.add(
                fig.grouped_hbars([_clip(n, 60) for n in names], series, "ms"),  # names unique
                f"The {ops.height} ops with the most {basis}",
            )
        )
        rows = [
            [
                r["name"],
                f"{r['count']:,}",
                format_us(r["self_ns"] / 1e3),
                format_us(r["gpu_ns"] / 1e3),
            ]
            for r in ops.iter_rows(named=True)
        ]
        out.append(table(["op", "calls", "self CPU", "GPU launched"], rows, numeric=(1, 2, 3)))
    out.append("<h3>Modules</h3>")
    basis, tree = timeline.module_tree(trace)
    if tree.height == 0 or tree["id"].to_list() == ["(no module)"]:
        out.append(
            "<p class=empty>The trace records no modules (profile with "
            "<code>with_stack=True</code> or <code>with_modules=True</code>).</p>"
        )
    else:
        out.append(figures.add(fig.treemap(tree, basis), f"{basis} by module (click to zoom)"))
        biggest = tree.sort("total_ns", "id", descending=[True, False]).head(25)
        rows = [
            [r["id"], format_us(r["total_ns"] / 1e3), format_us(r["own_ns"] / 1e3)]
            for r in biggest.iter_rows(named=True)
        ]
        out.append(table(["module", f"{basis} (with children)", "own"], rows, numeric=(1, 2)))
    out.append("</section>")
    return "\n".join(out)


# -- job ------------------------------------------------------------------------------------


def job_section(ranks: Sequence[Rank], figures: Figures, *, shown: Trace) -> str:
    """Per-rank breakdown and per-rank step times, from each rank's own trace."""
    from traceq.reports import figures as fig

    shown_rank = next((r.rank for r in ranks if r.trace is shown), ranks[0].rank)
    out = [
        '<section id="job"><h2>Ranks</h2>',
        f"<p>{len(ranks)} rank traces. The sections below this one are rank {shown_rank}'s.</p>",
        "<h3>Per-rank breakdown</h3>",
    ]
    totals = []
    steps: dict[str, dict[int, float]] = {}
    for r in ranks:
        breakdown = timeline.step_breakdown(r.trace)
        totals.append(breakdown.select(pl.exclude("step", "ts_ns")).sum())
        if r.trace.steps.height:
            steps[f"rank {r.rank}"] = dict(
                zip(breakdown["step"].to_list(), (breakdown["dur_ns"] / 1e6).to_list(), strict=True)
            )
    frame = pl.concat(totals)
    x = [f"rank {r.rank}" for r in ranks]
    out.append(figures.add(fig.step_bars(frame, x, title="rank"), "Profiled time per rank"))
    out.append(_breakdown_table(frame, x, "rank"))
    out.append("<h3>Step time per rank</h3>")
    if steps:
        all_steps = sorted({s for per in steps.values() for s in per})
        series = {name: [per.get(s) for s in all_steps] for name, per in steps.items()}
        out.append(
            figures.add(
                fig.lines([f"step {s}" for s in all_steps], series, "step", "ms"),
                "Step wall time per rank (the slowest rank sets the job's pace)",
            )
        )
        rows = [
            [name, *[("—" if v is None else f"{v:.3f}") for v in values]]
            for name, values in series.items()
        ]
        rows.append(["slowest − fastest", *[_skew(series, i) for i in range(len(all_steps))]])
        out.append(
            table(
                ["rank", *[f"step {s} (ms)" for s in all_steps]],
                rows,
                numeric=tuple(range(1, len(all_steps) + 1)),
            )
        )
    else:
        out.append("<p class=empty>No rank trace has ProfilerStep windows.</p>")
    out.append("</section>")
    return "\n".join(out)


def _skew(series: dict[str, list[float | None]], i: int) -> str:
    """The spread of step `i` across ranks, and which rank was slowest."""
    times = {name: values[i] for name, values in series.items() if values[i] is not None}
    if len(times) < 2:
        return "—"
    slowest = max(times, key=lambda name: times[name])
    return f"{times[slowest] - min(times.values()):.3f} ({slowest})"


# -- text helpers -------------------------------------------------------------------------


def short_kernel(name: str) -> str:
    """A kernel name to scan: no `void `, no trailing parameter list."""
    name = name.removeprefix("void ")
    if name.endswith(")") and "(" in name:
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i].rstrip() or name
                break
    return name


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _asset(name: str) -> str:
    """The page's stylesheet or script, shipped beside this module."""
    return resources.files("traceq.reports").joinpath(name).read_text(encoding="utf-8")
