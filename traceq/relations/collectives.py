"""Collectives of one rank, and the same collective matched across the ranks of a job.

One rank's side (`rank_collectives`) is a map step: it turns a loaded trace into one
compact row per collective call — what it was (Kineto's `record_param_comms` arguments:
collective name, process group, sequence number, message sizes, dtype, group size, or
what the NCCL/RCCL kernel's name says when the arguments are missing), where it ran (the
GPU kernel, or the CPU op for gloo) and when. The job's side (`match_collectives`) is a
reduce over those rows: each collective is keyed by its process group and sequence
number, its ranks' clocks aligned, and given per-rank wait (the time a rank spent in it
before the last rank arrived), the last-arriving rank, and algorithm / bus bandwidth by
NCCL's formulas (nccl-tests `doc/PERFORMANCE.md`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.intervals import union_ns

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

# NCCL/RCCL kernels by today's names (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`, NCCL ≥ 2.19)
# and the old ones (`ncclKernel_AllReduce_RING_LL_Sum_float(...)`).
COMM_KERNEL = r"^(?:nccl|rccl)(?:Dev)?Kernel_"
COMM_OP = r"^(?:record_param_comms|(?:nccl|gloo|mpi|ucc):\w+|c10d::\w+)$"
BACKEND_RANGE = r"^(?:gloo|mpi|ucc):\w+$"
KERNEL_COLLECTIVE = r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)"
ALGORITHMS = (
    "COLLNET_DIRECT",
    "COLLNET_CHAIN",
    "NVLS_TREE",
    "COLLNET",
    "NVLS",
    "TREE",
    "RING",
    "PAT",
)
PROTOCOLS = ("LL128", "SIMPLE", "LL")
KERNEL_DTYPES = (
    "float", "half", "bfloat16", "double", "int8_t", "uint8_t", "int32_t", "uint32_t",
    "int64_t", "uint64_t", "f32", "f16", "bf16", "f64", "i8", "u8", "i32", "u32", "i64",
    "u64", "f8e4m3", "f8e5m2",
)  # fmt: skip

# Element sizes by the `dtype` Kineto writes (c10 ScalarType names) or the kernel's suffix.
DTYPE_BYTES = {
    "float": 4, "float32": 4, "f32": 4, "double": 8, "float64": 8, "f64": 8,
    "half": 2, "float16": 2, "f16": 2, "bfloat16": 2, "bf16": 2,
    "int": 4, "int32": 4, "i32": 4, "u32": 4, "uint32": 4, "long": 8, "int64": 8,
    "i64": 8, "u64": 8, "uint64": 8, "short": 2, "int16": 2,
    "byte": 1, "char": 1, "int8": 1, "int8_t": 1, "uint8": 1, "uint8_t": 1, "i8": 1, "u8": 1,
    "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "f8e4m3": 1, "f8e5m2": 1,
}  # fmt: skip

# Bus bandwidth = algbw × factor(n), algbw = S / t with S the total message size
# (allgather: output, reducescatter: input): NCCL's doc/PERFORMANCE.md. A ring moves
# (n-1)/n of S per rank each way; allreduce is a reducescatter plus an allgather.
RING_COLLECTIVES = {"allreduce": 2.0, "reducescatter": 1.0, "allgather": 1.0, "alltoall": 1.0}
POINT_COLLECTIVES = ("broadcast", "reduce", "sendrecv", "send", "recv")

ARG_FIELDS = {
    "Collective name": "collective",
    "Process Group Name": "pg",
    "Process Group Description": "pg_desc",
    "Process Group Ranks": "pg_ranks",
    "Group size": "group_size",
    "In msg nelems": "in_nelems",
    "Out msg nelems": "out_nelems",
    "dtype": "dtype",
    "Seq": "seq_arg",
}

COLUMNS = {
    "rank": pl.Int64,
    "event": pl.Int64,
    "name": pl.String,
    "on": pl.String,
    "step": pl.Int64,
    "ts_ns": pl.Int64,
    "end_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "collective": pl.String,
    "pg": pl.String,
    "pg_ranks": pl.String,
    "group_size": pl.Int64,
    "dtype": pl.String,
    "in_nelems": pl.Int64,
    "out_nelems": pl.Int64,
    "bytes": pl.Int64,
    "algorithm": pl.String,
    "protocol": pl.String,
    "seq": pl.Int64,
    "seq_source": pl.String,
}


def normalize_collective(name: pl.Expr) -> pl.Expr:
    """`all_reduce`, `AllReduce`, `allreduce_coalesced`, `_allgather_base` -> `allreduce`,
    `allgather`: one spelling for the busbw table and for matching."""
    flat = name.str.to_lowercase().str.replace_all(r"[^a-z]", "")
    return (
        flat.str.replace(r"^(nccl|gloo|c10d)", "")
        .str.replace(r"(intotensor|tensor|coalesced|base|single)+$", "")
        .str.replace(r"^(allgather|alltoall|reducescatter|gather|scatter)v$", "$1")
    )


def rank_collectives(trace: LoadedTrace, rank: int | None = None) -> pl.DataFrame:
    """One row per collective this rank ran (see `COLUMNS`), in time order.

    GPU ranks: one row per NCCL/RCCL kernel, with the kernel's own collective arguments
    (recent Kineto copies them onto the kernel) or those of the `record_param_comms` op
    that launched it, else what the kernel name says. CPU ranks (gloo): one row per
    outermost communication op (`record_param_comms` or `gloo:*` / `c10d::*`).
    """
    kernels = trace.kernels.filter(
        (pl.col("kind") == "kernel") & pl.col("name").str.contains(COMM_KERNEL)
    )
    rows = _gpu_rows(trace, kernels) if kernels.height else _cpu_rows(trace)
    return _finish(rows, rank)


def _args(trace: LoadedTrace, frame: pl.DataFrame) -> pl.DataFrame:
    """The collective arguments (`ARG_FIELDS`) of `frame`'s events, row-aligned."""
    from traceq.loader.frames import args_frame, as_int

    args = trace.with_args(frame.select("event"))["args"]
    raw = args_frame(args, ARG_FIELDS)
    ints = ("group_size", "in_nelems", "out_nelems", "seq_arg")
    return raw.with_columns(as_int(c).alias(c) for c in ints)


def _gpu_rows(trace: LoadedTrace, kernels: pl.DataFrame) -> pl.DataFrame:
    own = _args(trace, kernels)
    rows = pl.concat(
        [kernels.select("event", "name", "step", "ts_ns", "end_ns", "dur_ns", "op_event"), own],
        how="horizontal",
    )
    # The launching op's arguments fill what the kernel lacks (older Kineto).
    ops = trace.ops.filter(pl.col("name") == "record_param_comms")
    if ops.height and rows["collective"].null_count():
        op_args = pl.concat(
            [ops.select(pl.col("event").alias("op_event"), "parent"), _args(trace, ops)],
            how="horizontal",
        )
        # The kernel may be launched under record_param_comms or under its parent op.
        by_op = op_args.drop("parent")
        by_parent = (
            op_args.drop("op_event").rename({"parent": "op_event"}).unique("op_event", keep="first")
        )
        filler = pl.concat([by_op, by_parent], how="vertical_relaxed")
        filler = filler.cast({"op_event": pl.Int64}).unique("op_event", keep="first")
        rows = rows.cast({"op_event": pl.Int64})
        rows = rows.join(filler, on="op_event", how="left", suffix="_op", maintain_order="left")
        rows = rows.with_columns(pl.coalesce(c, f"{c}_op").alias(c) for c in ARG_FIELDS.values())
        rows = rows.drop(pl.selectors.ends_with("_op"))
    name = pl.col("name")
    named = name.str.extract(KERNEL_COLLECTIVE)
    return rows.with_columns(
        pl.lit("gpu").alias("on"),
        pl.coalesce("collective", named).alias("collective"),
        pl.coalesce("dtype", name.str.extract(_name_part(KERNEL_DTYPES))).alias("dtype"),
        name.str.extract(_name_part(ALGORITHMS)).alias("algorithm"),
        name.str.extract(_name_part(PROTOCOLS)).alias("protocol"),
    )


def _name_part(words: tuple[str, ...]) -> str:
    """A regex for one of `words` as a `_`-delimited part of a kernel name (longest first,
    so `NVLS_TREE` wins over `NVLS`, `LL128` over `LL`)."""
    ordered = sorted(words, key=len, reverse=True)
    return r"_(" + "|".join(ordered) + r")(?:_|\(|$)"


def host_ranges(trace: LoadedTrace) -> pl.DataFrame:
    """CPU ops and `record_function` ranges (gloo writes its collectives as ranges on its
    worker threads), without the `ProfilerStep` ranges themselves."""
    columns = ["event", "name", "pid", "tid", "ts_ns", "end_ns", "dur_ns", "step"]
    annotations = trace.annotations.filter(pl.col("kind") == "cpu").join(
        trace.steps.select("event"), on="event", how="anti"
    )
    frames = [trace.ops.select(columns), annotations.select(columns)]
    return pl.concat(frames, how="vertical_relaxed")


def _cpu_rows(trace: LoadedTrace) -> pl.DataFrame:
    """The backend's own ranges (`gloo:all_reduce` on its worker thread: the collective
    itself), else the ops that enqueue collectives (`record_param_comms`, `c10d::*`)."""
    ranges = host_ranges(trace)
    comm = ranges.filter(pl.col("name").str.contains(BACKEND_RANGE))
    if comm.height == 0:
        comm = ranges.filter(pl.col("name").str.contains(COMM_OP))
    if comm.height == 0:
        return pl.DataFrame()
    comm = outermost(comm)
    rows = pl.concat([comm, _args(trace, comm)], how="horizontal")
    named = pl.col("name").str.extract(r"^\w+:+(\w+)$")
    return rows.with_columns(
        pl.lit("cpu").alias("on"),
        pl.coalesce("collective", named).alias("collective"),
        pl.lit(None, pl.String).alias("algorithm"),
        pl.lit(None, pl.String).alias("protocol"),
    )


def outermost(ranges: pl.DataFrame) -> pl.DataFrame:
    """Ranges not nested in another range of the same thread (host ranges nest by time)."""
    return (
        ranges.sort("pid", "tid", "ts_ns", "end_ns", descending=[False, False, False, True])
        .with_columns(pl.col("end_ns").cum_max().shift(1).over("pid", "tid").alias("_reach"))
        .filter(pl.col("_reach").is_null() | (pl.col("ts_ns") >= pl.col("_reach")))
        .drop("_reach")
    )


def _finish(rows: pl.DataFrame, rank: int | None) -> pl.DataFrame:
    if rows.height == 0:
        return pl.DataFrame(schema=COLUMNS)
    size = (
        pl.col("dtype")
        .str.to_lowercase()
        .replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)
    )
    nelems = pl.max_horizontal("in_nelems", "out_nelems")
    rows = rows.sort("ts_ns", "event").with_columns(
        pl.lit(rank, pl.Int64).alias("rank"),
        normalize_collective(pl.col("collective")).alias("collective"),
        pl.col("pg").fill_null("0"),
        (nelems * size).alias("bytes"),
    )
    # Sequence: Kineto's `Seq` when written; else the call's ordinal in its process group
    # within its step (profiling windows of ranks start at the same step, not the same call).
    ordinal = pl.int_range(pl.len()).over("pg", "step")
    rows = rows.with_columns(
        pl.coalesce("seq_arg", ordinal).alias("seq"),
        pl.when(pl.col("seq_arg").is_not_null())
        .then(pl.lit("Seq"))
        .otherwise(pl.lit("ordinal in step"))
        .alias("seq_source"),
    )
    return rows.select(pl.col(c).cast(t) for c, t in COLUMNS.items())


def busbw_factor(collective: pl.Expr, n: pl.Expr) -> pl.Expr:
    """NCCL's bus-bandwidth factor for `collective` over `n` ranks (null when unknown)."""
    expr = pl.when(collective.is_in(POINT_COLLECTIVES)).then(pl.lit(1.0))
    for name, times in RING_COLLECTIVES.items():
        expr = expr.when(collective == name).then(times * (n - 1) / n)
    return expr.otherwise(pl.lit(None, pl.Float64))


def clock_offsets(calls: pl.DataFrame, reference: int) -> pl.DataFrame:
    """Per rank, the clock offset to `reference`'s clock: the median difference of the ends
    of the collectives both entered (every rank leaves a collective together, whatever its
    arrival), with the spread (median absolute deviation) and the number of collectives
    used. Ranks that share no collective with the reference get offset 0, `matched` 0."""
    key = ["pg", "step", "seq", "collective"]
    ref = calls.filter(pl.col("rank") == reference).select(*key, pl.col("end_ns").alias("_ref_end"))
    diffs = calls.join(ref, on=key, how="inner", nulls_equal=True).with_columns(
        (pl.col("end_ns") - pl.col("_ref_end")).alias("_d")
    )
    stats = diffs.group_by("rank").agg(
        pl.col("_d").median().round().cast(pl.Int64).alias("offset_ns"),
        pl.len().alias("matched"),
        pl.col("_d"),
    )
    stats = stats.with_columns(
        (
            pl.col("_d")
            .list.eval((pl.element() - pl.element().median()).abs().median())
            .list.first()
        ).alias("spread_ns")
    ).drop("_d")
    ranks = calls.select("rank").unique()
    return (
        ranks.join(stats, on="rank", how="left")
        .with_columns(pl.col("offset_ns").fill_null(0), pl.col("matched").fill_null(0))
        .sort("rank")
    )


def match_collectives(calls: pl.DataFrame, offsets: pl.DataFrame | None = None) -> pl.DataFrame:
    """`calls` (rows of `rank_collectives` from every rank) matched across ranks: each row
    gains `instance` (one id per collective of the job), the aligned `start_ns`/`finish_ns`,
    `wait_ns` (time in the collective before the last rank arrived), `ranks_seen`,
    `last_rank` and the collective's `transfer_ns`, `algbw_gbs`, `busbw_gbs`."""
    if offsets is not None and offsets.height:
        calls = calls.join(offsets.select("rank", "offset_ns"), on="rank", how="left")
        calls = calls.with_columns(pl.col("offset_ns").fill_null(0))
    else:
        calls = calls.with_columns(pl.lit(0, pl.Int64).alias("offset_ns"))
    key = ["pg", "step", "seq", "collective"]
    calls = calls.with_columns(
        (pl.col("ts_ns") - pl.col("offset_ns")).alias("start_ns"),
        (pl.col("end_ns") - pl.col("offset_ns")).alias("finish_ns"),
    )
    over = key
    last_start = pl.col("start_ns").max().over(over)
    calls = calls.with_columns(
        pl.struct(key).rank("dense").cast(pl.Int64).alias("instance"),
        pl.col("rank").n_unique().over(over).alias("ranks_seen"),
        pl.col("rank").sort_by("start_ns").last().over(over).alias("last_rank"),
        last_start.alias("last_start_ns"),
    ).with_columns(
        pl.min_horizontal(
            (pl.col("last_start_ns") - pl.col("start_ns")).clip(lower_bound=0), pl.col("dur_ns")
        ).alias("wait_ns"),
        (pl.col("finish_ns") - pl.col("last_start_ns"))
        .clip(lower_bound=1)
        .median()
        .over(over)
        .alias("transfer_ns"),
    )
    n = pl.coalesce("group_size", "ranks_seen").cast(pl.Float64)
    algbw = pl.col("bytes") / pl.col("transfer_ns")  # bytes/ns = GB/s
    return calls.with_columns(
        algbw.alias("algbw_gbs"),
        (algbw * busbw_factor(pl.col("collective"), n)).alias("busbw_gbs"),
    ).sort("instance", "rank")


def step_waits(matched: pl.DataFrame) -> pl.DataFrame:
    """Per rank, step and the rank it waited for (`last_rank`): the wall time spent waiting
    (`wait_ns`, the union of its calls' waits: two buckets waiting for the same late rank at
    once count once) and the calls it waited in."""
    waits = matched.filter(
        (pl.col("wait_ns") > 0) & (pl.col("rank") != pl.col("last_rank"))
    ).with_columns(
        pl.col("start_ns").alias("ts_ns"), (pl.col("start_ns") + pl.col("wait_ns")).alias("end_ns")
    )
    by = ["rank", "step", "last_rank"]
    calls = waits.group_by(by).agg(pl.col("instance"), pl.col("seq"))
    return (
        union_ns(waits, by)
        .rename({"union_ns": "wait_ns"})
        .join(calls, on=by, how="left", nulls_equal=True)
    )
