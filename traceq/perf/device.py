"""The device model behind every savings estimate: bandwidth, tensor cores, launch cost.

Savings are physics, not guesses, only if the numbers they use are named. A model comes
from the trace's `deviceProperties` (GPU name, compute capability, memory size), matched
against a small table of vendor peak figures below; a GPU not in the table gets figures
by compute capability, flagged as `assumed`. Launch overhead is measured on the trace
itself (median duration of its kernel-launch API calls) when it holds enough launches.
CPU-only traces get a CPU model: a documented DRAM bandwidth and, as the "launch" cost
that fusion removes, the measured median duration of view-like ops (pure dispatch; those
run while torch.compile compiles, on fake tensors, are left out).
Every figure can be overridden in configuration (`[tool.traceq.device]`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import polars as pl

from traceq.errors import ConfigError

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

# Peak figures from vendor datasheets (dense, no sparsity): DRAM bandwidth GB/s, FP32
# (non-tensor) TFLOPS, TF32 tensor TFLOPS (0 = none), FP16 tensor TFLOPS with FP32
# accumulate (also BF16's from Ampere / CDNA2 on; Volta and Turing have no BF16 unit, see
# `DeviceModel.bf16`). Matched in order on the device name; `mem_gb` splits A100 40/80 GB
# parts.
GPU_TABLE: tuple[tuple[str, float | None, dict[str, float]], ...] = (
    (r"H200", None, {"bw": 4800, "fp32": 67, "tf32": 495, "half": 989}),
    (r"H100.*PCIe", None, {"bw": 2000, "fp32": 51, "tf32": 378, "half": 756}),
    (r"H100", None, {"bw": 3350, "fp32": 67, "tf32": 495, "half": 989}),
    (r"H800", None, {"bw": 3350, "fp32": 67, "tf32": 495, "half": 989}),
    (r"GH200", None, {"bw": 4000, "fp32": 67, "tf32": 495, "half": 989}),
    (r"B200", None, {"bw": 8000, "fp32": 80, "tf32": 1100, "half": 2250}),
    (r"A100", 60.0, {"bw": 2039, "fp32": 19.5, "tf32": 156, "half": 312}),
    (r"A100", None, {"bw": 1555, "fp32": 19.5, "tf32": 156, "half": 312}),
    (r"A800", None, {"bw": 2039, "fp32": 19.5, "tf32": 156, "half": 312}),
    (r"A10G", None, {"bw": 600, "fp32": 31.2, "tf32": 35, "half": 70}),
    (r"A10\b", None, {"bw": 600, "fp32": 31.2, "tf32": 62.5, "half": 125}),
    (r"L40S", None, {"bw": 864, "fp32": 91.6, "tf32": 183, "half": 366}),
    (r"L4\b", None, {"bw": 300, "fp32": 30.3, "tf32": 60, "half": 121}),
    (r"V100.*PCIe", None, {"bw": 900, "fp32": 14, "tf32": 0, "half": 112}),
    (r"V100", None, {"bw": 900, "fp32": 15.7, "tf32": 0, "half": 125}),
    (r"T4\b", None, {"bw": 320, "fp32": 8.1, "tf32": 0, "half": 65}),
    (r"RTX 4090", None, {"bw": 1008, "fp32": 82.6, "tf32": 82.6, "half": 165}),
    (r"RTX 3090", None, {"bw": 936, "fp32": 35.6, "tf32": 35.6, "half": 71}),
    (r"RTX 3060 Ti", None, {"bw": 448, "fp32": 16.2, "tf32": 16.2, "half": 32.4}),
    # Turing whitepaper: FP16 tensor with FP32 accumulate 53.8 (26.9 is its non-tensor FP16)
    (r"RTX 2080 Ti", None, {"bw": 616, "fp32": 13.4, "tf32": 0, "half": 53.8}),
    (r"MI300X", None, {"bw": 5300, "fp32": 163.4, "tf32": 653.7, "half": 1307}),
    (r"MI250X?", None, {"bw": 1638, "fp32": 23.9, "tf32": 0, "half": 191.5}),
)
# AMD MI250 reports itself as "AMD Radeon Graphics"; each GCD is one device (64 GB, gfx90a).
AMD_BY_ARCH = {(9, 0): "MI250", (9, 4): "MI300X"}

GPU_DEFAULT_BANDWIDTH_GBS = 1000.0
GPU_DEFAULT_LAUNCH_US = 4.0
CPU_DEFAULT_BANDWIDTH_GBS = 50.0
CPU_DEFAULT_DISPATCH_US = 2.0
MIN_SAMPLES = 20

LAUNCH_CALL = r"(?i)^(cuda|cu|hip|hipExt)(LaunchKernel|LaunchKernelExC|ModuleLaunchKernel)"
COMPILE_RANGE = r"^(dynamo|entire_frame_compile)$|\(dynamo_timed\)$"
VIEW_OPS = ("aten::view", "aten::as_strided", "aten::reshape", "aten::t", "aten::transpose")


@dataclass(frozen=True)
class DeviceModel:
    """Peak figures of one device. `source` says where each number came from."""

    kind: str  # "gpu" or "cpu"
    name: str
    vendor: str  # "nvidia", "amd", "cpu", "unknown"
    compute_capability: tuple[int, int] | None
    memory_bandwidth_gbs: float
    fp32_tflops: float | None
    tf32_tflops: float | None
    half_tflops: float | None
    tensor_cores: bool
    launch_overhead_us: float
    source: str
    num_sms: int | None = None

    @property
    def bf16(self) -> bool:
        """Whether the tensor cores take bf16: NVIDIA from Ampere (8.0), AMD CDNA2 on.
        Volta and Turing run fp16 only; `half_tflops` is their fp16 figure."""
        if not self.tensor_cores:
            return False
        if self.vendor == "nvidia" or (self.vendor != "amd" and self.compute_capability):
            return (self.compute_capability or (0, 0)) >= (8, 0)
        return True

    @property
    def bandwidth_text(self) -> str:
        bw = self.memory_bandwidth_gbs
        return f"{bw / 1000:.2f} TB/s" if bw >= 1000 else f"{bw:.0f} GB/s"

    def transfer_us(self, nbytes: float) -> float:
        """Time to move `nbytes` through DRAM at peak bandwidth (a lower bound)."""
        return nbytes / (self.memory_bandwidth_gbs * 1e3)

    def with_overrides(self, overrides: dict[str, Any]) -> DeviceModel:
        """A copy with configured figures (`[tool.traceq.device]`) replacing the table's."""
        if not overrides:
            return self
        if "spec_file" in overrides:  # a calibrated spec (`traceq device calibrate`)
            from traceq.perf.specs import device_overrides, load_spec

            overrides = dict(overrides)
            from_file = device_overrides(load_spec(overrides.pop("spec_file")))
            overrides = {**from_file, **overrides}  # figures set by name win
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(
                f"unknown device setting {unknown[0]!r}; known: {', '.join(sorted(known))}"
            )
        keys = ", ".join(sorted(overrides))
        return replace(self, **overrides, source=f"{self.source}; configured: {keys}")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def device_model(trace: LoadedTrace, device: int | None = None) -> DeviceModel:
    """The model of the device that ran most kernels (or `device`); a CPU model without GPU."""
    kernels = trace.kernels.filter(pl.col("kind") == "kernel")
    if kernels.height == 0:
        return cpu_model(trace)
    if device is None:
        counts = kernels.group_by("device").len().sort(["len", "device"], descending=[True, False])
        device = int(counts["device"][0]) if counts["device"][0] is not None else 0
    props = next((p for p in trace.device_properties if p.get("id") == device), None)
    if props is None and len(trace.device_properties) == 1:
        props = trace.device_properties[0]
    return gpu_model(props or {}, measured_launch_us(trace))


def gpu_model(props: dict[str, Any], launch: tuple[float, str] | None = None) -> DeviceModel:
    """A GPU model from one `deviceProperties` entry (name, computeMajor/Minor, memory)."""
    name = str(props.get("name") or "unknown GPU")
    major, minor = props.get("computeMajor"), props.get("computeMinor")
    cc = (int(major), int(minor)) if major is not None and minor is not None else None
    amd = props.get("warpSize") == 64 or bool(re.search(r"AMD|Radeon|Instinct|MI\d", name))
    vendor = (
        "amd" if amd else ("nvidia" if cc or "NVIDIA" in name or "Tesla" in name else "unknown")
    )
    mem_gb = (props.get("totalGlobalMem") or 0) / 1e9
    lookup = name
    if amd and cc in AMD_BY_ARCH and not re.search(r"MI\d", name):
        lookup = AMD_BY_ARCH[cc]
    row = _table_row(lookup, mem_gb)
    if row is not None:
        pattern, figures = row
        source = f"datasheet peak for {pattern!r} matched on {name!r}"
        tensor = figures["half"] > 0
    else:
        figures = _by_capability(cc, amd)
        source = f"assumed from compute capability {cc} (GPU {name!r} not in the table)"
        tensor = figures["half"] > 0
    launch_us, launch_source = launch or (GPU_DEFAULT_LAUNCH_US, "default")
    return DeviceModel(
        kind="gpu",
        name=name,
        vendor=vendor,
        compute_capability=cc,
        memory_bandwidth_gbs=float(figures["bw"]),
        fp32_tflops=figures["fp32"] or None,
        tf32_tflops=figures["tf32"] or None,
        half_tflops=figures["half"] or None,
        tensor_cores=tensor,
        launch_overhead_us=launch_us,
        source=f"{source}; launch overhead {launch_source}",
        num_sms=props.get("numSms"),
    )


def cpu_model(trace: LoadedTrace | None = None) -> DeviceModel:
    """The CPU model: documented DRAM bandwidth; dispatch cost measured on view-like ops."""
    dispatch, dispatch_source = CPU_DEFAULT_DISPATCH_US, "default"
    if trace is not None:
        views = _outside_compilation(trace.ops.filter(pl.col("name").is_in(VIEW_OPS)), trace.ops)
        views = views["dur_ns"]
        if views.len() >= MIN_SAMPLES:
            dispatch = float(views.median()) / 1000
            dispatch_source = f"median of {views.len()} view-like ops"
    return DeviceModel(
        kind="cpu",
        name="CPU",
        vendor="cpu",
        compute_capability=None,
        memory_bandwidth_gbs=CPU_DEFAULT_BANDWIDTH_GBS,
        fp32_tflops=None,
        tf32_tflops=None,
        half_tflops=None,
        tensor_cores=False,
        launch_overhead_us=dispatch,
        source=(
            f"CPU default: {CPU_DEFAULT_BANDWIDTH_GBS:.0f} GB/s DRAM (set "
            f"[tool.traceq.device] memory_bandwidth_gbs for your machine); per-op dispatch "
            f"{dispatch:.2f} µs ({dispatch_source})"
        ),
    )


def _outside_compilation(rows: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """`rows` not inside a torch.compile compilation range: ops traced there run on fake
    tensors through Dynamo and cost far more than dispatch."""
    ranges = (
        ops.filter(pl.col("name").str.contains(COMPILE_RANGE))
        .select(pl.col("ts_ns").alias("_start"), pl.col("end_ns"))
        .sort("_start")
        .with_columns(pl.col("end_ns").cum_max().alias("_reach"))
        .select("_start", "_reach")
    )
    if ranges.height == 0 or rows.height == 0:
        return rows
    probe = rows.sort("ts_ns").join_asof(ranges, left_on="ts_ns", right_on="_start")
    return probe.filter(pl.col("_reach").is_null() | (pl.col("ts_ns") >= pl.col("_reach")))


def measured_launch_us(trace: LoadedTrace) -> tuple[float, str] | None:
    """Median CPU duration of the trace's kernel-launch calls, when it has enough of them."""
    launches = trace.runtime.filter(pl.col("name").str.contains(LAUNCH_CALL))["dur_ns"]
    if launches.len() < MIN_SAMPLES:
        return None
    median_us = float(launches.median()) / 1000
    return median_us, f"measured: median of {launches.len()} launch calls ({median_us:.1f} µs)"


def _table_row(name: str, mem_gb: float) -> tuple[str, dict[str, float]] | None:
    for pattern, min_mem, figures in GPU_TABLE:
        if re.search(pattern, name) and (min_mem is None or mem_gb >= min_mem):
            return pattern, figures
    return None


def _by_capability(cc: tuple[int, int] | None, amd: bool) -> dict[str, float]:
    """Conservative figures by generation: tensor cores from Volta (7.0), TF32 from Ampere."""
    bw = GPU_DEFAULT_BANDWIDTH_GBS
    if amd:
        return {"bw": bw, "fp32": 20.0, "tf32": 0, "half": 100.0}
    if cc is None or cc < (7, 0):
        return {"bw": bw, "fp32": 10.0, "tf32": 0, "half": 0}
    if cc < (8, 0):
        return {"bw": bw, "fp32": 14.0, "tf32": 0, "half": 100.0}
    return {"bw": bw, "fp32": 20.0, "tf32": 80.0, "half": 160.0}
