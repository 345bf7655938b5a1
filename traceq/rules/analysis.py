"""`Analysis`: what one run of the rules produced, as a notebook reads it.

It is the findings (a `Sequence[Finding]`: iterate, index, `len`, compare with a list, as
the list `traceq.analyze` returned before), grouped by identity (`groups`), totalled with
each µs of the trace counted once (`total_saving_us`) and set against the time it is a
share of (`share_of`: the profiled steps' time, or the whole trace's when it has no
steps); `to_polars()` flattens it to one row per finding, `summary` to a dict, and a
notebook shows it as a table (`_repr_html_`).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, overload

import polars as pl

from traceq.rules.finding import SEVERITIES, Finding
from traceq.rules.groups import FindingGroup, group_findings

if TYPE_CHECKING:
    from traceq.perf.device import DeviceModel
    from traceq.rules.base import Rule
    from traceq.trace import Trace

HTML_GROUPS = 10
"""Finding groups a notebook's table shows (the largest savings); `groups` has them all."""

# One row per finding: the scalar columns of `Analysis.to_polars()`, in order.
FRAME_SCHEMA = {
    "rule": pl.String,
    "name": pl.String,
    "severity": pl.String,
    "message": pl.String,
    "step": pl.Int64,
    "module": pl.String,
    "dtype": pl.String,
    "time_us": pl.Float64,
    "est_saving_us": pl.Float64,
    "counted_saving_us": pl.Float64,
    "saving_model": pl.String,
    "fix": pl.String,
    "zoo": pl.String,
    "ops": pl.Int64,
    "kernels": pl.Int64,
    "shapes": pl.String,
    "source_file": pl.String,
    "source_line": pl.Int64,
    "source_function": pl.String,
    "key": pl.String,
    "group": pl.Int64,
    "evidence": pl.String,
}


@dataclass(eq=False, repr=False)
class Analysis(Sequence[Finding]):
    """What one run produced: findings (by est. saving, largest first) and how it ran.

    A sequence of its findings, so `for f in traceq.analyze(trace)` and
    `traceq.analyze(trace) == []` read as they always did."""

    findings: list[Finding]
    rules: list[Rule]
    device: DeviceModel
    problems: list[Any] = field(default_factory=list)  # `engine.Problem`s
    timings_s: dict[str, float] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    """What the trace lacks and what that costs the findings (`rules.recorded`)."""
    trace: Trace | None = field(default=None, repr=False)
    """The trace analyzed: what the total saving is counted on and a share of."""

    # -- a sequence of findings -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.findings)

    @overload
    def __getitem__(self, index: int) -> Finding: ...
    @overload
    def __getitem__(self, index: slice) -> list[Finding]: ...
    def __getitem__(self, index: int | slice) -> Finding | list[Finding]:
        return self.findings[index]

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Analysis):
            return self.findings == other.findings
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return self.findings == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by its findings

    # -- totals -----------------------------------------------------------------------------
    @cached_property
    def groups(self) -> list[FindingGroup]:
        """Occurrences grouped by `Finding.key()`, largest total saving first."""
        return group_findings(self.findings)

    @cached_property
    def counted_us(self) -> list[float]:
        """Per finding, the µs of its estimate the total counts (each µs of the trace once,
        `rules.counted`); each estimate whole when the trace is not at hand."""
        if self.trace is None:
            return [f.est_saving_us for f in self.findings]
        from traceq.rules.counted import counted_savings  # numpy: when totals are asked for

        return counted_savings(self.findings, self.trace)

    @property
    def total_saving_us(self) -> float:
        """The estimated saving of all findings, each µs of the trace counted once."""
        return float(sum(self.counted_us))

    @cached_property
    def base_us(self) -> float:
        """The time `total_saving_us` is a share of: the profiled steps' (`ProfilerStep#N`)
        summed, else the trace's, from its first event to its last (0: unknown)."""
        if self.trace is None:
            return 0.0
        steps = self.trace.steps
        if steps.height:
            return float(steps["dur_ns"].sum() or 0) / 1000
        return float(self.trace.duration_ns) / 1000

    @property
    def share_of(self) -> str:
        """What `total_saving_us` is a share of, in words: "3 steps' time" or "the trace's
        time" ("" when the trace is not at hand)."""
        if self.trace is None:
            return ""
        count = self.trace.steps.height
        if count:
            return f"{count} step{'s' if count > 1 else ''}' time"
        return "the trace's time"

    @property
    def share(self) -> float:
        """`total_saving_us` as a fraction of `base_us` (0.0 when that is unknown)."""
        return self.total_saving_us / self.base_us if self.base_us > 0 else 0.0

    @property
    def summary(self) -> dict[str, Any]:
        """Counts and totals: findings, groups, the counted saving and its share, by rule
        and severity, the rules run, notices and problems."""
        by_rule: dict[str, dict[str, Any]] = {}
        for f, once in zip(self.findings, self.counted_us, strict=True):
            entry = by_rule.setdefault(
                f.rule, {"name": f.name, "count": 0, "est_saving_us": 0.0, "counted_us": 0.0}
            )
            entry["count"] += 1
            entry["est_saving_us"] += f.est_saving_us
            entry["counted_us"] += once
        return {
            "findings": len(self.findings),
            "groups": len(self.groups),
            "est_saving_us": self.total_saving_us,
            "est_saving_us_sum": sum(f.est_saving_us for f in self.findings),
            "share": self.share,
            "share_of": self.share_of,
            "base_us": self.base_us,
            "by_rule": dict(sorted(by_rule.items())),
            "by_severity": {
                s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES
            },
            "rules_run": [r.code for r in self.rules],
            "device": self.device.name,
            "notices": list(self.notices),
            "problems": [str(p) for p in self.problems],
        }

    # -- views ------------------------------------------------------------------------------
    def to_polars(self) -> pl.DataFrame:
        """One row per finding: scalar columns (`FRAME_SCHEMA`), `shapes` and `evidence` as
        JSON text, `key` and `group` (its index in `groups`) to group by."""
        group_of = {id(f): i for i, g in enumerate(self.groups) for f in g.findings}
        rows = []
        for f, once in zip(self.findings, self.counted_us, strict=True):
            source = f.source or {}
            rows.append(
                {
                    "rule": f.rule,
                    "name": f.name,
                    "severity": f.severity,
                    "message": f.message,
                    "step": f.step,
                    "module": f.module,
                    "dtype": f.dtype,
                    "time_us": float(f.time_us),
                    "est_saving_us": float(f.est_saving_us),
                    "counted_saving_us": float(once),
                    "saving_model": f.saving_model,
                    "fix": f.fix,
                    "zoo": ", ".join(f.zoo),
                    "ops": len(f.ops),
                    "kernels": len(f.kernels),
                    "shapes": json.dumps(f.shapes),
                    "source_file": source.get("file"),
                    "source_line": source.get("line"),
                    "source_function": source.get("function"),
                    "key": self.groups[group_of[id(f)]].key,
                    "group": group_of[id(f)],
                    "evidence": json.dumps(f.evidence, default=str),
                }
            )
        return pl.DataFrame(rows, schema=FRAME_SCHEMA, orient="row")

    def __repr__(self) -> str:
        share = f" ({self.share:.1%} of {self.share_of})" if self.base_us > 0 else ""
        return (
            f"<Analysis {len(self.findings)} findings in {len(self.groups)} groups, estimated "
            f"saving {self.total_saving_us:,.1f} µs{share}>"
        )

    def _repr_html_(self) -> str:
        """A notebook's view: the totals, then the largest groups (every trace-derived
        string escaped)."""
        esc = html.escape
        share = f" ({self.share:.1%} of {esc(self.share_of)})" if self.base_us > 0 else ""
        head = (
            f"<b>Analysis</b>: {len(self.findings):,} findings in {len(self.groups):,} groups; "
            f"estimated saving {self.total_saving_us:,.1f} µs{share}, each µs counted once"
        )
        notices = "".join(f"<li>{esc(n)}</li>" for n in self.notices)
        rows = []
        for g in self.groups[:HTML_GROUPS]:
            source = g.first.source or {}
            at = f"{source['file']}:{source['line']}" if source.get("file") else ""
            cells = (g.rule, g.severity, g.first.message, g.where, at)
            rows.append(
                "<tr>"
                + "".join(f"<td style='text-align:left'>{esc(str(c))}</td>" for c in cells)
                + f"<td>{g.count:,}</td><td>{g.est_saving_us:,.1f}</td></tr>"
            )
        more = len(self.groups) - HTML_GROUPS
        tail = f"<p>… {more:,} more groups (<code>.groups</code>)</p>" if more > 0 else ""
        header = "".join(
            f"<th>{h}</th>" for h in ("rule", "severity", "message", "where", "source", "n", "µs")
        )
        table = f"<table><tr>{header}</tr>{''.join(rows)}</table>" if rows else ""
        return (
            f"<div><p>{head}</p>"
            + (f"<ul>{notices}</ul>" if notices else "")
            + table
            + tail
            + "</div>"
        )
