"""How a zoo entry is timed, and what its time means against the device.

On CUDA: ``triton.testing.do_bench``, median of runs with the L2 flushed before each, in
ms. On the CPU: ``torch.utils.benchmark`` (median of blocked runs, at the process's thread
count), and only for entries that really run compiled code there — Triton in its
interpreter is Python executing NumPy, and its time measures nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from traceq.zoo.device import DevicePeak


@dataclass(frozen=True)
class Timing:
    """One measured time, and the throughput it implies for the pattern's work."""

    method: str
    median_ms: float
    tflops: float | None
    gbps: float
    peak_tflops_fraction: float | None
    peak_gbps_fraction: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def median_ms(
    fn: Callable[[], object], device: str, min_run_time: float = 0.2
) -> tuple[float, str]:
    """Median time of ``fn()`` in ms on ``device``, and how it was measured."""
    if device == "cuda":
        from traceq.zoo.triton_support import INTERPRETED

        if not INTERPRETED:
            from triton.testing import do_bench

            return float(do_bench(fn, return_mode="median")), "do_bench median"
    from torch.utils import benchmark

    threads = torch.get_num_threads()
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    return measurement.median * 1e3, f"torch.utils.benchmark median, {threads} thread(s)"


def throughput(
    ms: float,
    method: str,
    flops: int | None,
    bytes_moved: int,
    dtype: str,
    peak: DevicePeak | None,
) -> Timing:
    """A `Timing` from a time and the pattern's work, with fractions of the device peak."""
    seconds = ms / 1e3
    tflops = flops / seconds / 1e12 if flops is not None and seconds > 0 else None
    gbps = bytes_moved / seconds / 1e9 if seconds > 0 else 0.0
    peak_tflops = peak.tflops.get(dtype) if peak is not None else None
    peak_gbps = peak.gbps if peak is not None else None
    return Timing(
        method=method,
        median_ms=ms,
        tflops=tflops,
        gbps=gbps,
        peak_tflops_fraction=tflops / peak_tflops if tflops is not None and peak_tflops else None,
        peak_gbps_fraction=gbps / peak_gbps if peak_gbps else None,
    )
