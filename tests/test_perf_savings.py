"""Savings on the performance model (`traceq.perf.savings.fusion_saving`): the bytes a
fusion removes at the bandwidth the replaced kernels achieved, plus the launches it
removes, capped at their measured time; and the fusion rules that state it.

Real trace: TraceLens's Qwen1.5-0.5B prefill on H100 (AMD-AGI/TraceLens, MIT; shared,
skipped when absent).
"""

from __future__ import annotations

import re

import polars as pl
import pytest
from conftest import SHARED_TRACES

import traceq
from traceq.perf.device import gpu_model
from traceq.perf.savings import Replaced, fusion_saving, replaced

H100 = gpu_model({"name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0})
QWEN = SHARED_TRACES / "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


def test_removed_bytes_move_at_the_bandwidth_the_kernels_achieved() -> None:
    # 100 MB in 100 µs: 1 TB/s, a third of the H100's datasheet 3.35 TB/s
    kernels = Replaced(time_us=100.0, modelled_bytes=1e8, modelled_us=100.0, ops=3)
    saving, text = fusion_saving(4e7, kernels, H100, removed_launches=2)
    assert kernels.achieved_gbs == pytest.approx(1000.0)
    assert saving == pytest.approx(40.0 + 2 * H100.launch_overhead_us)
    assert "1.00 TB/s, what the 3 replaced op(s) achieved" in text
    assert "2 launches removed" in text


def test_the_saving_is_capped_at_the_measured_time_less_the_fused_kernel() -> None:
    kernels = Replaced(time_us=100.0, modelled_bytes=1e8, modelled_us=100.0, ops=3)
    saving, text = fusion_saving(9e7, kernels, H100, removed_launches=5)
    assert saving == pytest.approx(100.0)
    assert "capped at the replaced ops' measured 100.00 µs" in text
    saving, text = fusion_saving(9e7, kernels, H100, removed_launches=5, kept_bytes=1e7)
    assert saving == pytest.approx(90.0)  # the fused kernel still moves 10 MB at 1 TB/s
    assert "less the fused kernel's" in text


def test_without_a_cost_model_the_device_bandwidth_is_used_and_said() -> None:
    saving, text = fusion_saving(3.35e7, Replaced(time_us=50.0), H100, removed_launches=0)
    assert saving == pytest.approx(10.0)
    assert "device model's 3.35 TB/s (no cost model for the ops)" in text


def test_with_no_bytes_known_a_gpu_kernels_time_stands() -> None:
    saving, text = fusion_saving(0.0, Replaced(time_us=11.0), H100, removed_launches=1)
    assert saving == 11.0 and "traffic unknown" in text


def test_on_a_cpu_trace_the_bandwidth_is_the_dram_figure() -> None:
    from traceq.perf.device import cpu_model

    cpu = cpu_model()
    # a GELU over 1 MB "measured" at 5 ms: 0.2 GB/s is the host's doing, not DRAM's
    kernels = Replaced(time_us=5000.0, modelled_bytes=1e6, modelled_us=5000.0, ops=1)
    saving, text = fusion_saving(1e6, kernels, cpu, removed_launches=1)
    assert saving == pytest.approx(1e6 / (cpu.memory_bandwidth_gbs * 1e3) + cpu.launch_overhead_us)
    assert "counts host time" in text
    fast = Replaced(time_us=5000.0, modelled_bytes=1e6, modelled_us=1.0, ops=1)  # 1 TB/s
    assert fusion_saving(1e6, fast, cpu, removed_launches=1)[0] == pytest.approx(saving)


def test_replaced_counts_only_modelled_ops_for_the_bandwidth() -> None:
    frame = pl.DataFrame(
        {
            "event": [1, 2, 3],
            "bytes": [1e6, 2e6, 0.0],
            "time_us": [1.0, 3.0, 5.0],
            "modelled": [True, True, False],
        }
    )
    kernels = replaced(frame, [1, 2, 3], time_us=9.0)
    assert (kernels.modelled_bytes, kernels.modelled_us, kernels.ops) == (3e6, 4.0, 2)
    assert kernels.time_us == 9.0 and kernels.achieved_gbs == pytest.approx(750.0)


@pytest.mark.shared
def test_norm_and_rotary_findings_on_h100_use_the_achieved_bandwidth() -> None:
    """Each TQ107/TQ108 finding's saving recomputed from its ops' cost-model bytes and
    their kernels' durations in the trace (not the datasheet's 3.35 TB/s)."""
    if not QWEN.exists():
        pytest.skip(f"{QWEN} is absent")
    trace = traceq.load(QWEN, cache=False)
    found = [f for f in traceq.analyze(trace, select=["TQ107", "TQ108"])]
    assert {f.rule for f in found} == {"TQ107", "TQ108"}
    roofline = trace.roofline.filter(pl.col("modelled") & (pl.col("bytes") > 0))
    kernels = trace.kernels.select(pl.col("event").cast(pl.Int64), "dur_ns")
    for f in found:
        ops = roofline.filter(pl.col("event").is_in(f.ops))
        ids = ops["kernel_events"].explode().drop_nulls().cast(pl.Int64)
        kernel_us = kernels.filter(pl.col("event").is_in(ids.implode()))["dur_ns"].sum() / 1000
        achieved = ops["bytes"].sum() / (kernel_us * 1e3)
        stated = re.search(r"no longer moved at ([\d.,]+) (TB|GB)/s", f.saving_model)
        value = float(stated.group(1).replace(",", "")) * (1000 if stated.group(2) == "TB" else 1)
        assert value == pytest.approx(achieved, rel=0.01)
        assert achieved < H100.memory_bandwidth_gbs  # below the datasheet on every one
        removed = f.evidence["unfused_bytes"] - f.evidence["fused_bytes"]
        launches = f.evidence["launches"] - 1
        model = removed / (achieved * 1e3) + launches * trace_launch_us(f)
        cap = f.evidence["measured_us"] - f.evidence["fused_bytes"] / (achieved * 1e3)
        assert f.est_saving_us == pytest.approx(max(0.0, min(model, cap)), rel=0.01, abs=0.01)
        assert 0 <= f.est_saving_us <= f.time_us


def trace_launch_us(finding: traceq.Finding) -> float:
    return float(re.search(r"× ([\d.]+) µs", finding.saving_model).group(1))
