"""TQ105 never groups GEMMs across a custom op whose result the trace does not give.

Serving engines run their norms and attention as custom ops (`sglang_profiler::` ranges,
vLLM's `unified_attention_with_output`, `rocm_aiter_rmsnorm2d_fwd_with_add`) that write
in place and record no output shape. With their GEMM wrappers read through to the
`aten::linear` inside, the qkv, o_proj and gate_up projections of a layer all read a
`[32, 4096]` tensor that shape matching tied to one earlier producer (SGLang: 36 groups
"N = 6144 + 4096 + 24576") or to no producer at all (vLLM: 24 layers' o_proj as one
"graph input"). Each reads what a different custom op wrote: no group is right. The
traces are TraceLens's (MIT), bundled in `fixtures/serving/`.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import FIXTURES

import traceq

SERVING = FIXTURES / "serving"
SGLANG_CAPTURE = SERVING / "sglang_decode/capture_traces/bs_32_rank0.json.gz"
VLLM_CAPTURE = next((SERVING / "vllm_decode_full/capture_traces").glob("*.pt.trace.json.gz"))
# each trace, and the capture trace whose ops it runs (a replay's ops come from its capture)
TRACES = [
    (SERVING / "sglang_decode/sglang_Qwen3-8B_decode.json.gz", SGLANG_CAPTURE),
    (SGLANG_CAPTURE, SGLANG_CAPTURE),
    (SERVING / "vllm_decode_full/graph_execution.json.gz", VLLM_CAPTURE),
    (VLLM_CAPTURE, VLLM_CAPTURE),
]


def custom_ops_between_linears(path: Path) -> int:
    """From the raw JSON: custom (non-aten) CPU ops that run between two `aten::linear`s
    with the same input shape on one thread: the places a group would have to bridge."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    ops = sorted(
        (e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"),
        key=lambda e: (e["tid"], float(e["ts"])),
    )
    count, seen_linear = 0, set()
    for e in ops:
        name = str(e.get("name"))
        if name == "aten::linear":
            seen_linear.add(e["tid"])
        elif "::" in name and not name.startswith("aten::") and e["tid"] in seen_linear:
            count += 1
    return count


@pytest.mark.parametrize(("path", "capture"), TRACES, ids=[pair[0].name for pair in TRACES])
def test_no_gemm_group_bridges_a_custom_op_of_unknown_result(path: Path, capture: Path) -> None:
    assert custom_ops_between_linears(capture) > 0  # the ops hold such custom ops
    assert list(traceq.analyze(traceq.load(path), select=["TQ105"])) == []
