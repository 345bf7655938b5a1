"""TQ101 split-matmul-bias: a bias added by its own op after a GEMM that could have done it.

The pattern is found on data flow: a bias-free GEMM (`mm`, `matmul`, `bmm`, or `linear`
without bias) whose output goes straight (through views at most) into an `add` whose other
input is a broadcast bias — one value per output feature ([N], [1, N], [1, 1, N]).
`split_bias_adds` is shared with TQ102 (an activation after the bias add is still an
activation of the GEMM) and TQ104 (the add is not reported again as part of a chain).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import polars as pl

from traceq.perf.savings import scaled_saving_us
from traceq.perf.traffic import numel
from traceq.rules.base import Context, rule
from traceq.rules.details import details, located, mib, shape_text
from traceq.rules.finding import Finding
from traceq.rules.op_classes import ATEN_BASE
from traceq.rules.op_groups import fusion_edges, fusion_ops

BIAS_FREE_GEMMS = ("mm", "matmul", "bmm", "linear")


def split_bias_adds(
    ops: pl.DataFrame,
    edges: pl.DataFrame,
    min_confidence: float = 0.0,
    single_consumer: bool = True,
) -> pl.DataFrame:
    """One row per GEMM -> bias `add` pair: `gemm`, `add`, `bias_shape`, `out_shape`,
    `confidence`. `ops` are `classify`d, `edges` bypass views (`through_views`).

    With `single_consumer`, the GEMM output must feed nothing but the add: only then can
    the intermediate disappear.
    """
    # forward GEMMs: backward adds no bias to a GEMM's output (a bias's gradient is a
    # sum); an `add` after a dgrad `mm` is a custom Function's backward recomputing
    # `bias + y` from the saved y (`tp_train`), which shape matching reads as the mm's
    forward = ~pl.col("backward") if "backward" in ops.columns else pl.lit(True)
    gemms = ops.filter(
        (pl.col("role") == "gemm")
        & ATEN_BASE.is_in(list(BIAS_FREE_GEMMS))
        & ~pl.col("has_bias")
        & ~pl.col("epilogue_act")
        & forward
    ).select(pl.col("event").alias("producer"), pl.col("output_shape").alias("out_shape"), "n")
    adds = ops.filter(
        (ATEN_BASE == "add") & ~pl.col("generated") & (pl.col("tensor_inputs") == 2) & forward
    ).select(pl.col("event").alias("consumer"), "shapes")
    # uses in the forward pass: backward's read of a saved GEMM output is autograd's, and
    # one that inferred data flow mostly misses (`tp_train`: the exact flow has Megatron's
    # bias-GELU backward read the fc1 output, the inferred one does not)
    forward_ops = ops.filter(forward).select(pl.col("event").alias("consumer"))
    consumers = (
        edges.join(forward_ops, on="consumer", how="semi")
        .group_by("producer")
        .agg(pl.col("consumer").n_unique().alias("_uses"))
    )
    other = pl.col("shapes").list.get(1 - pl.col("input_index"), null_on_oob=True)
    found = (
        edges.filter(pl.col("input_index").is_in([0, 1]) & (pl.col("confidence") >= min_confidence))
        .join(gemms, on="producer")
        .join(adds, on="consumer")
        .join(consumers, on="producer")
        .with_columns(other.alias("bias_shape"))
        .filter(
            (pl.col("bias_shape").list.last() == pl.col("n"))
            & (numel(pl.col("bias_shape")) == pl.col("n"))
            & (pl.col("bias_shape").list.len() <= pl.col("out_shape").list.len())
            & (numel(pl.col("out_shape")) > pl.col("n"))
        )
    )
    if single_consumer:
        found = found.filter(pl.col("_uses") == 1)
    return found.select(
        pl.col("producer").alias("gemm"),
        pl.col("consumer").alias("add"),
        "bias_shape",
        "out_shape",
        "confidence",
    ).sort("add")


@rule(
    "TQ101",
    "split-matmul-bias",
    "warning",
    defaults={"single_consumer": True, "min_confidence": 0.4, "min_saving_us": 0.0},
    zoo=("gemm_bias_act",),
)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds a bias added by its own `add` after a bias-free GEMM. The GEMM (`mm`, `matmul`,
    `bmm`, or `nn.Linear(bias=False)`) feeds its output straight into an `add` whose other
    input holds one value per output feature ([N] or [1, N]).

    ## Why is this bad?
    The GEMM writes its M×N result to memory, then the `add` launches another kernel that
    reads it back, reads the bias and writes M×N again. cuBLAS (`addmm`) and every fused
    GEMM add the bias in the epilogue, while the tile is still in registers: the `add`
    kernel, its launch and the round trip of the intermediate disappear. This is why
    `nn.Linear` runs as `aten::t` + `aten::addmm`, not `mm` + `add`.

    Estimated saving: the measured time of the `add` (GPU kernel time on a GPU trace, CPU
    op time on a CPU-only one), scaled by the traffic that remains once it is fused — the
    epilogue still reads the N bias values, nothing else.

    ## Example
    ```python
    y = torch.matmul(x, self.weight) + self.bias
    ```

    ## Use instead
    ```python
    y = torch.addmm(self.bias, x, self.weight)  # 2-D x
    y = F.linear(x, self.weight_t, self.bias)   # any leading dims; weight as [N, K]
    ```

    ## Options
    - `single_consumer` (true): only report when the add is the GEMM output's one consumer.
    - `min_confidence` (0.4): weakest data-flow edge accepted (0.4 = program order only).
    - `min_saving_us` (0): leave out findings that save less.

    ## References
    - PyTorch, `torch.addmm`: https://pytorch.org/docs/stable/generated/torch.addmm.html
    - Hugging Face, "Profiling in PyTorch (Part 2): From nn.Linear to a Fused MLP"
    - NVIDIA cuBLASLt epilogues (`CUBLASLT_EPILOGUE_BIAS`):
      https://docs.nvidia.com/cuda/cublas/#cublasltepilogue-t
    """
    ops = fusion_ops(ctx)
    pairs = split_bias_adds(
        ops,
        fusion_edges(ctx),
        min_confidence=ctx.options["min_confidence"],
        single_consumer=ctx.options["single_consumer"],
    )
    rows = details(ops, pairs["gemm"].to_list() + pairs["add"].to_list())
    for pair in pairs.iter_rows(named=True):
        gemm, add = rows[pair["gemm"]], rows[pair["add"]]
        where = located(ctx, [gemm, add])
        bias_bytes = math.prod(pair["bias_shape"] or []) * add["itemsize"]
        saving = scaled_saving_us(add["time_ns"] / 1000, add["traffic_bytes"], bias_bytes)
        if saving < ctx.options["min_saving_us"]:
            continue
        out = shape_text(pair["out_shape"])
        bias = shape_text(pair["bias_shape"])
        where["evidence"].update(
            {
                "bias_shape": pair["bias_shape"],
                "output_shape": pair["out_shape"],
                "add_traffic": mib(add["traffic_bytes"]),
                "dataflow_confidence": pair["confidence"],
                "round_trip_floor_us": round(ctx.device.transfer_us(add["traffic_bytes"]), 3),
            }
        )
        yield ctx.finding(
            message=(
                f"`{gemm['name']}` → `{add['name']}` of a {bias} bias: the {out} result "
                f"makes a round trip through memory for a bias the GEMM epilogue could add"
            ),
            shapes=[s for s in (gemm["shapes"] or []) if s] + [pair["bias_shape"]],
            est_saving_us=saving,
            saving_model=(
                f"measured time of the `add` ({add['time_ns'] / 1000:.2f} µs) × (1 − bias "
                f"bytes it still reads / bytes it moves: {bias_bytes} / "
                f"{add['traffic_bytes']}); at {ctx.device.bandwidth_text} its traffic alone "
                f"takes ≥ {ctx.device.transfer_us(add['traffic_bytes']):.2f} µs"
            ),
            fix=(
                "Add the bias inside the GEMM: `torch.addmm(bias, x, w)` or "
                "`F.linear(x, w.T, bias)` / `nn.Linear(bias=True)`; for an activation after "
                "it too, the zoo's `gemm_bias_act`."
            ),
            **where,
        )


RULE = check
