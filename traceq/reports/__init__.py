"""Reports: findings → text (terminal), JSON, Markdown (pull requests), SARIF (code scanning).

`model.build_report` turns an analysis into a `Report`; each renderer module exposes
`render(report) -> str` and knows nothing about rules or traces.
"""

from traceq.reports.model import FindingGroup, Report, build_report, group_findings

FORMATS = ("text", "json", "markdown", "sarif")


def render(report: Report, fmt: str, **kwargs: object) -> str:
    """`report` in one of `FORMATS`."""
    from importlib import import_module

    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}; known: {', '.join(FORMATS)}")
    module = import_module(f"traceq.reports.{fmt}")
    return module.render(report, **kwargs)


__all__ = ["FORMATS", "FindingGroup", "Report", "build_report", "group_findings", "render"]
