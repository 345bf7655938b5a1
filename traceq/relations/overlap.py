"""How much exposed communication could overlap compute that does not depend on it.

A collective can run beside compute only if that compute neither produces what it sends
nor consumes what it returns. The trace records no data flow between kernels and
collectives, so the phases of a training step stand in for it:

- **backward**: a gradient collective (DDP's bucket all-reduce, FSDP's reduce-scatter)
  reduces gradients the backward compute *before* it produced, and the optimizer after
  backward consumes its result. Only the backward compute *after* it started, up to the
  end of backward, is independent of it: the next buckets' gradients.
- **forward**: a parameter collective (FSDP's all-gather, a broadcast) depends on no
  forward compute, so earlier forward compute can hide it (prefetch). An activation
  collective (tensor-parallel all-reduce, sequence-parallel reduce-scatter, expert
  all-to-all) reads the op just before it and feeds the op just after: on the critical
  path by construction, hidden by nothing.

A trace without `ProfilerStep`s is one window of many iterations, where the next
iteration's forward (which reads the reduced gradients) would pass for later backward
compute: it gets no estimate (0).

`hideable_comm_ns`, the per-step breakdown's column (`breakdown.step_breakdown`), comes
from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations import autograd
from traceq.relations.collectives import (
    COMM_KERNEL,
    KERNEL_COLLECTIVE,
    normalize_collective,
    rank_collectives,
)

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

ACTIVATION_COLLECTIVES = ("allreduce", "reducescatter", "alltoall")
"""In forward, these carry activations (TP, SP, MoE): their neighbours depend on them."""

SCHEMA = {"step": pl.Int64, "hideable_comm_ns": pl.Int64}


def backward_bounds(trace: LoadedTrace, on: str) -> pl.DataFrame:
    """Per step, where its backward begins and ends (`step, backward_ns, backward_end_ns`):
    the first and last autograd node (`autograd::engine::evaluate_function: ...`) on the
    host; on a GPU rank, the first and last GPU activity those nodes launched. A trace
    without steps has one row with `step` null."""
    nodes = trace.ops.filter(autograd.is_frame())
    host = nodes.group_by("step").agg(
        pl.col("ts_ns").min().alias("backward_ns"), pl.col("end_ns").max().alias("backward_end_ns")
    )
    if on == "cpu" or host.height == 0:
        return host
    launched = trace.kernels.filter(pl.col("launch_ts_ns").is_not_null()).join(
        host, on="step", how="inner", nulls_equal=True
    )
    return (
        launched.filter(
            (pl.col("launch_ts_ns") >= pl.col("backward_ns"))
            & (pl.col("launch_ts_ns") <= pl.col("backward_end_ns"))
        )
        .group_by("step")
        .agg(
            pl.col("ts_ns").min().alias("backward_ns"),
            pl.col("end_ns").max().alias("backward_end_ns"),
        )
    )


def comm_kinds(trace: LoadedTrace) -> pl.DataFrame:
    """The rank's collectives as `step, ts_ns, end_ns, collective` (normalized names)."""
    kernels = trace.kernels.filter(pl.col("name").str.contains(COMM_KERNEL))
    if kernels.height:
        return kernels.select(
            "step",
            "ts_ns",
            "end_ns",
            normalize_collective(pl.col("name").str.extract(KERNEL_COLLECTIVE)).alias("collective"),
        )
    return rank_collectives(trace).select("step", "ts_ns", "end_ns", "collective")


def hideable_comm(trace: LoadedTrace, work: pl.DataFrame, on: str) -> pl.DataFrame:
    """Per step, the exposed communication that independent compute could hide
    (`step, hideable_comm_ns`), from `work` (`step, type, ts_ns, end_ns`, type COMM /
    COMP / MEM: `breakdown.typed_intervals`).

    Each stretch of exposed COMM (no COMP beside it) may be hidden by COMP with no COMM
    beside it, each nanosecond of compute hiding at most one of communication: in forward
    by compute earlier in forward (not for activation collectives, `ACTIVATION_COLLECTIVES`:
    those hide behind nothing), in backward by backward compute later than the stretch and
    before backward ends (not the gradients' producers before it, not the optimizer after
    it). A step without autograd nodes is all forward. Greedy in order (time order in
    forward, reverse time order in backward), the hidden total after the k-th stretch is
    A_k = min(A_{k−1} + e_k, C_k), so A = E + min(0, min_k(C_k − E_k)) with E the running
    exposed sum and C the running free compute: one pass per phase."""
    work = work.filter(pl.col("type").is_in(["COMM", "COMP"]))
    if work.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    bounds = backward_bounds(trace, on).select(
        pl.col("step").cast(pl.Int64), "backward_ns", "backward_end_ns"
    )
    kinds = comm_kinds(trace).join(bounds, on="step", how="left", nulls_equal=True)
    forward = pl.col("backward_ns").is_null() | (pl.col("ts_ns") < pl.col("backward_ns"))
    bound = kinds.filter(forward & pl.col("collective").is_in(ACTIVATION_COLLECTIVES))
    comm = (pl.col("type") == "COMM").cast(pl.Int64)
    comp = (pl.col("type") == "COMP").cast(pl.Int64)
    zero = pl.lit(0, pl.Int64)

    def edges(frame: pl.DataFrame, d_comm: pl.Expr, d_comp: pl.Expr, d_bound: pl.Expr):
        return [
            frame.select(
                pl.col("step").cast(pl.Int64),
                pl.col("ts_ns").alias("t"),
                d_comm.alias("d_comm"),
                d_comp.alias("d_comp"),
                d_bound.alias("d_bound"),
            ),
            frame.select(
                pl.col("step").cast(pl.Int64),
                pl.col("end_ns").alias("t"),
                (-d_comm).alias("d_comm"),
                (-d_comp).alias("d_comp"),
                (-d_bound).alias("d_bound"),
            ),
        ]

    marks = pl.concat(
        [
            bounds.select("step", pl.col("backward_ns").alias("t")),
            bounds.select("step", pl.col("backward_end_ns").alias("t")),
        ]
    ).select("step", "t", zero.alias("d_comm"), zero.alias("d_comp"), zero.alias("d_bound"))
    all_edges = pl.concat(
        [
            *edges(work, comm, comp, zero),
            *edges(bound, zero, zero, pl.lit(1, pl.Int64)),
            marks,
        ],
        how="vertical_relaxed",
    )
    segments = (
        all_edges.group_by("step", "t")
        .agg(pl.col("d_comm", "d_comp", "d_bound").sum())
        .sort("step", "t")
        .with_columns(
            pl.col("d_comm").cum_sum().over("step").alias("comm"),
            pl.col("d_comp").cum_sum().over("step").alias("comp"),
            pl.col("d_bound").cum_sum().over("step").alias("bound"),
            (pl.col("t").shift(-1).over("step") - pl.col("t")).fill_null(0).alias("len"),
        )
        .join(bounds, on="step", how="left", nulls_equal=True)
        .with_columns(
            (pl.col("t") >= pl.col("backward_ns")).fill_null(False).alias("backward"),
            (pl.col("t") >= pl.col("backward_end_ns")).fill_null(False).alias("after"),
        )
        .with_columns(
            pl.when((pl.col("comm") > 0) & (pl.col("comp") == 0) & (pl.col("bound") == 0))
            .then("len")
            .otherwise(0)
            .alias("e"),
            # Compute after backward (the optimizer) consumes the reduced gradients.
            pl.when((pl.col("comp") > 0) & (pl.col("comm") == 0) & ~pl.col("after"))
            .then("len")
            .otherwise(0)
            .alias("f"),
        )
    )
    phase = ["step", "backward"]
    order = pl.when(pl.col("backward")).then(-pl.col("t")).otherwise(pl.col("t"))
    phases = (
        segments.sort(pl.col("step"), order)
        .with_columns(
            pl.col("e").cum_sum().over(phase).alias("E"),
            pl.col("f").cum_sum().over(phase).alias("C"),
        )
        .group_by(phase)
        .agg(
            (
                pl.col("E").max() + pl.min_horizontal(pl.lit(0), (pl.col("C") - pl.col("E")).min())
            ).alias("hidden")
        )
    )
    # A window without steps holds many iterations: "later backward compute" would take in
    # the next iterations' forward, which reads the reduced gradients. No estimate there.
    return (
        phases.filter(pl.col("step").is_not_null())
        .group_by("step")
        .agg(pl.col("hidden").sum().alias("hideable_comm_ns"))
        .cast(SCHEMA)
    )
