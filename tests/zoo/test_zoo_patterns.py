"""The pattern contract: shape parsing, the cases every check runs, inputs and work."""

from __future__ import annotations

import pytest
import torch
from traceq.zoo.errors import BadShape, UnknownDtype, UnknownPattern
from traceq.zoo.patterns import (
    bytes_moved,
    cases,
    dtype_name,
    flops,
    make_inputs,
    output_shape,
    parse_shape,
    ragged,
)


def test_parse_shape_reads_m_k_n() -> None:
    assert parse_shape("64,128,96") == (64, 128, 96)
    assert parse_shape(" 8192, 768 ,3072 ") == (8192, 768, 3072)


@pytest.mark.parametrize("text", ["64,128", "64,128,96,1", "a,b,c", "64,0,96", "64,-1,96", ""])
def test_parse_shape_rejects_what_is_not_three_positive_ints(text: str) -> None:
    with pytest.raises(BadShape, match="M,K,N"):
        parse_shape(text)


def test_dtype_aliases_resolve_and_unknown_ones_raise() -> None:
    assert dtype_name("bf16") == "bfloat16"
    assert dtype_name("FP16") == "float16"
    assert dtype_name("tf32") == "tf32"
    with pytest.raises(UnknownDtype, match="int8"):
        dtype_name("int8")


@pytest.mark.parametrize("dim", [64, 96, 128, 512, 768, 3072, 8192])
def test_ragged_sizes_are_odd_so_no_power_of_two_block_divides_them(dim: int) -> None:
    size = ragged(dim)
    assert size % 2 == 1
    assert dim // 2 < size < dim


def test_every_check_runs_a_ragged_shape_and_a_3d_input() -> None:
    plan = cases("gemm_bias_act", (64, 128, 96))
    by_name = {c.name: c for c in plan}
    assert set(by_name) == {"main", "ragged", "3-D"}
    assert by_name["main"].timed and not by_name["ragged"].timed
    assert by_name["ragged"].problem.rows == (47,)
    assert (by_name["ragged"].problem.k, by_name["ragged"].problem.n) == (95, 71)
    assert by_name["3-D"].problem.rows == (2, 33)


def test_mlp_checks_plain_and_gated_and_glu_checks_chunked_halves() -> None:
    mlp = [c.name for c in cases("mlp", (64, 128, 96))]
    assert mlp == ["main", "ragged", "3-D", "gated main", "gated ragged", "gated 3-D"]
    glu = cases("glu", (64, 128, 96))
    assert [c.name for c in glu] == ["main", "ragged", "3-D", "chunked main"]
    chunked = glu[-1]
    gate, up = make_inputs("glu", chunked, torch.float32, "cpu", torch.Generator().manual_seed(0))
    assert gate.stride() == (192, 1) and up.stride() == (192, 1)


def test_unknown_pattern_raises_a_usage_error() -> None:
    with pytest.raises(UnknownPattern, match="gemm_bias_act"):
        cases("conv", (1, 2, 3))


def test_inputs_are_random_nonzero_and_shaped_for_3d() -> None:
    case = cases("mlp", (64, 128, 96))[2]
    x, w_gate, w_up, b_up, w_down, b_down = make_inputs(
        "mlp", case, torch.bfloat16, "cpu", torch.Generator().manual_seed(1)
    )
    assert w_gate is None
    assert x.shape == (2, 33, 128) and x.dtype == torch.bfloat16
    assert w_up.shape == (96, 128) and w_down.shape == (128, 96)
    assert b_up is not None and b_down is not None
    assert bool((x != 0).all()) and float(x.float().std()) > 0.5
    assert output_shape("mlp", case) == (2, 33, 128)


def test_work_counts_match_the_gemms() -> None:
    main = cases("mlp", (64, 128, 96))
    assert flops("gemm_bias_act", cases("gemm_bias_act", (64, 128, 96))[0]) == 2 * 64 * 128 * 96
    assert flops("mlp", main[0]) == 4 * 64 * 128 * 96
    assert flops("mlp", main[3]) == 6 * 64 * 128 * 96
    assert flops("glu", cases("glu", (64, 128, 96))[0]) is None
    assert bytes_moved("glu", cases("glu", (64, 128, 96))[0], 2) == 3 * 64 * 96 * 2
