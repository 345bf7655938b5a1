"""What a trace holds, in numbers: the content of `traceq info`."""

from __future__ import annotations

from typing import Any

import polars as pl

from traceq.trace import Trace


def summary(trace: Trace) -> dict[str, Any]:
    """Counts and spans a user checks first; plain JSON types only."""
    events = trace.events
    by_category = (
        events.group_by(pl.col("cat").fill_null(pl.concat_str(pl.lit("ph:"), pl.col("ph"))))
        .len()
        .sort("len", descending=True)
    )
    kernels = trace.kernels
    devices = []
    for device in sorted(kernels["device"].drop_nulls().unique().to_list()):
        mine = kernels.filter(pl.col("device") == device)
        devices.append(
            {
                "device": device,
                "name": trace.device_name(device),
                "streams": sorted(mine["stream"].drop_nulls().unique().to_list()),
                "kernels": mine.filter(pl.col("kind") == "kernel").height,
                "busy_us": _us(mine["dur_ns"].sum()),
            }
        )
    busy = trace.gpu_busy()
    return {
        "source": trace.source,
        "schema": trace.schema,
        "schema_version": trace.schema_version,
        "events": events.height,
        "by_category": dict(
            zip(by_category["cat"].to_list(), by_category["len"].to_list(), strict=True)
        ),
        "ops": trace.ops.height,
        "kernels": kernels.filter(pl.col("kind") == "kernel").height,
        "memcpy": kernels.filter(pl.col("kind") == "memcpy").height,
        "memset": kernels.filter(pl.col("kind") == "memset").height,
        "runtime": trace.runtime.height,
        "steps": trace.steps["step"].to_list(),
        "modules": trace.modules.height,
        "devices": devices,
        "gpu_utilization": {
            int(d): round(float(u), 4)
            for d, u in zip(busy["device"], busy["utilization"], strict=True)
        },
        "duration_us": _us(trace.duration_ns),
        "rank": trace.rank,
        "world_size": trace.world_size,
        "versions": trace.versions,
        "unlinked": trace.unlinked,
    }


def _us(ns: int | float | None) -> float:
    return round((ns or 0) / 1000, 3)
