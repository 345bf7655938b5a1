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

from traceq.perf.traffic import numel
from traceq.relations.dataflow import passed_shapeless
from traceq.rules.base import Context, rule
from traceq.rules.details import decode_kernels, details, located, mib, shape_text
from traceq.rules.finding import Finding
from traceq.rules.kernel_patterns import kernel_parallel_gemms
from traceq.rules.op_groups import (
    autograd_work,
    fusion_edges,
    fusion_ops,
    parent_module,
    reached_forward,
)


def custom_op() -> pl.Expr:
    """A library's own op (`vllm::`, `sglang_profiler::`, `_C::`, `aiter::`), not aten's and
    not a compiler's kernel (Inductor's `triton_poi_fused_...` has no namespace)."""
    name = pl.col("name")
    return name.str.contains("::") & ~name.str.starts_with("aten::")


def unbroken(edges: pl.DataFrame, ordered: pl.DataFrame) -> pl.Expr:
    """True for edges whose producer has a recorded output shape and, for an edge matched
    on element count only (`evidence` "numel...": a compiled graph's reinterpreted
    buffers), that pass no op without one (`passed_shapeless`): such an op (an Inductor
    C++ kernel records no arguments) may have written the buffer the consumer read, so it
    breaks the edge rather than being bridged by it; so does, for any edge, a custom op
    (not aten's) of unknown result. Edges without `evidence` (built by hand) count as
    shape-matched. `ordered` holds the ops with their thread order `_seq`."""
    shapeless = pl.col("output_shape").is_null()
    loose = (
        pl.col("evidence").str.starts_with("numel").fill_null(False)
        if "evidence" in edges.columns
        else pl.lit(False)
    )
    shaped = ordered.filter(~shapeless).select(pl.col("event").alias("producer"))
    known = edges.select("producer", "consumer", loose.alias("_loose")).join(
        shaped, on="producer", how="semi"
    )
    known = known.join(ordered.select(pl.col("event").alias("consumer")), on="consumer", how="semi")
    broken = passed_shapeless(known.filter("_loose"), ordered, shapeless, ["pid", "tid"])
    # A custom op (not aten's) whose result the trace does not give may have written the
    # buffer in place (SGLang's `sglang_profiler::` norms and attention inside a CUDA
    # graph): an edge past one rests on a shape it hid, however well the shapes match.
    opaque = shapeless & custom_op()
    hidden = passed_shapeless(known, ordered, opaque, ["pid", "tid"])
    ok = known.join(pl.concat([broken, hidden]), on=["producer", "consumer"], how="anti")
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
    if {"output_shape", "name"} <= set(ordered.columns):
        # Custom ops of unknown result seen so far on the thread: GEMMs with "no producer"
        # on either side of one may read what it wrote (vLLM's attention before each
        # layer's o_proj), so they are not one graph input.
        opaque = pl.col("output_shape").is_null() & custom_op()
        ordered = ordered.with_columns(
            opaque.cast(pl.Int64).cum_sum().over("pid", "tid", order_by="_seq").alias("_hidden")
        )
    else:
        ordered = ordered.with_columns(pl.lit(0, dtype=pl.Int64).alias("_hidden"))
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
        "_hidden",
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
            ["step", "pid", "tid", "call", "parent_module", "_hidden", *key],
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
    groups = independent(groups, edges, ordered)
    return (
        groups.with_columns(pl.col("gemms").list.len().alias("n"))
        .filter(pl.col("n") >= min_gemms)
        .with_columns((numel(pl.col("x_shape")) * pl.col("itemsize")).alias("x_bytes"))
        .sort(pl.col("gemms").list.first())
    )


def independent(
    groups: pl.DataFrame, edges: pl.DataFrame, ordered: pl.DataFrame, max_hops: int = 64
) -> pl.DataFrame:
    """`groups` less each GEMM that depends on an earlier GEMM of its group: reachable from
    it along `edges` (any data flow, through any ops) before it starts.

    Same shape is not same input, and two GEMMs one of which reads the other's result
    (through a norm, attention, a residual add) cannot run as one: a projection and the
    matmul that reads its normalized output; a QKV projection and a MoE router that runs
    after attention; attention's output projection and the MLP's first GEMM. Data flow
    matched their inputs by shape to one producer, or found none for either; the edges
    between them say which came from which. A walk that data flow cannot complete (an
    op with no recorded output in between) leaves the group as it was."""
    if groups.height == 0 or edges.height == 0:
        return groups
    members = (
        groups.with_row_index("_group")
        .select("_group", pl.col("gemms").alias("_gemm"))
        .explode("_gemm")
    )
    start = ordered.select(pl.col("event"), pl.col("ts_ns"))
    last = (
        members.join(start, left_on="_gemm", right_on="event")
        .group_by("_group")
        .agg(pl.col("ts_ns").max().alias("_until"))
    )
    frontier = members.join(last, on="_group").with_columns(pl.col("_gemm").alias("_at"))
    reached = reached_forward(edges, start, frontier, ["_group", "_gemm"], "_until", max_hops)
    if reached.height == 0:
        return groups
    dependent = (
        reached.select("_group", pl.col("_at").alias("_dependent"))
        .join(members, left_on=["_group", "_dependent"], right_on=["_group", "_gemm"], how="semi")
        .unique()
    )
    kept = (
        members.join(
            dependent, left_on=["_group", "_gemm"], right_on=["_group", "_dependent"], how="anti"
        )
        .group_by("_group")
        .agg(pl.col("_gemm").alias("_kept"))
    )
    ns = (
        groups.with_row_index("_group")
        .select("_group", "gemms", "ns")
        .explode("gemms", "ns")
        .join(
            kept.explode("_kept"),
            left_on=["_group", "gemms"],
            right_on=["_group", "_kept"],
            how="semi",
        )
        .group_by("_group", maintain_order=True)
        .agg("gemms", "ns")
    )
    return (
        groups.with_row_index("_group")
        .drop("gemms", "ns")
        .join(ns, on="_group", how="inner")
        .sort("_group")
        .drop("_group")
        .select(groups.columns)
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


@rule(
    "TQ105",
    "parallel-gemms",
    "info",
    defaults=DEFAULTS,
    zoo=("dual_gemm_glu",),
    defers=True,  # gives way to idiom findings (`traceq.rules.explained`)
)
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

    Where the GEMM kernels have no op of their own (a GPU compiled region), GEMM kernels
    back to back on a stream, of one name or grid, before an attention kernel or a fused
    GLU kernel, are one group (`kernel_patterns.kernel_parallel_gemms`).

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
    yield from kernel_groups(ctx)


def kernel_groups(ctx: Context) -> Iterator[Finding]:
    """Groups seen only on the stream (`kernel_parallel_gemms`): GEMM kernels of a compiled
    region with no op each, back to back before attention or a fused GLU kernel. No shapes:
    the saving is launches only, capped like the op groups'."""
    launch_us = ctx.device.launch_overhead_us
    for group in kernel_parallel_gemms(ctx).iter_rows(named=True):
        times = [t / 1000 for t in group["times_ns"]]
        n = len(group["kernels"])
        ceiling = sum(times) - max(times)
        saving = min((n - 1) * launch_us, ceiling)
        if saving < ctx.options["min_saving_us"]:
            continue
        yield ctx.finding(
            message=(
                f"{n} GEMM kernels run back to back before `{group['after']}` in "
                f"`{group['launcher']}` with no op of their own (the q/k/v or gate/up "
                "projections of one input): one GEMM over the concatenated weights would "
                "read it once"
            ),
            step=group["step"],
            module=group["module"],
            kernels=group["kernels"],
            time_us=sum(times),
            est_saving_us=saving,
            saving_model=(
                f"{n - 1} × launch {launch_us:.2f} µs, capped at the time of all but the "
                f"longest GEMM kernel ({ceiling:.2f} µs); no shapes recorded for kernels "
                "without an op, so the input re-read is not counted"
            ),
            fix=(
                "Concatenate the weights before compiling and run one GEMM, then split the "
                "output: `qkv_proj(x).split(...)`, `gate_up_proj(x).chunk(2, -1)`."
            ),
            evidence={
                "op_names": [],
                "kernel_names": group["names"],
                "decoded": decode_kernels(group["names"]),
                "followed_by": group["after"],
                "launched_by": group["launcher"],
                "launch_overhead_us": launch_us,
                "matched_on": "stream order, kernel names and grids (the kernels have no op: "
                "no shapes, no data flow)",
                "time_basis": "gpu kernels",
            },
        )


RULE = check
