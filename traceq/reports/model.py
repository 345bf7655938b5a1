"""What every output renders: findings grouped by identity, totals, and the trace they
came from. Renderers (`text`, `json`, `markdown`, `sarif`) only format a `Report`.

A group gathers the occurrences of one finding key (rule + normalized module + op names +
shapes): the same split GEMM→GELU in 24 layers and 3 steps is one group of 72. A group can
carry a `fix_check` (a dict, attached later, e.g. by the zoo proving a fused kernel on this
group's shapes); every renderer shows it when present.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from traceq.reports import replays
from traceq.reports.dtypes import dtype_name
from traceq.reports.savings import counted_savings
from traceq.rules.finding import SEVERITIES, Finding
from traceq.rules.groups import FindingGroup, group_findings, layer_count  # noqa: F401 (re-exported)
from traceq.version import __version__

if TYPE_CHECKING:
    from traceq.job.job import Job
    from traceq.job_analysis import JobAnalysis
    from traceq.rules.base import Rule
    from traceq.rules.engine import Analysis
    from traceq.trace import Trace


@dataclass
class Report:
    """One analysis, ready to render."""

    source: str
    trace: dict[str, Any]
    device: dict[str, Any]
    findings: list[Finding]
    groups: list[FindingGroup]
    rules: list[Rule]
    problems: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    version: str = __version__
    # Per finding (aligned with `findings`): the µs of its estimate the total counts, each
    # µs of the trace once (`traceq.reports.savings`). Empty: every estimate counts whole.
    counted_us: list[float] = field(default_factory=list)
    # What the trace lacks and what that costs the findings (`rules.recorded`), said once.
    notices: list[str] = field(default_factory=list)
    # Which data flow the rules saw (`Trace.dataflow_source.to_dict()`): exact from an
    # Execution Trace or inferred; None when no rule asked for data flow (or a job).
    dataflow: dict[str, Any] | None = None

    def counted(self) -> list[float]:
        if len(self.counted_us) == len(self.findings):
            return self.counted_us
        return [f.est_saving_us for f in self.findings]

    def group(self, key: str) -> FindingGroup | None:
        return next((g for g in self.groups if g.key == key), None)

    def attach_fix_check(self, key: str, result: dict[str, Any]) -> None:
        """Record a fix check (e.g. a zoo benchmark on this group's shapes) for a group."""
        group = self.group(key)
        if group is None:
            raise KeyError(f"no finding group {key!r}")
        group.fix_check = result

    def summary(self) -> dict[str, Any]:
        """Counts and totals. `est_saving_us` counts each µs of the trace once (a µs two
        findings both save is counted for the first in attribution order); the findings'
        own estimates summed are `est_saving_us_sum`. Per rule: both."""
        by_rule: dict[str, dict[str, Any]] = {}
        counted = self.counted()
        for f, once in zip(self.findings, counted, strict=True):
            entry = by_rule.setdefault(
                f.rule,
                {
                    "name": f.name,
                    "count": 0,
                    "time_us": 0.0,
                    "est_saving_us": 0.0,
                    "counted_saving_us": 0.0,
                },
            )
            entry["count"] += 1
            entry["time_us"] += f.time_us
            entry["est_saving_us"] += f.est_saving_us
            entry["counted_saving_us"] += once
        by_severity = {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES}
        return {
            "findings": len(self.findings),
            "groups": len(self.groups),
            "est_saving_us": sum(counted),
            "est_saving_us_sum": sum(f.est_saving_us for f in self.findings),
            "by_rule": dict(sorted(by_rule.items())),
            "by_severity": by_severity,
            "rules_run": [r.code for r in self.rules],
            "trace": self.trace,
            "device": self.device,
            "problems": self.problems,
            "notices": self.notices,
            "dataflow": self.dataflow,
            "timings_s": self.timings_s,
            "traceq_version": self.version,
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: every occurrence, the groups, and the summary."""
        index = {id(f): g.key for g in self.groups for f in g.findings}
        findings = [
            {
                **f.to_dict(),
                "key": index[id(f)],
                "counted_saving_us": once,
                "dtype_name": dtype_name(f.dtype) or None,  # display: `bf16`, not `c10::BFloat16`
            }
            for f, once in zip(self.findings, self.counted(), strict=True)
        ]
        return {
            "findings": findings,
            "groups": [g.to_dict() for g in self.groups],
            "summary": self.summary(),
        }


def build_report(analysis: Analysis, trace: Trace) -> Report:
    """A `Report` of one analysis of `trace`."""
    steps = trace.steps["step"].to_list() if trace.steps.height else []
    info = {
        "path": trace.source,
        "schema": trace.schema,
        "events": trace.events.height,
        "duration_us": trace.duration_ns / 1000,
        "ops": trace.ops.height,
        "kernels": trace.kernels.height,
        "steps": steps,
        # the profiled steps' time summed: what a saving is a share of, per step
        "steps_us": float(trace.steps["dur_ns"].sum() or 0) / 1000 if trace.steps.height else 0.0,
        "rank": trace.rank,
        # graph replays and kernels without a launch, where there are any (`reports.replays`)
        **{key: value for key, value in replays.facts(trace).items() if value},
    }
    return Report(
        source=trace.source,
        trace=info,
        device=analysis.device.to_dict(),
        findings=analysis.findings,
        groups=group_findings(analysis.findings),
        rules=analysis.rules,
        problems=[str(p) for p in analysis.problems],
        timings_s={k: round(v, 4) for k, v in analysis.timings_s.items()},
        counted_us=(
            analysis.counted_us
            if analysis.trace is trace
            else counted_savings(analysis.findings, trace)
        ),
        notices=list(analysis.notices),
        dataflow=_dataflow(trace),
    )


def _dataflow(trace: Trace) -> dict[str, Any] | None:
    used = getattr(trace, "dataflow_source", None)
    return None if used is None else used.to_dict()


def job_report(result: JobAnalysis, job: Job, source: str | None = None) -> Report:
    """A `Report` of `traceq.analyze_job(job)`: the job's findings (TQ4xx and each rank's),
    and `trace` facts for the whole job (`ranks`, `world_size`, how ranks were found)."""
    from traceq.perf.device import cpu_model
    from traceq.rules.engine import discover

    devices = list(result.devices.values())
    ranks = result.frames.ranks
    step_ns = result.frames.step_ns
    info = {
        "path": source or job.source,
        "schema": ", ".join(sorted(set(ranks["schema"].to_list()))) or "none",
        "events": int(ranks["events"].sum() or 0),
        "duration_us": 0.0,
        "ops": 0,
        "kernels": int(result.frames.kernel_types["count"].sum() or 0)
        if result.frames.kernel_types.height
        else 0,
        "steps": sorted(set(step_ns["step"].to_list())) if step_ns.height else [],
        "rank": None,
        "ranks": ranks["rank"].to_list(),
        "world_size": job.world_size,
        "rank_sources": sorted(set(job.rank_sources.values())),
    }
    return Report(
        source=info["path"],
        trace=info,
        device=devices[0] if devices else cpu_model().to_dict(),
        findings=result.findings,
        groups=group_findings(result.findings),
        rules=[r for r in discover().rules if r.code in result.rules_run],
        problems=result.notes,
        timings_s={k: round(v, 4) for k, v in result.timings_s.items()},
        notices=list(result.notices),
    )


def format_us(us: float) -> str:
    """A duration for people: 850 µs, 12.3 ms, 4.56 s."""
    if us >= 1e6:
        return f"{us / 1e6:,.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:,.1f} ms"
    return f"{us:,.1f} µs"


def format_share(us: float, trace: dict[str, Any]) -> str:
    """A saving with its denominators: "4.1% of the step, 0.9% of the trace" (against the
    profiled steps' time, each step's saving to its time, and against the whole trace);
    "" when neither is known (a job)."""
    shares = []
    steps_us = trace.get("steps_us") or 0.0
    if steps_us > 0:
        shares.append(f"{_percent(us / steps_us)} of the step")
    duration_us = trace.get("duration_us") or 0.0
    if duration_us > 0:
        shares.append(f"{_percent(us / duration_us)} of the trace")
    return ", ".join(shares)


def _percent(fraction: float) -> str:
    pct = 100 * fraction
    return f"{pct:.2f}%" if 0 < pct < 0.1 else f"{pct:.1f}%"


def format_source(source: dict[str, Any] | None) -> str:
    """Where a finding's ops were issued, for people: "model.py:12 in forward" ("" when the
    trace has no Python stacks)."""
    if not source or not source.get("file"):
        return ""
    line = f":{source['line']}" if source.get("line") is not None else ""
    function = f" in {source['function']}" if source.get("function") else ""
    return f"{source['file']}{line}{function}"


def format_fix_check(check: dict[str, Any]) -> str:
    """One line for a fix check: its `summary` when given, else its fields."""
    if "summary" in check:
        return str(check["summary"])
    return ", ".join(f"{k}={v}" for k, v in check.items())
