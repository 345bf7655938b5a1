"""TQ102 and TQ105 on kernels that no op launched, each on a documented edit of a real trace.

Trace: `tracelens/tests/traces/torch_compile_triton/trace.json.gz` (`../shared/traces`,
AMD-AGI/TraceLens, MIT): a `torch.compile`d LLaMA-style block on an MI300X. Every kernel
there has an op of its own (`aten::mm` for the hipBLASLt `Cijk_...` GEMMs, an op named
like each Inductor kernel): RMSNorm, q/k/v `mm`s, `attn_fwd`, o_proj, RMSNorm, gate/up
`mm`s, the fused SwiGLU, down, the residual add. On many GPU compiled traces the graph
shows as one region op and its kernels hang off launches with no op each; the edits below
make that trace so, and the findings must stay on the same kernels.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_TRACES, gpu_fixture

import traceq
from traceq.rules.config import Config
from traceq.rules.engine import run

COMPILED = SHARED_TRACES / "tracelens/tests/traces/torch_compile_triton/trace.json.gz"
GELU_KERNEL = "triton_poi_fused_addmm_gelu_3"


def _document() -> dict[str, Any]:
    if not COMPILED.is_file():
        pytest.skip("../shared/traces is not present")
    with gzip.open(COMPILED, "rt") as f:
        document = json.load(f)
    # the colleague's edit (test_rules_fusion_classes): the residual add after the down
    # projection's `mm` becomes the activation kernel Inductor emits for `gelu(linear(x))`
    for event in document["traceEvents"]:
        if event.get("name") == "triton_poi_fused__unsafe_view_add_3":
            event["name"] = GELU_KERNEL
    return document


def _load(document: dict[str, Any], tmp_path: Path, name: str) -> traceq.Trace:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(document))
    return traceq.load(path)


def _without_kernel_ops(document: dict[str, Any]) -> dict[str, Any]:
    """The edit: every `aten::` and `triton_` CPU op removed, so the kernels' launches sit
    directly under `Torch-Compiled Region: 0/0`, as in a compiled graph whose kernels
    have no per-kernel CPU op. Kernels, launches and their flows are untouched."""
    kept = [
        e
        for e in document["traceEvents"]
        if not (e.get("cat") == "cpu_op" and e["name"].startswith(("aten::", "triton_")))
    ]
    return {**document, "traceEvents": kept}


def _by_kernel_time(trace: traceq.Trace, codes: tuple[str, ...]) -> list[tuple[str, list[int]]]:
    """Each finding as its rule and its kernels' start times (event ids differ by edit)."""
    start = dict(trace.kernels.select("event", "ts_ns").iter_rows())
    found = run(trace, Config(select=list(codes))).findings
    return sorted((f.rule, [start[k] for k in f.kernels]) for f in found)


def test_compiled_kernels_without_ops_give_the_eager_findings(tmp_path: Path) -> None:
    """With ops, TQ102 pairs the down projection's GEMM with the GELU kernel and TQ105
    groups q/k/v and gate/up; with the ops removed none were found. Stream order inside
    the region, the kernel names (hipBLASLt `Cijk_` GEMMs, `attn_fwd`, Inductor's fused
    ops) and the grids find the same kernels."""
    codes = ("TQ102", "TQ105")
    with_ops = _by_kernel_time(_load(_document(), tmp_path, "ops"), codes)
    assert [rule for rule, _ in with_ops] == ["TQ102", "TQ105", "TQ105"]
    opless = _load(_without_kernel_ops(_document()), tmp_path, "opless")
    assert opless.dataflow_ops.height == 0
    assert _by_kernel_time(opless, codes) == with_ops
    for f in run(opless, Config(select=list(codes))).findings:
        assert "no shapes" in f.evidence["matched_on"]
        assert f.est_saving_us > 0


def test_opless_kernels_after_one_gemm_are_no_parallel_group(tmp_path: Path) -> None:
    """o_proj and down are single GEMMs (a norm kernel and an add follow them): no group."""
    opless = _load(_without_kernel_ops(_document()), tmp_path, "opless")
    found = run(opless, Config(select=["TQ105"])).findings
    assert sorted(len(f.kernels) for f in found) == [2, 3]


def test_opless_backward_kernels_are_no_split_and_no_group(tmp_path: Path) -> None:
    """The opless edit with the backward's names (`attn_fwd` as `flash_bwd_kernel`, the
    GELU kernel as `triton_poi_fused_gelu_backward_3`): a dgrad and a wgrad GEMM back to
    back before attention's backward are no merged projection, a GELU's gradient after a
    GEMM no split."""
    document = _without_kernel_ops(_document())
    renamed = {"attn_fwd": "flash_bwd_kernel", GELU_KERNEL: "triton_poi_fused_gelu_backward_3"}
    for event in document["traceEvents"]:
        if event.get("name") in renamed:
            event["name"] = renamed[event["name"]]
    found = run(_load(document, tmp_path, "backward"), Config(select=["TQ102", "TQ105"])).findings
    # gate and up before the fused SwiGLU stay one group
    assert [(f.rule, len(f.kernels)) for f in found] == [("TQ105", 2)]


def test_tq102_finds_an_anonymous_triton_activation_of_an_autograd_function(
    tmp_path: Path,
) -> None:
    """Megatron's bias-GELU (`GeLUFunction`) on a GPU runs an anonymous Triton kernel
    (`triton__0d1d2d3de`) after the fc1 GEMM, launched from the Function's own range. The
    edit: the residual-add op after the down projection's `mm` becomes a `GeLUFunction`
    range (same span, so it still encloses the launch) and its kernel
    `triton__0d1d2d3de`. Before, nothing was found: no op of the data flow ran it."""
    document = _document()
    for event in document["traceEvents"]:
        if event.get("name") == GELU_KERNEL:
            if event.get("cat") == "cpu_op":
                event["name"], event["args"] = "GeLUFunction", {}
            else:
                event["name"] = "triton__0d1d2d3de"
    trace = _load(document, tmp_path, "function")
    kernels = dict(trace.kernels.select("name", "event").iter_rows())
    down = trace.kernels.filter(trace.kernels["name"].str.starts_with("Cijk_"))["event"].max()
    found = run(trace, Config(select=["TQ102", "TQ104"])).findings
    assert [(f.rule, f.kernels, f.evidence["activation"]) for f in found] == [
        ("TQ102", [down, kernels["triton__0d1d2d3de"]], "gelu")
    ]
    assert found[0].ops == [trace.kernels.filter(trace.kernels["event"] == down)["op_event"].item()]


def test_an_anonymous_kernel_without_an_activation_function_is_no_split(tmp_path: Path) -> None:
    """The same kernel renamed `triton__0d1d2d3de` with no Function around it (launched
    from the compiled region): nothing says it is an activation."""
    document = _without_kernel_ops(_document())
    for event in document["traceEvents"]:
        if event.get("name") == GELU_KERNEL:
            event["name"] = "triton__0d1d2d3de"
    found = run(_load(document, tmp_path, "anonymous"), Config(select=["TQ102"])).findings
    assert found == []


# -- T5's written-out GELU gate, recorded without stacks -----------------------------------


def test_tq103_finds_t5s_gelu_new_geglu_recorded_without_stacks() -> None:
    """`fixtures/recording_modes/t5_nostack` (recorded here, CPU: the corpus's T5 v1.1,
    fp32, `with_stack=False`). With stacks TQ103 found its 4 GeGLUs; without, shape
    matching gave `x + 0.044715 * x**3` of two layers the previous layer's GLU product (of
    x's shape, made before the gate GEMM) as x, the written-out GELU lost its add, and TQ104
    reported 8 of the GeGLU's ops as a chain. Same findings in both modes now."""
    path = Path(__file__).parent.parent / "fixtures/recording_modes/t5_nostack.pt.trace.json.gz"
    found = run(traceq.load(path), Config(select=["TQ102", "TQ103", "TQ104"])).findings
    glus = [f for f in found if f.rule == "TQ103"]
    assert len(glus) == 4
    assert all(
        f.evidence["glu"] == "GeGLU" and len(f.evidence["activation_ops"]) == 8 for f in glus
    )
    # what stays TQ104 is T5's relative-position bucket arithmetic (div → log → div → mul)
    assert all(f.rule != "TQ102" for f in found)
    assert all("GELU" not in f.message for f in found if f.rule == "TQ104")


def test_tq105_groups_t5s_q_k_v_recorded_without_stacks() -> None:
    """The same recording: without module calls, data flow read T5's q, k and v `linear`s
    (three ops apart, one shape) as one op run over two values, and moved k's and v's
    input to the RMSNorm's inner `mul` (the reader of repeats): TQ105 grouped k and v and
    left q out in every self-attention. A Linear's weight is a second tensor, so two runs
    are two computations: q, k and v read the norm's output, one group of 3."""
    path = Path(__file__).parent.parent / "fixtures/recording_modes/t5_nostack.pt.trace.json.gz"
    found = run(traceq.load(path), Config(select=["TQ105"])).findings
    # the projections of attention are 64 wide (d_model), the GeGLU's gate and up 128
    attention = [f for f in found if set(f.evidence["n"]) == {64}]
    # 4 self-attentions (q, k, v) and 2 cross-attentions (k, v of the encoder output)
    assert sorted(len(f.ops) for f in attention) == [2, 2, 3, 3, 3, 3]


def test_a_product_with_a_value_made_in_the_block_stays_outside_a_written_out_activation() -> None:
    """HTA's CPU rank (`fixtures/gpu/hta-rank_non_gpu`, MIT): `sigmoid(a) * sigmoid(linear(h))`
    then `tanh`s. The other sigmoid, made after the GEMM's input, is a real outside input,
    not a stale shape guess: the GEMM's split is its sigmoid, not a 5-op written-out GELU."""
    found = run(traceq.load(gpu_fixture("hta-rank_non_gpu")), Config(select=["TQ102"])).findings
    assert not [f for f in found if f.evidence["written_out"] and len(f.ops) > 4]
    assert any(f.evidence["activation"] == "sigmoid" and "[1024, 9375]" in f.message for f in found)
