"""Markdown for pull requests: a summary table, then one section per group (largest first)."""

from __future__ import annotations

from traceq.reports.model import FindingGroup, Report, format_fix_check, format_us

ICON = {"error": "🔴", "warning": "🟠", "info": "🔵"}


def render(report: Report, *, max_groups: int | None = 30) -> str:
    summary = report.summary()
    lines = [
        "## traceq analyze",
        "",
        f"`{report.source}`: {report.trace['events']:,} events, device model "
        f"{report.device['name']}.",
        "",
    ]
    if not report.groups:
        return "\n".join([*lines, "No findings.", ""])
    lines += [
        f"**{summary['findings']} findings** in {summary['groups']} groups, estimated saving "
        f"**{format_us(summary['est_saving_us'])}** (each µs counted once; the findings' own "
        f"estimates sum to {format_us(summary['est_saving_us_sum'])}).",
        "",
        "| # | rule | severity | where | time | est. saving | message |",
        "|---:|---|---|---|---:|---:|---|",
    ]
    shown = report.groups if max_groups is None else report.groups[:max_groups]
    for number, group in enumerate(shown, 1):
        lines.append(
            f"| {number} | `{group.rule}` {group.name} | {ICON.get(group.severity, '')} "
            f"{group.severity} | {_cell(group.where) or '—'} | {format_us(group.time_us)} | "
            f"{format_us(group.est_saving_us)} | {_cell(group.first.message)} |"
        )
    hidden = len(report.groups) - len(shown)
    if hidden > 0:
        lines.append(f"\n…and {hidden} more groups.")
    lines.append("")
    for number, group in enumerate(shown, 1):
        lines += _details(number, group)
    if report.problems:
        lines += ["", "**Problems:**", *[f"- {p}" for p in report.problems]]
    return "\n".join(lines) + "\n"


def _details(number: int, group: FindingGroup) -> list[str]:
    first = group.first
    out = [
        "<details>",
        f"<summary>{number}. <code>{group.rule}</code> {group.name}: saves "
        f"~{format_us(group.est_saving_us)}</summary>",
        "",
        f"- **what:** {_cell(first.message)}",
        f"- **model:** {_cell(first.saving_model)}",
        f"- **fix:** {_cell(first.fix)}",
    ]
    if first.zoo:
        out.append(f"- **zoo:** {', '.join(f'`{z}`' for z in first.zoo)}")
    if first.shapes:
        out.append("- **shapes:** " + " ".join(f"`{s}`" for s in first.shapes[:4]))
    names = list(dict.fromkeys(first.evidence.get("op_names") or []))
    if names:
        out.append("- **ops:** " + ", ".join(f"`{n}`" for n in names[:8]))
    if group.fix_check:
        out.append(f"- **fix check:** {_cell(format_fix_check(group.fix_check))}")
    out += ["", "</details>", ""]
    return out


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")
