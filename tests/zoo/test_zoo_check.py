"""Every zoo entry through the one check harness, and the harness catching bad kernels.

The compiled entries live in test_zoo_compile.py (slow: Inductor builds C++ per graph).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from traceq.zoo.check import POISON_ALLOCATOR, POISON_OUT, check, relative_error
from traceq.zoo.errors import DeviceUnavailable, UnknownEntry, UnknownPattern
from traceq.zoo.registry import ACTIVATIONS, PATTERNS, Entry, Zoo
from traceq.zoo.triton_support import INTERPRETER_NOTE

FAST = {"reference", "triton", "cublaslt-epilogue", "liger"}
SHAPE = (64, 128, 96)


def _ran(report, name: str):  # type: ignore[no-untyped-def]
    result = report.entry(name)
    assert result.status != "skipped", result.note
    return result


# Every activation through the cheap patterns; the GEMM-heavy ones share the same
# epilogue code (traceq.zoo.triton_support.activate), so two activations each cover them.
FLOAT32_CASES = [
    *[("gemm_bias_act", act) for act in ACTIVATIONS],
    *[("glu", act) for act in ACTIVATIONS],
    *[(pattern, act) for pattern in ("dual_gemm_glu", "mlp") for act in ("gelu_tanh", "silu")],
]


@pytest.mark.parametrize(("pattern", "act"), FLOAT32_CASES)
def test_every_fast_entry_matches_float64_in_float32(
    builtin_zoo: Zoo, device: str, pattern: str, act: str
) -> None:
    report = check(
        pattern, SHAPE, "float32", device, act, zoo=builtin_zoo, select=FAST, timing=False
    )
    assert report.passed, [(e.entry, [(c.case, c.error) for c in e.cases]) for e in report.failures]
    triton = _ran(report, f"{pattern}.triton")
    assert triton.poisoning == POISON_OUT
    assert triton.note == (INTERPRETER_NOTE if device == "cpu" else "")
    assert len(triton.cases) == len(report.cases) >= 3
    assert triton.max_rel_error is not None and triton.max_rel_error < 1e-5
    assert report.entry(f"{pattern}.reference").poisoning == POISON_ALLOCATOR


@pytest.mark.parametrize(
    ("dtype", "act", "bound"),
    [("bfloat16", "gelu_tanh", 1.5e-2), ("float16", "silu", 2e-3), ("tf32", "gelu", 1e-3)],
)
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_every_fast_entry_meets_the_half_precision_bounds(
    builtin_zoo: Zoo, device: str, pattern: str, dtype: str, act: str, bound: float
) -> None:
    report = check(pattern, SHAPE, dtype, device, act, zoo=builtin_zoo, select=FAST, timing=False)
    assert report.bound == bound
    assert report.passed, [(e.entry, [(c.case, c.error) for c in e.cases]) for e in report.failures]
    triton = _ran(report, f"{pattern}.triton")
    assert triton.max_rel_error is not None and 0 < triton.max_rel_error < bound


@pytest.mark.parametrize("pattern", ["gemm_bias_act", "dual_gemm_glu"])
def test_triton_gemms_handle_more_row_tiles_than_one_swizzle_group(
    builtin_zoo: Zoo, device: str, pattern: str
) -> None:
    # 600 rows = 10 row tiles of 64: two GROUP_M=8 groups, the second one short.
    report = check(
        pattern,
        (600, 64, 80),
        "float32",
        device,
        "gelu",
        zoo=builtin_zoo,
        select={"triton"},
        timing=False,
    )
    assert report.entry(f"{pattern}.triton").status == "pass"


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_triton_entries_handle_degenerate_shapes(
    builtin_zoo: Zoo, device: str, pattern: str
) -> None:
    for shape in [(1, 1, 1), (3, 5, 7)]:
        report = check(
            pattern,
            shape,
            "float32",
            device,
            "gelu",
            zoo=builtin_zoo,
            select={"triton"},
            timing=False,
        )
        triton = report.entry(f"{pattern}.triton")
        assert triton.status == "pass", (shape, [(c.case, c.error) for c in triton.cases])


def test_triton_gemm_at_the_largest_test_shape(builtin_zoo: Zoo, device: str) -> None:
    report = check(
        "gemm_bias_act",
        (128, 256, 512),
        "bfloat16",
        device,
        "gelu_tanh",
        zoo=builtin_zoo,
        select={"triton"},
        timing=False,
    )
    assert report.entry("gemm_bias_act.triton").status == "pass"


def test_float64_runs_the_reference_exactly_and_skips_what_cannot(
    builtin_zoo: Zoo, device: str
) -> None:
    report = check(
        "mlp", SHAPE, "float64", device, "silu", zoo=builtin_zoo, select=FAST, timing=False
    )
    assert report.entry("mlp.reference").max_rel_error == 0.0
    triton = report.entry("mlp.triton")
    assert triton.status == "skipped" and triton.note.startswith("dtype float64 not supported")


def test_cpu_timing_covers_compiled_code_only(builtin_zoo: Zoo, device: str) -> None:
    if device != "cpu":
        pytest.skip("Triton runs compiled on this GPU machine: see test_zoo_cuda.py")
    report = check(
        "gemm_bias_act",
        SHAPE,
        "float32",
        "cpu",
        "relu",
        zoo=builtin_zoo,
        select=FAST,
        min_run_time=0.05,
    )
    reference = report.entry("gemm_bias_act.reference").timed_cases
    addmm = report.entry("gemm_bias_act.addmm_activation").timed_cases
    assert len(reference) == 1 and len(addmm) == 1
    timing = reference[0].timing
    assert timing is not None and timing.median_ms > 0
    assert timing.tflops == pytest.approx(2 * 64 * 128 * 96 / (timing.median_ms / 1e3) / 1e12)
    assert "torch.utils.benchmark" in timing.method
    assert timing.peak_tflops_fraction is None  # no peak on the CPU
    assert addmm[0].speedup == pytest.approx(timing.median_ms / addmm[0].timing.median_ms)
    assert report.entry("gemm_bias_act.triton").timed_cases == []


def test_report_is_strict_json(builtin_zoo: Zoo, device: str) -> None:
    report = check(
        "glu", SHAPE, "bfloat16", device, "silu", zoo=builtin_zoo, select=FAST, min_run_time=0.02
    )
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["pattern"] == "glu" and data["passed"] is True
    names = {e["entry"]: e for e in data["entries"]}
    if device == "cpu":
        assert names["glu.liger"]["status"] == "skipped"
    assert [c["case"] for c in names["glu.triton"]["cases"]] == report.cases


# --- the harness must fail what is wrong -------------------------------------------------


def _reference_and(entry: Entry, builtin_zoo: Zoo) -> Zoo:
    return Zoo((builtin_zoo.reference(entry.pattern), entry))


def _glu_entry(name: str, fn, out_fn=None) -> Entry:  # type: ignore[no-untyped-def]
    return Entry(
        name,
        "glu",
        "test",
        fn,
        tuple(ACTIVATIONS),
        ("float32", "bfloat16"),
        ("cpu",),
        "test entry",
        out_fn=out_fn,
    )


def _glu(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


def test_an_error_just_above_the_float32_bound_fails_but_passes_bf16(builtin_zoo: Zoo) -> None:
    def off_by_3e5(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
        return _glu(gate, up, act) * (1 + 3e-5)

    zoo = _reference_and(_glu_entry("off", off_by_3e5), builtin_zoo)
    fp32 = check("glu", SHAPE, "float32", "cpu", "silu", zoo=zoo, timing=False).entry("off")
    assert fp32.status == "fail"
    assert fp32.max_rel_error == pytest.approx(3e-5, rel=0.05)
    assert check("glu", SHAPE, "bfloat16", "cpu", "silu", zoo=zoo, timing=False).passed


def test_nan_output_fails_even_without_an_out_buffer(builtin_zoo: Zoo) -> None:
    def leaves_a_nan(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
        out = _glu(gate, up, act)
        out.view(-1)[-1] = math.nan
        return out

    zoo = _reference_and(_glu_entry("nan", leaves_a_nan), builtin_zoo)
    result = check("glu", SHAPE, "float32", "cpu", "silu", zoo=zoo, timing=False).entry("nan")
    assert result.status == "fail"
    assert {c.error for c in result.cases} == {"non-finite output"}
    assert all(c.rel_error is not None and math.isnan(c.rel_error) for c in result.cases)


def test_an_entry_that_writes_into_its_inputs_fails(builtin_zoo: Zoo) -> None:
    def in_place(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
        return up.mul_(torch.nn.functional.silu(gate))

    zoo = _reference_and(_glu_entry("inplace", in_place), builtin_zoo)
    result = check("glu", SHAPE, "float32", "cpu", "silu", zoo=zoo, timing=False).entry("inplace")
    assert result.status == "fail" and result.cases[0].error == "modified its inputs"


def test_an_entry_that_raises_fails_with_its_message(builtin_zoo: Zoo) -> None:
    def raises(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
        raise RuntimeError("kernel launch failed\nsecond line")

    zoo = _reference_and(_glu_entry("raises", raises), builtin_zoo)
    result = check("glu", SHAPE, "float32", "cpu", "silu", zoo=zoo, timing=False).entry("raises")
    assert result.cases[0].error == "RuntimeError: kernel launch failed"


def test_a_wrong_output_shape_fails(builtin_zoo: Zoo) -> None:
    def flattens(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
        return _glu(gate, up, act).reshape(-1)

    zoo = _reference_and(_glu_entry("flat", flattens), builtin_zoo)
    result = check("glu", SHAPE, "float32", "cpu", "silu", zoo=zoo, timing=False).entry("flat")
    assert result.cases[0].error == "output shape (6144,), expected (64, 96)"


def test_relative_error_is_nan_for_inf_and_exact_for_equal() -> None:
    ref = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert relative_error(ref.float(), ref) == 0.0
    assert math.isnan(relative_error(torch.tensor([1.0, math.inf]), ref))
    assert relative_error(torch.tensor([1.0, 2.5]), ref) == pytest.approx(0.5 / math.sqrt(5))


def test_bad_requests_raise_usage_errors(builtin_zoo: Zoo) -> None:
    with pytest.raises(UnknownPattern):
        check("conv", SHAPE, zoo=builtin_zoo)
    with pytest.raises(UnknownEntry, match="nope"):
        check("glu", SHAPE, zoo=builtin_zoo, select={"nope"})
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailable):
            check("glu", SHAPE, device="cuda", zoo=builtin_zoo)
