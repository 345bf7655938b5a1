"""Serving engines' own kernels (norms with a fused residual add, `silu_and_mul`, rotary
embedding, KV-cache writes) are costed by their signature inside CUDA-graph replays: bytes
recomputed here from the raw capture JSON's `Input Dims` and `Input type`."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import polars as pl
import pytest
from conftest import FIXTURES

import traceq

SERVING = FIXTURES / "serving"
SGLANG = SERVING / "sglang_decode" / "sglang_Qwen3-8B_decode.json.gz"
VLLM = SERVING / "vllm_decode_full" / "graph_execution.json.gz"
SIZE = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "long int": 8, "int": 4}


def raw_signature(path: Path, name: str) -> tuple[list, list]:
    """`Input Dims` and `Input type` of the first CPU op `name` in the replay or its capture."""
    captures = sorted((path.parent / "capture_traces").glob("*.json.gz"))
    for file in [path, *captures]:
        with gzip.open(file) as stream:
            for e in json.load(stream)["traceEvents"]:
                if e.get("cat") == "cpu_op" and e.get("name") == name:
                    return e["args"]["Input Dims"], e["args"]["Input type"]
    raise AssertionError(f"{name} not in {path}")


def nbytes(dims: list, types: list, i: int) -> int:
    return math.prod(dims[i]) * SIZE[types[i]]


@pytest.fixture(scope="module")
def roofs() -> dict[Path, pl.DataFrame]:
    return {p: traceq.load(p).roofline for p in (SGLANG, VLLM)}


def op_row(roofs: dict[Path, pl.DataFrame], path: Path, name: str) -> dict:
    rows = roofs[path].filter(pl.col("name") == name)
    assert rows.height, name
    return rows.row(0, named=True)


@pytest.mark.parametrize(
    ("path", "name", "expected"),
    [
        # x, residual in; out, residual out (4 recorded [T, H]); weight [H]
        (SGLANG, "sglang_profiler::rmsnorm_rmsnorm2d_fwd_with_add_110",
         lambda d, t: (2 * nbytes(d, t, 0) + nbytes(d, t, 4), 2 * nbytes(d, t, 0))),
        # in place: x and residual read and written
        (VLLM, "vllm::rocm_aiter_rmsnorm2d_fwd_with_add",
         lambda d, t: (2 * nbytes(d, t, 0) + nbytes(d, t, 2), 2 * nbytes(d, t, 0))),
        (VLLM, "vllm::rocm_aiter_rms_norm",
         lambda d, t: (nbytes(d, t, 0) + nbytes(d, t, 1), nbytes(d, t, 0))),
        # q and k normalized in place, weights not recorded
        (SGLANG, "sglang_profiler::utils_apply_qk_norm_487",
         lambda d, t: (nbytes(d, t, 0) + nbytes(d, t, 1), nbytes(d, t, 0) + nbytes(d, t, 1))),
        # out [T, N] first, [T, 2N] in
        (SGLANG, "sgl_kernel::silu_and_mul", lambda d, t: (nbytes(d, t, 1), nbytes(d, t, 0))),
        # positions [T], q, k in place, T rows of the [L, D] cos/sin cache
        (VLLM, "_C::rotary_embedding",
         lambda d, t: (nbytes(d, t, 0) + nbytes(d, t, 1) + nbytes(d, t, 2)
                       + d[0][0] * d[4][1] * SIZE[t[4]], nbytes(d, t, 1) + nbytes(d, t, 2))),
        # k and v of the step into the cache
        (VLLM, "vllm::unified_kv_cache_update",
         lambda d, t: (nbytes(d, t, 0) + nbytes(d, t, 1), nbytes(d, t, 0) + nbytes(d, t, 1))),
        (SGLANG, "sglang_profiler::memory_pool__set_kv_buffer_impl_353",
         lambda d, t: (nbytes(d, t, 0) + nbytes(d, t, 1), nbytes(d, t, 0) + nbytes(d, t, 1))),
    ],
)  # fmt: skip
def test_engine_op_bytes_equal_the_raw_signature(roofs, path, name, expected) -> None:
    row = op_row(roofs, path, name)
    assert row["modelled"], row["why_not"]
    dims, types = raw_signature(path, name)
    read, written = expected(dims, types)
    assert (row["bytes_read"], row["bytes_written"]) == (read, written)
    assert name in row["cost_basis"]  # how it was read, for the user to check


def test_silu_and_mul_flops_are_the_activation_and_the_product(roofs) -> None:
    dims, _ = raw_signature(SGLANG, "sgl_kernel::silu_and_mul")
    row = op_row(roofs, SGLANG, "sgl_kernel::silu_and_mul")
    silu = 3 + 4  # x / (1 + exp(-x)): three operations and one transcendental (4)
    assert row["flops"] == math.prod(dims[0]) * (silu + 1)


def test_a_reshape_named_for_a_norm_is_not_costed_as_one() -> None:
    from traceq.perf.cost import op_cost

    cost = op_cost("sglang_profiler::utils__reshape_for_qk_norm_486", [[32, 4096]],
                   ["c10::BFloat16"], [""])  # fmt: skip
    assert not (cost.modelled and cost.family == "norm")


def test_paged_attention_says_why_it_is_not_modelled(roofs) -> None:
    rows = roofs[SGLANG].filter(pl.col("name").str.contains("paged_attention"))
    assert rows.height and not rows["modelled"].any()


def test_modelled_share_of_replayed_time(roofs) -> None:
    """SGLang's replay: GEMMs, norms, activations, rotary and KV writes modelled, paged
    attention not; vLLM's: its fused MoE's expert weights are not inputs."""
    for path, least in ((SGLANG, 0.75), (VLLM, 0.20)):
        frame = roofs[path]
        share = frame.filter(pl.col("modelled"))["time_us"].sum() / frame["time_us"].sum()
        assert share >= least, (path.name, share)
