"""What a fusion saves, from the time its ops took and the traffic it removes.

`fusion_saving` is the model: the bytes a fusion removes at the bandwidth the kernels it
replaces achieved (their bytes from `perf.cost` over their measured time), plus the
launches it removes, capped at their measured time. `scaled_saving_us` and `removable_us`
are the earlier forms (measured time scaled by bytes; a datasheet-bandwidth cap)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from collections.abc import Iterable

    from traceq.perf.device import DeviceModel


def scaled_saving_us(removed_us: float, unfused_bytes: float, fused_bytes: float) -> float:
    """Measured time of the ops a fusion replaces, scaled by the memory traffic it keeps.

    These ops are memory-bound, so their time follows the bytes they move: a fused kernel
    that moves `fused_bytes` where the separate ops moved `unfused_bytes` takes about
    `removed_us * fused / unfused`, and the rest is saved. With nothing left to move (an
    activation folded into a GEMM epilogue) the whole measured time is saved.
    """
    if fused_bytes <= 0:
        return removed_us
    if unfused_bytes <= 0:
        return 0.0
    return removed_us * max(0.0, 1.0 - fused_bytes / unfused_bytes)


def removable_us(
    saving_us: float, removed_bytes: float, removed_ops: int, device: DeviceModel
) -> float:
    """`saving_us`, at most what a fusion can physically remove: the traffic it removes at
    the device's peak bandwidth plus one launch (GPU) or dispatch (CPU) per op it removes.

    A fused kernel still computes what the removed ops computed; it saves their memory
    passes and their launches. The measured time of an op can be far above that: a CPU op
    stretched by the OS, the allocator or the profiler (a GELU over 32K elements measured
    at 5-7 ms, where its 256 KB move in ~5 µs). With the traffic unknown (no shapes) a GPU
    kernel's measured time stands (a GPU kernel is the device's own time, not the host's);
    on a CPU only the dispatches are known to go."""
    per_op = max(0, removed_ops) * device.launch_overhead_us
    if removed_bytes > 0:
        return min(saving_us, device.transfer_us(removed_bytes) + per_op)
    return min(saving_us, per_op) if device.kind == "cpu" else saving_us


@dataclass(frozen=True)
class Replaced:
    """The measured kernels of the ops a fusion replaces: the time they took and, for those
    the cost model (`perf.cost`) counts, the bytes they moved in their own time."""

    time_us: float
    """Measured time of all the replaced ops (GPU kernel time; CPU time on a CPU trace)."""
    modelled_bytes: float = 0.0
    """Bytes `perf.cost` counts for the replaced ops it models (each tensor once)."""
    modelled_us: float = 0.0
    """Measured time of those modelled ops."""
    ops: int = 0
    """Replaced ops the bytes come from."""

    @property
    def achieved_gbs(self) -> float | None:
        """GB/s the replaced kernels moved their modelled bytes at; None without a model."""
        if self.modelled_bytes <= 0 or self.modelled_us <= 0:
            return None
        return self.modelled_bytes / (self.modelled_us * 1e3)


def replaced(roofline: pl.DataFrame, events: Iterable[int], time_us: float) -> Replaced:
    """`Replaced` of the op calls `events` from a per-op roofline frame (`trace.roofline`:
    event, bytes, time_us, modelled); `time_us` is their measured time as the rule counts it."""
    wanted = pl.Series("event", sorted(set(events)), dtype=pl.Int64).implode()
    rows = roofline.filter(
        pl.col("event").cast(pl.Int64).is_in(wanted) & pl.col("modelled") & (pl.col("bytes") > 0)
    )
    return Replaced(
        time_us=time_us,
        modelled_bytes=float(rows["bytes"].sum() or 0.0),
        modelled_us=float(rows["time_us"].sum() or 0.0),
        ops=rows.height,
    )


def fusion_saving(
    removed_bytes: float,
    kernels: Replaced,
    device: DeviceModel,
    removed_launches: int,
    kept_bytes: float = 0.0,
) -> tuple[float, str]:
    """What a fusion saves, and the sentence that says how: the bytes it no longer moves at
    the bandwidth the replaced kernels achieved (not the datasheet's: a 4 KB elementwise
    kernel reaches a few % of HBM bandwidth, a large one 80 %), plus the launches it
    removes at the device's launch cost, capped at the replaced ops' measured time less
    the time the fused kernel still takes to move `kept_bytes` at that bandwidth.

    Without a cost model for any replaced op (no recorded shapes) the bandwidth is the
    device model's, and the sentence says so; with no bytes known either, on a GPU the
    replaced kernels' measured time stands (as `removable_us` has it). On a CPU trace an
    op's time holds its dispatch and whatever else stretched it (the OS, the allocator,
    the profiler; a GELU over 256 KB measured at 5 ms), not the time its bytes took: the
    bandwidth there is the device model's DRAM figure, as it was before this model."""
    achieved = kernels.achieved_gbs
    if removed_bytes <= 0 and achieved is None and device.kind == "gpu":
        # no shapes: the traffic is unknown, and a GPU kernel's time is the device's own
        return max(0.0, kernels.time_us), (
            f"traffic unknown (no shapes recorded): the replaced kernels' measured "
            f"{kernels.time_us:,.2f} µs"
        )
    if achieved is None:
        gbs = device.memory_bandwidth_gbs
        source = f"the device model's {device.bandwidth_text} (no cost model for the ops)"
    elif device.kind == "cpu":
        gbs = device.memory_bandwidth_gbs
        source = (
            f"{device.bandwidth_text}, the device model's DRAM figure (on a CPU trace the "
            f"ops' own {_gbs(achieved)} counts host time, not memory time)"
        )
    else:
        gbs = achieved
        source = (
            f"{_gbs(achieved)}, what the {kernels.ops} replaced op(s) achieved "
            f"({_bytes(kernels.modelled_bytes)} in {kernels.modelled_us:,.2f} µs)"
        )
    moved_us = max(0.0, removed_bytes) / (gbs * 1e3)
    launches = max(0, removed_launches)
    launch_us = launches * device.launch_overhead_us
    model_us = moved_us + launch_us
    kept_us = max(0.0, kept_bytes) / (gbs * 1e3)
    cap_us = max(0.0, kernels.time_us - kept_us)
    saving = max(0.0, min(cap_us, model_us))
    unit = "launch" if device.kind == "gpu" else "dispatch"
    text = (
        f"{_bytes(removed_bytes)} no longer moved at {source} = {moved_us:,.2f} µs, + "
        f"{launches} {unit}{'es' * (launches != 1)} removed × "
        f"{device.launch_overhead_us:.2f} µs = {model_us:,.2f} µs"
    )
    kept = (
        f" less the fused kernel's {_bytes(kept_bytes)} at that bandwidth ({kept_us:,.2f} µs)"
        if kept_bytes > 0
        else ""
    )
    if model_us > cap_us:
        text += f", capped at the replaced ops' measured {kernels.time_us:,.2f} µs{kept}"
    else:
        text += f" (the replaced ops' measured {kernels.time_us:,.2f} µs{kept})"
    return saving, text


def _gbs(value: float) -> str:
    return f"{value / 1000:.2f} TB/s" if value >= 1000 else f"{value:,.1f} GB/s"


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"
