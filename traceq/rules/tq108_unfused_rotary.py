"""TQ108 unfused-rotary: a rotary position embedding written out as pointwise ops,
`q * cos + rotate_half(q) * sin`, for q and k.

Matched on data flow (views and casts stepped over): `rotate_half(x)` is
`cat(-x[..., d/2:], x[..., :d/2])` — a `neg` reading x through a slice, and a `cat` reading
the `neg` and x through the other slice; a `mul` of the `cat` (by sin) and a `mul` of x
itself (by cos), same shape, both read by one `add`. HF's `apply_rotary_pos_emb` runs it
for q and for k one after the other: the ropes of one attention call (same step, model
call and module) are one finding, as one fused kernel applies both.

Every op the finding holds is explained (`traceq.rules.explained`): TQ104 no longer
reports its `mul → mul → add` fragments.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.details import details, located, mib, shape_text
from traceq.rules.finding import Finding
from traceq.rules.idioms import (
    byte_rows,
    dtype_text,
    op_bytes,
    site_saving,
    tensor_bytes,
    through_casts,
)
from traceq.rules.op_classes import ATEN_BASE
from traceq.rules.op_groups import fusion_edges, fusion_ops

SCHEMA = {
    "x": pl.Int64,
    "mul_cos": pl.Int64,
    "neg": pl.Int64,
    "cat": pl.Int64,
    "mul_sin": pl.Int64,
    "add": pl.Int64,
    "casts": pl.List(pl.Int64),
    "confidence": pl.Float64,
}


def rotary_embeddings(
    ops: pl.DataFrame, edges: pl.DataFrame, min_confidence: float = 0.0
) -> pl.DataFrame:
    """One row per written-out rotary embedding of one tensor (`SCHEMA`): `x` (the op whose
    output is rotated, views and casts stepped over; q's or k's projection), the five ops
    of `x * cos + rotate_half(x) * sin`, the casts among them, and the weakest edge."""
    trusted = edges.filter(pl.col("confidence") >= min_confidence)
    flow = through_casts(ops, trusted)
    base = ATEN_BASE
    two = pl.col("tensor_inputs") == 2
    negs = ops.filter((base == "neg") & (pl.col("tensor_inputs") == 1)).select("event")
    cats = ops.filter(base == "cat").select("event", pl.col("output_shape").alias("_shape"))
    muls = ops.filter((base == "mul") & two & ~pl.col("generated")).select("event")
    adds = ops.filter((base == "add") & two & ~pl.col("generated")).select(
        "event", pl.col("output_shape").alias("_add_shape")
    )

    def reads(consumers: pl.DataFrame, producer: str, consumer: str) -> pl.DataFrame:
        return flow.join(consumers.select(pl.col("event").alias("consumer")), on="consumer").select(
            pl.col("producer").alias(producer),
            pl.col("consumer").alias(consumer),
            pl.col("casts").alias(f"_{consumer}_casts"),
            pl.col("confidence").alias(f"_{consumer}_conf"),
            pl.col("shape").alias(f"_{consumer}_in"),
        )

    found = (
        reads(negs, "x", "neg")
        .join(reads(cats, "neg", "cat"), on="neg")
        .join(
            reads(cats, "x", "cat").rename(
                {"_cat_casts": "_half_casts", "_cat_conf": "_half_conf", "_cat_in": "_half_in"}
            ),
            on=["x", "cat"],
        )
        .join(cats.rename({"event": "cat"}), on="cat")
        .join(reads(muls, "cat", "mul_sin"), on="cat")
        .join(reads(adds, "mul_sin", "add"), on="mul_sin")
        .join(adds.rename({"event": "add"}), on="add")
        .join(
            reads(adds, "mul_cos", "add")
            .join(muls.select(pl.col("event").alias("mul_cos")), on="mul_cos", how="semi")
            .rename({"_add_casts": "_add2_casts", "_add_conf": "_add2_conf", "_add_in": "_a2"}),
            on="add",
        )
        .filter(pl.col("mul_cos") != pl.col("mul_sin"))
        .join(reads(muls, "x", "mul_cos"), on=["x", "mul_cos"])
        .filter(
            (pl.col("_shape") == pl.col("_add_shape"))
            & (pl.col("_mul_cos_in") == pl.col("_shape"))
            & (pl.col("_neg_in").list.last() * 2 == pl.col("_shape").list.last())
        )
    )
    if found.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    casts = [c for c in found.columns if c.endswith("_casts")]
    confs = [c for c in found.columns if c.endswith("_conf")]
    return (
        found.select(
            "x",
            "mul_cos",
            "neg",
            "cat",
            "mul_sin",
            "add",
            pl.concat_list(casts).list.unique().list.sort().alias("casts"),
            pl.min_horizontal(confs).alias("confidence"),
        )
        # a cast of x read as x too: x is the value, the cast the rope's
        .sort(pl.col("casts").list.len(), descending=True, maintain_order=True)
        .unique("add", keep="first")
        .sort("add")
        .cast(SCHEMA)  # type: ignore[arg-type]
    )


def rotary_calls(ops: pl.DataFrame, ropes: pl.DataFrame) -> pl.DataFrame:
    """`ropes` gathered per attention call: consecutive pairs of the ropes of one step,
    model call and module (q's and k's), one row each: `ropes` (their `add`s), `ops` (all
    their ops and casts), `tensors` (how many were rotated)."""
    where = ops.select(
        pl.col("event").alias("add"),
        "step",
        "call",
        "module",
    )
    members = pl.concat_list("mul_cos", "neg", "cat", "mul_sin", "add", "casts")
    keyed = ropes.join(where, on="add", how="left").with_columns(
        # no module recorded: each rope is its own call (nothing says which two belong)
        pl.when(pl.col("module").is_null())
        .then(pl.col("add").cast(pl.String))
        .otherwise(pl.col("module"))
        .alias("_site")
    )
    # HF rotates q, then k: consecutive ropes of one site pair up (a module that runs
    # several attention calls, or none recorded per layer, still gives one per call)
    site = ["step", "call", "_site"]
    keyed = keyed.sort("add").with_columns((pl.int_range(pl.len()).over(site) // 2).alias("_pair"))
    return (
        keyed.group_by(*site, "_pair", maintain_order=True)
        .agg(
            pl.col("add").alias("ropes"),
            members.list.explode().unique().sort().alias("ops"),
            pl.len().alias("tensors"),
            pl.col("confidence").min(),
        )
        .drop("_site", "_pair")
    )


DEFAULTS = {"min_confidence": 0.4, "min_saving_us": 0.0}

FIX = (
    "Apply the rotary embedding to q and k in one kernel: Liger's "
    "`liger_kernel.transformers.rope.liger_rotary_pos_emb(q, k, cos, sin)` (liger-kernel "
    "≥ 0.3; `apply_liger_kernel_to_llama(rope=True)` / `apply_liger_kernel_to_qwen2()` patch "
    "HF models), flash-attn's `flash_attn.layers.rotary.apply_rotary_emb(x, cos, sin)` "
    "(cos/sin [seqlen, rotary_dim / 2]), vLLM's `rotary_embedding` op, `torch.compile` "
    "the attention block (one `triton_poi_fused_*` kernel for q and k), or the zoo's `rope` "
    "Triton kernel (`traceq zoo verify rope` proves it)"
)


@rule("TQ108", "unfused-rotary", "warning", defaults=DEFAULTS, zoo=("rope",), explains=True)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds rotary position embeddings (RoPE) written out as pointwise ops:
    `q * cos + rotate_half(q) * sin`, where `rotate_half` slices the head dim in two,
    negates one half and concatenates them (`neg`, `cat`), then two `mul`s and an `add`;
    the same for k. HF's `apply_rotary_pos_emb` (Llama, Qwen2, Mistral, Gemma, ...) is
    this. Found on data flow; one finding per attention call, q and k together.

    ## Why is this bad?
    Rotating one element needs that element, its partner in the other half, and cos and
    sin of its position: one read and one write per element. Written out, the five ops
    write and read back four full intermediates (`q * cos`, `-x2`, the `cat`, `... * sin`)
    and launch five kernels per tensor, ten for q and k — on the widest activations of
    attention, in every layer.

    Estimated saving: the bytes one fused kernel no longer moves (the ops' recorded
    inputs and outputs − one read of q, k, cos and sin and one write of the rotated q and
    k) at the bandwidth the ops' own kernels achieved (their modelled bytes over their
    time, `traceq.perf.savings.fusion_saving`), plus one launch per op removed, never more
    than the ops' measured time.

    ## Example
    ```python
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    ```

    ## Use instead
    ```python
    from liger_kernel.transformers.rope import liger_rotary_pos_emb
    q, k = liger_rotary_pos_emb(q, k, cos, sin)  # one Triton kernel for both
    # or flash_attn.layers.rotary.apply_rotary_emb, or torch.compile the attention block
    ```
    ## Options
    - `min_confidence` (0.4): weakest data-flow edge accepted.
    - `min_saving_us` (0): leave out findings that save less.

    ## References
    - Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding" (2021):
      https://arxiv.org/abs/2104.09864
    - Liger Kernel `liger_rotary_pos_emb`: https://github.com/linkedin/Liger-Kernel
    - flash-attn rotary: https://github.com/Dao-AILab/flash-attention
    """
    ops = fusion_ops(ctx)
    ropes = rotary_embeddings(ops, fusion_edges(ctx), ctx.options["min_confidence"])
    calls = rotary_calls(ops, ropes)
    events = calls["ops"].explode().drop_nulls().to_list()
    rows = details(ops, events)
    raw = byte_rows(ops, events)
    by_add = {r["add"]: r for r in ropes.iter_rows(named=True)}
    for call in calls.iter_rows(named=True):
        yield from _finding(ctx, call, [by_add[a] for a in call["ropes"]], rows, raw)


def _finding(
    ctx: Context,
    call: dict[str, Any],
    ropes: list[dict[str, Any]],
    rows: dict[int, dict[str, Any]],
    raw: dict[int, dict[str, Any]],
) -> Iterator[Finding]:
    members = sorted((rows[e] for e in call["ops"] if e in rows), key=lambda r: r["ts_ns"])
    if not members:
        return
    measured_us = sum(r["time_ns"] for r in members) / 1000
    unfused = fused = 0
    shapes = []
    for rope in ropes:
        mul_cos, mul_sin, cat = raw[rope["mul_cos"]], raw[rope["mul_sin"]], raw[rope["cat"]]
        x_shape, x_type = mul_cos["shapes"][0], mul_cos["input_types"][0]
        cos_shape, cos_type = mul_cos["shapes"][1], mul_cos["input_types"][1]
        sin_index = 1 if mul_sin["shapes"][0] == cat["output_shape"] else 0
        sin_shape = mul_sin["shapes"][sin_index]
        sin_type = mul_sin["input_types"][sin_index]
        # `cat` records a tensor list: it reads both halves and writes the whole
        cat_bytes = 2 * tensor_bytes(cat["output_shape"], x_type)
        others = [rope[k] for k in ("mul_cos", "neg", "mul_sin", "add")] + rope["casts"]
        unfused += cat_bytes + sum(op_bytes(raw[e]) for e in others if e in raw)
        fused += (
            2 * tensor_bytes(x_shape, x_type)
            + tensor_bytes(cos_shape, cos_type)
            + tensor_bytes(sin_shape, sin_type)
        )
        shapes.append(x_shape)
    saved = site_saving(ctx, members, measured_us, unfused, fused, len(members))
    if saved is None:
        return
    saving, model, launches = saved
    where = located(ctx, members)
    names = " → ".join(
        r["name"].removeprefix("aten::")
        for r in sorted(
            (rows[ropes[0][k]] for k in ("mul_cos", "neg", "cat", "mul_sin", "add")),
            key=lambda r: r["ts_ns"],
        )
    )
    which = "q and k" if len(ropes) == 2 else f"{len(ropes)} tensor{'s' * (len(ropes) > 1)}"
    where["evidence"].update(
        {
            "idiom": "RoPE",
            "tensors": len(ropes),
            "ropes": [
                {k: r[k] for k in ("x", "mul_cos", "neg", "cat", "mul_sin", "add")} for r in ropes
            ],
            "unfused_bytes": unfused,
            "fused_bytes": fused,
            "unfused_traffic": mib(unfused),
            "fused_traffic": mib(fused),
            "launches": launches,
            "measured_us": round(measured_us, 3),
            "dataflow_confidence": call["confidence"],
        }
    )
    yield ctx.finding(
        message=(
            f"rotary embedding (RoPE) written out for {which} ({names} each) on "
            f"{' and '.join(shape_text(s) for s in dict.fromkeys(map(tuple, shapes)))} "
            f"{dtype_text(raw[ropes[0]['mul_cos']]['input_types'][0])}: one fused kernel "
            f"would move {mib(fused)} instead of {mib(unfused)} in 1 launch instead of "
            f"{launches}"
        ),
        shapes=[list(s) for s in dict.fromkeys(map(tuple, shapes))],
        est_saving_us=saving,
        saving_model=f"unfused − fused bytes ({unfused} − {fused}): {model}",
        fix=FIX + f". Saves about {saving:.1f} µs per call here.",
        **where,
    )


RULE = check
