"""The outputs of a split (or a `topk`, a `sort`) that a module call returns: its caller
reads them.

`shift, scale, gate, ... = emb.chunk(6, dim=1)` in a module that uses some of the pieces
and returns the rest (diffusers' `AdaLayerNormZero` returns `gate_msa, shift_mlp,
scale_mlp, gate_mlp` to the DiT block, which reads them after attention): the split is
not the call's last op, so by encapsulation (`matching`: a value that stayed inside a
module call that has ended is hidden) its pieces are hidden from the caller, which then
reads no producer at all (against the ET corpus: 16 missed edges in DiT's two blocks and
two steps). A split of n pieces whose pieces the call's own ops read fewer than n times
left some unread; a value made and never read is rarer than one returned, so the pieces
stay visible to the caller. A split whose pieces are all read inside (`q, k, v =
qkv.chunk(3)`) stays hidden.

`topk` and `sort` return values and indices: a Mixture of Experts router normalizes the
`topk` weights in its own call and returns the expert indices, unread, to the experts'
dispatch. What tells the two outputs apart is the dtype the reader takes: indices are
read where every argument of that shape is an integer (`_int_only`), values elsewhere;
the outputs stay visible when either kind of read is missing inside the call.

A consumer of several values of one shape may take a split more than once (`a - b` of
`a, b = x.chunk(2)`), but not pieces that earlier ops took: in `gate, up = h.chunk(2);
act(gate) * up`, the `mul` prefers the values of its own module call and took the chunk
for both arguments, passing over `act(gate)`, made in the activation's call (Mixtral's
experts: 2 missed edges). Copies of a split beyond its pieces not read before the
consumer are no candidates (one always is: a piece is a variable, read again).
"""

from __future__ import annotations

import polars as pl


def _pieces() -> pl.Expr:
    """How many outputs a multi-output op returned: a split's pieces of one shape (input
    elements / piece elements), values and indices (`_pindexed`) two."""
    numel = pl.col("_pin_numel").str.slice(1).cast(pl.Int64, strict=False)
    pieces = numel // pl.col("_pnumel").str.slice(1).cast(pl.Int64, strict=False)
    return pl.when("_pindexed").then(2).otherwise(pieces)


def spare_copies(ranked: pl.DataFrame, earlier: pl.DataFrame) -> pl.DataFrame:
    """`ranked` without the copies (`_copy`) of a multi-output op beyond its outputs that
    the first round's picks (`earlier`) of other consumers had not read before."""
    extra = ranked.filter(pl.col("_pmulti") & (pl.col("_copy") > 0))
    if extra.height == 0:
        return ranked
    reads = earlier.filter("_pmulti").select(
        "producer", pl.col("event").alias("_reader"), pl.col("_seq").alias("_rseq")
    )
    before = (
        extra.select("event", "producer", "_seq")
        .unique()
        .join(reads, on="producer")
        .filter((pl.col("_rseq") < pl.col("_seq")) & (pl.col("_reader") != pl.col("event")))
        .group_by("event", "producer")
        .agg(pl.len().alias("_read_before"))
    )
    spare = _pieces() - pl.col("_read_before").fill_null(0)
    return (
        ranked.join(before, on=["event", "producer"], how="left")
        .filter(~pl.col("_pmulti") | (pl.col("_copy") == 0) | (pl.col("_copy") < spare))
        .drop("_read_before")
    )


def returned_pieces(earlier: pl.DataFrame) -> pl.DataFrame:
    """`producer`, `_returned`: multi-output ops (`_pmulti`) whose outputs the first
    round's picks (`earlier`) did not all read inside their module call (`_enclosed`
    false): a split of n pieces of one shape (input elements / piece elements) read fewer
    than n times, values and indices (`_pindexed`) not read as both."""
    outputs = earlier.filter(pl.col("_pmulti")).select("producer", _pieces().alias("_pieces"))
    inside = earlier.filter(pl.col("_pmulti") & ~pl.col("_enclosed") & (pl.col("_tier") == 0))
    reads = inside.group_by("producer").agg(
        pl.when(pl.col("_pindexed").first())
        .then(pl.col("_int_only").n_unique())
        .otherwise(pl.len())
        .alias("_reads")
    )
    return (
        outputs.unique("producer")
        .join(reads, on="producer", how="left")
        .select(
            "producer",
            (pl.col("_reads").fill_null(0) < pl.col("_pieces")).fill_null(False).alias("_returned"),
        )
    )
