"""`LoadedTrace`: what a load produces — one profile's frames and metadata, and nothing else.

A value, not a facade: the relations stage takes it (and computes links, data flow, the
graph from its frames) without reaching up to `traceq.trace.Trace`, which adds the lazily
computed relations and the questions asked most on top of it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import polars as pl


@runtime_checkable
class Selectable(Protocol):
    """Frames that can give some columns without decoding the rest (`loader.cache.Stored`)."""

    def select(self, name: str, columns: Sequence[str]) -> pl.DataFrame: ...


class LoadedTrace:
    """A loaded trace's value. Frames are Polars DataFrames; `events` holds every raw event
    with its `args`.

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
        counts = f"{_count(events, 'event')}, {_count(steps, 'step')}"
        return (
            f"<{type(self).__name__} {self.source}: {counts}, "
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
        """One dict per GPU the profiler described; entries of another type are left out."""
        props = self.metadata.get("deviceProperties")
        return [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []

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


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"
