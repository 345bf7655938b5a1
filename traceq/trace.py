"""`Trace`: one loaded profile — its frames, its metadata, and the questions asked most."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import polars as pl

from traceq.relations.launches import LAUNCH_API


@runtime_checkable
class Selectable(Protocol):
    """Frames that can give some columns without decoding the rest (`loader.cache.Stored`)."""

    def select(self, name: str, columns: Sequence[str]) -> pl.DataFrame: ...


class Trace:
    """A loaded trace. Frames are Polars DataFrames; `events` holds every raw event + `args`.

    `events` and `frames` are what a cold load built, or, for a cached trace, a function
    giving the events frame and a mapping that decodes each frame when first used
    (`loader.cache.Stored`): a command pays only for the frames it reads. The questions
    below (`schema`, `unlinked`, `gpu_busy`, ...) ask `select` for the columns they use.
    """

    def __init__(
        self,
        source: str,
        metadata: dict[str, Any],
        events: pl.DataFrame | Callable[[], pl.DataFrame],
        frames: Mapping[str, pl.DataFrame],
    ) -> None:
        self.source = source
        self.metadata = metadata
        self.frames = frames
        self._events = events

    @cached_property
    def events(self) -> pl.DataFrame:
        return self._events if isinstance(self._events, pl.DataFrame) else self._events()

    def __getstate__(self) -> dict[str, Any]:
        """A pickled trace (a process pool's argument) carries its frames decoded: a cached
        trace's reader, and the file it would rebuild from, stay in this process."""
        return {
            "source": self.source,
            "metadata": self.metadata,
            "frames": {name: self.frames[name] for name in self.frames},
            "_events": self.events,
        }

    def select(self, name: str, *columns: str) -> pl.DataFrame:
        """Frame `name` ("events", "ops", "kernels", ...) with only `columns`: on a cached
        trace only those columns are decoded (5 of the 20 event columns of a 2.16M-event
        trace are 60 MB of its 340 MB)."""
        if isinstance(self.frames, Selectable):
            return self.frames.select(name, columns)
        return (self.events if name == "events" else self.frames[name]).select(columns)

    def __repr__(self) -> str:
        """One line, whatever the trace holds: `metadata` often carries the recording
        machine's pip list and environment variables (tokens among them), so `print(trace)`
        and a notebook cell show counts, and the metadata stays one attribute away."""
        devices = self.select("kernels", "device")["device"].drop_nulls().unique().sort()
        on = f"device{'s' * (len(devices) > 1)} {', '.join(map(str, devices))}"
        rank = "" if self.rank is None else f", rank {self.rank} of {self.world_size or '?'}"
        events = self.select("events", "event").height
        steps = self.select("steps", "step").height
        return (
            f"<Trace {self.source}: {_count(events, 'event')}, {_count(steps, 'step')}, "
            f"{on if len(devices) else 'CPU only'}{rank}>"
        )

    # -- frames -----------------------------------------------------------------------
    @property
    def ops(self) -> pl.DataFrame:
        return self.frames["ops"]

    @property
    def kernels(self) -> pl.DataFrame:
        return self.frames["kernels"]

    @property
    def runtime(self) -> pl.DataFrame:
        return self.frames["runtime"]

    @property
    def annotations(self) -> pl.DataFrame:
        return self.frames["annotations"]

    @property
    def steps(self) -> pl.DataFrame:
        return self.frames["steps"]

    @property
    def python(self) -> pl.DataFrame:
        return self.frames["python"]

    @property
    def modules(self) -> pl.DataFrame:
        return self.frames["modules"]

    @property
    def flows(self) -> pl.DataFrame:
        return self.frames["flows"]

    @property
    def syncs(self) -> pl.DataFrame:
        return self.frames["syncs"]

    @property
    def counters(self) -> pl.DataFrame:
        return self.frames["counters"]

    @property
    def instants(self) -> pl.DataFrame:
        return self.frames["instants"]

    @property
    def threads(self) -> pl.DataFrame:
        return self.frames["threads"]

    @property
    def other(self) -> pl.DataFrame:
        return self.frames["other"]

    def with_args(self, frame: pl.DataFrame) -> pl.DataFrame:
        """`frame` with the raw `args` JSON of each row's event joined back on."""
        return frame.join(self.events.select("event", "args"), on="event", how="left")

    # -- metadata ---------------------------------------------------------------------
    @property
    def schema(self) -> str:
        """'kineto' (today's categories), 'kineto-2021' (Operator/Kernel/Runtime) or 'chrome'."""
        cats = set(self.select("events", "cat")["cat"].drop_nulls().unique().to_list())
        if cats & {"cpu_op", "kernel", "cuda_runtime", "user_annotation", "python_function"}:
            return "kineto"
        if cats & {"Operator", "Kernel", "Runtime", "Memcpy", "Memset"}:
            return "kineto-2021"
        return "chrome"

    @property
    def schema_version(self) -> Any:
        return self.metadata.get("schemaVersion")

    @property
    def device_properties(self) -> list[dict[str, Any]]:
        props = self.metadata.get("deviceProperties")
        return props if isinstance(props, list) else []

    @property
    def distributed(self) -> dict[str, Any]:
        info = self.metadata.get("distributedInfo")
        return info if isinstance(info, dict) else {}

    @property
    def rank(self) -> int | None:
        return self.distributed.get("rank")

    @property
    def world_size(self) -> int | None:
        return self.distributed.get("world_size")

    @property
    def base_time_ns(self) -> int | None:
        return self.metadata.get("baseTimeNanoseconds")

    @property
    def trace_id(self) -> str | None:
        return self.metadata.get("trace_id")

    @property
    def versions(self) -> dict[str, Any]:
        """CUDA/ROCm/CUPTI versions the profiler wrote at the top level."""
        keys = [k for k in self.metadata if k.endswith("_version")]
        return {k: self.metadata[k] for k in sorted(keys)}

    def device_name(self, device: int = 0) -> str | None:
        """The GPU's name from `deviceProperties`.

        ROCm traces may number devices differently in events (`device` 2) and properties
        (`id` 0); when the trace describes one device and its activities ran on one, they
        are the same device.
        """
        props = self.device_properties
        for prop in props:
            if prop.get("id") == device:
                return prop.get("name")
        used = self.select("kernels", "device")["device"].drop_nulls().unique()
        if len(props) == 1 and used.len() == 1 and used[0] == device:
            return props[0].get("name")
        return None

    # -- relations (built on first use) ---------------------------------------------------
    @cached_property
    def dataflow_ops(self) -> pl.DataFrame:
        """The semantic ops data flow is defined over (see `traceq.relations.dataflow`)."""
        from traceq.relations.dataflow import dataflow_ops

        return dataflow_ops(self)

    @cached_property
    def dataflow(self) -> pl.DataFrame:
        """Inferred producer -> consumer edges between `dataflow_ops` (`relations.dataflow`)."""
        from traceq.relations.dataflow import dataflow

        return dataflow(self, self.dataflow_ops)

    def with_execution_trace(self, src: str | os.PathLike[str]) -> pl.DataFrame:
        """Data-flow edges made exact by an Execution Trace recorded beside this trace:
        ops the ET pairs with get tensor-id edges; the others keep inferred ones."""
        from traceq.relations.dataflow import dataflow
        from traceq.relations.execution_trace import load_execution_trace

        return dataflow(self, self.dataflow_ops, execution_trace=load_execution_trace(src))

    @cached_property
    def graph(self) -> Any:
        """The kernel dependency graph, a networkx DiGraph (see `traceq.relations.graph`)."""
        from traceq.relations.graph import build_graph

        return build_graph(self)

    def critical_path(self, region: Any = None) -> Any:
        """The critical path of the whole trace or a region (step, annotation, or window)."""
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
        counts = {
            "kernels_without_launch": kernels.filter(pl.col("runtime_event").is_null()).height,
            "kernels_without_op": kernels.filter(pl.col("op_event").is_null()).height,
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

    @property
    def duration_ns(self) -> int:
        """From the first event's start to the last event's end."""
        timed = self.select("events", "ph", "ts_ns", "dur_ns").filter(pl.col("ph") != "M")
        if timed.height == 0:
            return 0
        end = (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max()
        start = pl.col("ts_ns").min()
        return int(timed.select(end - start).item() or 0)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"
