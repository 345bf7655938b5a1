"""Serving engines' GEMMs are custom ops: a custom op wrapping `aten::linear` is costed and
classed by that child, one named and shaped as a GEMM by its signature; the capture's
module calls are copied into the replay with its ops. Numbers come from the capture's raw
`Input Dims`."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

import traceq
from traceq.perf.cost import op_cost, op_costs
from traceq.relations.dataflow import dataflow_ops

SERVING = Path(__file__).parent.parent / "fixtures" / "serving"
CASES = {
    "vllm_decode_full": ("graph_execution.json.gz", "vllm::rocm_unquantized_gemm"),
    "sglang_decode": ("sglang_Qwen3-8B_decode.json.gz", "aiter::gemm_a16w16"),
}


def raw_gemm_dims(case: str, wrapper: str) -> list[list[list[int]]]:
    """`Input Dims` of every `aten::linear` directly inside `wrapper` in the raw capture JSON."""
    (path,) = (SERVING / case / "capture_traces").glob("*.json.gz")
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    outer = [e for e in ops if e["name"] == wrapper]
    dims = []
    for e in ops:
        if e["name"] != "aten::linear":
            continue
        if any(
            o["tid"] == e["tid"] and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]
            for o in outer
        ):
            dims.append(e["args"]["Input Dims"])
    return dims


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    name = request.param
    return name, traceq.load(SERVING / name / CASES[name][0])


def test_wrapped_linear_is_the_semantic_op_and_costed_from_its_shapes(case):
    name, trace = case
    wrapper = CASES[name][1]
    ops = dataflow_ops(trace).join(
        trace.ops.select(pl.col("event").cast(pl.Int64), "replayed"), on="event"
    )
    replayed = ops.filter(pl.col("replayed"))
    assert wrapper not in replayed["name"].to_list()
    linears = replayed.filter(pl.col("name") == "aten::linear")
    expected = raw_gemm_dims(name, wrapper)
    assert linears.height == len(expected) > 0
    x, w = expected[0][0], expected[0][1]
    m, k, n = x[0], x[1], w[0]
    costs = op_costs(linears)
    assert (costs["family"] == "gemm").all() and costs["modelled"].all()
    assert costs["matmul_flops"][0] == 2.0 * m * n * k
    assert (costs["gpu_ns"] > 0).all()  # the replayed GEMM kernels roll up to the linear


def test_roofline_models_most_replayed_gemm_time(case):
    _, trace = case
    rows = trace.roofline.filter(
        pl.col("event").is_in(
            trace.ops.filter(pl.col("replayed"))["event"].cast(pl.Int64).implode()
        )
    )
    gemm = rows.filter(pl.col("family") == "gemm")
    assert gemm["modelled"].all() and gemm["time_us"].sum() > 0


def test_custom_op_named_and_shaped_as_gemm_is_costed_by_its_signature():
    cost = op_cost(
        "mylib::gemm_a16w16",
        [[32, 4096], [6144, 4096], [6144]],
        ["c10::BFloat16"] * 3,
        ["", "", ""],
    )
    assert cost.family == "gemm" and cost.modelled
    assert cost.matmul_flops == 2.0 * 32 * 6144 * 4096
    assert cost.flops == cost.matmul_flops + 32 * 6144  # the bias
    assert "M=32, N=6144, K=4096" in cost.basis


def test_custom_gemm_in_k_n_layout():
    cost = op_cost("mylib::fp16_mm", [[8, 64], [64, 128]], ["c10::Half"] * 2, ["", ""])
    assert cost.matmul_flops == 2.0 * 8 * 128 * 64 and "[K, N]" in cost.basis


def test_custom_op_with_gemm_name_but_not_gemm_shapes_stays_other():
    cost = op_cost("mylib::linear_attention", [[2, 8, 64], [2, 8, 64]], ["float"] * 2, ["", ""])
    assert cost.family == "other" and not cost.modelled


def test_moe_without_expert_weights_says_routing_not_recorded():
    cost = op_cost("vllm::moe_forward", [[32, 3072], [32, 32], [], []], ["c10::BFloat16"] * 2, [])
    assert not cost.modelled and "expert routing not recorded" in cost.why_not


def test_moe_with_routing_and_expert_weights_is_costed():
    t, k, e, inter, topk = 32, 2048, 128, 768, 8
    dims = [[t, k], [e, 2 * inter, k], [e, k, inter], [t, topk], [t, topk]]
    types = ["c10::BFloat16"] * 3 + ["float", "int"]
    cost = op_cost("sglang::fused_experts", dims, types, [""] * 5)
    assert cost.family == "gemm" and cost.modelled
    assert cost.matmul_flops == 2.0 * t * topk * (2 * inter * k + k * inter)


def test_custom_gemm_is_classed_as_gemm_for_the_fusion_rules():
    from traceq.rules.op_classes import classify

    ops = pl.DataFrame(
        {
            "name": ["mylib::gemm_bf16"],
            "shapes": [[[32, 4096], [6144, 4096]]],
            "input_types": [["c10::BFloat16", "c10::BFloat16"]],
            "concrete_inputs": [["", ""]],
            "dtype": ["c10::BFloat16"],
            "data_inputs": [
                [{"index": 0, "shape": [32, 4096]}, {"index": 1, "shape": [6144, 4096]}]
            ],
            "output_shape": [[32, 6144]],
        }
    )
    row = classify(ops).row(0, named=True)
    assert row["role"] == "gemm" and row["custom_gemm"]
    assert (row["k"], row["n"]) == (4096, 6144)


def test_capture_module_calls_are_copied_into_the_replay():
    trace = traceq.load(SERVING / "sglang_decode" / CASES["sglang_decode"][0])
    capture = traceq.load(
        SERVING / "sglang_decode" / "capture_traces" / "bs_32_rank0.json.gz", capture=False
    )
    added = (
        trace.modules.height
        - traceq.load(
            SERVING / "sglang_decode" / CASES["sglang_decode"][0], capture=False
        ).modules.height
    )
    assert 0 < added <= capture.modules.height
    copied = set(trace.modules["path"].to_list())
    assert any("Qwen3DecoderLayer" in p for p in copied)
