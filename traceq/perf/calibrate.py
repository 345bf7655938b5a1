"""Achievable peaks of the GPU this runs on: the roofs a real kernel can reach, beside the
datasheet's.

Datasheet peaks are boost-clock, ideal-case figures no kernel reaches (cuBLAS tops out
near 70-80 % of H100's dense BF16 peak; a device-to-device copy near 90 % of HBM). An op
at 60 % of the datasheet may be at 85 % of what is achievable: "already good". This times
large `torch.matmul`s per dtype and a device-to-device copy, takes the best of several
runs, and writes a spec file `specs.load_spec` reads (`traceq roofline --spec FILE`,
`[tool.traceq.device] spec_file = ...`). Torch is imported here only: `import traceq`
never pulls it in.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from traceq.errors import TraceError

GEMM_SIZE = 8192
"""M = N = K of the timed GEMMs: large enough that every tensor-core GEMM is compute bound
(intensity ~2700 FLOP/byte in bf16), small enough for any 16 GB part."""
COPY_BYTES = 1 << 30
"""Bytes of the timed copy: far beyond any L2, so it measures HBM (read + write counted)."""
REPEATS = 10


class CalibrationError(TraceError):
    """No GPU to calibrate on (or torch missing): the command exits 2 with this message."""


def torch_gpu() -> Any:
    """torch, when it sees a CUDA or ROCm GPU; else a `CalibrationError` saying why not."""
    try:
        import torch
    except ImportError as exc:
        raise CalibrationError("calibrate needs PyTorch (pip install torch)") from exc
    if not torch.cuda.is_available():
        raise CalibrationError(
            "calibrate needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)"
        )
    return torch


def _best_seconds(torch: Any, fn: Any) -> float:
    fn()  # warm-up: cuBLAS heuristics, allocation
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    return best


def gemm_tflops(torch: Any, dtype_name: str, n: int = GEMM_SIZE) -> float | None:
    """Best TFLOP/s of an n×n×n matmul in one dtype; None when the GPU cannot run it."""
    device = "cuda"
    try:
        if dtype_name == "fp8":
            if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
                return None
            a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
            b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
            one = torch.tensor(1.0, device=device)

            def run() -> Any:
                return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        else:
            dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                     "fp16": torch.float16, "fp64": torch.float64}[dtype_name]  # fmt: skip
            a = torch.randn(n, n, device=device, dtype=dtype)
            b = torch.randn(n, n, device=device, dtype=dtype)

            def run() -> Any:
                return torch.matmul(a, b)

        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
        try:
            seconds = _best_seconds(torch, run)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
    except (RuntimeError, TypeError):  # unsupported dtype on this part
        return None
    return 2.0 * n**3 / seconds / 1e12


def copy_gbs(torch: Any, nbytes: int = COPY_BYTES) -> float:
    """Best GB/s of a device-to-device copy, counting the bytes read and written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = _best_seconds(torch, lambda: dst.copy_(src))
    return 2 * nbytes / seconds / 1e9


def calibrate(dtypes: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")) -> dict:
    """Measure, and return the spec file's content (the keys `specs.load_spec` reads)."""
    torch = torch_gpu()
    props = torch.cuda.get_device_properties(0)
    started = time.time()
    peaks = {d: gemm_tflops(torch, d) for d in dtypes}
    return {
        "name": props.name,
        "kind": "achievable",
        "vendor": "amd" if getattr(torch.version, "hip", None) else "nvidia",
        "compute_units": props.multi_processor_count,
        "peak_tflops": {d: (round(v, 2) if v else None) for d, v in peaks.items()},
        "hbm_gbs": round(copy_gbs(torch), 1),
        "source": (
            f"measured by traceq device calibrate: best of {REPEATS} torch.matmul "
            f"{GEMM_SIZE}^3 per dtype, a {COPY_BYTES >> 20} MiB device copy; torch "
            f"{torch.__version__}, {time.strftime('%Y-%m-%d', time.gmtime(started))}"
        ),
    }


def write_spec(spec: dict, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(spec, indent=2) + "\n")
    return path
