"""Terminal report (rich): groups by impact, largest estimated saving first.

Each group is one block: severity and code, the message of its largest occurrence, where
it repeats ("×24 in `encoder.layer.*.mlp`"), the saving and how it was estimated, the fix,
and the evidence a reader checks it against (decoded kernel names, op names).
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table
from rich.text import Text

from traceq.reports import replays
from traceq.reports.dtypes import dtype_name
from traceq.reports.model import (
    FindingGroup,
    Report,
    format_fix_check,
    format_share,
    format_source,
    format_us,
)
from traceq.reports.safe_text import LINE_CHARS, clip, printable, terminal

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def render(
    report: Report,
    *,
    width: int = 100,
    color: bool = False,
    max_groups: int | None = 30,
) -> str:
    """The report as text (ANSI colors when `color`)."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        force_terminal=color,
        no_color=not color,
        highlight=False,
        soft_wrap=not color,  # files and pipes get whole lines; terminals wrap to width
    )
    print_report(report, console, max_groups=max_groups)
    return buffer.getvalue()


def what(trace: dict) -> str:
    """What was analyzed: `kineto trace`, or for a job `job of 4 ranks (rank from file
    name), kineto traces` (`ranks` in the facts marks a job: `reports.model.job_report`)."""
    ranks = trace.get("ranks")
    if ranks is None:
        return f"{trace['schema']} trace"
    world = trace.get("world_size") or len(ranks)
    count = f"{len(ranks)} of {world} ranks" if world != len(ranks) else _plural(len(ranks), "rank")
    sources = trace.get("rank_sources") or []
    found = f" (rank from {' / '.join(sources)})" if sources else ""
    return f"job of {count}{found}, {trace['schema']} traces"


def print_report(report: Report, console: Console, *, max_groups: int | None = 30) -> None:
    summary = report.summary()
    trace = report.trace
    device = report.device
    console.print(_line(f"traceq analyze {report.source}", style="bold"))
    console.print(
        _line(
            f"{what(trace)}, {trace['events']:,} events, {trace['kernels']:,} GPU "
            f"activities, {_plural(len(trace['steps']), 'step')}; device model: "
            f"{clip(device['name'])} ({_bandwidth(device)}, launch "
            f"{device['launch_overhead_us']:.1f} µs)"
        )
    )
    for label, text in replays.lines(trace):  # graph replays, kernels without a launch
        console.print(_line(f"{label.strip()}: {text}"))
    for notice in report.notices:  # what the trace lacks: once, before the findings
        console.print(_line(f"note: {notice}", style="yellow"))
    if not report.groups:
        ran = report.rules or not report.notices  # none ran: the notices say why
        console.print(Text("No findings.", style="green") if ran else Text("No rule ran."))
        _problems(report, console)
        return
    share = format_share(summary["est_saving_us"], trace)
    console.print(
        f"{_plural(summary['findings'], 'finding')} in {_plural(summary['groups'], 'group')}; "
        f"estimated saving {format_us(summary['est_saving_us'])}"
        f"{f' ({share})' if share else ''} in all, each µs counted once (the findings' "
        f"own estimates sum to {format_us(summary['est_saving_us_sum'])})"
    )
    shown = report.groups if max_groups is None else report.groups[:max_groups]
    for number, group in enumerate(shown, 1):
        console.print()
        _group(number, group, console, trace)
    hidden = len(report.groups) - len(shown)
    if hidden > 0:
        console.print(
            f"\n… {hidden} more group{'s' * (hidden != 1)} (--top N shows more; --format json all)"
        )
    console.print()
    console.print(_by_rule(report))
    _problems(report, console)


def _group(number: int, group: FindingGroup, console: Console, trace: dict) -> None:
    first = group.first
    head = Text()
    head.append(f"{number}. ")
    head.append(f"{group.rule} {group.name}", style=STYLE.get(group.severity, ""))
    head.append(f"  [{group.severity}]  ")
    head.append(f"saves ~{format_us(group.est_saving_us)}", style="bold")
    head.append(f" of {format_us(group.time_us)}")
    share = format_share(group.est_saving_us, trace)
    head.append(f" ({share})" if share else "")
    if group.where:
        head.append(printable(f"  {clip(group.where)}"))
    console.print(head)
    console.print(_line(f"   {first.message}"))
    if first.source:
        console.print(_line(f"   at {format_source(first.source)}"))
    if group.steps:
        console.print(_line(f"   steps: {_steps(group.steps)}"))
    if first.shapes:
        shapes = " ".join("[" + "x".join(map(str, s)) + "]" for s in first.shapes[:4])
        dtype = f"  dtype {dtype_name(first.dtype)}" if first.dtype else ""
        console.print(_line(f"   shapes: {shapes}{dtype}"))
    elif first.dtype:
        console.print(_line(f"   dtype: {dtype_name(first.dtype)}"))
    console.print(_line(f"   model: {first.saving_model}"))
    for line in _evidence(first.evidence):
        console.print(_line(f"   {line}"))
    console.print(_line(f"   fix: {first.fix}", style="green"))
    if first.zoo:
        console.print(_line(f"   zoo: {', '.join(first.zoo)}"))
    if group.fix_check:
        console.print(_line(f"   fix check: {format_fix_check(group.fix_check)}", style="bold"))


def _evidence(evidence: dict) -> list[str]:
    lines = []
    names = list(dict.fromkeys(evidence.get("op_names") or []))
    top = evidence.get("top_ops")
    if isinstance(top, list) and top:
        lines.append("top ops: " + ", ".join(f"{t['name']} ({t['kernels']} kernels)" for t in top))
    if names:
        more = f" (+{len(names) - 6})" if len(names) > 6 else ""
        lines.append("ops: " + ", ".join(names[:6]) + more)
    decoded = evidence.get("decoded")
    if isinstance(decoded, dict) and decoded:
        lines.append("kernel: " + ", ".join(f"{k} {v}" for k, v in decoded.items()))
    elif isinstance(decoded, list):
        for item in decoded[:3]:
            lines.append(f"kernel: {item}")
    kernels = list(dict.fromkeys(evidence.get("kernel_names") or []))
    if kernels and not decoded:
        short = [k if len(k) <= 70 else k[:67] + "..." for k in kernels[:3]]
        lines.append("kernels: " + "; ".join(short))
    return lines


def _by_rule(report: Report) -> Table:
    table = Table(title="by rule", title_justify="left", show_edge=False)
    table.add_column("rule")
    table.add_column("name")
    table.add_column("findings", justify="right")
    table.add_column("time", justify="right")
    table.add_column("est. saving", justify="right")
    table.add_column("counted once", justify="right")
    for code, entry in report.summary()["by_rule"].items():
        table.add_row(
            code,
            entry["name"],
            str(entry["count"]),
            format_us(entry["time_us"]),
            format_us(entry["est_saving_us"]),
            format_us(entry["counted_saving_us"]),
        )
    return table


def _problems(report: Report, console: Console) -> None:
    for problem in report.problems:
        console.print(_line(f"warning: {problem}", style="yellow"))


def _line(text: str, style: str = "") -> Text:
    """One line of the report, which may quote the trace's names: printed as it is (never
    as rich markup), control characters escaped, at most `LINE_CHARS` long."""
    return terminal(text, LINE_CHARS, style)


def _steps(steps: list[int]) -> str:
    if len(steps) > 6:
        return f"{steps[0]}…{steps[-1]} ({len(steps)})"
    return ", ".join(map(str, steps))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _bandwidth(device: dict) -> str:
    bw = device["memory_bandwidth_gbs"]
    return f"{bw / 1000:.2f} TB/s" if bw >= 1000 else f"{bw:.0f} GB/s"
