"""TQ105 parallel-gemms: two or more GEMMs reading the same input with the same K.

"The same input" is decided on data flow: the GEMMs' activation operands (`x` of
`linear`/`mm`/`matmul`, `mat1` of `addmm`) come from the same producer op, one with a
recorded output shape; when matched on element count only (a compiled graph's views), with
no op between it and the GEMM that records no shapes (`unbroken`): Inductor's C++ kernels
record no arguments, so one of them may have written what the GEMM read, and two GEMMs
matched past one are often fed by two different kernels (a compiled LLaMA's q, k/v and
gate/up projections, each after its own kernel). A GEMM whose input has only such an
edge, or one weaker than `min_confidence`, has an unknown input and joins no group.

When the input is a graph input (no edge into it at all: the model's, or a compiled
graph's, input, and no argument-less kernel ran before it in its graph: `after_argless_ops`),
GEMMs count as reading it together if they run in the same step, thread and parent module
on the same input shape — q/k/v or gate/up projections of one block.

Either way the GEMMs of one group run close together: at most `max_ops_between` ops from
one to the next. One GEMM over concatenated weights replaces them where the first runs;
GEMMs of one input far apart (another layer's cross-attention, CLIP's text projection 300
ops after the vision one) are other code. Program order, not time: a loaded machine
stretches time, not order.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.finding import Finding
from traceq.rules.opclass import (
    autograd_work,
    details,
    fusion_edges,
    fusion_ops,
    located,
    mib,
    numel,
    parent_module,
    shape_text,
)


def unbroken(edges: pl.DataFrame, ordered: pl.DataFrame) -> pl.Expr:
    """True for edges whose producer has a recorded output shape and, for an edge matched
    on element count only (`evidence` "numel...": a compiled graph's reinterpreted
    buffers), between which and whose consumer no op without one ran on the thread: such
    an op (an Inductor C++ kernel records no arguments) may have written the buffer the
    consumer read, so it breaks the edge rather than being bridged by it. Edges without
    `evidence` (built by hand) count as shape-matched. `ordered` holds the ops with their
    thread order `_seq`."""
    shapeless = pl.col("output_shape").is_null()
    blind = ordered.sort("_seq").select(
        "event",
        shapeless.alias("_blind"),
        shapeless.cast(pl.Int64).cum_sum().over("pid", "tid").alias("_n"),
    )
    producer = blind.select(pl.col("event").alias("producer"), "_blind", pl.col("_n").alias("_np"))
    consumer = blind.select(pl.col("event").alias("consumer"), pl.col("_n").alias("_nc"))
    loose = (
        pl.col("evidence").str.starts_with("numel").fill_null(False)
        if "evidence" in edges.columns
        else pl.lit(False)
    )
    ok = (
        edges.select("producer", "consumer", loose.alias("_loose"))
        .join(producer, on="producer")
        .join(consumer, on="consumer")
        .filter(~pl.col("_blind") & (~pl.col("_loose") | (pl.col("_nc") == pl.col("_np"))))
    )
    key = pl.struct("producer", "consumer")
    return key.is_in(ok.select(key.alias("k"))["k"].implode())


def after_argless_ops(ordered: pl.DataFrame) -> pl.Series:
    """Events of the ops from the first op recording no arguments (an Inductor C++ kernel)
    on, under the same enclosing op (a compiled graph's call) on their thread.

    Such a kernel may have written the buffer a later op reads, so an input with no edge
    there is unknown, not a graph input: in a compiled LLaMA the q/k/v GEMMs read the
    norm kernel's output and gate/up the next norm's, and the Execution Trace, which
    records no outputs for those kernels, has no edge into any GEMM of the graph, so
    "graph input, same shape" put q, k, v, o_proj, up and the LM head in one group
    (`ordered`: ops with their thread order `_seq`)."""
    if "input_dims" not in ordered.columns:  # frames built without arguments (tests)
        return pl.Series([], dtype=pl.Int64)
    within = ["pid", "tid"]
    if "parent" in ordered.columns:
        within.append(pl.col("parent").fill_null(-1))
    seen = (
        ordered.sort("_seq")
        .with_columns(
            pl.col("input_dims").is_null().cast(pl.Int64).cum_sum().over(within).alias("_argless")
        )
        .filter(pl.col("_argless") > 0)
    )
    return seen["event"].cast(pl.Int64)


def parallel_gemms(
    ops: pl.DataFrame,
    edges: pl.DataFrame,
    min_gemms: int = 2,
    max_ops_between: int = 16,
    min_confidence: float = 0.0,
    backward: pl.Series | None = None,
) -> pl.DataFrame:
    """One row per group of GEMMs sharing an input: `gemms` (event ids, in order), `n`,
    `source` (the producer op, or null for a graph input), `x_shape`, `k`, `ns` (output
    features of each), `x_bytes` (size of the shared input), `confidence`.

    `backward` GEMMs (an autograd node's work) read a gradient or a saved tensor, never a
    graph input: one with no edge into its input has an unknown input. On HTA's GPU
    training traces "graph input, same shape" grouped the `grad.mm(W)` of two heads, each
    reading its own head's gradient (38 findings on one rank).
    """
    ordered = ops.with_columns(
        pl.col("ts_ns").rank("ordinal").over("pid", "tid").cast(pl.Int64).alias("_seq")
    )
    gemms = ordered.filter(
        (pl.col("role") == "gemm") & pl.col("k").is_not_null() & pl.col("x_shape").is_not_null()
    ).select(
        "event",
        "gemm_x",
        "x_shape",
        "k",
        "n",
        "dtype",
        "step",
        "pid",
        "tid",
        "ts_ns",
        "_seq",
        "itemsize",
        parent_module(),
        _call(ops),
    )
    into_x = edges.join(gemms.select("event", "gemm_x"), left_on="consumer", right_on="event")
    into_x = into_x.filter(pl.col("input_index") == pl.col("gemm_x"))
    fed = (
        into_x.filter((pl.col("confidence") >= min_confidence) & unbroken(into_x, ordered))
        .group_by("consumer")
        .agg(pl.col("producer").first().alias("source"), pl.col("confidence").min())
    )
    read_something = into_x.select(pl.col("consumer").alias("event")).unique()
    gemms = gemms.join(fed, left_on="event", right_on="consumer", how="left")
    graph_input = (
        pl.col("source").is_null()
        & ~pl.col("event").is_in(read_something["event"].implode())
        & ~pl.col("event").is_in(after_argless_ops(ordered).implode())
    )
    if backward is not None:
        graph_input = graph_input & ~pl.col("event").is_in(backward.implode())
    key = ["x_shape", "k", "dtype"]
    by_source = _bursts(
        gemms.filter(pl.col("source").is_not_null()),
        ["source", "call", *key],
        max_ops_between,
    ).agg(
        pl.col("event").alias("gemms"),
        pl.col("n").alias("ns"),
        pl.col("itemsize").first(),
        pl.col("confidence").min(),
    )
    by_place = (
        _bursts(
            gemms.filter(graph_input),
            ["step", "pid", "tid", "call", "parent_module", *key],
            max_ops_between,
        )
        .agg(
            pl.col("event").alias("gemms"),
            pl.col("n").alias("ns"),
            pl.col("itemsize").first(),
        )
        .with_columns(
            pl.lit(None, dtype=pl.Int64).alias("source"),
            pl.lit(None, dtype=pl.Float64).alias("confidence"),
        )
    )
    columns = ["gemms", "source", *key, "ns", "itemsize", "confidence"]
    groups = pl.concat(
        [by_source.select(columns), by_place.select(columns)], how="vertical_relaxed"
    )
    return (
        groups.with_columns(pl.col("gemms").list.len().alias("n"))
        .filter(pl.col("n") >= min_gemms)
        .with_columns((numel(pl.col("x_shape")) * pl.col("itemsize")).alias("x_bytes"))
        .sort(pl.col("gemms").list.first())
    )


def _bursts(gemms: pl.DataFrame, scope: list[str], max_ops_between: int) -> pl.GroupBy:
    """`gemms` grouped by `scope` and run: a new group starts where more than
    `max_ops_between` ops (of any kind, on the thread) ran since the previous GEMM."""
    gap = (pl.col("_seq") - pl.col("_seq").shift(1) - 1).over(scope).fill_null(0)
    return (
        gemms.sort("ts_ns", "event")
        .with_columns((gap > max_ops_between).cum_sum().over(scope).alias("_burst"))
        .group_by([*scope, "_burst"], maintain_order=True)
    )


def _call(ops: pl.DataFrame) -> pl.Expr:
    """The forward call each GEMM ran in (`fusion_ops`' `call`): GEMMs of two calls of a
    model (a loop, an ensemble) are never one group, even reading one input."""
    if "call" in ops.columns:
        return pl.col("call")
    return pl.lit(None, dtype=pl.Int64).alias("call")


DEFAULTS = {"min_gemms": 2, "max_ops_between": 16, "min_confidence": 0.4, "min_saving_us": 0.0}


@rule("TQ105", "parallel-gemms", "info", defaults=DEFAULTS, zoo=("dual_gemm_glu",))
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds GEMMs that read the same input with the same K, each run on its own. Typically
    the q, k and v projections of attention, or the gate and up projections of a GLU MLP.

    ## Why is this bad?
    Each GEMM reads the whole input again and pays its own launch, and small GEMMs leave
    SMs idle (a [tokens, K] × [K, N] GEMM with few tokens is launch- and tail-bound). One
    GEMM over the concatenated weights ([K, N1 + N2 + ...]) reads the input once, launches
    once and fills the GPU better; its output splits back with views (`chunk`/`split`).

    Estimated saving: a launch and a read of the shared input per GEMM merged away —
    (n − 1) × (device launch overhead + input bytes / memory bandwidth), at most the time
    of all but the longest GEMM. Better occupancy of small GEMMs is not counted.

    ## Example
    ```python
    q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    h = F.silu(self.gate_proj(x)) * self.up_proj(x)
    ```

    ## Use instead
    ```python
    q, k, v = self.qkv_proj(x).split([d_q, d_kv, d_kv], dim=-1)
    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    ```
    For a GLU MLP, the zoo's `dual_gemm_glu` computes both GEMMs and the gate in one kernel.

    ## Options
    - `min_gemms` (2): fewest GEMMs in a group.
    - `max_ops_between` (16): the most ops (of any kind, on the thread) between two GEMMs of
      one group.
    - `min_confidence` (0.4): weakest data-flow edge accepted.
    - `min_saving_us` (0): leave out findings that save less.

    ## References
    - vLLM `QKVParallelLinear` / `MergedColumnParallelLinear`:
      https://github.com/vllm-project/vllm
    - Hugging Face, "Profiling in PyTorch (Part 2): From nn.Linear to a Fused MLP"
    """
    ops = fusion_ops(ctx)
    groups = parallel_gemms(
        ops,
        fusion_edges(ctx),
        min_gemms=ctx.options["min_gemms"],
        max_ops_between=ctx.options["max_ops_between"],
        min_confidence=ctx.options["min_confidence"],
        backward=autograd_work(ctx),
    )
    rows = details(ops, groups["gemms"].explode().to_list())
    launch_us = ctx.device.launch_overhead_us
    for group in groups.iter_rows(named=True):
        members = [rows[e] for e in group["gemms"]]
        times = [r["time_ns"] / 1000 for r in members]
        extra = group["n"] - 1
        modeled = extra * (launch_us + ctx.device.transfer_us(group["x_bytes"]))
        ceiling = sum(times) - max(times)
        saving = min(modeled, ceiling)
        if saving < ctx.options["min_saving_us"]:
            continue
        where = located(ctx, members)
        widths = " + ".join(str(n) for n in group["ns"])
        where["evidence"].update(
            {
                "source": group["source"],
                "x_shape": group["x_shape"],
                "k": group["k"],
                "n": group["ns"],
                "shared_input": mib(group["x_bytes"]),
                "launch_overhead_us": launch_us,
                "dataflow_confidence": group["confidence"],
            }
        )
        source = (
            "graph input (same shape, same parent module)"
            if group["source"] is None
            else "input (one producer)"
        )
        yield ctx.finding(
            message=(
                f"{group['n']} GEMMs read the same {shape_text(group['x_shape'])} {source} "
                f"with K={group['k']}: one GEMM with N = {widths} would read it once"
            ),
            shapes=[group["x_shape"]],
            est_saving_us=saving,
            saving_model=(
                f"{extra} × (launch {launch_us:.2f} µs + input read "
                f"{ctx.device.transfer_us(group['x_bytes']):.2f} µs at "
                f"{ctx.device.bandwidth_text}) = {modeled:.2f} µs, capped at the time of all "
                f"but the longest GEMM ({ceiling:.2f} µs)"
            ),
            fix=(
                "Concatenate the weights and run one GEMM, then split the output: "
                "`qkv_proj(x).split(...)`, `gate_up_proj(x).chunk(2, -1)`; for gate/up of a "
                "GLU MLP, the zoo's `dual_gemm_glu`."
            ),
            **where,
        )


RULE = check
