"""What a device can do at best, so an achieved TFLOP/s or GB/s can be read as a fraction.

CUDA does not report peak throughput, so known cards come from a table of the vendors'
dense (non-sparse) datasheet numbers, matched on ``torch.cuda.get_device_name()``. For an
unknown card the DRAM bandwidth comes from the driver (clock × bus width, via Triton) and
the TFLOP/s peak stays unknown: a fraction of a guessed peak would be a made-up number.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DevicePeak:
    """Peak dense TFLOP/s per dtype name, and DRAM GB/s, of one device."""

    name: str
    tflops: dict[str, float] = field(default_factory=dict)
    gbps: float | None = None
    source: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "tflops": self.tflops, "gbps": self.gbps, "source": self.source}


def _peaks(fp32: float, tf32: float, half: float) -> dict[str, float]:
    return {"float32": fp32, "tf32": tf32, "float16": half, "bfloat16": half}


DATASHEET = "vendor datasheet, dense"

#: (substring of the device name, peaks). Most specific names first.
KNOWN_PEAKS: tuple[tuple[str, dict[str, float], float], ...] = (
    ("H200 NVL", _peaks(60.0, 417.0, 835.0), 4800.0),
    ("H200", _peaks(67.0, 494.5, 989.5), 4800.0),
    ("H100 NVL", _peaks(60.0, 417.0, 835.0), 3900.0),
    ("H100 PCIe", _peaks(51.0, 378.0, 756.0), 2000.0),
    ("H100", _peaks(67.0, 494.5, 989.5), 3350.0),
    ("A100-SXM4-80GB", _peaks(19.5, 156.0, 312.0), 2039.0),
    ("A100 80GB PCIe", _peaks(19.5, 156.0, 312.0), 1935.0),
    ("A100", _peaks(19.5, 156.0, 312.0), 1555.0),
    ("L40S", _peaks(91.6, 183.0, 362.0), 864.0),
    ("L4", _peaks(30.3, 60.0, 121.0), 300.0),
    ("A10", _peaks(31.2, 62.5, 125.0), 600.0),
)


def peak_for_name(name: str) -> DevicePeak | None:
    """The datasheet peaks of a CUDA device name, or None when the card is not in the table."""
    for needle, tflops, gbps in KNOWN_PEAKS:
        if needle.lower() in name.lower():
            return DevicePeak(name, dict(tflops), gbps, DATASHEET)
    return None


def device_peak(device: str) -> DevicePeak | None:
    """Peaks of ``device`` here: None on the CPU (no meaningful single peak)."""
    if device != "cuda":
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    known = peak_for_name(name)
    if known is not None:
        return known
    try:
        from triton.testing import get_dram_gbps

        return DevicePeak(name, {}, float(get_dram_gbps()), "driver: memory clock × bus width")
    except Exception:  # no driver query on this build: leave the peak unknown
        return DevicePeak(name, {}, None, "unknown card")
