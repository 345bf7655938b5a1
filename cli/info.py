"""`traceq info TRACE`: what a trace holds."""

from __future__ import annotations

import click
from rich.table import Table
from traceq.cli import jobs
from traceq.cli.common import (
    JobEngine,
    echo_json,
    format_option,
    job_options,
    load,
    output_console,
    traces_argument,
)

from traceq.reports.safe_text import LINE_CHARS, clip, terminal
from traceq.reports.summary import summary
from traceq.rules.recorded import notices


@click.command()
@traces_argument
@format_option()
@job_options
def info(trace: tuple[str, ...], fmt: str, engine: JobEngine) -> None:
    """Show what TRACE holds: events by category, ops, kernels, steps, devices, links.

    TRACE may be a job (a directory, a glob, several files): ranks, process groups, the
    per-rank step breakdown, collectives and clock alignment."""
    if jobs.is_job(trace):
        return jobs.info(trace, fmt, engine)
    loaded = load(trace[0])
    data = summary(loaded)
    data["notices"] = [{"kind": n.kind, "message": n.message} for n in notices(loaded)]
    if fmt == "json":
        echo_json(data)
        return
    console = output_console()
    table = Table(title=terminal(trace[0], LINE_CHARS), show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("schema", f"{data['schema']} (schemaVersion {data['schema_version']})"),
        ("events", f"{data['events']:,}"),
        ("duration", f"{data['duration_us']:,.1f} µs"),
        ("ops", f"{data['ops']:,}"),
        ("kernels", f"{data['kernels']:,} (+ {data['memcpy']} memcpy, {data['memset']} memset)"),
        ("runtime calls", f"{data['runtime']:,}"),
        ("steps", ", ".join(map(str, data["steps"])) or "none"),
        ("modules", f"{data['modules']:,}"),
    ]
    if data["rank"] is not None:
        rows.append(("rank", f"{data['rank']} of {data['world_size']}"))
    for dev in data["devices"]:
        util = data["gpu_utilization"].get(dev["device"], 0.0)
        rows.append(
            (
                f"device {dev['device']}",
                f"{clip(dev['name'] or '?')}: {dev['kernels']:,} kernels on streams "
                f"{dev['streams']}, busy {dev['busy_us']:,.1f} µs ({util:.0%} of its span)",
            )
        )
    top = ", ".join(f"{clip(k)} {v:,}" for k, v in list(data["by_category"].items())[:8])
    rows.append(("by category", top))
    unlinked = ", ".join(f"{k} {v:,}" for k, v in data["unlinked"].items()) or "none"
    rows.append(("not linked", unlinked))
    rows.extend(graph_rows(data))
    for i, notice in enumerate(data["notices"]):  # what the trace lacks, what that costs
        rows.append(("not recorded" if i == 0 else "", notice["message"]))
    for key, value in rows:  # names from the trace: as they are, never as markup
        table.add_row(terminal(key), terminal(value, LINE_CHARS))
    console.print(table)


def graph_rows(data: dict) -> list[tuple[str, str]]:
    """`info`'s lines on CUDA/HIP graph replays and on kernels without a launch."""
    rows = []
    graphs = data.get("graphs") or {}
    if graphs:
        rows.append(
            (
                "graph replays",
                f"{graphs['graph_launches']:,} launches, {graphs['replayed_kernels']:,} kernels, "
                f"{graphs['replayed_us']:,.1f} µs ({graphs['replayed_share']:.1%} of GPU time); "
                f"ops attributed to {graphs['attributed_share']:.1%} of it",
            )
        )
        methods = ", ".join(
            f"{clip(method)} {m['share']:.1%} ({m['kernels']:,} kernels)"
            + (" replayed, ops unknown" if method == "launch" else "")
            for method, m in graphs["by_method"].items()
        )
        rows.append(("  by method", methods))
        captures = ", ".join(
            f"{clip(c['source'])} (batch {c['batch_size'] or '?'}, {c['mode'] or '?'})"
            for c in graphs["captures"]
        )
        rows.append(("  captures", captures or "none (pass --capture PATH)"))
    orphans = data.get("without_launch") or {}
    if orphans:
        reasons = "; ".join(
            f"{clip(reason)}: {r['kernels']:,} ({r['us']:,.1f} µs)"
            for reason, r in orphans["reasons"].items()
        )
        rows.append(
            (
                "without launch",
                f"{orphans['kernels']:,} kernels, {orphans['us']:,.1f} µs GPU time - {reasons}",
            )
        )
    return rows
