"""The roofline: physics (no op above its datasheet roof), the per-kernel and per-module
views adding up to the per-op one, the `traceq roofline` command and `traceq device
calibrate`."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result
from conftest import FIXTURES, GPU_FIXTURES, SHARED_TRACES, is_kineto, shared_trace_paths

import traceq
from traceq.perf.roofline import roofline, trace_spec

H100_QWEN = SHARED_TRACES / "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
TOLERANCE = 1.05
"""No op may be reported above 105 % of a datasheet roof."""


def physics_params() -> list:
    local = [*sorted(FIXTURES.glob("*.pt.trace.json.gz")), *sorted(GPU_FIXTURES.glob("*.json.gz"))]
    params = [pytest.param(p, id=p.name) for p in local]
    shared = [p for p in shared_trace_paths() if is_kineto(p) and "execution_details" not in p.name]
    params += [
        pytest.param(p, id=str(p.relative_to(SHARED_TRACES)), marks=pytest.mark.shared)
        for p in shared
    ]
    if not shared:
        params.append(pytest.param(None, marks=pytest.mark.skip(reason=f"{SHARED_TRACES} absent")))
    return params


def tick_ns(trace: traceq.Trace) -> int:
    """The trace's clock resolution: 1 µs when every kernel duration is whole µs (older
    Kineto), else 1 ns. A 6.0 µs kernel there may have run 6.99 µs."""
    durations = trace.kernels["dur_ns"]
    return 1000 if durations.len() and (durations % 1000 == 0).all() else 1


@pytest.mark.parametrize("path", physics_params())
def test_no_op_is_above_its_datasheet_roof(path: Path) -> None:
    """Rates recomputed here from FLOPs, bytes, kernel time and the spec's peaks. Up to an
    L2's worth of an op's bytes can be served by L2 (operands the op before it just wrote,
    an output written back after the kernel ends), so the bytes that must cross HBM are at
    least `bytes - L2 size`: those are held to the HBM roof. Kernel times are taken one
    clock tick long (whole-µs clocks in older traces)."""
    trace = traceq.load(path, cache=False)
    spec = trace_spec(trace)
    frame = roofline(trace, spec=spec)
    if spec is None:
        assert frame["pct_compute_datasheet"].is_null().all()
        return
    slowest = frame.filter(pl.col("modelled")).with_columns(
        ((pl.col("time_us") * 1000 + tick_ns(trace) * pl.col("n_kernels")) / 1e9).alias("_s")
    )
    peak = pl.col("peak_tflops_datasheet") * 1e12
    l2_bytes = (spec.l2_mib or 0) * 2**20
    rates = slowest.select(
        (pl.col("flops") / pl.col("_s") / peak).max().alias("compute"),
        ((pl.col("bytes") - l2_bytes).clip(lower_bound=0) / pl.col("_s") / (spec.hbm_gbs * 1e9))
        .max()
        .alias("memory"),
    ).row(0, named=True)
    assert (rates["compute"] or 0) <= TOLERANCE, rates
    assert (rates["memory"] or 0) <= TOLERANCE, rates


def test_cpu_traces_have_no_datasheet_roof() -> None:
    trace = traceq.load(FIXTURES / "mlp_gelu-eager.pt.trace.json.gz", cache=False)
    frame = roofline(trace)
    assert frame.height > 0 and frame["pct_roof_datasheet"].is_null().all()
    assert frame["flops"].sum() > 0


@pytest.fixture(scope="module")
def qwen() -> traceq.Trace:
    if not H100_QWEN.exists():
        pytest.skip(f"{H100_QWEN} is absent")
    return traceq.load(H100_QWEN, cache=False)


@pytest.mark.shared
def test_kernel_and_module_views_add_up_to_the_op_view(qwen) -> None:
    ops = roofline(qwen)
    kernels = roofline(qwen, by="kernel")
    modules = roofline(qwen, by="module")
    assert kernels["flops"].sum() == pytest.approx(ops["flops"].sum(), rel=1e-9)
    assert kernels["bytes"].sum() == pytest.approx(ops["bytes"].sum(), rel=1e-9)
    assert modules["time_us"].sum() == pytest.approx(ops["time_us"].sum(), rel=1e-9)
    assert modules["flops"].sum() == pytest.approx(ops["flops"].sum(), rel=1e-9)


@pytest.mark.shared
def test_the_big_gemms_are_compute_bound_and_their_rate_is_flops_over_kernel_time(qwen) -> None:
    ops = roofline(qwen)
    gemm = ops.filter(pl.col("family") == "gemm").sort("flops", descending=True).row(0, named=True)
    kernel_ns = qwen.kernels.filter(pl.col("event").cast(pl.Int64).is_in(gemm["kernel_events"]))[
        "dur_ns"
    ].sum()
    assert gemm["tflops"] == pytest.approx(gemm["flops"] / kernel_ns / 1e3)
    assert gemm["bound"] == "compute"
    assert gemm["pct_compute_datasheet"] == pytest.approx(100 * gemm["tflops"] / 989.5)


@pytest.mark.shared
def test_an_achievable_spec_gets_its_own_columns(qwen, tmp_path: Path) -> None:
    from traceq.perf.specs import load_spec

    path = tmp_path / "h100.json"
    path.write_text(json.dumps({"name": "H100", "peak_tflops": {"bf16": 700.0}, "hbm_gbs": 3000}))
    frame = roofline(qwen, achievable=load_spec(path))
    gemm = frame.filter(pl.col("family") == "gemm").row(0, named=True)
    assert gemm["pct_compute_achievable"] == pytest.approx(100 * gemm["tflops"] / 700.0)
    assert gemm["pct_compute_achievable"] > gemm["pct_compute_datasheet"]


# -- commands -----------------------------------------------------------------------------


def run(*args: str) -> Result:
    from traceq.cli.main import main

    return CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args))


def test_roofline_command_on_a_fixture() -> None:
    result = run("roofline", str(FIXTURES / "mlp_gelu-eager.pt.trace.json.gz"), "--top", "5")
    assert result.exit_code == 0, result.output
    assert "aten::linear" in result.output and "gemm" in result.output


@pytest.mark.shared
@pytest.mark.parametrize("by", ["op", "kernel", "module"])
def test_roofline_command_on_an_h100_trace(by: str) -> None:
    if not H100_QWEN.exists():
        pytest.skip(f"{H100_QWEN} is absent")
    result = run("roofline", str(H100_QWEN), "--by", by, "--format", "json", "--top", "3")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 3 and rows[0]["time_us"] >= rows[1]["time_us"]
    assert all(0 < r["pct_roof_datasheet"] <= 105 for r in rows if r["pct_roof_datasheet"])


def gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(gpu_available(), reason="a GPU is present: calibrate runs instead")
def test_calibrate_without_a_gpu_says_why_in_one_line() -> None:
    result = run("device", "calibrate", "-o", "/dev/null")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "traceq: error: calibrate needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)"
    )


@pytest.mark.skipif(not gpu_available(), reason="calibrate needs a CUDA or ROCm GPU")
def test_calibrate_writes_a_spec_the_roofline_reads(tmp_path: Path) -> None:
    from traceq.perf.specs import identify, load_spec

    out = tmp_path / "spec.json"
    result = run("device", "calibrate", "-o", str(out))
    assert result.exit_code == 0, result.output
    measured = load_spec(out)
    datasheet = identify({"name": measured.name})
    if datasheet is not None:  # achievable stays under the datasheet
        for dtype, value in measured.peak_tflops.items():
            if value and datasheet.peak(dtype):
                assert value <= datasheet.peak(dtype) * TOLERANCE
        assert measured.hbm_gbs <= datasheet.hbm_gbs * TOLERANCE
