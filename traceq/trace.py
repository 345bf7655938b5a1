"""`Trace`: one loaded profile — its frames and metadata (`LoadedTrace`), the relations
computed from them on first use, and the questions asked most."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from traceq.errors import TraceError
from traceq.loader.loaded import LoadedTrace, Selectable
from traceq.relations.launches import LAUNCH_API

if TYPE_CHECKING:
    from traceq.relations.critical_path import CriticalPath, Region

__all__ = ["DataflowSource", "Selectable", "Trace"]

_UNUSABLE_ET = (TraceError, OSError, ValueError, TypeError, KeyError, pl.exceptions.PolarsError)
"""What reading or pairing an Execution Trace that is not this
trace's (edited, truncated, of another run) may raise; data flow is then inferred."""


@dataclass(frozen=True)
class DataflowSource:
    """Which data flow `Trace.dataflow` gave: exact from an Execution Trace (`paired` of
    `ops` data-flow ops made exact, the rest inferred), or inferred from shapes and order
    (`problem`: why the Execution Trace given or beside the trace could not be used)."""

    execution_trace: str | None = None
    paired: int = 0
    ops: int = 0
    problem: str | None = None

    @property
    def exact(self) -> bool:
        return self.execution_trace is not None and self.problem is None

    def __str__(self) -> str:
        if self.exact:
            return f"exact from {self.execution_trace} ({self.paired:,} of {self.ops:,} ops paired)"
        if self.problem is not None:
            return f"inferred: {self.problem}"
        return "inferred from shapes and order"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "exact" if self.exact else "inferred",
            "execution_trace": self.execution_trace,
            "paired_ops": self.paired,
            "ops": self.ops,
            "problem": self.problem,
            "text": str(self),
        }


MIN_PAIRED = 0.5
"""The share of the trace's ops an Execution Trace must pair to be taken as its own: every
corpus pair reaches 0.56 (a compiled graph's kernels have no ET node) to 1.0, another
run's ET of a similar model paired 0.08 (`inplace`'s beside `gpt2`)."""


class Trace(LoadedTrace):
    """A loaded trace, with its relations (data flow, graph, critical path) built on first
    use and the questions asked most (`sql`, `kernels_of`, `step_times`, `gpu_busy`, ...).

    `execution_trace_file`: the Execution Trace `traceq.load` found beside the trace (or was
    given); `dataflow` reads it when first asked for and is exact for the ops it pairs."""

    execution_trace_file: Path | None = None
    dataflow_source: DataflowSource | None = None
    """Which data flow `dataflow` gave; None until it is first asked for."""

    def __getstate__(self) -> dict[str, Any]:
        """A pickled trace keeps the Execution Trace it reads its data flow from."""
        return {**super().__getstate__(), "execution_trace_file": self.execution_trace_file}

    # -- relations (built on first use) ---------------------------------------------------
    @cached_property
    def dataflow_ops(self) -> pl.DataFrame:
        """The semantic ops data flow is defined over (see `traceq.relations.dataflow`)."""
        from traceq.relations.dataflow import dataflow_ops

        return dataflow_ops(self)

    @cached_property
    def dataflow(self) -> pl.DataFrame:
        """Producer -> consumer edges between `dataflow_ops` (`relations.dataflow`): inferred,
        or, with an `execution_trace_file`, exact for the ops it pairs (`with_execution_trace`).
        An Execution Trace that cannot be read or pairs no op leaves the inferred edges, and
        `dataflow_source` says why: analysis goes on either way."""
        from traceq.relations.dataflow import inferred_edges
        from traceq.relations.dataflow.execution_trace import (
            load_execution_trace,
            replaced_and_paired,
        )

        ops = self.dataflow_ops
        edges = inferred_edges(self, ops)
        path = self.execution_trace_file
        if path is None:
            self.dataflow_source = DataflowSource(ops=ops.height)
            return edges
        name = path.name
        try:
            et = load_execution_trace(path)
            exact, paired = replaced_and_paired(edges, self, et, ops)
        except _UNUSABLE_ET as exc:  # the ET is a companion: a broken one costs exactness only
            problem = str(exc) if isinstance(exc, TraceError) else f"{type(exc).__name__}: {exc}"
            self.dataflow_source = DataflowSource(
                name, ops=ops.height, problem=f"{name} unusable ({_first_line(problem, name)})"
            )
            return edges
        if paired.len() == 0:
            self.dataflow_source = DataflowSource(
                name, ops=ops.height, problem=f"{name} pairs none of the trace's ops"
            )
            return edges
        if paired.len() < MIN_PAIRED * ops.height:  # another run's ET pairs a few ops by name
            self.dataflow_source = DataflowSource(
                name,
                ops=ops.height,
                problem=f"{name} pairs only {paired.len()} of {ops.height} ops: another run's?",
            )
            return edges
        self.dataflow_source = DataflowSource(name, paired.len(), ops.height)
        return exact

    def with_execution_trace(self, src: str | os.PathLike[str]) -> pl.DataFrame:
        """Data-flow edges made exact by an Execution Trace recorded beside this trace:
        ops the ET pairs with get tensor-id edges; the others keep inferred ones."""
        from traceq.relations.dataflow import dataflow, load_execution_trace

        return dataflow(self, self.dataflow_ops, execution_trace=load_execution_trace(src))

    @cached_property
    def graph(self) -> Any:
        """The kernel dependency graph, a networkx DiGraph (see `traceq.relations.graph`)."""
        from traceq.relations.graph import build_graph

        return build_graph(self)

    @cached_property
    def roofline(self) -> pl.DataFrame:
        """Per op: FLOPs, bytes, achieved rates and % of the device's roofs, and what bounds
        it (`traceq.perf.roofline`; the device from `deviceProperties`)."""
        from traceq.perf.roofline import roofline  # numpy with it: not for `traceq info`

        return roofline(self, ops=self.dataflow_ops)

    def critical_path(self, region: Region = None) -> CriticalPath:
        """The critical path of the whole trace or a region: a step number, an annotation
        name, (name, instance) or (start_ns, end_ns) (see `relations.critical_path`)."""
        from traceq.relations.critical_path import critical_path

        return critical_path(self, region)

    # -- questions --------------------------------------------------------------------
    @cached_property
    def unlinked(self) -> dict[str, int]:
        """Counts of what could not be linked or modeled; reported, never silently dropped."""
        kernels = self.select("kernels", "runtime_event", "op_event", "correlation")
        runtime = self.select("runtime", "name", "correlation")
        flows = self.select("flows", "start_event", "end_event")
        launches = runtime.filter(
            pl.col("name").str.contains(LAUNCH_API) & pl.col("correlation").is_not_null()
        )
        no_op = pl.col("op_event").is_null()
        if "captures" in self.frames:  # graph replays attributed: their op is the capture's
            no_op &= pl.col("capture_op_event").is_null()
            kernels = self.select(
                "kernels", "runtime_event", "op_event", "correlation", "capture_op_event"
            )
        counts = {
            "kernels_without_launch": kernels.filter(pl.col("runtime_event").is_null()).height,
            "kernels_without_op": kernels.filter(no_op).height,
            "launches_without_kernel": launches.join(
                kernels.select("correlation").unique(), on="correlation", how="anti"
            ).height,
            "flows_without_end": flows.filter(pl.col("end_event").is_null()).height,
            "flows_without_start": flows.filter(pl.col("start_event").is_null()).height,
            "events_not_modeled": self.select("other", "event").height,
        }
        return {k: v for k, v in counts.items() if v}

    def sql(self, query: str) -> pl.DataFrame:
        """Run SQL over the frames (tables: events, ops, kernels, runtime, steps, ...).

        Columns stored as Categorical (`ph`, `cat`, `pid`, ...) read as text here, as SQL's
        `LIKE` and string functions need; lazily, so a query casts only what it reads."""
        frames = {"events": self.events, **self.frames}
        text = pl.col(pl.Categorical).cast(pl.String)
        tables = {name: frame.lazy().with_columns(text) for name, frame in frames.items()}
        ctx = pl.SQLContext(frames=tables, eager=True)
        return ctx.execute(query)

    def kernels_of(self, target: str | int) -> pl.DataFrame:
        """GPU activities launched by an op (event id or name, descendants included) or under
        a module (dotted path or a prefix of it, e.g. 'MLP_0' or 'Model_0.Layer_3')."""
        ops = self.ops
        if isinstance(target, int):
            roots = ops.filter(pl.col("event") == target)
        else:
            roots = ops.filter(pl.col("name") == target)
            if roots.height == 0:
                module = pl.col("module")
                under = (module == target) | module.str.starts_with(f"{target}.")
                return self.kernels.filter(under).sort("ts_ns")
        selected = roots.select("event")
        frontier = selected
        while frontier.height:
            frontier = ops.join(
                frontier.rename({"event": "parent"}), on="parent", how="semi"
            ).select("event")
            selected = pl.concat([selected, frontier])
        return self.kernels.join(
            selected.rename({"event": "op_event"}).unique(), on="op_event", how="semi"
        ).sort("ts_ns")

    def step_times(self) -> pl.DataFrame:
        """Per step: CPU wall time, and GPU time and kernel count of what the step launched."""
        gpu = (
            self.select("kernels", "step", "dur_ns")
            .group_by("step")
            .agg(pl.col("dur_ns").sum().alias("gpu_ns"), pl.len().alias("kernels"))
        )
        return (
            self.select("steps", "step", "dur_ns")
            .rename({"dur_ns": "cpu_ns"})
            .join(gpu, on="step", how="left")
            .with_columns(pl.col("gpu_ns").fill_null(0), pl.col("kernels").fill_null(0))
            .sort("step")
        )

    def top_kernels(self, n: int = 10) -> pl.DataFrame:
        """The kernels that take the most GPU time, grouped by name."""
        total = self.kernels["dur_ns"].sum() or 1
        return (
            self.kernels.group_by("name")
            .agg(
                pl.len().alias("count"),
                pl.col("dur_ns").sum().alias("total_ns"),
                pl.col("dur_ns").mean().alias("mean_ns"),
            )
            .with_columns((100 * pl.col("total_ns") / total).alias("pct"))
            .sort("total_ns", descending=True)
            .head(n)
        )

    def gpu_busy(self) -> pl.DataFrame:
        """Per device: busy time (union of activity intervals over all streams), idle time
        within the span of its activities, and utilization."""
        spans = self.select("kernels", "device", "ts_ns", "end_ns").sort("device", "ts_ns")
        merged = spans.with_columns(
            pl.col("end_ns").cum_max().shift(1).over("device").alias("_reach")
        ).with_columns(
            (pl.col("_reach").is_null() | (pl.col("ts_ns") > pl.col("_reach")))
            .cum_sum()
            .over("device")
            .alias("_block")
        )
        blocks = merged.group_by("device", "_block").agg(
            pl.col("ts_ns").min().alias("start"), pl.col("end_ns").max().alias("end")
        )
        return (
            blocks.group_by("device")
            .agg(
                (pl.col("end") - pl.col("start")).sum().alias("busy_ns"),
                (pl.col("end").max() - pl.col("start").min()).alias("span_ns"),
            )
            .with_columns(
                (pl.col("span_ns") - pl.col("busy_ns")).alias("idle_ns"),
                (pl.col("busy_ns") / pl.col("span_ns")).alias("utilization"),
            )
            .sort("device")
        )

    def _repr_html_(self) -> str:
        """A notebook's view: what the trace holds, one row each (never the metadata; the
        source path escaped)."""
        import html

        steps = self.steps["step"].to_list() if self.steps.height else []
        shown = ", ".join(map(str, steps[:8])) + (" …" if len(steps) > 8 else "")
        rows = [
            ("source", self.source),
            ("schema", self.schema),
            ("events", f"{self.events.height:,}"),
            ("duration", f"{self.duration_ns / 1e3:,.1f} µs"),
            ("ops", f"{self.ops.height:,}"),
            ("GPU activities", f"{self.kernels.height:,}"),
            ("steps", shown or "none"),
            ("Python frames", f"{self.python.height:,}"),
        ]
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>"
            for k, v in rows
        )
        return f"<div><b>Trace</b><table>{body}</table></div>"

    @property
    def duration_ns(self) -> int:
        """From the first event's start to the last event's end."""
        timed = self.select("events", "ph", "ts_ns", "dur_ns").filter(pl.col("ph") != "M")
        if timed.height == 0:
            return 0
        end = (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max()
        start = pl.col("ts_ns").min()
        return int(timed.select(end - start).item() or 0)


def _first_line(message: str, name: str) -> str:
    """An error's message as one short clause: its first line, without the path it names."""
    line = message.splitlines()[0] if message else "unreadable"
    return line.split(f"{name}: ", 1)[-1][:200]
