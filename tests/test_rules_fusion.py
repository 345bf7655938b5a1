"""The fusion rules (TQ101–TQ105) and the op classification they share.

Two kinds of tests: small hand-built frames that pin down one behaviour of `op_classes`
(which op is a ReLU, how views are bypassed, what a written-out GELU is), and the
project's own CPU fixture traces (`fixtures/`, recorded from `fixtures/models.py`), where
each rule must fire exactly where the model code has its pattern and nowhere else. Counts
are checked against what the model code and the trace's raw ops say, savings against the
rule's documented model recomputed from the raw op durations.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import traceq
from traceq.perf.device import device_model
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.finding import Finding
from traceq.rules.op_classes import classify
from traceq.rules.op_groups import through_views, written_out_activations
from traceq.rules.tq102_split_gemm_activation import split_activations
from traceq.rules.tq103_unfused_glu import glu_patterns
from traceq.rules.tq104_pointwise_chain import components, pointwise_chains
from traceq.rules.tq105_parallel_gemms import parallel_gemms

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


# -- helpers ------------------------------------------------------------------------------

OPS_SCHEMA = {
    "event": pl.Int64,
    "name": pl.String,
    "shapes": pl.List(pl.List(pl.Int64)),
    "input_types": pl.List(pl.String),
    "concrete_inputs": pl.List(pl.String),
    "dtype": pl.String,
    "data_inputs": pl.List(pl.Struct({"index": pl.Int64, "shape": pl.List(pl.Int64)})),
    "output_shape": pl.List(pl.Int64),
    "module": pl.String,
    "n_kernels": pl.Int64,
    "ts_ns": pl.Int64,
    "step": pl.Int64,
    "pid": pl.Int64,
    "tid": pl.Int64,
}
EDGE_SCHEMA = {
    "producer": pl.Int64,
    "consumer": pl.Int64,
    "input_index": pl.Int64,
    "shape": pl.List(pl.Int64),
    "confidence": pl.Float64,
}


def op(
    event: int,
    name: str,
    shapes: list[list[int]],
    out: list[int] | None,
    concrete: list[str] | None = None,
    data: Sequence[int] | None = None,
) -> dict[str, Any]:
    """One semantic op row: float32 tensors for each non-empty shape (or those in `data`)."""
    types = ["float" if s else "Scalar" for s in shapes]
    indices = data if data is not None else [i for i, s in enumerate(shapes) if s]
    return {
        "event": event,
        "name": name,
        "shapes": shapes,
        "input_types": types,
        "concrete_inputs": concrete or [""] * len(shapes),
        "dtype": "float",
        "data_inputs": [{"index": i, "shape": shapes[i]} for i in indices],
        "output_shape": out,
        "module": None,
        "n_kernels": 0,
        "ts_ns": 1000 * event,  # program order follows event ids in these frames
        "step": 1,
        "pid": 1,
        "tid": 1,
    }


def ops_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return classify(pl.DataFrame(rows, schema=OPS_SCHEMA))


def edges_frame(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {"producer": p, "consumer": c, "input_index": i, "shape": None, "confidence": 0.9}
            for p, c, i in rows
        ],
        schema=EDGE_SCHEMA,
    )


def analyze(trace: traceq.Trace, code: str, **options: Any) -> list[Finding]:
    config = Config(select=(code,), rules={code: options} if options else {})
    return run(trace, config).findings


@pytest.fixture(scope="module")
def fixture() -> Any:
    cache: dict[str, traceq.Trace] = {}

    def load(name: str) -> traceq.Trace:
        path = FIXTURES / f"{name}.pt.trace.json.gz"
        if not path.is_file():
            pytest.skip(f"{path} is not recorded")
        if name not in cache:
            cache[name] = traceq.load(path)
        return cache[name]

    return load


def top_ops(trace: traceq.Trace) -> list[dict[str, Any]]:
    """Raw CPU ops not nested in another `aten::` op, in program order (no data flow)."""
    ops = trace.ops.sort("ts_ns")
    aten = ops.filter(pl.col("name").str.starts_with("aten::"))["event"].implode()
    parent_is_aten = pl.col("parent").is_in(aten).fill_null(False)
    nested = ops.filter(parent_is_aten)["event"].implode()
    keep = ops.filter(pl.col("name").str.starts_with("aten::") & ~pl.col("event").is_in(nested))
    return keep.select("event", "name", "tid", "dur_ns", "shapes", "step").to_dicts()


# -- op classification -------------------------------------------------------------------


def test_relu_is_recognised_by_op_and_scalar_arguments_not_by_name_alone() -> None:
    frame = ops_frame(
        [
            op(1, "aten::relu", [[4, 8]], [4, 8]),
            op(2, "aten::clamp", [[4, 8], [], []], [4, 8], ["", "0", ""]),
            op(3, "aten::clamp", [[4, 8], [], []], [4, 8], ["", "-1", ""]),
            op(4, "aten::clamp", [[4, 8], [], []], [4, 8], ["", "0", "6"]),
            op(5, "aten::clamp_min", [[4, 8], []], [4, 8], ["", "0."]),
            op(6, "aten::threshold", [[4, 8], [], []], [4, 8], ["", "0.", "0."]),
            op(7, "aten::threshold", [[4, 8], [], []], [4, 8], ["", "0.", "-1"]),
            op(8, "aten::relu_", [[4, 8]], [4, 8]),
        ]
    )
    assert frame["activation"].to_list() == [
        "relu",
        "relu",
        None,
        None,
        "relu",
        "relu",
        None,
        "relu",
    ]
    assert frame.filter(pl.col("activation").is_null())["role"].unique().to_list() == [
        "elementwise"
    ]


def test_compiled_and_library_kernels_are_classified_by_what_they_fused() -> None:
    names = {
        10: "triton_poi_fused__unsafe_view_mul_silu_2",  # Inductor SwiGLU: fused GLU
        11: "graph_0_cpp_fused_gelu_mul_0",  # Inductor C++ GeGLU: fused GLU
        12: "graph_0_cpp_fused_gelu_0",  # activation alone, compiled
        13: "triton_red_fused_add_mean_mul_pow_rsqrt_0",  # RMSNorm: fused, no activation
        14: "triton_tem_fused_addmm_relu_0",  # Triton GEMM template with a ReLU epilogue
        15: "_vllm_C::silu_and_mul",
        16: "zoo::glu",
    }
    frame = ops_frame([op(e, n, [[4, 8]], [4, 8]) for e, n in names.items()])
    got = {
        r["event"]: (r["role"], r["glu_fused"], r["generated"], r["activation"])
        for r in frame.iter_rows(named=True)
    }
    assert got[10] == ("fused", True, True, "silu")
    assert got[11] == ("fused", True, True, "gelu")
    assert got[12] == ("activation", False, True, "gelu")
    assert got[13] == ("fused", False, True, None)
    assert got[14][0] == "gemm"
    assert frame.filter(pl.col("event") == 14)["epilogue_act"].item() is True
    assert got[15][:2] == ("fused", True)
    assert got[16][:2] == ("fused", True)


def test_gemm_operands_give_k_and_n_for_each_weight_layout() -> None:
    frame = ops_frame(
        [
            op(1, "aten::linear", [[4, 16, 64], [128, 64], []], [4, 16, 128], data=[0]),
            op(2, "aten::addmm", [[128], [32, 64], [64, 128], [], []], [32, 128]),
            op(3, "aten::mm", [[32, 64], [64, 128]], [32, 128]),
            op(4, "aten::bmm", [[8, 32, 64], [8, 64, 16]], [8, 32, 16]),
            op(5, "aten::linear", [[4, 64], [128, 64], [128]], [4, 128], data=[0]),
        ]
    )
    rows = frame.select("event", "k", "n", "x_shape", "has_bias").rows()
    assert rows == [
        (1, 64, 128, [4, 16, 64], False),
        (2, 64, 128, [32, 64], True),
        (3, 64, 128, [32, 64], False),
        (4, 64, 16, [8, 32, 64], False),
        (5, 64, 128, [4, 64], True),
    ]


def test_wrapped_python_scalars_are_not_tensor_inputs_or_traffic() -> None:
    # `x * 2` records the 2 as a 0-d "long int" tensor; it is passed by value
    frame = ops_frame([op(1, "aten::mul", [[32, 128], []], [32, 128], data=[0, 1])])
    assert frame["tensor_inputs"].item() == 1
    assert frame["traffic_bytes"].item() == 2 * 32 * 128 * 4


def test_views_are_bypassed_and_remembered() -> None:
    frame = ops_frame(
        [
            op(1, "aten::mm", [[64, 32], [32, 16]], [64, 16]),
            op(2, "aten::view", [[64, 16], []], [4, 16, 16], data=[0]),
            op(3, "aten::add", [[4, 16, 16], [16]], [4, 16, 16]),
        ]
    )
    edges = through_views(frame, edges_frame([(1, 2, 0), (2, 3, 0)]))
    assert edges.select("producer", "consumer", "input_index", "via").rows() == [(1, 3, 0, [2])]


def gelu_new_ops(x: int = 1) -> tuple[list[dict[str, Any]], list[tuple[int, int, int]]]:
    """GPT-2's gelu_new on the output of GEMM `x`: 8 pointwise ops, events 11..18."""
    s = [32, 128]
    rows = [
        op(x, "aten::mm", [[32, 64], [64, 128]], s),
        op(11, "aten::mul", [s, []], s, data=[0]),  # 0.5 * x
        op(12, "aten::pow", [s, []], s, data=[0]),  # x ** 3
        op(13, "aten::mul", [s, []], s, data=[0]),  # 0.044715 * x**3
        op(14, "aten::add", [s, s, []], s, data=[0, 1]),  # x + ...
        op(15, "aten::mul", [s, []], s, data=[0]),  # sqrt(2/pi) * (...)
        op(16, "aten::tanh", [s], s),
        op(17, "aten::add", [s, []], s, data=[0]),  # 1 + tanh(...)
        op(18, "aten::mul", [s, s], s),  # 0.5x * (1 + tanh(...))
    ]
    links = [
        (x, 11, 0),
        (x, 12, 0),
        (12, 13, 0),
        (x, 14, 0),
        (13, 14, 1),
        (14, 15, 0),
        (15, 16, 0),
        (16, 17, 0),
        (11, 18, 0),
        (17, 18, 1),
    ]
    return rows, links


def test_written_out_gelu_is_one_activation_of_its_gemm() -> None:
    rows, links = gelu_new_ops()
    frame = ops_frame(rows)
    found = written_out_activations(frame, through_views(frame, edges_frame(links)))
    assert found.rows() == [(1, list(range(11, 19)), 18, "gelu")]


def test_pointwise_ops_that_read_another_tensor_are_not_an_activation() -> None:
    rows, links = gelu_new_ops()
    s = [32, 128]
    # `x + y` with y from elsewhere (a residual): the tanh no longer depends on x alone
    rows.append(op(20, "aten::mm", [[32, 64], [64, 128]], s))
    links = [link for link in links if link != (13, 14, 1)] + [(20, 14, 1)]
    frame = ops_frame(rows)
    found = written_out_activations(frame, through_views(frame, edges_frame(links)))
    assert found.height == 0


def test_components_join_every_connected_op() -> None:
    links = pl.DataFrame({"producer": [1, 2, 10, 5], "consumer": [2, 3, 11, 3]})
    nodes = pl.concat([links["producer"], links["consumer"]])
    chains = components(nodes, links).sort("event")
    assert chains.rows() == [(1, 1), (2, 1), (3, 1), (5, 1), (10, 10), (11, 10)]


def test_a_chain_is_cut_where_it_waits_on_a_later_op_from_outside() -> None:
    s = [32, 128]
    frame = ops_frame(
        [
            op(1, "aten::mul", [s, []], s, data=[0]),
            op(2, "aten::mul", [s, []], s, data=[0]),
            op(3, "aten::mm", [[32, 64], [64, 128]], s),  # runs after 2: may depend on it
            op(4, "aten::add", [s, s], s),
            op(5, "aten::neg", [s], s),
            op(6, "aten::exp", [s], s),
        ]
    )
    edges = through_views(
        frame, edges_frame([(1, 2, 0), (2, 4, 0), (3, 4, 1), (4, 5, 0), (5, 6, 0)])
    )
    chains = pointwise_chains(frame, edges, pl.Series([], dtype=pl.Int64), min_ops=3)
    assert chains["ops"].to_list() == [[4, 5, 6]]
    # add 3 passes + neg 2 + exp 2; fused: the add's two inputs in, the exp's result out
    nbytes = 32 * 128 * 4
    assert chains.select("unfused_bytes", "fused_bytes").row(0) == (7 * nbytes, 3 * nbytes)


def _chains(frame: pl.DataFrame, links: list[tuple[int, int, int]]) -> list[list[int]]:
    edges = through_views(frame, edges_frame(links))
    return pointwise_chains(frame, edges, pl.Series([], dtype=pl.Int64), min_ops=3)["ops"].to_list()


def test_a_residual_read_back_through_a_chain_op_that_waits_on_it_is_cut() -> None:
    """`x + gate * mlp(x)`: the add (4) reads x (1) and the mul (3), and the mul reads the
    GEMM (2) computed from x. The GEMM is the mul's input, not the add's, so only a walk
    along the edges shows that no kernel can hold both x and the add."""
    s = [32, 64]
    frame = ops_frame(
        [
            op(0, "aten::neg", [s], s),
            op(1, "aten::exp", [s], s),
            op(2, "aten::mm", [s, [64, 64]], s),
            op(3, "aten::mul", [s, s], s),
            op(4, "aten::add", [s, s], s),
        ]
    )
    links = [(0, 1, 0), (1, 2, 0), (2, 3, 0), (3, 4, 1), (1, 4, 0)]
    assert _chains(frame, links) == []
    # the mul's input independent of x (a projection of another value): one chain
    independent = [(0, 1, 0), (2, 3, 0), (3, 4, 1), (1, 4, 0)]
    assert _chains(frame, independent) == [[0, 1, 3, 4]]


def test_a_zero_dim_tensor_written_between_two_links_cuts_them() -> None:
    """`(x - b) / a` with `a = alpha ** 0.5` a 0-d tensor computed after the subtraction:
    data flow matches no 0-d value, so the `pow` in between is the read it cannot see."""
    s = [2, 4, 8]
    frame = ops_frame(
        [
            op(1, "aten::neg", [s], s),
            op(2, "aten::sub", [s, [], []], s, data=[0]),
            op(3, "aten::pow", [[], []], [], data=[]),
            op(4, "aten::div", [s, []], s, data=[0]) | {"input_types": ["float", "float"]},
            op(5, "aten::exp", [s], s),
        ]
    )
    assert _chains(frame, [(1, 2, 0), (2, 4, 0), (4, 5, 0)]) == []  # two pairs
    scalar = frame.with_columns(
        pl.when(pl.col("event") == 4)
        .then(pl.lit(["float", "Scalar"]))
        .otherwise(pl.col("input_types"))
        .alias("input_types")
    )
    assert _chains(scalar, [(1, 2, 0), (2, 4, 0), (4, 5, 0)]) == [[1, 2, 4, 5]]


def test_no_chain_spans_a_forward_call() -> None:
    """A scheduler step's result (2) read by the next step (3) with the model's call (10)
    run in between: no kernel spans a model call."""
    s = [2, 4, 8]
    rows = [
        op(1, "aten::neg", [s], s),
        op(2, "aten::exp", [s], s),
        op(10, "aten::relu", [s], s),
        op(11, "aten::relu", [s], s),
        op(12, "aten::mul", [s, s], s),
        op(13, "aten::neg", [s], s),
    ]
    frame = ops_frame(rows).with_columns(
        pl.when(pl.col("event").is_in([10, 11])).then(10).alias("call")
    )
    links = [(1, 2, 0), (2, 12, 0), (12, 13, 0)]
    assert _chains(frame, links) == []
    assert _chains(frame.drop("call"), links) == [[1, 2, 12, 13]]


def test_a_compiled_activation_kernel_after_an_extern_gemm_is_opt_in() -> None:
    s = [32, 128]
    frame = ops_frame(
        [
            op(1, "aten::mm", [[32, 64], [64, 128]], s),
            op(2, "triton_poi_fused_addmm_gelu_0", [s, [128]], s),  # bias + GELU, fused
            op(3, "aten::mm", [s, [128, 64]], [32, 64]),
        ]
    )
    edges = through_views(frame, edges_frame([(1, 2, 0), (2, 3, 0)]))
    glus = glu_patterns(frame, edges)
    assert split_activations(frame, edges, glus).height == 0
    found = split_activations(frame, edges, glus, include_compiled=True)
    assert found.select("gemm", "act_output", "activation", "consumer_gemm").rows() == [
        (1, 2, "gelu", 3)
    ]


def test_gemms_on_a_graph_input_group_only_when_close_in_program_order() -> None:
    def linear(event: int, module: str) -> dict[str, Any]:
        return op(event, "aten::linear", [[32, 64], [128, 64], []], [32, 128], data=[0]) | {
            "module": module
        }

    rows = [linear(1, "Mlp_0.Linear_0"), linear(2, "Mlp_0.Linear_1")]
    rows += [op(3 + i, "aten::neg", [[32, 128]], [32, 128]) for i in range(17)]
    rows += [linear(20, "Mlp_0.Linear_2"), linear(21, "Other_0.Linear_3")]
    frame = ops_frame(rows)
    groups = parallel_gemms(frame, through_views(frame, edges_frame([])))
    # 1 and 2 read x together; 20 is 17 ops later; 21 is in another module
    assert groups["gemms"].to_list() == [[1, 2]]
    wider = parallel_gemms(frame, through_views(frame, edges_frame([])), max_ops_between=17)
    assert wider["gemms"].to_list() == [[1, 2, 20]]


def test_gemms_of_one_producer_group_only_when_close_in_program_order() -> None:
    """Two projections of one value right after it, and a third GEMM of that value 17 ops
    later (another layer, another tower): the group holds the first two."""

    def linear(event: int) -> dict[str, Any]:
        return op(event, "aten::linear", [[32, 64], [128, 64], []], [32, 128], data=[0])

    rows = [op(1, "aten::neg", [[32, 64]], [32, 64]), linear(2), linear(3)]
    rows += [op(4 + i, "aten::neg", [[32, 128]], [32, 128]) for i in range(17)]
    rows += [linear(21)]
    frame = ops_frame(rows)
    edges = through_views(frame, edges_frame([(1, 2, 0), (1, 3, 0), (1, 21, 0)]))
    assert parallel_gemms(frame, edges)["gemms"].to_list() == [[2, 3]]
    wider = parallel_gemms(frame, edges, max_ops_between=17)
    assert wider["gemms"].to_list() == [[2, 3, 21]]


def test_gemms_matched_by_element_count_past_a_shapeless_kernel_have_no_producer() -> None:
    """A compiled graph: a shape-less Inductor kernel (2) runs between the producer (1) and
    two `mm`s matched to it by element count; the kernel may have written what they read.
    Matched by element count with nothing in between, they are one group."""
    rows = [
        op(1, "aten::neg", [[32, 64]], [32, 64]),
        op(2, "graph_0_cpp_fused_add_mean_mul_0", [], None),
        op(3, "aten::mm", [[32, 64], [64, 128]], [32, 128]),
        op(4, "aten::mm", [[32, 64], [64, 128]], [32, 128]),
    ]
    loose = edges_frame([(1, 3, 0), (1, 4, 0)]).with_columns(
        pl.lit("numel+same-module").alias("evidence")
    )
    frame = ops_frame(rows)
    assert parallel_gemms(frame, through_views(frame, loose)).height == 0
    without = ops_frame([rows[0], *rows[2:]])
    assert parallel_gemms(without, through_views(without, loose))["gemms"].to_list() == [[3, 4]]
    # the same edges matched on shapes: the kernel does not break them
    exact = edges_frame([(1, 3, 0), (1, 4, 0)])
    assert parallel_gemms(frame, through_views(frame, exact))["gemms"].to_list() == [[3, 4]]


# -- fixtures: where each rule must fire --------------------------------------------------


def test_tq101_fires_once_per_step_on_matmul_then_bias_add(fixture: Any) -> None:
    trace = fixture("matmul_add-eager")
    found = analyze(trace, "TQ101")
    raw = top_ops(trace)
    expected = [
        (a["event"], b["event"])
        for a, b in itertools.pairwise(raw)
        if a["name"] == "aten::matmul" and b["name"] == "aten::add" and b["shapes"][1] == [128]
    ]
    assert len(expected) == trace.steps.height == 3
    assert sorted(tuple(f.ops) for f in found) == sorted(expected)
    durations = {r["event"]: r["dur_ns"] for r in raw}
    for f in found:
        add_us = durations[f.ops[1]] / 1000
        moved = (32 * 128 + 128 + 32 * 128) * 4  # read out and bias, write out; fp32
        assert f.est_saving_us == pytest.approx(add_us * (1 - 128 * 4 / moved))
        assert f.time_us == pytest.approx(sum(durations[e] for e in f.ops) / 1000)
        assert f.zoo == ["gemm_bias_act"]
        assert f.module == "MatmulAdd_0"


@pytest.mark.parametrize(
    "name", ["matmul_add-compiled", "linear-eager", "linear-compiled", "mlp_gelu-eager"]
)
def test_tq101_is_silent_where_the_bias_is_in_the_gemm(fixture: Any, name: str) -> None:
    assert analyze(fixture(name), "TQ101") == []


@pytest.mark.parametrize("name", ["mlp_gelu-eager", "mlp_gelu-train"])
def test_tq102_fires_on_linear_then_gelu(fixture: Any, name: str) -> None:
    trace = fixture(name)
    found = analyze(trace, "TQ102")
    raw = top_ops(trace)
    expected = [
        (a["event"], b["event"])
        for a, b in itertools.pairwise(raw)
        if a["name"] == "aten::linear" and b["name"] == "aten::gelu" and a["tid"] == b["tid"]
    ]
    assert len(expected) == 3  # one per profiled step; backward has no forward GELU
    assert sorted(tuple(f.ops) for f in found) == sorted(expected)
    durations = {r["event"]: r["dur_ns"] for r in raw}
    device = device_model(trace)
    for f in found:
        # Fusing the GELU into the GEMM's epilogue removes its read and write of the GEMM's
        # output (rows x out-features x 4 bytes, each way, from the raw `Input Dims`) and
        # one dispatch; never more than the GELU's measured time (issue 30, class 9).
        (rows, _), (out_features, _) = f.shapes[0], f.shapes[1]
        removed = 2 * rows * out_features * 4
        cap = removed / (device.memory_bandwidth_gbs * 1e3) + device.launch_overhead_us
        assert f.est_saving_us == pytest.approx(min(durations[f.ops[1]] / 1000, cap))
        assert f.evidence["activation"] == "gelu"
        assert f.zoo == ["gemm_bias_act", "mlp"]  # fc1 -> gelu -> fc2


def test_tq102_reports_a_compiled_activation_kernel_after_an_extern_gemm(fixture: Any) -> None:
    """Issue 10, class 8: Inductor's extern `addmm` then `cpp_fused_gelu_0` is a split GEMM +
    activation, reported by default with the compiled-specific fix."""
    trace = fixture("mlp_gelu-compiled")
    found = analyze(trace, "TQ102")
    kernels = trace.ops.filter(pl.col("name").str.contains("cpp_fused_gelu"))
    assert kernels.height == 3
    assert sorted(f.ops[-1] for f in found) == sorted(kernels["event"].to_list())
    assert {f.evidence["op_names"][0] for f in found} == {"aten::addmm"}
    assert all(f.evidence["compiled"] for f in found)
    assert all("max-autotune" in f.fix and "gemm_bias_act" in f.fix for f in found)
    assert analyze(trace, "TQ102", include_compiled=False) == []


@pytest.mark.parametrize("name", ["geglu_mlp-eager", "swiglu_mlp-eager"])
def test_tq102_leaves_glu_gates_to_tq103(fixture: Any, name: str) -> None:
    assert analyze(fixture(name), "TQ102") == []


@pytest.mark.parametrize(
    ("name", "act"), [("geglu_mlp-eager", "gelu"), ("swiglu_mlp-eager", "silu")]
)
def test_tq103_fires_on_each_unfused_glu(fixture: Any, name: str, act: str) -> None:
    trace = fixture(name)
    found = analyze(trace, "TQ103")
    raw = top_ops(trace)
    by_step: dict[int, list[str]] = {}
    for r in raw:
        by_step.setdefault(r["step"], []).append(r["name"])
    # the model code: gate linear, act, up linear, mul, down linear — in every step
    assert all(
        names == ["aten::linear", f"aten::{act}", "aten::linear", "aten::mul", "aten::linear"]
        for names in by_step.values()
    )
    assert len(found) == len(by_step) == 3
    durations = {r["event"]: r["dur_ns"] for r in raw}
    names = {r["event"]: r["name"] for r in raw}
    for f in found:
        gate, act_op, up, mul = f.ops
        assert [names[e] for e in f.ops] == [
            "aten::linear",
            f"aten::{act}",
            "aten::linear",
            "aten::mul",
        ]
        assert (f.evidence["gate"], f.evidence["up"], f.evidence["mul"]) == (gate, up, mul)
        removed = (durations[act_op] + durations[mul]) / 1000
        # the performance model (`perf.savings.fusion_saving`) on a CPU trace: 2 of the 5
        # passes over the [4, 16, 128] fp32 product go, at the device model's DRAM figure,
        # and 1 dispatch; at most the ops' time less the fused kernel's 3 passes
        device = device_model(trace)
        passes_us = 4 * 16 * 128 * 4 / (device.memory_bandwidth_gbs * 1e3)
        model = 2 * passes_us + device.launch_overhead_us
        assert f.est_saving_us == pytest.approx(min(model, removed - 3 * passes_us))
        assert f.zoo == ["glu", "dual_gemm_glu", "mlp"]


@pytest.mark.parametrize(
    "name",
    ["geglu_mlp-compiled", "swiglu_mlp-compiled", "geglu_mlp-compiled_cold", "mlp_gelu-eager"],
)
def test_tq103_is_silent_on_fused_glus_and_plain_mlps(fixture: Any, name: str) -> None:
    assert analyze(fixture(name), "TQ103") == []


def test_tq104_fires_on_the_five_op_chain_with_its_traffic_model(fixture: Any) -> None:
    trace = fixture("pointwise_chain-eager")
    found = analyze(trace, "TQ104")
    assert len(found) == trace.steps.height == 3
    durations = {r["event"]: r["dur_ns"] for r in top_ops(trace)}
    for f in found:
        assert f.evidence["op_names"] == [
            "aten::mul",
            "aten::add",
            "aten::sigmoid",
            "aten::mul",
            "aten::relu",
        ]
        # unfused: 2+2+2+3+2 = 11 passes over [32, 128]; fused: x twice in, result once out
        chain_us = sum(durations[e] for e in f.ops) / 1000
        # the performance model on a CPU trace: 8 passes go at the DRAM figure, and 4
        # dispatches; at most the chain's time less the fused kernel's 3 passes
        device = device_model(trace)
        pass_us = 32 * 128 * 4 / (device.memory_bandwidth_gbs * 1e3)
        model = 8 * pass_us + 4 * device.launch_overhead_us
        assert f.est_saving_us == pytest.approx(min(model, chain_us - 3 * pass_us))


@pytest.mark.parametrize(
    "name", ["pointwise_chain-compiled", "geglu_mlp-eager", "mlp_gelu-eager", "matmul_add-eager"]
)
def test_tq104_is_silent_on_fused_chains_and_ops_other_rules_report(
    fixture: Any, name: str
) -> None:
    assert analyze(fixture(name), "TQ104") == []


@pytest.mark.parametrize("name", ["geglu_mlp-eager", "swiglu_mlp-eager", "geglu_mlp-compiled"])
def test_tq105_fires_on_gate_and_up_reading_one_input(fixture: Any, name: str) -> None:
    trace = fixture(name)
    found = analyze(trace, "TQ105")
    assert len(found) == trace.steps.height == 3
    for f in found:
        assert len(f.ops) == 2
        assert f.evidence["k"] == 64 and f.evidence["n"] == [128, 128]


@pytest.mark.parametrize("name", ["mlp_gelu-eager", "matmul_add-eager", "linear-eager"])
def test_tq105_is_silent_on_sequential_gemms(fixture: Any, name: str) -> None:
    assert analyze(fixture(name), "TQ105") == []
