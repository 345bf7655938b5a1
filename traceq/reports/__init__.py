"""Reports: findings → text (terminal), JSON, Markdown (pull requests), SARIF (code scanning).

`model.build_report` turns an analysis into a `Report`; each renderer module exposes
`render(report) -> str` and knows nothing about rules or traces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from traceq.reports.model import FindingGroup, Report, build_report, group_findings

FORMATS = ("text", "json", "markdown", "sarif")


def render(report: Report, fmt: str, **kwargs: object) -> str:
    """`report` in one of `FORMATS`."""
    from importlib import import_module

    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}; known: {', '.join(FORMATS)}")
    module = import_module(f"traceq.reports.{fmt}")
    return module.render(report, **kwargs)


def __getattr__(name: str) -> object:
    """The model's names, imported when used: `traceq info` reads `reports.summary` and
    needs neither the model nor numpy, which `savings` imports."""
    if name in ("FindingGroup", "Report", "build_report", "group_findings"):
        from traceq.reports import model

        return getattr(model, name)
    raise AttributeError(f"module 'traceq.reports' has no attribute {name!r}")


__all__ = ["FORMATS", "FindingGroup", "Report", "build_report", "group_findings", "render"]
