"""Data flow between ops (`traceq.relations.dataflow`): the edges each model's code implies.

The fixtures' `manifest.json` (written by `fixtures/record.py` from the model code) names
the producer -> consumer edges of each recorded model; the tests map those names to ops
independently (by op name and ancestors, walking `parent` in Python) and compare.

Real traces (skipped when ../shared/traces is absent):
- tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz and
  tracelens/tests/traces/torch_compile_triton/trace.json.gz: AMD-AGI/TraceLens, MIT.
- param/et_replay/tests/inputs/linear_kineto.json.gz: facebookresearch/param, MIT.
- hta/tests/data/df_index_resolver/df_index_resolver.json.gz:
  facebookresearch/HolisticTraceAnalysis, MIT.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest

import traceq
from traceq.relations.dataflow import dataflow, dataflow_ops

QWEN = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
TRITON = "tracelens/tests/traces/torch_compile_triton/trace.json.gz"
PARAM_LINEAR = "param/et_replay/tests/inputs/linear_kineto.json.gz"
DF_INDEX = "hta/tests/data/df_index_resolver/df_index_resolver.json.gz"
SURE = 0.5
"""Edges at or above this confidence are the ones the rules act on."""
EXACT = [
    "mlp_gelu-eager",
    "mlp_gelu-compiled",
    "geglu_mlp-eager",
    "geglu_mlp-compiled",
    "geglu_mlp-compiled_cold",
    "swiglu_mlp-eager",
    "swiglu_mlp-compiled",
    "matmul_add-eager",
    "matmul_add-compiled",
    "linear-eager",
    "linear-compiled",
    "pointwise_chain-eager",
    "pointwise_chain-compiled",
]


def _manifest(repo_root: Path) -> dict:
    path = repo_root / "fixtures" / "manifest.json"
    if not path.is_file():
        pytest.skip("fixtures/manifest.json not recorded yet")
    return json.loads(path.read_text())["traces"]


def _fixture(repo_root: Path, name: str) -> tuple[traceq.Trace, dict]:
    entry = _manifest(repo_root).get(f"{name}.pt.trace.json.gz")
    path = repo_root / "fixtures" / f"{name}.pt.trace.json.gz"
    if entry is None or not path.is_file():
        pytest.skip(f"fixture {name} not recorded")
    return traceq.load(path), entry["expected_dataflow"]


def _named_ops(trace: traceq.Trace, expected: dict, step: int) -> dict[str, frozenset[int]]:
    """Manifest op name -> the data-flow ops (outermost aten op or kernel) it denotes.

    An op matches a path (outer, ..., inner) when it is named `inner` and `outer ...`
    enclose it in time on its thread (ops and annotations such as `Optimizer.step#...`).
    Names sharing a path take the path's occurrences in program order (gate_proj the
    first linear, up_proj the second, ...); when there are fewer occurrences than names
    (one fused kernel is both `act` and `mul`), all share them. Ops run while compiling
    (inside Dynamo's `(dynamo_timed)` ranges) are not the model's.
    """
    window = trace.steps.filter(pl.col("step") == step).row(0, named=True)
    spans = [
        r
        for frame in (trace.ops, trace.annotations.filter(pl.col("kind") == "cpu"))
        for r in frame.filter(
            (pl.col("ts_ns") >= window["ts_ns"]) & (pl.col("end_ns") <= window["end_ns"])
        ).iter_rows(named=True)
    ]

    def enclosing(op: dict) -> list[dict]:
        """Spans holding `op`, innermost first (a tie in time: the later event is inner)."""
        outer = [
            s
            for s in spans
            if s["event"] != op["event"]
            and s["tid"] == op["tid"]
            and s["ts_ns"] <= op["ts_ns"]
            and op["end_ns"] <= s["end_ns"]
            and (s["ts_ns"], -s["end_ns"], s["event"]) < (op["ts_ns"], -op["end_ns"], op["event"])
        ]
        return sorted(outer, key=lambda s: (s["ts_ns"], -s["end_ns"], s["event"]), reverse=True)

    def compiling(op: dict) -> bool:
        return any(s["name"].endswith("(dynamo_timed)") for s in enclosing(op))

    def occurrences(path: list[str]) -> list[list[dict]]:
        groups: dict[int, list[dict]] = defaultdict(list)
        for op in spans:
            if op["name"] != path[-1] or compiling(op):
                continue
            wanted, anchor = list(reversed(path[:-1])), op
            for span in enclosing(op):
                if wanted and span["name"] == wanted[0]:
                    wanted.pop(0)
                    anchor = span
            if not wanted:
                groups[anchor["event"]].append(op)
        anchors = {e: min(o["ts_ns"] for o in ops) for e, ops in groups.items()}
        return [groups[e] for e in sorted(groups, key=lambda e: (anchors[e], e))]

    def semantic(op: dict) -> int:
        outermost = op["event"]
        for span in enclosing(op):
            name = span["name"]
            if name.startswith("aten::") or "cpp_fused" in name or name.startswith("triton_"):
                outermost = span["event"]
        return outermost

    by_path: dict[tuple, list[str]] = defaultdict(list)
    for name, path in expected["ops"].items():
        by_path[tuple(path)].append(name)
    named: dict[str, frozenset[int]] = {}
    for path, names in by_path.items():
        found = occurrences(list(path))
        assert found, f"{path} not in step {step}"
        for k, name in enumerate(names):
            mine = found[k] if len(found) == len(names) else [o for g in found for o in g]
            named[name] = frozenset(semantic(o) for o in mine)
    return named


def _sure_edges(edges: pl.DataFrame) -> set[tuple[int, int]]:
    sure = edges.filter((pl.col("confidence") >= SURE) & (pl.col("evidence") != "fwdbwd"))
    return set(sure.select("producer", "consumer").iter_rows())


@pytest.mark.parametrize("name", EXACT)
def test_fixture_edges_are_exactly_the_models(repo_root: Path, name: str) -> None:
    """Between the ops the model names, the sure edges are exactly the model's; an edge
    inside one fused kernel (`act` -> `mul` in `..._gelu_mul_0`) is no edge between ops."""
    trace, expected = _fixture(repo_root, name)
    edges = _sure_edges(dataflow(trace))
    for step in trace.steps["step"]:
        named = _named_ops(trace, expected, step)
        want = {(named[p], named[c]) for p, c in expected["edges"] if named[p] != named[c]}
        groups = set(named.values())
        found = {
            (p, c)
            for p in groups
            for c in groups
            if p != c and any((a, b) in edges for a in p for b in c)
        }
        assert found == want, f"step {step}"


def test_training_fixture_has_the_models_edges_through_views(repo_root: Path) -> None:
    """Backward ops read gradients through `t`/`detach`/`view`; the loss's backward reads
    the seed gradient `ones_like(loss)` (evidence `gradient-seed`), not the loss itself."""
    trace, expected = _fixture(repo_root, "mlp_gelu-train")
    ops = dataflow_ops(trace)
    edges = dataflow(trace, ops)
    passthrough = set(
        ops.filter(pl.col("kind").is_in(["view", "copy"]) | (pl.col("name") == "aten::ones_like"))[
            "event"
        ]
    )
    succ: dict[int, set[int]] = defaultdict(set)
    for p, c in (
        edges.filter(pl.col("confidence") >= SURE).select("producer", "consumer").iter_rows()
    ):
        succ[p].add(c)

    def reaches(sources: set[int], targets: set[int]) -> bool:
        frontier, seen = set(sources), set(sources)
        while frontier:
            nxt = {c for p in frontier for c in succ[p]} - seen
            if nxt & targets:
                return True
            frontier = {c for c in nxt if c in passthrough}
            seen |= nxt
        return False

    for step in trace.steps["step"]:
        named = _named_ops(trace, expected, step)
        for p, c in expected["edges"]:
            assert reaches(named[p], named[c]), f"step {step}: {p} -> {c}"


def test_qwen_swiglu_mul_reads_silu_and_up_gemm(load_shared) -> None:
    """HF Qwen2MLP: down(silu(gate(x)) * up(x)); the up GEMM runs between silu and mul."""
    trace = load_shared(QWEN)
    ops = dataflow_ops(trace)
    edges = dataflow(trace, ops)
    mlp = ops.filter(
        pl.col("module").str.contains(r"Qwen2MLP_\d+$") & (pl.col("name") == "aten::mul")
    )
    assert mlp.height == 24  # one per decoder layer
    by_event = {r["event"]: r for r in ops.iter_rows(named=True)}
    for mul in mlp["event"]:
        into = edges.filter((pl.col("consumer") == mul) & (pl.col("confidence") >= SURE))
        producers = dict(zip(into["input_index"], into["producer"], strict=True))
        silu, up = by_event[producers[0]], by_event[producers[1]]
        assert silu["name"] == "aten::silu"
        assert up["name"] == "aten::linear"
        assert silu["ts_ns"] < up["ts_ns"] < by_event[mul]["ts_ns"]  # a GEMM between them
        gate = edges.filter(pl.col("consumer") == silu["event"])["producer"].to_list()
        assert [by_event[g]["name"] for g in gate] == ["aten::linear"]
        down = edges.filter(pl.col("producer") == mul)["consumer"].to_list()
        assert [by_event[d]["name"] for d in down] == ["aten::linear"]


def test_inductor_kernel_after_gemm_reads_its_output(repo_root: Path, load_shared) -> None:
    trace, _ = _fixture(repo_root, "mlp_gelu-compiled")
    ops = dataflow_ops(trace)
    edges = dataflow(trace, ops).filter(pl.col("consumer_name") == "graph_0_cpp_fused_gelu_0")
    kernels = ops.filter(pl.col("name") == "graph_0_cpp_fused_gelu_0")
    assert set(edges["consumer"]) == set(kernels["event"])
    assert set(edges["producer_name"]) == {"aten::addmm"}

    triton = load_shared(TRITON)
    edges = dataflow(triton)
    glu = edges.filter(pl.col("consumer_name") == "triton_poi_fused__unsafe_view_mul_silu_2")
    assert glu["producer_name"].to_list() == ["aten::mm", "aten::mm"]  # gate and up GEMMs
    assert glu["confidence"].min() >= SURE


def test_parallel_projections_read_one_input(load_shared) -> None:
    """q/k/v projections in the compiled Llama-style block all read the norm kernel."""
    edges = dataflow(load_shared(TRITON))
    norm = "triton_red_fused_add_mean_mul_pow_rsqrt_0"
    qkv = edges.filter((pl.col("producer_name") == norm) & (pl.col("consumer_name") == "aten::mm"))
    assert qkv.height == 3
    assert qkv["confidence"].min() >= SURE


def test_gpu_time_of_each_op_is_its_kernels(load_shared) -> None:
    """`gpu_ns` against `Trace.kernels_of` (which walks op descendants by itself)."""
    trace = load_shared(QWEN)
    ops = dataflow_ops(trace)
    sample = ops.filter(pl.col("n_kernels") > 0).head(40)
    for row in sample.iter_rows(named=True):
        kernels = trace.kernels_of(row["event"])
        assert row["gpu_ns"] == kernels["dur_ns"].sum()
        assert row["kernel_events"] == kernels["event"].cast(pl.Int64).to_list()
    launched = trace.kernels.filter(pl.col("op_event").is_not_null())
    assert ops["gpu_ns"].sum() == launched["dur_ns"].sum()


def test_without_shapes_relu_reads_the_linear_before_it(load_shared) -> None:
    """param's linear_kineto has no `Input Dims`: edges fall back to sibling order."""
    trace = load_shared(PARAM_LINEAR)
    edges = dataflow(trace)
    relu = edges.filter(pl.col("consumer_name") == "aten::relu")
    assert relu.height == trace.ops.filter(pl.col("name") == "aten::relu").height
    assert set(relu["producer_name"]) == {"aten::linear"}
    assert set(relu["evidence"]) == {"order"}


@pytest.mark.slow
def test_dataflow_of_a_216k_event_trace_is_fast(load_shared) -> None:
    trace = load_shared(DF_INDEX)
    started = time.perf_counter()
    ops = dataflow_ops(trace)
    edges = dataflow(trace, ops)
    elapsed = time.perf_counter() - started
    assert ops.height > 10_000 and edges.height > 10_000
    assert elapsed < 3.0  # ~0.5 s here; generous for a shared CI machine


def _shape_cases() -> dict:
    """Op calls whose output shape `opshapes` derives, each recorded by torch.profiler."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    x3, w, b = r(4, 16, 64), r(128, 64), r(128)
    img, kernel = r(2, 3, 17, 19), r(8, 3, 3, 5)
    return {
        "linear": lambda: F.linear(x3, w, b),
        "linear_nobias": lambda: F.linear(x3, w),
        "addmm": lambda: torch.addmm(b, r(32, 64), r(64, 128)),
        "mm": lambda: torch.mm(r(32, 64), r(64, 16)),
        "bmm": lambda: torch.bmm(r(8, 32, 64), r(8, 64, 16)),
        "baddbmm": lambda: torch.baddbmm(r(8, 32, 16), r(8, 32, 64), r(8, 64, 16)),
        "matmul_broadcast": lambda: torch.matmul(r(2, 1, 32, 64), r(3, 64, 16)),
        "matmul_vec_mat": lambda: torch.matmul(r(64), r(64, 16)),
        "matmul_mat_vec": lambda: torch.matmul(r(4, 32, 64), r(64)),
        "add_broadcast": lambda: torch.add(r(32, 1, 64), r(8, 64)),
        "mul_scalar": lambda: torch.mul(r(5, 7), 3.0),
        "where": lambda: torch.where(r(5, 1) > 0, r(1, 7), r(5, 7)),
        "gelu": lambda: F.gelu(r(6, 10), approximate="tanh"),
        "softmax": lambda: torch.softmax(r(6, 10), dim=-1),
        "layer_norm": lambda: F.layer_norm(r(4, 6, 10), (10,)),
        "view": lambda: r(16, 12, 64).view(16, 12, -1, 8),
        "reshape": lambda: r(16, 12, 64).reshape(-1, 64),
        "transpose": lambda: r(2, 3, 5, 7).transpose(1, -1),
        "permute": lambda: r(2, 3, 5, 7).permute(0, 2, 3, 1),
        "t": lambda: r(3, 9).t(),
        "unsqueeze": lambda: r(3, 9).unsqueeze(-1),
        "squeeze": lambda: r(3, 1, 9).squeeze(1),
        "slice": lambda: r(3, 10)[:, 1::3],
        "select": lambda: r(3, 10, 4).select(1, 2),
        "narrow": lambda: r(3, 10).narrow(1, 2, 5),
        "expand": lambda: r(1, 5, 1).expand(4, -1, 6),
        "flatten": lambda: r(2, 3, 5, 7).flatten(1, 2),
        "cat": lambda: torch.cat([r(2, 3, 5), r(2, 4, 5)], dim=1),
        "stack": lambda: torch.stack([r(2, 3), r(2, 3)], dim=-1),
        "mean_keepdim": lambda: r(4, 6, 10).mean(-1, keepdim=True),
        "sum_dims": lambda: r(4, 6, 10).sum((0, 2)),
        "amax": lambda: r(4, 6, 10).amax(1),
        "conv2d": lambda: F.conv2d(img, kernel, stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
        "max_pool2d": lambda: F.max_pool2d(img, 3, stride=2, padding=1, ceil_mode=True),
        "adaptive_avg_pool2d": lambda: F.adaptive_avg_pool2d(img, (4, 5)),
        "embedding": lambda: F.embedding(torch.tensor([[1, 2, 3], [4, 5, 6]]), r(10, 8)),
        "sdpa": lambda: F.scaled_dot_product_attention(r(2, 4, 9, 8), r(2, 4, 7, 8), r(2, 4, 7, 6)),
        "index_select": lambda: torch.index_select(r(5, 7), 1, torch.tensor([0, 3, 3, 6])),
        "gather": lambda: torch.gather(r(5, 7), 1, torch.tensor([[0, 3]] * 4)),
        "to": lambda: r(3, 4).to(torch.float64),
        "mse_loss": lambda: F.mse_loss(r(3, 4), r(3, 4)),
        "topk": lambda: torch.topk(r(5, 7), 3)[1],
        "topk_dim": lambda: torch.topk(r(5, 7), 2, dim=0)[0],
        "sort": lambda: torch.sort(r(5, 7), dim=0)[1],
        "histc": lambda: torch.histc(r(40), bins=6, min=-1, max=1),
        "grouped_mm": lambda: torch._grouped_mm(
            r(6, 8), r(2, 4, 8).transpose(-1, -2), torch.tensor([2, 6], dtype=torch.int32)
        ),
        "index": lambda: r(5, 7)[torch.tensor([0, 3, 3, 1])],
        "index_2d": lambda: r(5, 7)[torch.tensor([[0, 1], [2, 4]])],
        "index_pair": lambda: r(5, 7)[torch.tensor([0, 3]), torch.tensor([6, 1])],
        "upsample_scale": lambda: F.interpolate(r(2, 3, 5, 7), scale_factor=2.0),
        "upsample_size": lambda: F.interpolate(r(2, 3, 5, 7), size=(4, 9)),
        "upsample_bilinear": lambda: F.interpolate(
            r(2, 3, 5, 7), scale_factor=(1.5, 2.0), mode="bilinear"
        ),
    }


def test_derived_output_shapes_match_torch(tmp_path: Path) -> None:
    """Record each op with torch.profiler (record_shapes), read the trace back with traceq,
    and compare the derived output shape with the shape torch returned."""
    pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    cases = _shape_cases()
    returned = {}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for name, call in cases.items():
            with record_function(f"case:{name}"):
                returned[name] = list(call().shape)
    path = tmp_path / "shapes.json"
    prof.export_chrome_trace(str(path))
    trace = traceq.load(path)
    ops = dataflow_ops(trace)
    windows = trace.annotations.filter(pl.col("name").str.starts_with("case:"))
    derived = {}
    for name, start, end in windows.select("name", "ts_ns", "end_ns").iter_rows():
        inside = ops.filter(
            (pl.col("ts_ns") >= start)
            & (pl.col("ts_ns") + pl.col("dur_ns") <= end)
            & ~pl.col("name").is_in(["aten::randn", "aten::lift_fresh", "aten::gt", "aten::empty"])
        ).sort("ts_ns")
        derived[name.removeprefix("case:")] = inside["output_shape"].to_list()[-1]
    assert set(derived) == set(cases)
    assert derived == returned


def test_a_dict_among_input_dims_gives_an_unknown_output_not_a_key_error() -> None:
    """Hypothesis found `Input Dims: [[], {}]` on an `aten::mm`: `b[-1]` on a dict raised
    KeyError out of `analyze`; a shape that is not a list of ints is an unknown output."""
    from traceq.relations.dataflow import shapes

    sig = shapes.signature("aten::mm", "[[], {}]", ["float", "float"], ["", ""])
    assert sig.output is None
