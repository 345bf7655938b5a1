"""What each GPU can do at best: dense peak TFLOP/s per dtype, HBM bandwidth, L2 size, with
the document each figure comes from.

A roofline is only as honest as its roofs. Every figure below is the vendor's own dense
(no structured sparsity) peak for one device as PyTorch sees it: one MI250X GCD, one GPU of
a GB200 superchip. Where the datasheet prints only the sparse figure (marked `*` there),
the figure here is half of it. `peak_tflops` holds the fastest unit for each dtype (tensor
or matrix cores where the part has them: MI300X's FP32 matrix rate, H100's FP64 tensor
rate); `vector_fp32_tflops` is the plain FP32 rate that elementwise, normalization and
reduction kernels run at. A dtype mapped to `None` is one the part has no unit for
(Turing and Volta have no BF16 or TF32); a dtype missing from the dict is one the vendor
does not publish.

`identify` picks the spec of a trace's device from its `deviceProperties` (name, memory,
SM/CU count, compute capability) and, when the name says nothing (ROCm writes
"AMD Radeon Graphics" or ""), from the architecture and CU count; `load_spec` reads the
achievable figures `traceq device calibrate` measured (`calibrate.py`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceq.errors import ConfigError

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
"""The dtypes a spec gives peaks for (`int8` in TOP/s)."""

_A100 = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; L2 from the NVIDIA A100 Tensor "
    "Core GPU Architecture whitepaper (40 MB)"
)
_H100 = (
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet "
    "(H100 SXM / PCIe / NVL columns; sparse figures halved); L2 from the NVIDIA H100 "
    "Tensor Core GPU Architecture whitepaper (50 MB)"
)
_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM; sparse figures halved)"
_H800 = "NVIDIA H800 Tensor Core GPU datasheet (SXM: FP64 1 TFLOPS, else as H100 SXM)"
_GH200 = (
    "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip (GH200 datasheet: "
    "H100 compute; 4 TB/s HBM3 96 GB, 4.9 TB/s HBM3e 144 GB)"
)
_B200 = (
    "NVIDIA HGX B200 datasheet, per GPU (8-GPU totals / 8; sparse figures halved); FP32 "
    "from traceq's earlier device table (the HGX datasheet does not print it)"
)
_GB200 = (
    "NVIDIA GB200 NVL72 datasheet, per GPU (72-GPU totals / 72; sparse figures halved); "
    "FP32 as B200 (same die; not printed)"
)
_L4 = "https://www.nvidia.com/en-us/data-center/l4/ (sparse figures halved)"
_L40S = "https://www.nvidia.com/en-us/data-center/l40s/ (sparse figures halved)"
_ADA = (
    "NVIDIA Ada GPU Architecture whitepaper, RTX 4090 column (tensor rates with FP32 "
    "accumulate, dense)"
)
_GA102 = (
    "NVIDIA Ampere GA102 GPU Architecture whitepaper, RTX 3090 column (tensor rates with "
    "FP32 accumulate, dense)"
)
_TURING = (
    "NVIDIA Turing GPU Architecture whitepaper, RTX 2080 Ti reference column (FP16 tensor "
    "with FP32 accumulate 53.8; no BF16, TF32 or FP8 units)"
)
_V100 = (
    "https://images.nvidia.com/content/technologies/volta/pdf/"
    "volta-v100-datasheet-update-us-1165301-r5.pdf (no BF16, TF32 or FP8 units)"
)
_T4 = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
    "t4-tensor-core-datasheet-951643.pdf (no BF16, TF32 or FP8 units)"
)
_A10 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf"
_A10G = (
    "AWS publishes no A10G datasheet: traceq's earlier device table (FP16 70, TF32 35); "
    "bandwidth and L2 as A10"
)
_MI210 = "https://www.amd.com/en/products/accelerators/instinct/mi200/mi210.html (no TF32/FP8)"
_MI250 = (
    "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250.html, halved: each "
    "of the 2 GCDs is one device (no TF32/FP8)"
)
_MI250X = (
    "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html, halved: each "
    "of the 2 GCDs is one device (no TF32/FP8)"
)
_MI300X = (
    "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html (L2 4 MB per "
    "XCD x 8; 256 MB Infinity Cache not counted)"
)
_MI325X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html"
_MI355X = (
    "https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html (dense; no "
    "TF32 in CDNA 4)"
)


@dataclass(frozen=True)
class Spec:
    """Peak figures of one part. `peak_tflops[dtype] is None`: no unit for that dtype."""

    name: str
    match: str
    """Regex on `deviceProperties.name`."""
    vendor: str
    arch: str
    compute_units: int | None
    """SMs (NVIDIA) or CUs (AMD) of one device."""
    peak_tflops: dict[str, float | None]
    vector_fp32_tflops: float | None
    hbm_gbs: float
    l2_mib: float | None
    source: str
    min_memory_gb: float | None = None
    """Only devices with at least this much memory (splits A100 40 GB from 80 GB)."""
    kind: str = "datasheet"
    """"datasheet", or "achievable" for figures `traceq device calibrate` measured."""
    extra: dict[str, Any] = field(default_factory=dict)

    def peak(self, dtype: str | None) -> float | None:
        """Peak TFLOP/s for a dtype (`fp32`, `bf16`, ...); None when unknown or absent."""
        return self.peak_tflops.get(dtype) if dtype else None

    def has_unit(self, dtype: str) -> bool:
        return dtype in self.peak_tflops and self.peak_tflops[dtype] is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vendor": self.vendor,
            "arch": self.arch,
            "compute_units": self.compute_units,
            "peak_tflops": dict(self.peak_tflops),
            "vector_fp32_tflops": self.vector_fp32_tflops,
            "hbm_gbs": self.hbm_gbs,
            "l2_mib": self.l2_mib,
            "source": self.source,
            "kind": self.kind,
            **({"extra": self.extra} if self.extra else {}),
        }


def _nv(
    name: str,
    match: str,
    arch: str,
    sms: int | None,
    peaks: dict[str, float | None],
    vector_fp32: float | None,
    hbm_gbs: float,
    l2_mib: float | None,
    source: str,
    min_memory_gb: float | None = None,
) -> Spec:
    return Spec(
        name, match, "nvidia", arch, sms, peaks, vector_fp32, hbm_gbs, l2_mib, source, min_memory_gb
    )


def _amd(
    name: str,
    match: str,
    arch: str,
    cus: int,
    peaks: dict[str, float | None],
    vector_fp32: float,
    hbm_gbs: float,
    l2_mib: float,
    source: str,
) -> Spec:
    memory = {"MI355X": 288, "MI325X": 256, "MI300X": 192, "MI210": 64}.get(name, 64)
    return Spec(
        name,
        match,
        "amd",
        arch,
        cus,
        peaks,
        vector_fp32,
        hbm_gbs,
        l2_mib,
        source,
        extra={"memory_gb": memory},
    )


_NO_LOW = {"tf32": None, "bf16": None, "fp8": None}  # Volta, Turing
_HOPPER = {"fp32": 67, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979, "int8": 1979}
_AMPERE_DC = {
    "fp64": 19.5,
    "fp32": 19.5,
    "tf32": 156,
    "bf16": 312,
    "fp16": 312,
    "fp8": None,
    "int8": 624,
}
_CDNA2_GCD_MI250 = {
    "fp64": 45.3,
    "fp32": 45.3,
    "tf32": None,
    "bf16": 181,
    "fp16": 181,
    "fp8": None,
    "int8": 181,
}
_CDNA3 = {
    "fp64": 163.4,
    "fp32": 163.4,
    "tf32": 653.7,
    "bf16": 1307.4,
    "fp16": 1307.4,
    "fp8": 2614.9,
    "int8": 2614.9,
}

#: Matched in order: the first spec whose regex (and memory floor) fits the device wins, so
#: a specific name (`H100 PCIe`, `A100 80GB PCIe`) comes before the general one.
SPECS: tuple[Spec, ...] = (
    _nv(
        "GH200 (HBM3e)",
        r"GH200",
        "hopper",
        132,
        {"fp64": 67, **_HOPPER},
        67,
        4900,
        50,
        _GH200,
        min_memory_gb=120,
    ),
    _nv("GH200", r"GH200", "hopper", 132, {"fp64": 67, **_HOPPER}, 67, 4000, 50, _GH200),
    _nv("H200", r"H200", "hopper", 132, {"fp64": 67, **_HOPPER}, 67, 4800, 50, _H200),
    _nv(
        "H100 PCIe",
        r"H100.*PCIe",
        "hopper",
        114,
        {
            "fp64": 51,
            "fp32": 51,
            "tf32": 378,
            "bf16": 756.5,
            "fp16": 756.5,
            "fp8": 1513,
            "int8": 1513,
        },
        51,
        2000,
        50,
        _H100,
    ),
    _nv(
        "H100 NVL",
        r"H100 NVL",
        "hopper",
        132,
        {
            "fp64": 60,
            "fp32": 60,
            "tf32": 417.5,
            "bf16": 835.5,
            "fp16": 835.5,
            "fp8": 1670.5,
            "int8": 1670.5,
        },
        60,
        3900,
        50,
        _H100,
    ),
    _nv("H100 SXM", r"H100", "hopper", 132, {"fp64": 67, **_HOPPER}, 67, 3350, 50, _H100),
    _nv("H800", r"H800", "hopper", 132, {"fp64": 1, **_HOPPER}, 67, 3350, 50, _H800),
    _nv(
        "GB200",
        r"GB200",
        "blackwell",
        None,
        {
            "fp64": 45,
            "fp32": 80,
            "tf32": 1250,
            "bf16": 2500,
            "fp16": 2500,
            "fp8": 5000,
            "int8": 5000,
        },
        80,
        8000,
        None,
        _GB200,
    ),
    _nv(
        "B200",
        r"B200",
        "blackwell",
        148,
        {
            "fp64": 37,
            "fp32": 80,
            "tf32": 1125,
            "bf16": 2250,
            "fp16": 2250,
            "fp8": 4500,
            "int8": 4500,
        },
        80,
        8000,
        None,
        _B200,
    ),
    _nv(
        "A100 80GB PCIe",
        r"A100.*PCIe",
        "ampere",
        108,
        _AMPERE_DC,
        19.5,
        1935,
        40,
        _A100,
        min_memory_gb=60,
    ),
    _nv("A100 80GB", r"A100", "ampere", 108, _AMPERE_DC, 19.5, 2039, 40, _A100, min_memory_gb=60),
    _nv("A100 40GB", r"A100", "ampere", 108, _AMPERE_DC, 19.5, 1555, 40, _A100),
    _nv(
        "A10G",
        r"A10G",
        "ampere",
        80,
        {"fp32": 31.2, "tf32": 35, "bf16": 70, "fp16": 70, "fp8": None},
        31.2,
        600,
        6,
        _A10G,
    ),
    _nv(
        "A10",
        r"A10\b",
        "ampere",
        72,
        {"fp32": 31.2, "tf32": 62.5, "bf16": 125, "fp16": 125, "fp8": None, "int8": 250},
        31.2,
        600,
        6,
        _A10,
    ),
    _nv(
        "L40S",
        r"L40S",
        "ada",
        142,
        {"fp32": 91.6, "tf32": 183, "bf16": 362.05, "fp16": 362.05, "fp8": 733, "int8": 733},
        91.6,
        864,
        96,
        _L40S,
    ),
    _nv(
        "L4",
        r"L4\b",
        "ada",
        58,
        {"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121, "fp8": 242.5, "int8": 242.5},
        30.3,
        300,
        48,
        _L4,
    ),
    _nv(
        "RTX 4090",
        r"RTX 4090",
        "ada",
        128,
        {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3, "int8": 660.6},
        82.6,
        1008,
        72,
        _ADA,
    ),
    _nv(
        "RTX 3090",
        r"RTX 3090",
        "ampere",
        82,
        {"fp32": 35.6, "tf32": 35.6, "bf16": 71, "fp16": 71, "fp8": None, "int8": 284},
        35.6,
        936,
        6,
        _GA102,
    ),
    _nv(
        "RTX 2080 Ti",
        r"RTX 2080 Ti",
        "turing",
        68,
        {"fp32": 13.4, **_NO_LOW, "fp16": 53.8, "int8": 215.2},
        13.4,
        616,
        5.5,
        _TURING,
    ),
    _nv(
        "V100S PCIe",
        r"V100S",
        "volta",
        80,
        {"fp64": 8.2, "fp32": 16.4, **_NO_LOW, "fp16": 130},
        16.4,
        1134,
        6,
        _V100,
    ),
    _nv(
        "V100 PCIe",
        r"V100.*PCIe",
        "volta",
        80,
        {"fp64": 7, "fp32": 14, **_NO_LOW, "fp16": 112},
        14,
        900,
        6,
        _V100,
    ),
    _nv(
        "V100 SXM2",
        r"V100",
        "volta",
        80,
        {"fp64": 7.8, "fp32": 15.7, **_NO_LOW, "fp16": 125},
        15.7,
        900,
        6,
        _V100,
    ),
    _nv(
        "T4",
        r"T4\b",
        "turing",
        40,
        {"fp32": 8.1, **_NO_LOW, "fp16": 65, "int8": 130},
        8.1,
        320,
        4,
        _T4,
    ),
    _amd(
        "MI355X",
        r"MI355X",
        "cdna4",
        256,
        {
            "fp64": 78.6,
            "fp32": 157.3,
            "tf32": None,
            "bf16": 2516.6,
            "fp16": 2516.6,
            "fp8": 5033.2,
            "int8": 5033.2,
        },
        157.3,
        8000,
        32,
        _MI355X,
    ),
    _amd("MI325X", r"MI325X", "cdna3", 304, _CDNA3, 163.4, 6000, 32, _MI325X),
    _amd("MI300X", r"MI300X", "cdna3", 304, _CDNA3, 163.4, 5300, 32, _MI300X),
    _amd(
        "MI250X (one GCD)",
        r"MI250X",
        "cdna2",
        110,
        {
            "fp64": 47.85,
            "fp32": 47.85,
            "tf32": None,
            "bf16": 191.5,
            "fp16": 191.5,
            "fp8": None,
            "int8": 191.5,
        },
        23.95,
        1638.4,
        8,
        _MI250X,
    ),
    _amd("MI250 (one GCD)", r"MI250", "cdna2", 104, _CDNA2_GCD_MI250, 22.65, 1638.4, 8, _MI250),
    _amd("MI210", r"MI210", "cdna2", 104, _CDNA2_GCD_MI250, 22.6, 1638.4, 8, _MI210),
)

#: Architectures by compute capability (NVIDIA) or gfx major.minor (AMD, `computeMajor/Minor`
#: as ROCm reports them: gfx90a is 9.0, gfx942 9.4, gfx950 9.5).
ARCH_BY_CC = {
    ("nvidia", 7, 0): "volta",
    ("nvidia", 7, 5): "turing",
    ("nvidia", 8, 0): "ampere",
    ("nvidia", 8, 6): "ampere",
    ("nvidia", 8, 9): "ada",
    ("nvidia", 9, 0): "hopper",
    ("nvidia", 10, 0): "blackwell",
    ("amd", 9, 0): "cdna2",
    ("amd", 9, 4): "cdna3",
    ("amd", 9, 5): "cdna4",
}

#: Architecture named by kernel names (cuBLAS/CUTLASS `sm90_`, `ampere_`, ...): evidence
#: when `deviceProperties` is missing. First match wins.
KERNEL_ARCH = (
    (r"\bsm_?100|sm100_|cutlass_100", "blackwell"),
    (r"\bsm_?90|sm90_|cutlass_90", "hopper"),
    (r"\bsm_?89|sm89_", "ada"),
    (r"\bsm_?8[06]|sm80_|ampere_|cutlass_80", "ampere"),
    (r"\bsm_?75|sm75_|turing_", "turing"),
    (r"\bsm_?70|sm70_|volta_", "volta"),
    (r"gfx950", "cdna4"),
    (r"gfx94\d|MT\d+x\d+x\d+.*_MI\d+", "cdna3"),
    (r"gfx90a", "cdna2"),
)


def arch_of_kernels(kernel_names: list[str] | tuple[str, ...]) -> str | None:
    """The architecture most of the kernel names name, or None."""
    counts: dict[str, int] = {}
    for name in kernel_names:
        for pattern, arch in KERNEL_ARCH:
            if re.search(pattern, name):
                counts[arch] = counts.get(arch, 0) + 1
                break
    return max(counts, key=lambda a: counts[a]) if counts else None


def identify(
    device_properties: dict[str, Any] | None, kernel_names: list[str] | tuple[str, ...] = ()
) -> Spec | None:
    """The spec of one device: by name (and memory), else by architecture and SM/CU count
    when exactly one part fits; None when nothing identifies it (no guess)."""
    props = device_properties or {}
    name = str(props.get("name") or "")
    mem_gb = (props.get("totalGlobalMem") or 0) / 1e9
    if name:
        for spec in SPECS:
            if re.search(spec.match, name, re.IGNORECASE) and (
                spec.min_memory_gb is None or mem_gb >= spec.min_memory_gb
            ):
                return spec
    major, minor = props.get("computeMajor"), props.get("computeMinor")
    amd = (
        props.get("warpSize") == 64
        or bool(re.search(r"AMD|Radeon|Instinct", name))
        or ((major, minor) in ((9, 4), (9, 5)) and "NVIDIA" not in name)  # no such NVIDIA cc
    )
    arch = ARCH_BY_CC.get(("amd" if amd else "nvidia", major, minor)) if major is not None else None
    arch = arch or arch_of_kernels(kernel_names)
    units = props.get("numSms")
    if arch is None or units is None:
        return None
    fits = [s for s in SPECS if s.arch == arch and s.compute_units == units]
    if len(fits) > 1 and mem_gb:  # MI300X (192 GB) and MI325X (256 GB) share arch and CUs
        fits = [s for s in fits if abs(s.extra.get("memory_gb", mem_gb) - mem_gb) < 0.1 * mem_gb]
    if len({(s.hbm_gbs, tuple(s.peak_tflops.items())) for s in fits}) == 1:
        return fits[0]  # several names, one set of figures (MI210 and an MI250 GCD)
    return None


def spec_named(name: str) -> Spec:
    """The table's spec for a part name (`"H100 SXM"`, `"MI300X"`), for tests and configs."""
    for spec in SPECS:
        if spec.name == name:
            return spec
    raise KeyError(name)


def load_spec(path: str | Path) -> Spec:
    """A spec file written by `traceq device calibrate` (JSON) or by hand (JSON or TOML with
    the same keys: name, peak_tflops, hbm_gbs; optional vector_fp32_tflops, l2_mib, ...)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read device spec {str(path)!r}: {exc.strerror}") from exc
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"device spec {str(path)!r} is not valid: {exc}") from exc
    if not isinstance(data, dict) or "peak_tflops" not in data or "hbm_gbs" not in data:
        raise ConfigError(f"device spec {str(path)!r} needs 'peak_tflops' and 'hbm_gbs'")
    peaks = data["peak_tflops"]
    unknown = sorted(set(peaks) - set(DTYPES))
    if unknown:
        raise ConfigError(f"device spec {str(path)!r}: unknown dtype {unknown[0]!r}")
    return Spec(
        name=str(data.get("name", path.stem)),
        match=re.escape(str(data.get("name", path.stem))),
        vendor=str(data.get("vendor", "unknown")),
        arch=str(data.get("arch", "unknown")),
        compute_units=data.get("compute_units"),
        peak_tflops={k: (None if v is None else float(v)) for k, v in peaks.items()},
        vector_fp32_tflops=data.get("vector_fp32_tflops"),
        hbm_gbs=float(data["hbm_gbs"]),
        l2_mib=data.get("l2_mib"),
        source=str(data.get("source", f"spec file {path}")),
        kind=str(data.get("kind", "achievable")),
        extra=dict(data.get("extra", {})),
    )


def device_overrides(spec: Spec) -> dict[str, float]:
    """`DeviceModel` fields (`[tool.traceq.device]` keys) a spec file sets: what a
    calibrated file changes in every savings estimate."""
    out: dict[str, float] = {"memory_bandwidth_gbs": spec.hbm_gbs}
    for field_name, dtype in (("fp32_tflops", "fp32"), ("tf32_tflops", "tf32")):
        if spec.peak(dtype):
            out[field_name] = float(spec.peak(dtype))  # type: ignore[arg-type]
    halves = [v for v in (spec.peak("fp16"), spec.peak("bf16")) if v]
    if halves:
        out["half_tflops"] = float(max(halves))
    return out
