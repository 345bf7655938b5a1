"""The fusion rules' false findings and misses by class, each on a real trace.

Traces:
- `tracelens/tests/traces/torch_compile_triton/trace.json.gz` (`../shared/traces`,
  AMD-AGI/TraceLens, MIT): a `torch.compile`d LLaMA-style block on an MI300X — RMSNorm,
  q/k/v `mm`s, SDPA, o_proj, RMSNorm, gate/up `mm`s, the fused SwiGLU, down, residual add.
- `fixtures/corpus/*` (recorded here on the CPU, `fixtures/record_corpus.py`), each with an
  Execution Trace of the same run.

Each test names the behaviour and fails on the rule before its fix.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import SHARED_TRACES, corpus_et, corpus_paths, gpu_fixture

import traceq
from traceq.rules.config import Config
from traceq.rules.engine import run

COMPILED = SHARED_TRACES / "tracelens/tests/traces/torch_compile_triton/trace.json.gz"


def _findings(trace: traceq.Trace, *codes: str) -> list[Any]:
    return run(trace, Config(select=list(codes))).findings


def _compiled_document() -> dict[str, Any]:
    if not COMPILED.is_file():
        pytest.skip("../shared/traces is not present")
    with gzip.open(COMPILED, "rt") as f:
        return json.load(f)


def _renamed(document: dict[str, Any], old: str, new: str, tmp_path: Path) -> traceq.Trace:
    """`document` with every event named `old` (the CPU op and its GPU kernel) named `new`."""
    for event in document["traceEvents"]:
        if event.get("name") == old:
            event["name"] = new
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(document))
    return traceq.load(path)


# -- class 1: TQ102 in compiled graphs names the wrong GEMM -----------------------------


def test_tq102_pairs_a_compiled_activation_kernel_with_one_gemm(tmp_path: Path) -> None:
    """The MI300X block with its last kernel renamed (the documented edit):
    `triton_poi_fused__unsafe_view_add_3`, which finishes the down projection's `mm` (and
    adds the residual), becomes `triton_poi_fused_addmm_gelu_3`, an activation kernel after
    an extern GEMM, as Inductor emits for `gelu(linear(x))`. Shape-matched data flow also
    gives it the k projection's `mm` (same [32768, 2048] output, run 30 ops earlier, read by
    SDPA) as a producer: the kernel made two findings, its saving counted twice. It belongs
    to one: the down projection, the GEMM that ran last before it."""
    trace = _renamed(
        _compiled_document(),
        "triton_poi_fused__unsafe_view_add_3",
        "triton_poi_fused_addmm_gelu_3",
        tmp_path,
    )
    ops = trace.dataflow_ops
    kernel = ops.filter(pl.col("name") == "triton_poi_fused_addmm_gelu_3")["event"].item()
    mms = ops.filter((pl.col("name") == "aten::mm") & (pl.col("event") < kernel))
    down = mms["event"].max()
    found = [f for f in _findings(trace, "TQ102") if kernel in f.ops]
    assert [f.ops for f in found] == [[down, kernel]]


# -- class 2: TQ104 chains that cross non-elementwise work ------------------------------


def test_tq104_chains_only_ops_that_launched_kernels_on_a_gpu_trace() -> None:
    """HTA's MTIA rank (`hta/tests/data/mtia_trace_single_rank`, MIT): four `add_` on [1]
    tensors made a chain, two of them CPU-side arithmetic with no kernel (0 µs of device
    time, nothing to fuse). On a GPU trace whose ops are linked to kernels, every member
    of a chain launched one."""
    path = SHARED_TRACES / "hta/tests/data/mtia_trace_single_rank/mtia_rank_0.json.gz"
    if not path.is_file():
        pytest.skip("../shared/traces is not present")
    trace = traceq.load(path)
    launched = dict(trace.dataflow_ops.select("event", "n_kernels").iter_rows())
    found = _findings(trace, "TQ104")
    assert found
    assert all(launched[e] > 0 for f in found for e in f.ops)


def test_tq104_does_not_chain_a_forward_op_into_the_backward_pass() -> None:
    """`tp_train` (a Megatron layer trained, fixtures/corpus): `x ** 2` in the forward and
    the `pow` of its gradient in `PowBackward0` read as one chain on exact data flow (the
    backward reads the saved x); the loss and the whole backward run between them."""
    from traceq.relations.dataflow import dataflow

    trace = traceq.load(corpus_paths("tp_train")[0])
    trace.__dict__["dataflow"] = dataflow(
        trace, trace.dataflow_ops, execution_trace=corpus_et("tp_train")
    )
    backward = set(
        trace.dataflow_ops.join(
            trace.ops.filter(pl.col("name").str.contains(r"Backward\d*$")).select(
                pl.col("event").cast(pl.Int64).alias("parent")
            ),
            on="parent",
            how="semi",
        )["event"].to_list()
    )
    for f in _findings(trace, "TQ104"):
        sides = {e in backward for e in f.ops}
        assert len(sides) == 1, f.message


# -- class 3: TQ105 groups GEMMs that depend on each other ------------------------------


def test_tq105_leaves_out_a_gemm_that_reads_another_of_its_group() -> None:
    """HTA's sampled rank (`fixtures/gpu/hta-sampled_rank-0`, MIT): `mm` 563 read `mm` 560's
    output as its weight, and 560 read `mm` 554's: "the same [2048, 125] input, K=125"
    grouped 554 and 563, though 563 cannot start before 554 ends."""
    trace = traceq.load(gpu_fixture("hta-sampled_rank-0"))
    edges = trace.dataflow.select("producer", "consumer").rows()
    assert (554, 560) in edges and (560, 563) in edges
    assert all(not {554, 563} <= set(f.ops) for f in _findings(trace, "TQ105"))


# -- class 8: fix text that does not fit ------------------------------------------------


def test_tq102_fix_names_addmm_activation_only_for_relu_and_gelu_on_a_gpu() -> None:
    """HTA's sampled rank (A100, MIT) has Linear → sigmoid / tanh / GELU splits: only the
    GELU's fix may name `torch._addmm_activation` (cuBLASLt has ReLU and GELU epilogues);
    the sigmoid's and tanh's said `use_gelu=...` too."""
    found = _findings(traceq.load(gpu_fixture("hta-sampled_rank-0")), "TQ102")
    acts = {f.evidence["activation"] for f in found}
    assert {"sigmoid", "tanh", "gelu"} <= acts
    for f in found:
        names_it = "torch._addmm_activation(" in f.fix
        assert names_it == (f.evidence["activation"] in ("relu", "gelu")), f.fix


def test_tq102_fix_on_a_cpu_trace_names_no_cublaslt_epilogue() -> None:
    """HTA's CPU-only rank (`fixtures/gpu/hta-rank_non_gpu`, MIT): Linear → ReLU/sigmoid/
    tanh on the CPU. The fix proposed cuBLASLt, which a CPU run does not have."""
    found = _findings(traceq.load(gpu_fixture("hta-rank_non_gpu")), "TQ102")
    assert found
    for f in found:
        assert "torch._addmm_activation(" not in f.fix and "epilogue: `torch" not in f.fix
        assert "on the CPU" in f.fix


# -- missed: activations outside the list -----------------------------------------------


def test_tq102_finds_activations_outside_relu_gelu_silu_tanh_sigmoid() -> None:
    """`fixtures/activations/linear_activations` (recorded here, CPU, three steps): Linear
    then ELU, Mish, hardswish, leaky_relu and tanh-GELU. Only the GELU was found."""
    path = Path(__file__).parent.parent / "fixtures/activations/linear_activations.pt.trace.json.gz"
    found = _findings(traceq.load(path), "TQ102")
    by_act: dict[str, int] = {}
    for f in found:
        by_act[f.evidence["activation"]] = by_act.get(f.evidence["activation"], 0) + 1
    assert by_act == {"elu": 3, "mish": 3, "hardswish": 3, "leaky_relu": 3, "gelu": 3}
    assert all("_addmm_activation(" not in f.fix for f in found)


# -- gpt2_train_ce: a written-out GELU in training --------------------------------------


def test_tq102_finds_gpt2s_gelu_new_on_exact_flow_in_a_training_step() -> None:
    """`gpt2_train_ce` (fixtures/corpus): with the Execution Trace's data flow, GPT-2's
    `PowBackward0` reads the MLP GEMM's output (the saved x), and the written-out GELU's
    region grew into the backward and had two results: TQ102 found it only on inferred
    flow. And the backward of that GELU (nine pointwise ops whose edges shape matching
    guesses) is the same problem, not a TQ104 chain."""
    from traceq.relations.dataflow import dataflow

    trace = traceq.load(corpus_paths("gpt2_train_ce")[0])
    trace.__dict__["dataflow"] = dataflow(
        trace, trace.dataflow_ops, execution_trace=corpus_et("gpt2_train_ce")
    )
    found = _findings(trace, "TQ102", "TQ104")
    assert [(f.rule, f.evidence.get("written_out")) for f in found] == [("TQ102", True)]
