"""Markdown for pull requests: a summary table, then one section per group (largest first)."""

from __future__ import annotations

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
from traceq.reports.safe_text import LINE_CHARS, markdown, markdown_code

ICON = {"error": "🔴", "warning": "🟠", "info": "🔵"}


def render(report: Report, *, max_groups: int | None = 30) -> str:
    summary = report.summary()
    lines = [
        "## traceq analyze",
        "",
        f"{markdown_code(report.source)}: {report.trace['events']:,} events, device model "
        f"{markdown(report.device['name'])}.",
        "",
    ]
    facts = replays.lines(report.trace)  # graph replays, kernels without a launch
    if facts:
        lines += [*[f"- **{_cell(label.strip())}**: {_cell(text)}" for label, text in facts], ""]
    if report.notices:  # what the trace lacks: once, before the findings
        lines += [*[f"> **Note:** {_cell(n)}" for n in report.notices], ""]
    if not report.groups:
        return "\n".join([*lines, "No findings.", ""])
    lines += [
        f"**{_plural(summary['findings'], 'finding')}** in {_plural(summary['groups'], 'group')}"
        f", estimated saving **{format_us(summary['est_saving_us'])}**"
        f"{_share(summary['est_saving_us'], report.trace)} (each µs counted once; the "
        f"findings' own estimates sum to {format_us(summary['est_saving_us_sum'])}).",
        "",
        "| # | rule | severity | where | time | est. saving | message |",
        "|---:|---|---|---|---:|---:|---|",
    ]
    shown = report.groups if max_groups is None else report.groups[:max_groups]
    for number, group in enumerate(shown, 1):
        lines.append(
            f"| {number} | `{group.rule}` {_cell(group.name)} | {ICON.get(group.severity, '')} "
            f"{group.severity} | {_cell(group.where) or '—'} | {format_us(group.time_us)} | "
            f"{format_us(group.est_saving_us)}{_share(group.est_saving_us, report.trace)} | "
            f"{_cell(group.first.message)} |"
        )
    hidden = len(report.groups) - len(shown)
    if hidden > 0:
        lines.append(f"\n…and {hidden} more group{'s' * (hidden != 1)}.")
    lines.append("")
    for number, group in enumerate(shown, 1):
        lines += _details(number, group)
    if report.problems:
        lines += ["", "**Problems:**", *[f"- {_cell(p)}" for p in report.problems]]
    return "\n".join(lines) + "\n"


def _details(number: int, group: FindingGroup) -> list[str]:
    first = group.first
    out = [
        "<details>",
        f"<summary>{number}. <code>{group.rule}</code> {group.name}: saves "
        f"~{format_us(group.est_saving_us)}</summary>",
        "",
        f"- **what:** {_cell(first.message)}",
        *([f"- **at:** {markdown_code(format_source(first.source))}"] if first.source else []),
        f"- **model:** {_cell(first.saving_model)}",
        f"- **fix:** {_cell(first.fix)}",
    ]
    if first.zoo:
        out.append(f"- **zoo:** {', '.join(markdown_code(z) for z in first.zoo)}")
    if first.shapes:
        out.append("- **shapes:** " + " ".join(markdown_code(s) for s in first.shapes[:4]))
    if first.dtype:
        out.append(f"- **dtype:** {markdown_code(dtype_name(first.dtype))}")
    names = list(dict.fromkeys(first.evidence.get("op_names") or []))
    if names:
        out.append("- **ops:** " + ", ".join(markdown_code(n) for n in names[:8]))
    if group.fix_check:
        out.append(f"- **fix check:** {_cell(format_fix_check(group.fix_check))}")
    out += ["", "</details>", ""]
    return out


def _cell(text: object) -> str:
    """Trace text (names, messages quoting them) for a table cell or a list item: shown as
    it is, never as a link, an image or HTML (`safe_text.markdown`)."""
    return markdown(text, LINE_CHARS)


def _share(us: float, trace: dict) -> str:
    """ " (4.1% of the step, 0.9% of the trace)", or "" when unknown (`format_share`)."""
    share = format_share(us, trace)
    return f" ({share})" if share else ""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
