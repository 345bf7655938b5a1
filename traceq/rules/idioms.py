"""What the idiom rules (TQ107 unfused-norm, TQ108 unfused-rotary) share: data flow with
dtype casts stepped over, the bytes an op moves as the trace records it, and the saving of
replacing a written-out idiom by one fused kernel (`fused_saving`, `model_saving`: the
performance model's `perf.savings.fusion_saving`, which TQ106 and TQ109 use too).

Casts sit inside the idioms as models write them (HF's RMSNorm upcasts to fp32 before the
statistics and casts back before the weight), and where a cast returns its input unchanged
(`x.to(torch.float32)` on an fp32 model) data flow may link the reader to the cast or past
it. Matching over `through_casts` edges makes both read the same: the op that made the
value, with the casts in between listed beside it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import polars as pl

from traceq.perf.savings import fusion_saving, replaced
from traceq.perf.traffic import ITEMSIZE, numel
from traceq.rules.op_classes import ATEN_BASE

if TYPE_CHECKING:
    from traceq.rules.base import Context

#: c10 `ScalarType` codes (what `aten::to` records as its dtype argument) -> bytes.
SCALAR_TYPE_ITEMSIZE: dict[str, int] = {
    "0": 1,  # uint8
    "1": 1,  # int8
    "2": 2,  # int16
    "3": 4,  # int32
    "4": 8,  # int64
    "5": 2,  # float16
    "6": 4,  # float32
    "7": 8,  # float64
    "11": 1,  # bool
    "15": 2,  # bfloat16
}

#: c10 `ScalarType` codes -> the profiler's `Input type` spelling, for messages.
SCALAR_TYPE_NAME: dict[str, str] = {"5": "fp16", "6": "fp32", "7": "fp64", "15": "bf16"}

#: Profiler dtype strings -> short names for messages.
DTYPE_NAME: dict[str, str] = {
    "float": "fp32",
    "double": "fp64",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
}

#: Columns of `fusion_ops` an idiom finding's byte count reads.
BYTE_COLUMNS = ("event", "name", "shapes", "input_types", "concrete_inputs", "output_shape")


def through_casts(ops: pl.DataFrame, edges: pl.DataFrame, max_hops: int = 2) -> pl.DataFrame:
    """`edges` (already `through_views`) with dtype casts stepped over: `x -> to -> pow`
    also reads as `x -> pow` with `casts` [to]. Every edge keeps its own row (an edge out
    of a cast stays too); `casts` lists the casts passed, producer side first, and
    `confidence` is the weakest edge along the way."""
    casts = ops.filter((pl.col("role") == "cast") & (pl.col("tensor_inputs") <= 1)).select("event")
    cols = ["producer", "consumer", "input_index", "shape", "confidence"]
    current = edges.select(cols).with_columns(pl.lit([], dtype=pl.List(pl.Int64)).alias("casts"))
    feed = current.join(casts, left_on="consumer", right_on="event", how="semi").select(
        pl.col("consumer").alias("_cast"),
        pl.col("producer").alias("_source"),
        pl.col("confidence").alias("_source_confidence"),
        pl.col("casts").alias("_source_casts"),
    )
    result = [current]
    frontier = current
    for _ in range(max_hops):
        stepped = frontier.join(feed, left_on="producer", right_on="_cast").select(
            pl.col("_source").alias("producer"),
            "consumer",
            "input_index",
            "shape",
            pl.min_horizontal("confidence", "_source_confidence").alias("confidence"),
            pl.concat_list("_source_casts", pl.col("producer").cast(pl.Int64), "casts").alias(
                "casts"
            ),
        )
        if stepped.height == 0:
            break
        result.append(stepped)
        frontier = stepped
    return pl.concat(result).unique(
        ["producer", "consumer", "input_index", "casts"], maintain_order=True
    )


def output_itemsize(row: Mapping[str, Any]) -> int:
    """Bytes per element of what an op returns: a cast's target dtype, else the widest of
    its tensor inputs (type promotion; 0-d scalars do not promote)."""
    base = row["name"].split("::")[-1].rstrip("_")
    concrete = row.get("concrete_inputs") or []
    if base == "to" and len(concrete) > 1 and concrete[1] in SCALAR_TYPE_ITEMSIZE:
        return SCALAR_TYPE_ITEMSIZE[concrete[1]]
    sizes = [size for size, _ in _tensor_inputs(row)]
    return max(sizes) if sizes else 4


def op_bytes(row: Mapping[str, Any]) -> int:
    """Bytes one op moves if every tensor input is read once and its output written once,
    from its recorded `Input Dims` and `Input type` (0-d scalars move nothing)."""
    read = sum(size * math.prod(shape) for size, shape in _tensor_inputs(row))
    out = row.get("output_shape")
    written = math.prod(out) * output_itemsize(row) if out is not None else 0
    return read + written


def tensor_bytes(shape: Iterable[int] | None, dtype: str | None) -> int:
    """Bytes of one tensor of `shape` in the profiler's `dtype` (4 per element if unknown)."""
    return math.prod(shape) * ITEMSIZE.get(dtype or "", 4) if shape is not None else 0


def _tensor_inputs(row: Mapping[str, Any]) -> list[tuple[int, list[int]]]:
    shapes = row.get("shapes") or []
    types = row.get("input_types") or []
    found = []
    for shape, dtype in zip(shapes, types, strict=False):
        if shape and dtype in ITEMSIZE:
            found.append((ITEMSIZE[dtype], shape))
    return found


def fused_saving(
    ctx: Context,
    events: Iterable[int],
    measured_us: float,
    unfused_bytes: int,
    fused_bytes: int,
    launches: int,
) -> tuple[float, str]:
    """What one fused kernel saves over the ops `events` it replaces, and how
    (`model_saving`): the bytes it no longer moves, plus every launch but its own, at most
    their measured time less its own `fused_bytes` at the same bandwidth."""
    removed = max(0, unfused_bytes - fused_bytes)
    return model_saving(ctx, events, measured_us, removed, max(0, launches - 1), fused_bytes)


def site_saving(
    ctx: Context,
    members: list[dict[str, Any]],
    measured_us: float,
    unfused_bytes: int,
    fused_bytes: int,
    cpu_launches: int,
) -> tuple[float, str, int] | None:
    """`fused_saving` of one site whose ops (`members`: rows with `event` and
    `kernel_events`) one kernel replaces; the launches are the kernels they ran on a GPU,
    `cpu_launches` on the CPU (where an op is a dispatch, not a kernel). Returns the saving,
    its model's text and the launches; None when the saving is under the rule's
    `min_saving_us`."""
    launches = cpu_launches
    if ctx.device.kind == "gpu":
        launches = sum(len(r["kernel_events"]) for r in members)
    events = [r["event"] for r in members]
    saving, model = fused_saving(ctx, events, measured_us, unfused_bytes, fused_bytes, launches)
    return None if saving < ctx.options["min_saving_us"] else (saving, model, launches)


def model_saving(
    ctx: Context,
    events: Iterable[int],
    measured_us: float,
    removed_bytes: float,
    removed_launches: int,
    kept_bytes: float = 0.0,
) -> tuple[float, str]:
    """`perf.savings.fusion_saving` for the op calls `events` of this trace: the bytes a
    fusion removes at the bandwidth those ops' kernels achieved (their bytes from the
    trace's roofline, `trace.roofline`, over their time), plus the launches it removes at
    the device's launch cost, at most `measured_us` (their time as the rule counts it).
    Returns the saving and the sentence naming the numbers it used."""
    frame = ctx.cached("perf.roofline", lambda: ctx.trace.roofline)
    kernels = replaced(frame, events, measured_us)
    return fusion_saving(removed_bytes, kernels, ctx.device, removed_launches, kept_bytes)


def byte_rows(ops: pl.DataFrame, events: Iterable[int]) -> dict[int, dict[str, Any]]:
    """The `BYTE_COLUMNS` of `events`, by event id (what `op_bytes` reads)."""
    wanted = pl.Series("event", sorted(set(events)), dtype=pl.Int64)
    rows = ops.filter(pl.col("event").is_in(wanted.implode())).select(BYTE_COLUMNS)
    return {row["event"]: row for row in rows.iter_rows(named=True)}


def dtype_text(dtype: str | None) -> str:
    return DTYPE_NAME.get(dtype or "", dtype or "?")


# -- following data flow (TQ106, TQ109) ----------------------------------------------------


def chain_ops(ops: pl.DataFrame) -> pl.DataFrame:
    """Per op: its aten base name, role, output elements and rank: what `walk` follows."""
    return ops.select(
        "event",
        ATEN_BASE.alias("_base"),
        "role",
        numel(pl.col("output_shape")).alias("_numel"),
        pl.col("output_shape").list.len().alias("_rank"),
    )


def walk(
    starts: pl.DataFrame,
    ops: pl.DataFrame,
    edges: pl.DataFrame,
    through: tuple[str, ...],
    targets: pl.DataFrame,
    max_hops: int,
    direction: str = "back",
) -> pl.DataFrame:
    """From each `start` (with `size`: elements of the tensor followed) along the data flow
    through ops named in `through` whose output has `size` elements, to an op of `targets`
    (`event`) with an output of that size: up to what made it (`direction="back"`), or down
    to what reads it (`"forward"`). One row per start that reaches one: `start`, `target`,
    `path` (the ops passed, nearest the start first; event ids) and `reads` (the input index
    each op of `path` + [start] read the followed tensor at, target side first). The nearest
    target wins (the lowest event id among the nearest)."""
    info = chain_ops(ops)
    here, there = ("consumer", "producer") if direction == "back" else ("producer", "consumer")
    links = edges.select(pl.col(here).alias("_at"), pl.col(there).alias("_next"), "input_index")
    passable = info.filter(pl.col("_base").is_in(list(through))).select(
        pl.col("event").alias("_next"), pl.col("_numel").alias("size")
    )
    target_ids = targets.select(pl.col("event").alias("_next"))
    sizes = info.select(pl.col("event").alias("_next"), pl.col("_numel").alias("_next_numel"))
    frontier = starts.select(
        "start",
        "size",
        pl.col("start").alias("_at"),
        pl.lit([], dtype=pl.List(pl.Int64)).alias("path"),
        pl.lit([], dtype=pl.List(pl.Int64)).alias("reads"),
    )
    found = []
    for _ in range(max_hops + 1):
        if frontier.height == 0:
            break
        step = (
            frontier.join(links, on="_at")
            .join(sizes, on="_next")
            .filter(~pl.col("path").list.contains(pl.col("_next")))
        )
        # the input index at which the tensor entered the consumer of this hop
        step = step.with_columns(
            pl.concat_list(
                pl.col("reads"), pl.col("input_index").fill_null(-1).cast(pl.Int64)
            ).alias("reads")
        )
        # going back, the target wrote the tensor followed; going forward it reads it
        hit = step.join(target_ids, on="_next", how="semi")
        if direction == "back":
            hit = hit.filter(pl.col("_next_numel") == pl.col("size"))
        hit = hit.select("start", pl.col("_next").alias("target"), "path", "reads")
        found.append(hit)
        frontier = step.join(passable, on=["_next", "size"], how="semi").select(
            "start",
            "size",
            pl.col("_next").alias("_at"),
            pl.concat_list("path", pl.col("_next")).alias("path"),
            "reads",
        )
    if not found:
        return pl.DataFrame(
            schema={
                "start": pl.Int64,
                "target": pl.Int64,
                "path": pl.List(pl.Int64),
                "reads": pl.List(pl.Int64),
            }
        )
    return (
        pl.concat(found)
        .with_columns(pl.col("path").list.len().alias("_hops"))
        .sort("start", "_hops", "target")
        .unique("start", keep="first", maintain_order=True)
        .drop("_hops")
    )


def computes(ctx: Context, events: list[int], may_alias: tuple[str, ...]) -> set[int]:
    """Of `events`, those that wrote a tensor of their own: every op not in `may_alias`,
    and those that ran a child op (`aten::to` -> `_to_copy`, `dropout` -> `native_dropout`);
    a cast to its own dtype or dropout in eval returns its input."""
    rows = ctx.trace.ops.select(pl.col("event").cast(pl.Int64), "name", "parent")
    wanted = rows.filter(pl.col("event").is_in(events))
    alias = wanted.filter(ATEN_BASE.is_in(list(may_alias)))["event"].to_list()
    parents = set(
        rows.filter(pl.col("parent").cast(pl.Int64).is_in(alias))["parent"].cast(pl.Int64)
    )
    return {e for e in wanted["event"].to_list() if e not in alias or e in parents}
