"""What each op computes and moves, checked against others' numbers: TraceLens's own perf
report for the three shared H100 traces (AMD-AGI/TraceLens, MIT), and PyTorch's
`FlopCounterMode` re-running the corpus's recorded ops on meta tensors."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest
from conftest import CORPUS, SHARED_TRACES
from flop_counter_reference import flop_counter_flops

import traceq
from traceq.perf import flop_table
from traceq.perf.cost import fused_tokens, kept_scores, op_cost, op_costs

H100 = SHARED_TRACES / "tracelens" / "tests" / "traces" / "h100"
H100_TRACES = [
    "gaunernst_bert-small-uncased__1016001",
    "Falconsai_nsfw_image_detection__1016002",
    "Qwen_Qwen1.5-0.5B-Chat__1016005",
]
MIB = 2**20


def tracelens_rows(trace: str, report: str) -> pl.DataFrame:
    """TraceLens's rows of one report (GEMM.csv, ...) keyed as traceq keys ops: the op name
    and its `Input Dims` (spaces dropped), with its GFLOPS and data moved (MiB)."""
    path = H100 / f"{trace}_perf_report_csvs" / report
    if not path.exists():
        return pl.DataFrame()
    rows = pl.read_csv(path, infer_schema_length=0)
    return rows.select(
        "name",
        pl.col("Input Dims_first").str.replace_all(" ", "").alias("dims"),
        pl.col("GFLOPS_first").cast(pl.Float64).alias("tl_flops") * 1e9,
        pl.col("Data Moved (MB)_first").cast(pl.Float64).alias("tl_bytes") * MIB,
        *[pl.col(c) for c in rows.columns if c.startswith("param: ")],
    )


@pytest.fixture(scope="module", params=H100_TRACES)
def h100(request: pytest.FixtureRequest) -> tuple[str, pl.DataFrame]:
    """(trace name, traceq's cost of every op in it, one row per name + input dims)."""
    path = H100 / f"{request.param}.json.gz"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    costs = op_costs(traceq.load(path, cache=False).ops)
    ours = costs.with_columns(pl.col("input_dims").str.replace_all(" ", "").alias("dims"))
    return request.param, ours.unique(["name", "dims"], keep="first")


def joined(h100: tuple[str, pl.DataFrame], report: str) -> pl.DataFrame:
    trace, ours = h100
    theirs = tracelens_rows(trace, report)
    if theirs.height == 0:
        pytest.skip(f"no {report} for {trace}")
    rows = theirs.join(ours, on=["name", "dims"], how="left")
    assert rows["flops"].null_count() == 0, "every TraceLens row has its op in the trace"
    return rows


@pytest.mark.shared
def test_gemm_flops_and_bytes_equal_tracelens_for_every_gemm_row(h100) -> None:
    rows = joined(h100, "GEMM.csv")
    # TraceLens's own M, N, K and bias, recomputed: 2·B·M·N·K (+ M·N for a bias)
    b, m, n, k = (pl.col(f"param: {p}").cast(pl.Int64) for p in "BMNK")
    bias = (pl.col("param: bias") == "True").cast(pl.Int64)
    rows = rows.with_columns((2 * b * m * n * k + bias * b * m * n).alias("from_params"))
    for row in rows.iter_rows(named=True):
        assert row["flops"] == row["from_params"] == pytest.approx(row["tl_flops"], rel=1e-9)
        assert row["bytes"] == pytest.approx(row["tl_bytes"], rel=1e-9), row["dims"]


@pytest.mark.shared
def test_attention_flops_match_tracelens_non_causal_and_causal_by_the_stated_rule(h100) -> None:
    """Non-causal: equal. Causal: TraceLens halves N_q·N_kv; traceq counts the scores at or
    left of the diagonal, N(N+1)/2. Bytes: traceq adds the fp32 log-sum-exp the flash
    kernel writes (B·H·N_q·4)."""
    rows = joined(h100, "SDPA_fwd.csv")
    for row in rows.iter_rows(named=True):
        b, h, n_q, n_kv = (int(row[f"param: {p}"]) for p in ("B", "H_Q", "N_Q", "N_KV"))
        if row["param: causal"] == "True":
            kept = n_q * (n_q + 1) // 2
            assert row["flops"] == pytest.approx(row["tl_flops"] * 2 * kept / (n_q * n_kv))
        else:
            assert row["flops"] == pytest.approx(row["tl_flops"], rel=1e-12)
        assert row["bytes"] - row["tl_bytes"] == pytest.approx(b * h * n_q * 4)


# Where traceq and TraceLens count different bytes or FLOPs for the same op, and why.
DIFFERENCES = {
    "elementwise FLOPs": "TraceLens counts 1 FLOP per element; traceq `flop_table` "
    "(silu 7, pow(x, 2) 1, copy_ 0: a copy computes nothing)",
    "causal attention FLOPs": "TraceLens halves N²; traceq counts the N(N+1)/2 kept scores",
    "attention bytes": "traceq adds the fp32 log-sum-exp flash/efficient/cuDNN kernels write",
    "norm FLOPs": "TraceLens 5 per element and 6 per channel; traceq 8 per element (mean 1, "
    "variance 3, normalize 2, affine 2)",
    "norm bytes": "TraceLens adds 2 fp32 statistics per channel; traceq adds native_layer_norm's "
    "fp32 mean and rstd per row (kept for the backward), and none for layer_norm",
    "reduction bytes": "TraceLens counts only the input; traceq adds the output",
    "conv bias": "TraceLens reads the bias as absent (param bias False) though Input Dims "
    "records it; traceq counts its bytes and N·C_out·H·W adds",
}


@pytest.mark.shared
@pytest.mark.parametrize("report", ["BinaryElementwise.csv", "UnaryElementwise.csv"])
def test_elementwise_bytes_equal_and_flops_differ_only_by_the_flop_table(h100, report) -> None:
    rows = joined(h100, report)
    for row in rows.iter_rows(named=True):
        assert row["bytes"] == pytest.approx(row["tl_bytes"], rel=1e-9), row["dims"]
        op = row["name"].removeprefix("aten::").rstrip("_")
        per = 0 if op == "copy" else flop_table.ELEMENTWISE_FLOPS[op]
        if op == "pow" and json.loads(row["dims"])[1] == []:
            per = 1  # x.pow(2): one multiply
        assert row["flops"] == pytest.approx(row["tl_flops"] * per), DIFFERENCES[
            "elementwise FLOPs"
        ]


@pytest.mark.shared
def test_norm_differences_are_the_stated_ones(h100) -> None:
    rows = joined(h100, "Normalization.csv")
    for row in rows.iter_rows(named=True):
        x = json.loads(row["dims"])[0]
        elements, channels = math.prod(x), x[-1]
        tl_per_element = (row["tl_flops"] - 6 * channels) / elements
        assert tl_per_element == pytest.approx(5)
        assert row["flops"] == pytest.approx(elements * 8), DIFFERENCES["norm FLOPs"]
        ours_stats = (
            2 * (elements // channels) * 4 if row["name"] == "aten::native_layer_norm" else 0
        )
        assert row["bytes"] - ours_stats + 2 * channels * 4 == pytest.approx(row["tl_bytes"])


@pytest.mark.shared
def test_reduction_and_conv_differences_are_the_stated_ones(h100) -> None:
    trace, _ = h100
    if tracelens_rows(trace, "Reduce_fwd.csv").height:
        for row in joined(h100, "Reduce_fwd.csv").iter_rows(named=True):
            assert row["flops"] == pytest.approx(row["tl_flops"])
            assert row["bytes"] - row["bytes_written"] == pytest.approx(row["tl_bytes"])
    if tracelens_rows(trace, "CONV_fwd.csv").height:
        for row in joined(h100, "CONV_fwd.csv").iter_rows(named=True):
            assert row["matmul_flops"] == pytest.approx(row["tl_flops"], rel=1e-12)
            bias = json.loads(row["dims"])[2]
            out_elements = (row["flops"] - row["matmul_flops"]) / bias[0]
            assert out_elements == 4 * 14 * 14  # N·H·W of the patch embedding's output
            assert row["bytes"] - row["tl_bytes"] == pytest.approx(bias[0] * 2)  # bf16 bias


# -- PyTorch's own count ------------------------------------------------------------------

FLOP_COUNTER_FAMILIES = ("gemm", "conv", "attention")
"""The families `FlopCounterMode` has formulas for (GEMMs, convolutions, SDPA)."""
CORPUS_TRACES = sorted(CORPUS.glob("*.pt.trace.json.gz"))


@pytest.fixture(scope="module")
def corpus_signatures() -> pl.DataFrame:
    frames = []
    for path in CORPUS_TRACES:
        costs = op_costs(traceq.load(path, cache=False).ops)
        frames.append(costs.filter(pl.col("family").is_in(FLOP_COUNTER_FAMILIES)))
    return pl.concat(frames, how="diagonal_relaxed").unique(
        ["name", "input_dims", "concrete_inputs"]
    )


def test_matmul_flops_equal_flop_counter_mode_on_corpus_ops(corpus_signatures) -> None:
    """Every GEMM, convolution and attention signature of the CPU-recorded corpus that
    FlopCounterMode can re-run on meta tensors: equal, except causal attention, which
    FlopCounterMode counts unmasked (its own NB) and traceq scales by the kept scores."""
    compared: dict[str, int] = {}
    for row in corpus_signatures.iter_rows(named=True):
        theirs = flop_counter_flops(
            row["name"], row["input_dims"], row["input_types"], row["concrete_inputs"]
        )
        if not theirs:  # not re-runnable (CPU-only kernels), or an op it has no formula for
            continue
        compared[row["family"]] = compared.get(row["family"], 0) + 1
        if row["family"] == "attention" and row["concrete_inputs"][5] == "True":
            q, k = json.loads(row["input_dims"])[:2]
            ratio = kept_scores(q[2], k[2], causal=True) / (q[2] * k[2])
            assert row["matmul_flops"] == pytest.approx(theirs * ratio), row["input_dims"]
        else:
            assert row["matmul_flops"] == theirs, (row["name"], row["input_dims"])
    assert set(compared) == set(FLOP_COUNTER_FAMILIES), compared
    assert sum(compared.values()) >= 100


# -- the model's own rules ----------------------------------------------------------------


def cost(name: str, dims: list, types: list[str], concrete: list[str] | None = None):
    return op_cost(name, json.dumps(dims), types, concrete or [""] * len(dims))


def test_gelu_silu_and_exp_are_not_one_flop_per_element() -> None:
    n = 1000
    for op in ("gelu", "silu", "exp"):
        assert cost(f"aten::{op}", [[n]], ["float"]).flops > 1 * n
    assert cost("aten::add", [[n], [n], []], ["float", "float", "Scalar"]).flops == n


def test_bytes_come_from_each_tensors_own_dtype() -> None:
    mixed = cost("aten::mul", [[10], [10]], ["c10::BFloat16", "float"])
    assert mixed.bytes_read == 10 * 2 + 10 * 4
    assert mixed.bytes_written == 10 * 4  # bf16 * fp32 promotes to fp32


def test_an_unknown_dtype_is_not_modelled_rather_than_defaulted() -> None:
    result = cost("aten::add", [[10], [10], []], ["float", "c10::Mystery", "Scalar"])
    assert not result.modelled and "Mystery" in result.why_not


def test_ops_without_recorded_shapes_say_so() -> None:
    result = op_cost("aten::mm", None, None, None)
    assert not result.modelled and "shapes" in result.why_not


def test_an_out_argument_is_written_not_read() -> None:
    """`mul.out(self, other, out)`: read self, write out (not read it too)."""
    result = cost("aten::mul", [[100], [], [100]], ["float", "Scalar", "float"], ["", "2", ""])
    assert result.bytes_read == 400 and result.bytes_written == 400


def test_gqa_and_a_sliding_window_count_only_the_scores_computed() -> None:
    # 8 query heads over 2 KV heads: FLOPs at 8 heads, K and V read at 2
    q, kv = [1, 8, 128, 64], [1, 2, 128, 64]
    gqa = cost(
        "aten::scaled_dot_product_attention",
        [q, kv, kv, [], [], [], [], []],
        ["c10::BFloat16"] * 3 + ["", "Scalar", "Scalar", "Scalar", "Scalar"],
        ["", "", "", "", "0.", "False", "", "True"],
    )
    assert gqa.matmul_flops == 2 * 8 * 128 * 128 * (64 + 64)
    assert gqa.bytes_read == (128 * 64 * (8 + 2 + 2)) * 2
    assert kept_scores(4, 4, causal=True) == 10
    assert kept_scores(6, 6, causal=True, left=1) == 11  # each query sees itself and one back


def test_inductor_kernels_are_costed_from_the_ops_their_names_list() -> None:
    assert fused_tokens("triton_poi_fused__to_copy_add_mul_silu_0") == (
        "_to_copy",
        "add",
        "mul",
        "silu",
    )
    n = 4096
    result = cost(
        "triton_poi_fused_mul_silu_0", [[n], [n], [n], []], ["c10::BFloat16"] * 3 + ["Scalar"]
    )
    assert result.family == "fused"
    assert result.flops == n * (1 + flop_table.ELEMENTWISE_FLOPS["silu"])
    assert result.bytes_read == 2 * n * 2 and result.bytes_written == n * 2


def test_conv_forward_and_backward_count_both_gradient_gemms() -> None:
    x, w, out = [2, 3, 8, 8], [4, 3, 3, 3], [2, 4, 6, 6]
    fwd = cost(
        "aten::convolution",
        [x, w, [], [], [], [], [], [], []],
        [
            "float",
            "float",
            "",
            "ScalarList",
            "ScalarList",
            "ScalarList",
            "Scalar",
            "ScalarList",
            "Scalar",
        ],
        ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"],
    )
    assert fwd.matmul_flops == 2 * 2 * 36 * 4 * 27
    bwd = cost(
        "aten::convolution_backward",
        [out, x, w, [], [], [], [], [], [], [], []],
        ["float"] * 3 + ["ScalarList"] * 4 + ["ScalarList", "Scalar", "ScalarList"],
        [
            "",
            "",
            "",
            "[4]",
            "[1, 1]",
            "[0, 0]",
            "[1, 1]",
            "False",
            "[0, 0]",
            "1",
            "[True, True, True]",
        ],
    )
    assert bwd.matmul_flops == 2 * fwd.matmul_flops


def test_every_family_is_modelled_somewhere_in_the_corpus() -> None:
    families = set()
    for path in CORPUS_TRACES[:12]:
        costs = op_costs(traceq.load(path, cache=False).ops)
        families |= set(
            costs.filter(pl.col("modelled") & (pl.col("flops") + pl.col("bytes") > 0))["family"]
        )
    assert {
        "gemm",
        "attention",
        "conv",
        "norm",
        "softmax",
        "reduction",
        "embedding",
        "copy",
        "elementwise",
    } <= families


def test_unmodelled_ops_are_counted_with_a_reason() -> None:
    from traceq.perf.cost import unmodelled_counts

    costs = op_costs(traceq.load(CORPUS / "llama.pt.trace.json.gz", cache=False).ops)
    counts = unmodelled_counts(costs)
    assert counts["why_not"].null_count() == 0
    assert counts["count"].sum() == costs.filter(~pl.col("modelled")).height
