"""The fusion rules (TQ101–TQ105) on real GPU traces from public projects.

Traces (under `../shared/traces`, see its INDEX.md; tests skip when absent):
- `param/et_replay/tests/inputs/linear_kineto.json.gz` — facebookresearch/param, MIT:
  Linear+ReLU MLP training on an RTX 2080 Ti; CUDA ReLU runs as `launch_clamp_scalar`.
- `hta/tests/data/critical_path/alexnet/...` and `hta/tests/data/df_index_resolver/...` —
  facebookresearch/HolisticTraceAnalysis, MIT: AlexNet (conv+ReLU and Linear+ReLU) on an
  A100; a V100 DDP rank with Linear + ReLU / sigmoid / tanh.
- `tracelens/tests/traces/h100/*` — AMD-AGI/TraceLens, MIT: BERT-small, ViT and
  Qwen1.5-0.5B forward passes in bf16 on an H100 (eager: Linear→GELU, unfused SwiGLU).
- `tracelens/tests/traces/torch_compile_triton/trace.json.gz` — same: a torch.compile'd
  block on an MI300X with Inductor's fused SwiGLU (`triton_poi_fused__unsafe_view_mul_silu`).

Expected counts are computed here from the stdlib's decode of the raw JSON, with a method
that shares nothing with traceq's data flow: kernels in stream order, each attributed to
the outermost `aten::` op that launched it (runtime call → correlation → kernel), and a
GEMM→activation split counted where a GEMM op's last kernel is followed directly by an
activation op's first kernel. Savings are recomputed from raw kernel durations.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import read_json

import traceq
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.finding import Finding

pytestmark = pytest.mark.shared

LINEAR_KINETO = "param/et_replay/tests/inputs/linear_kineto.json.gz"
ALEXNET = "hta/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
DF_INDEX = "hta/tests/data/df_index_resolver/df_index_resolver.json.gz"
BERT = "tracelens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz"
VIT = "tracelens/tests/traces/h100/Falconsai_nsfw_image_detection__1016002.json.gz"
QWEN = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
COMPILED = "tracelens/tests/traces/torch_compile_triton/trace.json.gz"

GEMMS = {"aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "aten::bmm"}
ACTIVATIONS = {
    f"aten::{a}{s}" for a in ("relu", "gelu", "silu", "tanh", "sigmoid") for s in ("", "_")
}


@dataclass
class RawOp:
    event: int
    name: str
    tid: Any
    ts: Decimal
    end: Decimal
    module: str | None = None


class Raw:
    """A trace as the stdlib decodes it: outermost aten ops and the kernels they launched."""

    def __init__(self, path: Path) -> None:
        events = read_json(path, parse_float=Decimal)["traceEvents"]
        ops, launches, kernels = [], [], []
        for i, e in enumerate(events):
            cat = str(e.get("cat", "")).lower()
            if e.get("ph") != "X":
                continue
            if cat == "cpu_op":
                ts = Decimal(e["ts"])
                ops.append(RawOp(i, e["name"], (e["pid"], e["tid"]), ts, ts + Decimal(e["dur"])))
            elif cat in ("cuda_runtime", "cuda_driver") and "LaunchKernel" in e["name"]:
                launches.append(((e["pid"], e["tid"]), Decimal(e["ts"]), e["args"]["correlation"]))
            elif cat == "kernel":
                kernels.append(e | {"event": i})
        # outermost aten op per thread: aten ops not inside another aten op
        ops.sort(key=lambda o: (str(o.tid), o.ts, -o.end))
        self.roots: list[RawOp] = []
        open_until: dict[Any, Decimal] = {}
        for o in ops:
            if not o.name.startswith("aten::"):
                continue
            if o.tid in open_until and o.ts < open_until[o.tid]:
                continue
            open_until[o.tid] = o.end
            self.roots.append(o)
        by_thread: dict[Any, list[RawOp]] = defaultdict(list)
        for o in self.roots:
            by_thread[o.tid].append(o)
        starts = {tid: [r.ts for r in roots] for tid, roots in by_thread.items()}
        root_of_launch: dict[int, RawOp] = {}
        for tid, ts, correlation in launches:
            at = bisect.bisect_right(starts.get(tid, []), ts) - 1
            if at >= 0 and by_thread[tid][at].end >= ts:
                root_of_launch[correlation] = by_thread[tid][at]
        self.kernels = sorted(kernels, key=lambda k: (k["pid"], k["tid"], Decimal(k["ts"])))
        self.root_of = {
            k["event"]: root_of_launch.get(k["args"].get("correlation")) for k in self.kernels
        }
        self._gpu: dict[int, Decimal] = defaultdict(Decimal)
        for k in self.kernels:
            root = self.root_of[k["event"]]
            if root is not None:
                self._gpu[root.event] += Decimal(k["dur"])

    def gpu_us(self, root: RawOp) -> float:
        """GPU time of the kernels an outermost op launched."""
        return float(self._gpu[root.event])

    def kernel_adjacent(self, first: set[str], second: set[str]) -> set[tuple[int, int]]:
        """(op, op) pairs where a `first` op's kernel is directly followed on its stream by
        a kernel of a different, `second` op."""
        pairs = set()
        for a, b in itertools.pairwise(self.kernels):
            if (a["pid"], a["tid"]) != (b["pid"], b["tid"]):
                continue
            ra, rb = self.root_of[a["event"]], self.root_of[b["event"]]
            if ra and rb and ra is not rb and ra.name in first and rb.name in second:
                pairs.add((ra.event, rb.event))
        return pairs


@pytest.fixture(scope="module")
def raw(shared_trace: Callable[[str], Path]) -> Callable[[str], Raw]:
    cache: dict[str, Raw] = {}

    def decode(relpath: str) -> Raw:
        if relpath not in cache:
            cache[relpath] = Raw(shared_trace(relpath))
        return cache[relpath]

    return decode


def analyze(trace: traceq.Trace, *codes: str, **options: Any) -> list[Finding]:
    rules = {code: options for code in codes} if options else {}
    return run(trace, Config(select=codes, rules=rules)).findings


# -- TQ102: GEMM -> activation ------------------------------------------------------------


@pytest.mark.parametrize(
    ("relpath", "count"),
    [
        (LINEAR_KINETO, 840),  # 21 Linear+ReLU layers x 40 steps
        (ALEXNET, 4),  # the classifier's Linear+ReLU; conv+ReLU is not a GEMM
        (BERT, 5),  # 4 layers' intermediate GELU + the LM head transform
        (VIT, 13),  # 12 layers' GELU + the pooler's tanh
        pytest.param(DF_INDEX, 220, marks=pytest.mark.slow),  # relu 160, sigmoid 40, tanh 20
    ],
)
def test_tq102_finds_every_gemm_activation_split(
    load_shared: Callable[[str], traceq.Trace],
    raw: Callable[[str], Raw],
    relpath: str,
    count: int,
) -> None:
    trace = load_shared(relpath)
    found = analyze(trace, "TQ102")
    decoded = raw(relpath)
    expected = decoded.kernel_adjacent(GEMMS, ACTIVATIONS)
    assert len(expected) == count
    assert {(f.ops[0], f.ops[-1]) for f in found} == expected
    # saving = the activation kernels' measured GPU time, recomputed from raw durations
    roots = {r.event: r for r in decoded.roots}
    expected_us = sum(decoded.gpu_us(roots[act]) for _, act in expected)
    assert sum(f.est_saving_us for f in found) == pytest.approx(expected_us, rel=1e-9)


def test_tq102_sees_relu_through_launch_clamp_scalar(
    load_shared: Callable[[str], traceq.Trace],
) -> None:
    found = analyze(load_shared(LINEAR_KINETO), "TQ102")
    kernel_names = Counter(n for f in found for n in f.evidence["kernel_names"][-1:])
    assert len(kernel_names) == 1
    (name,) = kernel_names
    assert "clamp_scalar" in name and "relu" not in name.lower()
    assert {f.evidence["activation"] for f in found} == {"relu"}


@pytest.mark.parametrize("relpath", [QWEN, COMPILED])
def test_tq102_is_silent_on_glu_gates_and_fused_kernels(
    load_shared: Callable[[str], traceq.Trace], relpath: str
) -> None:
    assert analyze(load_shared(relpath), "TQ102") == []


# -- TQ103: unfused GLU -------------------------------------------------------------------


def test_tq103_finds_qwen_swiglu_across_the_interleaved_up_projection(
    load_shared: Callable[[str], traceq.Trace], raw: Callable[[str], Raw]
) -> None:
    trace = load_shared(QWEN)
    decoded = raw(QWEN)
    found = analyze(trace, "TQ103")
    silus = [r for r in decoded.roots if r.name == "aten::silu"]
    assert len(silus) == 24  # one per decoder layer
    assert sorted(f.evidence["activation_ops"][0] for f in found) == [r.event for r in silus]
    roots = {r.event: r for r in decoded.roots}
    for f in found:
        gate, up, mul = f.evidence["gate"], f.evidence["up"], f.evidence["mul"]
        # the up projection runs between the silu and the mul: not adjacency
        assert roots[gate].ts < roots[f.evidence["activation_ops"][0]].ts < roots[up].ts
        assert roots[up].ts < roots[mul].ts
        assert f.module is not None and f.module.split(".")[-1].startswith("Qwen2MLP_")
        removed = decoded.gpu_us(roots[f.evidence["activation_ops"][0]]) + decoded.gpu_us(
            roots[mul]
        )
        assert f.est_saving_us == pytest.approx(removed * (1 - 3 / 5))
        assert f.dtype == "c10::BFloat16"


@pytest.mark.parametrize("relpath", [COMPILED, BERT, VIT, LINEAR_KINETO])
def test_tq103_never_fires_on_fused_or_absent_glus(
    load_shared: Callable[[str], traceq.Trace], relpath: str
) -> None:
    assert analyze(load_shared(relpath), "TQ103") == []


def test_the_compiled_trace_holds_the_fused_swiglu_kernel(
    load_shared: Callable[[str], traceq.Trace],
) -> None:
    # the negative above means something only if the fused kernel is there
    names = load_shared(COMPILED).kernels["name"].to_list()
    assert any("mul_silu" in n for n in names)


# -- TQ105: parallel GEMMs ----------------------------------------------------------------


def modules_named(trace: traceq.Trace, pattern: str) -> set[str]:
    """Distinct `nn.Module` instances whose class name matches `pattern` (a regex)."""
    names = trace.python.filter(trace.python["name"].str.contains(f"^nn.Module: {pattern}"))
    return set(names["name"].to_list())


@pytest.mark.parametrize(
    ("relpath", "attention"), [(BERT, r"Bert\w*SelfAttention_"), (VIT, r"ViT\w*SelfAttention_")]
)
def test_tq105_finds_qkv_projections_of_each_layer(
    load_shared: Callable[[str], traceq.Trace], relpath: str, attention: str
) -> None:
    trace = load_shared(relpath)
    found = analyze(trace, "TQ105")
    layers = modules_named(trace, attention)
    assert len(found) == len(layers) > 0
    for f in found:
        assert len(f.ops) == 3
        assert re.match(attention, f.module.split(".")[-1])
        assert f.evidence["n"] == [f.evidence["k"]] * 3


def test_tq105_finds_qkv_and_gate_up_in_qwen(load_shared: Callable[[str], traceq.Trace]) -> None:
    trace = load_shared(QWEN)
    found = analyze(trace, "TQ105")
    kinds = Counter((len(f.ops), f.module.split(".")[-1].split("_")[0]) for f in found)
    assert kinds == {
        (3, "Qwen2Attention"): len(modules_named(trace, "Qwen2Attention_")),
        (2, "Qwen2MLP"): len(modules_named(trace, "Qwen2MLP_")),
    }


def test_tq105_groups_the_compiled_blocks_mm_ops(
    load_shared: Callable[[str], traceq.Trace],
) -> None:
    trace = load_shared(COMPILED)
    mm = trace.ops.filter(trace.ops["name"] == "aten::mm").sort("ts_ns")
    wide = mm.filter(mm["shapes"].list.get(1).list.get(1) == 8192)["event"].to_list()
    attention = trace.ops.filter(trace.ops["name"].str.contains("flash_attention"))
    before = mm.filter(mm["ts_ns"] < attention["ts_ns"].min())["event"].to_list()
    found = analyze(trace, "TQ105")
    assert sorted(sorted(f.ops) for f in found) == sorted([sorted(before), sorted(wide)])
    assert len(before) == 3 and len(wide) == 2


def test_tq105_is_silent_on_a_sequential_mlp(load_shared: Callable[[str], traceq.Trace]) -> None:
    assert analyze(load_shared(LINEAR_KINETO), "TQ105") == []


# -- TQ101 / TQ104 ------------------------------------------------------------------------


@pytest.mark.parametrize("relpath", [BERT, VIT, QWEN, COMPILED, LINEAR_KINETO])
def test_tq101_is_silent_where_linear_layers_carry_their_bias(
    load_shared: Callable[[str], traceq.Trace], relpath: str
) -> None:
    # BERT and ViT add GEMM outputs to full-shape residuals: not a bias
    assert analyze(load_shared(relpath), "TQ101") == []


def test_tq104_finds_qwen_rmsnorm_tails(load_shared: Callable[[str], traceq.Trace]) -> None:
    trace = load_shared(QWEN)
    found = analyze(trace, "TQ104")
    tails = [
        f
        for f in found
        if f.evidence["op_names"] == ["aten::mul", "aten::to", "aten::mul"]
        and f.module.split(".")[-1].startswith("Qwen2RMSNorm")
    ]
    # x * rsqrt(...) -> to(bf16) -> weight * : once per norm module
    assert len(tails) == len(modules_named(trace, "Qwen2RMSNorm")) == 49
    assert all(0 < f.est_saving_us < f.time_us for f in found)
    # the SwiGLU's silu and mul are TQ103's; no chain repeats them
    glu = {
        e
        for f in analyze(trace, "TQ103")
        for e in [*f.evidence["activation_ops"], f.evidence["mul"]]
    }
    assert len(glu) == 48
    assert not glu & {e for f in found for e in f.ops}


@pytest.mark.parametrize("relpath", [COMPILED, LINEAR_KINETO])
def test_tq104_is_silent_without_unfused_chains(
    load_shared: Callable[[str], traceq.Trace], relpath: str
) -> None:
    assert analyze(load_shared(relpath), "TQ104") == []
