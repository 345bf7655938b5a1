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

import glob
import json
import os
import re
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from traceq.errors import TraceFileError
from traceq.reports import replays, timeline
from traceq.reports.dtypes import dtype_name
from traceq.reports.model import (
    FindingGroup,
    Report,
    format_fix_check,
    format_source,
    format_us,
)
from traceq.reports.safe_text import LINE_CHARS, TITLE_CHARS, clip, html_text, script_json
from traceq.version import __version__

if TYPE_CHECKING:
    from collections.abc import Sequence

    from traceq.job import Job, JobFrames
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
    """Text for HTML content or an attribute: escaped, control characters shown as escapes
    (`safe_text.html_text`), so a trace's names are text on the page, never markup."""
    return html_text(value)


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
        # no `<`, `>` or `&` in the block: `</script>` or `<!--` in a name cannot end it
        text = script_json(json.dumps(spec, separators=(",", ":")))
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
    source: Trace | Job | str | os.PathLike[str] | Sequence[Any],
    path: str | os.PathLike[str],
    *,
    cache: bool | None = None,
    **analyze: Any,
) -> Path:
    """Write the HTML report of a trace, a trace file, or a job — a `Job`, a directory of
    rank traces, a glob, or a list of rank trace files (or of `Trace`s loaded from files)
    — to `path`; `analyze` goes to `traceq.analyze` / `traceq.analyze_job` (select,
    ignore, config, options); `cache` as `traceq.load`'s, for what it loads from files.
    Returns the path written.

    A job is loaded with `traceq.load_job` and analyzed with `traceq.analyze_job` (each
    rank's rules and TQ4xx across ranks); the page's job section draws the job's frames,
    and its Time and Where sections show the lowest rank's trace."""
    from traceq.analyze import analysis
    from traceq.reports.figures import go
    from traceq.reports.model import build_report

    go()  # fail before a long load when plotly is missing
    out = Path(path)
    if not out.parent.is_dir():  # and when the page has nowhere to go
        raise TraceFileError(f"cannot write {out}: directory {out.parent} does not exist")
    trace, job = _resolve(source, cache)
    if job is None:
        found = analysis(trace, **analyze)
        page_text = render_trace(trace, build_report(found, trace))
    else:
        page_text = render_job(job, **analyze)
    out.write_text(page_text, encoding="utf-8")
    return out


def _resolve(source: Any, cache: bool | None = None) -> tuple[Trace | None, Job | None]:
    """(the one trace, None) or (None, the job)."""
    from traceq.job import Job, load_job
    from traceq.pipeline import load
    from traceq.trace import Trace

    if isinstance(source, Trace):
        return source, None
    if isinstance(source, Job):
        return None, source
    if isinstance(source, (str, os.PathLike)):
        if Path(source).is_dir() or glob.has_magic(os.fspath(source)):
            return None, load_job(source, cache=cache)
        return load(source, cache=cache), None
    items = list(source)
    if items and all(isinstance(t, Trace) for t in items):
        items = [t.source for t in items]  # a job of the files they came from
    if not items or not all(isinstance(p, (str, os.PathLike)) for p in items):
        raise TypeError("report() takes a Trace, a Job, a path, or a list of rank traces")
    return None, load_job(list(items), cache=cache)


def render_job(job: Job, **analyze: Any) -> str:
    """The report page of a job: its findings (`traceq.analyze_job`), the job section from
    its cross-rank frames, and the lowest rank's Time and Where sections."""
    from traceq.job_analysis import analyze_job
    from traceq.reports.model import job_report

    options = {k: v for k, v in analyze.items() if k in ("select", "ignore", "config", "options")}
    result = analyze_job(job, **options)
    if not result.frames.ranks.height:
        notes = "; ".join(job.notes()) or "no rank loaded"
        raise TraceFileError(f"{job.source}: no rank of the job could be loaded ({notes})")
    report = job_report(result, job)
    shown = int(result.frames.ranks["rank"].min())
    return render_trace(job.trace(shown), report, job=result.frames, shown_rank=shown)


def render_trace(
    trace: Trace, report: Report, *, job: JobFrames | None = None, shown_rank: int | None = None
) -> str:
    """The report page of `trace` with the findings of `report`; `job` (the frames of the
    job `trace` is rank `shown_rank` of) adds the job section."""
    figures = Figures()
    facts = _facts(trace, report, job)
    parts = [
        f"<header><h1>traceq report</h1><p class=source>{esc(report.source)}</p>{facts}</header>",
        _nav(job is not None),
    ]
    if job is not None:
        parts.append(job_section(job, figures, shown_rank=shown_rank))
    parts += [
        findings_section(report, figures),
        time_section(trace, figures),
        where_section(trace, figures),
        roofline_section(trace, figures),
    ]
    if report.problems:
        items = "".join(f"<li>{esc(p)}</li>" for p in report.problems)
        parts.append(f'<section id="problems"><h2>Problems</h2><ul>{items}</ul></section>')
    if report.notices:  # what the trace lacks and what that costs the findings
        items = "".join(f"<li>{esc(n)}</li>" for n in report.notices)
        parts.append(f'<section id="notices"><h2>Not recorded</h2><ul>{items}</ul></section>')
    return page(f"traceq report: {report.source}", "\n".join(parts), figures)


def _facts(trace: Trace, report: Report, job: JobFrames | None) -> str:
    steps = trace.steps
    duration = trace.duration_ns / 1e3
    util = timeline.utilization(trace)
    device = trace.device_name(0) if trace.kernels.height else None
    if device is None:
        device = "GPU (name not recorded)" if trace.kernels.height else "CPU only (no GPU activity)"
    saving = report.summary()["est_saving_us"]
    profiled = (steps["dur_ns"].sum() / 1e3) if steps.height else duration
    basis = "the profiled time"
    if job is not None and job.step_ns.height:  # job findings span every rank's time
        profiled, basis = job.step_ns["dur_ns"].sum() / 1e3, "the ranks' profiled time"
    share = f" ({100 * saving / profiled:.1f}% of {basis})" if profiled else ""
    # for a job, the trace rows describe the rank whose Time and Where sections follow
    of = f" (rank {trace.rank})" if job is not None and trace.rank is not None else ""
    rows = [
        ("device", f"{clip(device)} · model: {clip(report.device.get('name'))}"),
        (f"steps{of}", _steps_text(steps)),
        (f"duration{of}", format_us(duration)),
        (
            f"GPU utilization{of}",
            "—" if util is None else f"{100 * util:.1f}% of the GPU's active span",
        ),
        (
            f"events{of}",
            f"{trace.events.height:,} events · {trace.ops.height:,} ops · "
            f"{trace.kernels.height:,} GPU activities",
        ),
    ]
    if job is not None:
        from traceq.reports.text import what

        rows.insert(0, ("job", f"{what(report.trace)}, {report.trace['events']:,} events"))
    elif trace.rank is not None:
        world = trace.world_size
        rows.append(("rank", f"{trace.rank}" + (f" of {world}" if world else "")))
    # graph replays (share, attribution) and kernels without a launch (`reports.replays`)
    rows.extend((label.strip(), text) for label, text in replays.lines(replays.facts(trace)))
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
    links.append(("roofline", "Roofline"))
    if job:
        links.insert(0, ("job", "Job"))
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
    job_rules = {r.code for r in report.rules if getattr(r, "scope", "trace") == "job"}
    out += [group_section(n, g, job=g.rule in job_rules) for n, g in enumerate(shown, 1)]
    out.append("</section>")
    return "\n".join(out)


def group_section(number: int, group: FindingGroup, *, job: bool = False) -> str:
    """One finding group's section; `job`: a cross-rank rule's, whose evidence is ranks,
    steps and collectives rather than ops and kernels."""
    first = group.first
    steps = group.steps or sorted(
        {s for f in group.findings for s in (f.evidence.get("steps") or []) if s is not None}
    )
    facts = [
        ("what", prose(first.message)),
        ("where", prose(group.where or "—")),
        *([("source", f"<code>{esc(format_source(first.source))}</code>")] if first.source else []),
        ("steps", esc(", ".join(map(str, steps)) or "—")),
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
        f'<dl class="group">{dl}</dl>{_job_evidence(group) if job else _evidence(group)}'
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
            f'<span title="{esc(clip(k.name, TITLE_CHARS))}">{esc(_decoded(k))}</span> '
            f'<small class="kname">{esc(_clip(short_kernel(k.name), 36))}</small>'
            for k in decoded
        ) + (f"<br><small>+{len(kernels) - 3} more</small>" if len(kernels) > 3 else "")
        shapes = " ".join("[" + "×".join(map(str, s)) + "]" for s in f.shapes[:4])
        more_ops = f" +{len(ops) - 6}" if len(ops) > 6 else ""
        rows.append(
            [
                esc("—" if f.step is None else f.step),
                dotted(f.module or "—"),
                esc(clip(", ".join(ops[:6]), LINE_CHARS) + more_ops) or "—",
                kernel_cell or "—",
                esc(shapes or "—"),
                esc(dtype_name(f.dtype) or "—"),
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


def _job_evidence(group: FindingGroup) -> str:
    """A cross-rank finding's evidence: its ranks, steps, process group, collective,
    sequence numbers and how many of each rank's events it names."""
    rows = []
    ranked = sorted(group.findings, key=lambda f: -f.est_saving_us)
    for f in ranked[:MAX_EVIDENCE]:
        ev = f.evidence
        ranks = ev.get("ranks") or ([ev["rank"]] if "rank" in ev else [])
        events = ev.get("events") or {}
        named = ", ".join(f"rank {r}: {len(ids)}" for r, ids in sorted(events.items()))
        seq = list(dict.fromkeys(_flat(ev.get("seq") or [])))
        rows.append(
            [
                ", ".join(map(str, ranks)) or "—",
                ", ".join(map(str, ev.get("steps") or [])) or "—",
                ev.get("process_group") or "—",
                ev.get("collective") or "—",
                ", ".join(map(str, seq[:8])) + (" …" if len(seq) > 8 else "") or "—",
                named or "—",
                format_us(f.time_us),
                format_us(f.est_saving_us),
            ]
        )
    return table(
        ["rank", "steps", "process group", "collective", "seq", "events named", "time", "saving"],
        rows,
        numeric=(6, 7),
        caption=f"Evidence: {len(group.findings)} occurrence(s); event ids are each rank's own "
        "(traceq analyze --format json lists them)",
    )


def _flat(items: list[Any]) -> list[Any]:
    """TQ401 lists each step's sequence numbers; the others one list."""
    return [x for item in items for x in (item if isinstance(item, list) else [item])]


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
                f'<span title="{esc(clip(r["name"], TITLE_CHARS))}">'
                f"{esc(_clip(short_kernel(r['name']), 70))}</span>",
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


# -- roofline -------------------------------------------------------------------------------


def roofline_section(trace: Trace, figures: Figures) -> str:
    """The heaviest modelled ops against the device's datasheet roofs (`trace.roofline`):
    the chart, and the top ops' numbers under it. One line instead on a CPU trace, a part
    traceq's spec table lacks, or a trace without recorded shapes."""
    from traceq.perf.roofline import trace_spec
    from traceq.reports import roofline_figure as rf

    out = ['<section id="roofline"><h2>Roofline</h2>']
    spec = trace_spec(trace) if trace.kernels.height else None
    ops = rf.signatures(trace.roofline) if spec is not None else None
    if spec is None:
        out.append(
            "<p class=empty>No roofline: no GPU kernels, or a device traceq's spec table "
            "does not have (<code>traceq device calibrate</code> writes one).</p></section>"
        )
        return "\n".join(out)
    if ops is None or ops.filter(pl.col("flops") > 0).height == 0:
        out.append(
            "<p class=empty>No roofline: no op has a cost model here (record with "
            "<code>record_shapes=True</code> for FLOPs and bytes).</p></section>"
        )
        return "\n".join(out)
    drawn = ops.filter(pl.col("flops") > 0).head(rf.POINTS)
    out.append(
        f"<p>Each point is one op (its calls of one shape and dtype summed): its FLOPs over "
        f"the bytes it must move, against the FLOP/s it reached in its kernels' time. "
        f"Roofs are the {esc(spec.name)} datasheet's ({esc(spec.hbm_gbs)} GB/s HBM); an op "
        f"left of a roof's ridge is bound by memory, right of it by compute. Ops that "
        f"compute nothing (copies) are in <code>traceq roofline</code>, not on log axes. "
        f"Source: {esc(spec.source)}.</p>"
    )
    out.append(
        figures.add(
            rf.figure(ops, spec),
            f"Roofline: the {drawn.height} heaviest modelled ops on {spec.name}, by family",
        )
    )
    shown = rf.rows(ops)
    out.append(
        table(
            rf.HEADER,
            shown,
            numeric=rf.NUMERIC,
            caption=f"The {len(shown)} modelled ops with the most time (of {ops.height})",
        )
    )
    out.append("</section>")
    return "\n".join(out)


# -- job ------------------------------------------------------------------------------------

MAX_COLLECTIVES = 240
"""Columns of the ranks × collectives heatmap (the calls with the largest arrival skew)."""
MAX_COLLECTIVE_ROWS = 40
"""Rows of the collectives table (largest skew first)."""


def job_section(frames: JobFrames, figures: Figures, *, shown_rank: int | None) -> str:
    """The job's cross-rank frames (`traceq.load_job`): per-rank breakdown, step time per
    rank, the straggler chart, and the collectives' arrival skew and bus bandwidth."""
    ranks = frames.ranks["rank"].to_list()
    out = [
        '<section id="job"><h2>Job</h2>',
        f"<p>{len(ranks)} ranks ({esc(_rank_list(ranks))}), matched by "
        "<code>traceq.load_job</code>: collectives by process group, step and sequence "
        "number, clocks aligned by the collectives' ends. The Time and Where sections below "
        f"are rank {shown_rank}'s; the findings are the whole job's.</p>",
        "<h3>Per-rank breakdown</h3>",
        _rank_breakdown(frames, figures),
        "<h3>Step time per rank</h3>",
        _rank_steps(frames, figures),
        "<h3>Stragglers: wait caused per rank and step</h3>",
        _stragglers(frames, figures),
        "<h3>Collectives: arrival skew per rank</h3>",
        _skew(frames, figures),
        "<h3>Collectives: bus bandwidth</h3>",
        _busbw(frames, figures),
        "</section>",
    ]
    return "\n".join(out)


def _rank_list(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}–{ranks[-1]}"
    return "rank" + ("s " if len(ranks) > 1 else " ") + ", ".join(map(str, ranks[:16]))


def rank_breakdown(breakdown: pl.DataFrame) -> pl.DataFrame:
    """Per rank, summed over its steps, the parts of its wall time that add up exactly:
    compute; communication with no compute beside it (exposed); memcpy with neither; idle.
    (|COMP ∪ COMM| = compute + exposed, so memcpy-only = busy − compute − exposed.)"""
    return (
        breakdown.group_by("rank")
        .agg(
            pl.len().alias("steps"),
            pl.col("on").first(),
            *(pl.col(c).sum() for c in ("span_ns", "compute_ns", "comm_ns", "exposed_comm_ns")),
            pl.col("memcpy_ns", "busy_ns", "idle_ns").sum(),
        )
        .with_columns(
            (pl.col("busy_ns") - pl.col("compute_ns") - pl.col("exposed_comm_ns"))
            .clip(lower_bound=0)
            .alias("memcpy_only_ns")
        )
        .sort("rank")
    )


def _rank_breakdown(frames: JobFrames, figures: Figures) -> str:
    from traceq.reports import figures as fig

    if frames.breakdown.height == 0:
        return "<p class=empty>No rank has timed work.</p>"
    per_rank = rank_breakdown(frames.breakdown)
    x = [f"rank {r}" for r in per_rank["rank"].to_list()]
    parts = {
        "compute": per_rank["compute_ns"],
        "communication": per_rank["exposed_comm_ns"],
        "memcpy": per_rank["memcpy_only_ns"],
        "idle": per_rank["idle_ns"],
    }
    chart = figures.add(
        fig.stacked_bars(x, {k: (v / 1e6).to_list() for k, v in parts.items()}, "rank", "ms"),
        "Profiled time per rank (summed over its steps): compute, exposed communication, "
        "memcpy, idle",
    )
    rows = [
        [
            f"rank {r['rank']}",
            r["on"].upper(),
            r["steps"],
            format_us(r["span_ns"] / 1e3),
            format_us(r["compute_ns"] / 1e3),
            format_us(r["comm_ns"] / 1e3),
            f"{format_us(r['exposed_comm_ns'] / 1e3)} ({_pct(r['exposed_comm_ns'], r['span_ns'])})",
            format_us(r["memcpy_ns"] / 1e3),
            f"{format_us(r['idle_ns'] / 1e3)} ({_pct(r['idle_ns'], r['span_ns'])})",
        ]
        for r in per_rank.iter_rows(named=True)
    ]
    header = ["rank", "on", "steps", "wall", "compute", "communication", "exposed comm.",
              "memcpy", "idle"]  # fmt: skip
    note = (
        "<p>Interval unions per step (two streams or threads busy at once count once), "
        "measured on the GPU, or on the host for CPU (gloo) ranks. Communication in all, "
        "and exposed: with no compute beside it (the bar's orange).</p>"
    )
    return note + chart + table(header, rows, numeric=tuple(range(2, 9)))


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "—"


def _rank_steps(frames: JobFrames, figures: Figures) -> str:
    from traceq.reports import figures as fig

    steps = frames.step_ns
    if steps.height == 0:
        return "<p class=empty>No rank trace has ProfilerStep windows.</p>"
    all_steps = sorted(set(steps["step"].to_list()))
    series: dict[str, list[float | None]] = {}
    for (rank,), rows in steps.sort("rank").group_by("rank", maintain_order=True):
        per = dict(zip(rows["step"].to_list(), (rows["dur_ns"] / 1e6).to_list(), strict=True))
        series[f"rank {rank}"] = [per.get(s) for s in all_steps]
    chart = figures.add(
        fig.lines([f"step {s}" for s in all_steps], series, "step", "ms"),
        "Step wall time per rank (the slowest rank sets the job's pace)",
    )
    rows = [
        [name, *[("—" if v is None else f"{v:.3f}") for v in values]]
        for name, values in series.items()
    ]
    rows.append(["slowest − fastest", *[_spread(series, i) for i in range(len(all_steps))]])
    return chart + table(
        ["rank", *[f"step {s} (ms)" for s in all_steps]],
        rows,
        numeric=tuple(range(1, len(all_steps) + 1)),
    )


def _spread(series: dict[str, list[float | None]], i: int) -> str:
    """The spread of step `i` across ranks, and which rank was slowest."""
    times = {name: values[i] for name, values in series.items() if values[i] is not None}
    if len(times) < 2:
        return "—"
    slowest = max(times, key=lambda name: times[name])
    return f"{times[slowest] - min(times.values()):.3f} ({slowest})"


def caused_waits(calls: pl.DataFrame) -> pl.DataFrame:
    """Per step and late rank: the wait it caused, as TQ401 counts it — each other rank's
    wall time waiting in collectives for it (`step_waits`), averaged over the other ranks
    of the step (`caused_ns`)."""
    from traceq.relations.collectives import step_waits

    calls = calls.filter(pl.col("ranks_seen") > 1)
    schema = {"step": pl.Int64, "last_rank": pl.Int64, "caused_ns": pl.Float64}
    if calls.height == 0:
        return pl.DataFrame(schema=schema)
    ranks = calls.group_by("step").agg(pl.col("rank").n_unique().alias("_ranks"))
    return (
        step_waits(calls)
        .group_by("step", "last_rank")
        .agg(pl.col("wait_ns").sum())
        .join(ranks, on="step", how="left", nulls_equal=True)
        .select(
            "step", "last_rank", (pl.col("wait_ns") / (pl.col("_ranks") - 1)).alias("caused_ns")
        )
        .cast(schema)
        .sort("step", "last_rank")
    )


def _stragglers(frames: JobFrames, figures: Figures) -> str:
    from traceq.reports import figures as fig

    caused = caused_waits(frames.collectives)
    if caused.height == 0:
        return "<p class=empty>No collective was matched across ranks: nobody waited.</p>"
    steps = sorted(set(caused["step"].to_list()))
    culprits = sorted(set(caused["last_rank"].to_list()))
    grid = {(r["step"], r["last_rank"]): r["caused_ns"] for r in caused.iter_rows(named=True)}
    series = {f"rank {c}": [grid.get((s, c), 0.0) / 1e6 for s in steps] for c in culprits}
    x = [f"step {s}" for s in steps]
    chart = figures.add(
        fig.stacked_bars(x, series, "step", "ms waited by each other rank", ranks=culprits),
        "Wait caused per step, by the rank that arrived last (the other ranks' mean wall "
        "time in collectives before it arrived)",
    )
    rows = []
    for i in range(len(steps)):
        values = {c: series[f"rank {c}"][i] for c in culprits}
        worst = max(values, key=lambda c: values[c])
        rows.append([x[i], *[f"{values[c]:.3f}" for c in culprits], f"rank {worst}"])
    text = (
        "<p>For every collective matched across ranks, the rank that arrived last made the "
        "others wait: each other rank's time in it before the last one arrived. A bar is a "
        "step; its parts, the ranks that caused the wait (two buckets waiting for the same "
        "rank at once count once; TQ401 reads the same numbers).</p>"
    )
    return (
        text
        + chart
        + table(
            ["step", *[f"rank {c} caused (ms)" for c in culprits], "most wait caused by"],
            rows,
            numeric=tuple(range(1, len(culprits) + 1)),
        )
    )


def collective_calls(calls: pl.DataFrame) -> pl.DataFrame:
    """One row per collective of the job, with its arrival skew (last start − first
    start), the rank that arrived last, its size and bus bandwidth."""
    return (
        calls.group_by("instance")
        .agg(
            pl.col("collective", "pg", "step", "seq", "ranks_seen", "last_rank").first(),
            (pl.col("start_ns").max() - pl.col("start_ns").min()).alias("skew_ns"),
            pl.col("bytes").max(),
            pl.col("transfer_ns").first(),
            pl.col("busbw_gbs").first(),
        )
        .sort("instance")
    )


def _call_label(row: dict[str, Any]) -> str:
    return f"#{row['instance']} {row['collective']} s{row['step']}"


def _skew(frames: JobFrames, figures: Figures) -> str:
    from traceq.reports import figures as fig

    calls = frames.collectives.filter(pl.col("ranks_seen") > 1)
    per_call = collective_calls(calls)
    if per_call.height == 0:
        return "<p class=empty>No collective was matched across ranks (one rank, or no "
        "common collectives).</p>"
    shown = per_call
    cut = ""
    if per_call.height > MAX_COLLECTIVES:
        shown = per_call.sort("skew_ns", descending=True).head(MAX_COLLECTIVES).sort("instance")
        cut = f"; the {MAX_COLLECTIVES} of {per_call.height} with the largest skew"
    late = calls.join(shown.select("instance"), on="instance", how="semi").with_columns(
        ((pl.col("start_ns") - pl.col("start_ns").min().over("instance")) / 1e6).alias("late_ms")
    )
    ranks = frames.ranks["rank"].to_list()
    labels = [_call_label(r) for r in shown.iter_rows(named=True)]
    column = {i: n for n, i in enumerate(shown["instance"].to_list())}
    z: list[list[float | None]] = [[None] * len(labels) for _ in ranks]
    row_of = {r: n for n, r in enumerate(ranks)}
    for r in late.iter_rows(named=True):
        z[row_of[r["rank"]]][column[r["instance"]]] = round(r["late_ms"], 4)
    chart = figures.add(
        fig.heatmap(labels, [f"rank {r}" for r in ranks], z, "ms after the first rank"),
        f"Arrival skew: how late each rank entered each collective, ms after the first "
        f"rank (the late rank is bright; the others wait that long){cut}",
    )
    top = per_call.sort("skew_ns", descending=True).head(MAX_COLLECTIVE_ROWS)
    rows = [
        [
            _call_label(r),
            r["pg"],
            r["seq"],
            r["ranks_seen"],
            f"rank {r['last_rank']}",
            format_us(r["skew_ns"] / 1e3),
            format_us(r["transfer_ns"] / 1e3),
        ]
        for r in top.iter_rows(named=True)
    ]
    caption = f"The {len(rows)} collectives with the largest arrival skew" + (
        f" of {per_call.height}" if per_call.height > len(rows) else ""
    )
    return chart + table(
        ["collective", "process group", "seq", "ranks", "last to arrive", "skew", "transfer"],
        rows,
        numeric=(2, 3, 5, 6),
        caption=caption,
    )


def _busbw(frames: JobFrames, figures: Figures) -> str:
    from traceq.reports import figures as fig

    per_call = collective_calls(frames.collectives).filter(pl.col("busbw_gbs").is_not_null())
    if per_call.height == 0:
        return (
            "<p class=empty>No message sizes recorded (older Kineto or CPU collectives "
            "without <code>record_param_comms</code> sizes): no bus bandwidth.</p>"
        )
    series: dict[str, tuple[list[str], list[float], list[str]]] = {}
    for r in per_call.iter_rows(named=True):
        xs, ys, hover = series.setdefault(r["collective"], ([], [], []))
        xs.append(_call_label(r))
        ys.append(float(f"{r['busbw_gbs']:.6g}"))
        hover.append(f"{_bytes(r['bytes'])} in {format_us(r['transfer_ns'] / 1e3)}")
    chart = figures.add(
        fig.markers(series, "collective (in order)", "bus bandwidth (GB/s)"),
        "Bus bandwidth per collective (NCCL's formulas over the time after the last rank arrived)",
    )
    classes = (
        per_call.with_columns(
            (2 ** pl.col("bytes").log(2).floor()).cast(pl.Int64).alias("size_class")
        )
        .group_by("collective", "size_class")
        .agg(
            pl.len().alias("calls"),
            pl.col("busbw_gbs").median().alias("median"),
            pl.col("busbw_gbs").min().alias("min"),
            pl.col("busbw_gbs").max().alias("max"),
        )
        .sort("collective", "size_class")
    )
    rows = [
        [
            r["collective"],
            f"≥ {_bytes(r['size_class'])}",
            r["calls"],
            f"{r['median']:.2f}",
            f"{r['min']:.2f}",
            f"{r['max']:.2f}",
        ]
        for r in classes.iter_rows(named=True)
    ]
    return chart + table(
        ["collective", "size", "calls", "median GB/s", "min GB/s", "max GB/s"],
        rows,
        numeric=(2, 3, 4, 5),
    )


def _bytes(n: int | None) -> str:
    if n is None:
        return "—"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


# -- text helpers -------------------------------------------------------------------------


def short_kernel(name: str) -> str:
    """A kernel name to scan: no `void `, no trailing parameter list."""
    name = name.removeprefix("void ")
    if name.endswith(")") and "(" in name:
        depth = 0
        # the trailing "(...)" is looked for in the last 10,000 characters
        for i in range(len(name) - 1, max(len(name) - 10_000, 0) - 1, -1):
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
