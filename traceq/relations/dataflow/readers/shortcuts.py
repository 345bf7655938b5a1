"""ResNet blocks' shortcuts: the residual add reads the block's input, not its branch.

A ResNet block (diffusers' `ResnetBlock2D`, the UNet of Stable Diffusion) computes

    h = conv1(act(norm1(x))) + temb
    h = conv2(act(norm2(h)))
    out = (shortcut(x) + h) / scale          # shortcut: a 1x1 conv, or nothing

Shape and order read the add as `h_before_norm2 + h` (the block's own value, preferred for
a consumer of two values of one shape) and the shortcut conv as reading `act(norm1(x))`
(the most recent value of x's shape): against the ET corpus wrong every time (26 edges in
the UNet, and 2 in its `Transformer2DModel`, `proj_out(h) + residual`). A pre-norm
transformer block has the same outline up to its second sum (`h = x + attn(norm1(x));
out = h + mlp(norm2(h))`), where the add does read norm2's input: what tells the two apart
is that norm2's input is the transformer's first sum (of two values of one shape), and
that sum read `x` already.

Reads: a residual block's shortcut read past the block's norms and convs (`h +
shortcut(x)`, `proj_out(h) + residual`). Appears in: ResNet blocks of diffusers' UNet, its
`Transformer2DModel`; corpus entries whose edges it changes: `unet`. On the ET corpus: +28
right, -28 wrong, -28 missed edges (without it: precision 0.990, recall 0.957;
`benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import THREAD, last_before, shape_key, with_moved

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`shortcut_reads` as a reader (`readers.READERS`)."""
    return shortcut_reads(edges, flow.nodes)


def shortcut_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Point a ResNet block's residual add (and its shortcut GEMM/conv) at the block input.

    Where a module call C starts with a norm op N1 reading `x` (made before C), a sum A of
    two values of one shape in C reads `h`, the input of a later norm N2 of C (or, with `x`
    of A's shape, `h` and a GEMM/conv's result of `h`: diffusers' `Transformer2DModel` adds
    `proj_out(h) + residual`), `h` is no such sum itself (`conv1(...) + temb` broadcasts),
    and no earlier sum of C read `x`: A reads `x` instead of `h` when `x` has A's shape.
    Otherwise the last GEMM/conv before A reading a value of `x`'s shape after N2 is the
    shortcut S: S reads `x`, and A reads S's result instead of `h` (or, where it reads S
    already, the branch's end: the last GEMM/conv of A's shape before S).
    """
    if edges.height == 0 or "_call_start" not in nodes.columns:
        return edges
    base = pl.col("name").str.replace(r"^\w+::", "")
    inputs = pl.col("data_inputs").list.eval(pl.element().struct.field("shape"))
    info = nodes.select("event", "_seq", *THREAD, "ts_ns", "_call", "kind", "_out_shape")
    adds = nodes.filter(
        (base == "add")
        & pl.col("_call_start").is_not_null()
        & (inputs.list.len() == 2)
        & (inputs.list.first().list.len() > 0)
        & (inputs.list.first() == inputs.list.last())
    ).select(
        pl.col("event").alias("_a"),
        pl.col("_seq").alias("_aseq"),
        *THREAD,
        "_call",
        "_call_start",
        pl.col("_out_shape").alias("_ashape"),
    )
    if adds.height == 0:
        return edges
    # N1: the call's first op, a norm, and the value it read from before the call
    first = (
        adds.sort("_call_start")
        .join_asof(
            info.sort("ts_ns").select(
                *THREAD,
                pl.col("ts_ns").alias("_call_start"),
                pl.col("event").alias("_n1"),
                pl.col("_seq").alias("_n1seq"),
                pl.col("kind").alias("_n1kind"),
            ),
            on="_call_start",
            by=THREAD,
            strategy="forward",
            check_sortedness=False,
        )
        .filter(pl.col("_n1kind") == shapes.NORM)
    )
    produced = info.select(
        pl.col("event").alias("_x"), pl.col("ts_ns").alias("_xts"), pl.col("_out_shape")
    )
    blocks = (
        first.join(
            edges.select(pl.col("producer").alias("_x"), pl.col("consumer").alias("_n1")),
            on="_n1",
        )
        .join(produced, on="_x")
        .filter(pl.col("_xts") < pl.col("_call_start"))
        .rename({"_out_shape": "_xshape"})
    )
    # A reads h, the input of a later norm N2 of the call
    norm_reads = edges.join(
        info.filter(pl.col("kind") == shapes.NORM).select(
            pl.col("event").alias("consumer"), pl.col("_seq").alias("_n2seq")
        ),
        on="consumer",
    ).select(pl.col("producer").alias("_h"), "_n2seq")
    into_add = edges.filter(pl.col("input_index").is_not_null()).select(
        pl.col("producer").alias("_h"), pl.col("consumer").alias("_a"), "input_index"
    )
    # ... or A reads h and proj(h), a GEMM/conv of h (`x + proj_out(h)`, x of A's shape)
    projected = (
        edges.join(
            info.filter(pl.col("kind").is_in([shapes.GEMM, shapes.CONV])).select(
                pl.col("event").alias("consumer"), pl.col("_seq").alias("_n2seq")
            ),
            on="consumer",
        )
        .select(pl.col("producer").alias("_h"), pl.col("consumer").alias("_g"), "_n2seq")
        .join(into_add.select(pl.col("_h").alias("_g"), "_a"), on="_g")
    )
    found = [
        blocks.join(into_add, on="_a").join(norm_reads, on="_h"),
        blocks.join(into_add, on="_a")
        .join(projected, on=["_h", "_a"])
        .filter(pl.col("_xshape") == pl.col("_ashape"))
        .drop("_g"),
    ]
    # ... where h is no sum of two values itself (a transformer's `h = x + attn(...)`)
    suspects = (
        pl.concat(found)
        .filter(pl.col("_n2seq").is_between(pl.col("_n1seq"), pl.col("_aseq"), closed="none"))
        .join(adds.select(pl.col("_a").alias("_h")), on="_h", how="anti")
        .sort("_n2seq")
        .unique(["_a", "_h"], keep="first")
    )
    # ... and no earlier sum of the call read x
    summed = (
        adds.select("_a", "_aseq", "_call")
        .join(into_add, on="_a")
        .select(pl.col("_h").alias("_x"), "_call", pl.col("_aseq").alias("_sseq"))
    )
    suspects = suspects.join(
        suspects.join(summed, on=["_x", "_call"])
        .filter(pl.col("_sseq") < pl.col("_aseq"))
        .select("_a")
        .unique(),
        on="_a",
        how="anti",
    )
    if suspects.height == 0:
        return edges
    direct = suspects.filter(pl.col("_xshape") == pl.col("_ashape"))
    moved = [
        direct.select(
            pl.col("_h").alias("producer"),
            pl.col("_a").alias("consumer"),
            "input_index",
            pl.col("_x").alias("_to"),
        )
    ]
    # the shortcut: the last GEMM/conv before A reading a value of x's shape, after N2
    convs = edges.filter(pl.col("input_index").is_not_null()).join(
        info.filter(pl.col("kind").is_in([shapes.GEMM, shapes.CONV])).select(
            pl.col("event").alias("consumer"),
            *THREAD,
            "_seq",
            pl.col("_out_shape").alias("_sshape"),
        ),
        on="consumer",
    )
    convs = convs.with_columns(shape_key(pl.col("shape")).alias("_xshape")).rename(
        {"consumer": "_s", "producer": "_v", "input_index": "_sindex", "_seq": "_sseq"}
    )
    shortcut = last_before(
        suspects.filter(pl.col("_xshape") != pl.col("_ashape")),
        convs.select(*THREAD, "_xshape", "_s", "_v", "_sindex", "_sseq", "_sshape"),
        "_aseq",
        "_sseq",
        [*THREAD, "_xshape"],
    ).filter((pl.col("_sseq") > pl.col("_n2seq")) & (pl.col("_sshape") == pl.col("_ashape")))
    # A may read S by shape already: then h gives way to the branch's end, the last GEMM/conv
    # of A's shape before S (`conv2`)
    ends = info.filter(pl.col("kind").is_in([shapes.GEMM, shapes.CONV])).select(
        *THREAD,
        pl.col("_out_shape").alias("_ashape"),
        pl.col("event").alias("_b"),
        pl.col("_seq").alias("_bseq"),
    )
    read_s = into_add.select(pl.col("_h").alias("_s"), "_a", pl.lit(True).alias("_read_s"))
    shortcut = (
        last_before(shortcut, ends, "_sseq", "_bseq", [*THREAD, "_ashape"])
        .join(read_s.unique(["_s", "_a"]), on=["_s", "_a"], how="left")
        .with_columns(
            pl.when(pl.col("_read_s").fill_null(False))
            .then(pl.when(pl.col("_bseq") > pl.col("_n2seq")).then(pl.col("_b")))
            .otherwise(pl.col("_s"))
            .alias("_into_a")
        )
    )
    moved += [
        shortcut.select(
            pl.col("_v").alias("producer"),
            pl.col("_s").alias("consumer"),
            pl.col("_sindex").alias("input_index"),
            pl.col("_x").alias("_to"),
        ),
        shortcut.drop_nulls("_into_a").select(
            pl.col("_h").alias("producer"),
            pl.col("_a").alias("consumer"),
            "input_index",
            pl.col("_into_a").alias("_to"),
        ),
    ]
    key = ["producer", "consumer", "input_index"]
    found = pl.concat(moved).unique(key)
    return with_moved(edges, edges.join(found, on=key), "+shortcut")
