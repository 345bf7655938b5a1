"""`Summary`: what a diff or check needs from one trace, and all a baseline file keeps.

Diffs and checks run on summaries, never on traces, so "a baseline" and "a full trace" are
interchangeable inputs: `summarize(trace)` makes one from a loaded trace and
`load_baseline` reads one back from JSON. A summary holds per-step samples for every
group, the op → kernel dispatch table, the analyzer's findings when it could run, and a
whitelist of the trace's metadata (device, dtype, versions), never its free-form parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from traceq.analyze import analyze
from traceq.regression import groups as G
from traceq.regression.dispatch import implementations
from traceq.trace import Trace

# Top-level trace keys a baseline may copy: versions of the stack that produced the trace.
VERSION_KEYS = (
    "pytorch_version",
    "torch_version",
    "cuda_runtime_version",
    "cuda_driver_version",
    "cupti_version",
    "hip_runtime_version",
    "hip_driver_version",
    "roctracer_version",
    "schemaVersion",
)


@dataclass
class Summary:
    """Per-step samples of one trace. Times are integer ns; `basis` says whose time."""

    basis: str  # "gpu" (device time) or "cpu" (op self time)
    steps: list[int]  # ProfilerStep numbers, in order; empty when the trace has none
    step_wall_ns: list[int]  # wall time of each step
    step_time_ns: list[int]  # basis time inside each step
    total_wall_ns: int  # the trace's span
    groups: pl.DataFrame  # dim, group, step (null: outside steps), count, time_ns
    dispatch: pl.DataFrame  # dispatch.IMPL_SCHEMA
    metadata: dict[str, Any] = field(default_factory=dict)
    findings: list[dict[str, Any]] | None = None  # Finding.to_dict() each; None: not analyzed
    source: str = ""

    @property
    def has_steps(self) -> bool:
        return bool(self.steps)

    @property
    def total_time_ns(self) -> int:
        """Basis time of the whole trace, inside steps or not."""
        kernel_or_op = "kernel" if self.basis == "gpu" else "op"
        return int(self.groups.filter(pl.col("dim") == kernel_or_op)["time_ns"].sum())

    @property
    def devices(self) -> list[str]:
        return list(self.metadata.get("devices") or [])

    def group_names(self, dim: str) -> list[str]:
        return self.groups.filter(pl.col("dim") == dim)["group"].unique().sort().to_list()

    def samples(
        self, dim: str, names: list[str], field_: str = "time_ns", per_step: bool = True
    ) -> np.ndarray:
        """(len(names), samples) matrix: per group, its value in each step (0 where absent),
        or one column of whole-trace totals without steps or when not `per_step`."""
        rows = self.groups.filter((pl.col("dim") == dim) & pl.col("group").is_in(names))
        index = pl.DataFrame({"group": names}, schema={"group": pl.String})
        if not (self.has_steps and per_step):
            totals = rows.group_by("group").agg(pl.col(field_).sum())
            out = index.join(totals, on="group", how="left").fill_null(0)
            return out[field_].to_numpy().astype(float).reshape(-1, 1)
        wide = (
            rows.filter(pl.col("step").is_not_null())
            .pivot(on="step", index="group", values=field_, aggregate_function="sum")
            .rename(lambda c: c if c == "group" else f"s{c}")
        )
        cols = [f"s{s}" for s in self.steps]
        for col in cols:
            if col not in wide.columns:
                wide = wide.with_columns(pl.lit(0, dtype=pl.Int64).alias(col))
        out = index.join(wide, on="group", how="left").select(cols).fill_null(0)
        return out.to_numpy().astype(float).reshape(len(names), len(cols))

    def totals(self, dim: str) -> pl.DataFrame:
        """Per group of `dim`: count and time over the whole trace."""
        return (
            self.groups.filter(pl.col("dim") == dim)
            .group_by("group")
            .agg(pl.col("count").sum(), pl.col("time_ns").sum())
        )

    def step_samples(self, metric: str, per_step: bool = True) -> np.ndarray:
        """Per-step wall ('step') or basis ('time') samples; one whole-trace sample without
        steps or when not `per_step`."""
        if self.has_steps and per_step:
            values = self.step_wall_ns if metric == "step" else self.step_time_ns
            return np.asarray(values, dtype=float)
        total = self.total_wall_ns if metric == "step" else self.total_time_ns
        return np.asarray([total], dtype=float)


def summarize(trace: Trace, findings: bool | None = None) -> Summary:
    """A trace's `Summary`. `findings`: False skips the analyzer (the summary then holds no
    findings); True or None run it."""
    semantic = G.semantic_ops(trace.ops)
    rows = G.timed_rows(trace, semantic)
    steps = G.step_table(trace.steps, rows)
    return Summary(
        basis=G.time_basis(trace),
        steps=steps["step"].to_list(),
        step_wall_ns=steps["wall_ns"].to_list(),
        step_time_ns=steps["time_ns"].to_list(),
        total_wall_ns=trace.duration_ns,
        groups=pl.concat([G.group_times(rows), G.op_totals(trace)]),
        dispatch=implementations(trace, semantic),
        metadata=trace_metadata(trace),
        findings=analyze_findings(trace) if findings is not False else None,
        source=trace.source,
    )


def trace_metadata(trace: Trace) -> dict[str, Any]:
    """Device, vendor, dtype and versions: a whitelist, so nothing private (host, user,
    environment, job names) ever reaches a committed baseline."""
    versions = {k: trace.metadata[k] for k in VERSION_KEYS if k in trace.metadata}
    return {
        "vendor": G.vendor(trace),
        "devices": G.device_names(trace),
        "dtype": G.dominant_dtype(trace),
        "versions": {k: v for k, v in versions.items() if isinstance(v, str | int | float)},
        "world_size": trace.world_size if isinstance(trace.world_size, int) else None,
    }


def analyze_findings(trace: Trace) -> list[dict[str, Any]]:
    """The analyzer's findings as dicts, as a baseline stores them."""
    return [finding.to_dict() for finding in analyze(trace)]
