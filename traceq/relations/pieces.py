"""The pieces of a split that a module call returns: its caller reads them.

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
"""

from __future__ import annotations

import polars as pl


def returned_pieces(earlier: pl.DataFrame) -> pl.DataFrame:
    """`producer`, `_returned`: splits (`_pmulti`, their n pieces of one shape: input
    elements / piece elements) that the first round's picks (`earlier`) read inside
    their module call (`_enclosed` false) fewer than n times."""
    numel = pl.col("_pin_numel").str.slice(1).cast(pl.Int64, strict=False)
    pieces = numel // pl.col("_pnumel").str.slice(1).cast(pl.Int64, strict=False)
    splits = earlier.filter(pl.col("_pmulti")).select("producer", pieces.alias("_pieces"))
    inside = earlier.filter(pl.col("_pmulti") & ~pl.col("_enclosed") & (pl.col("_tier") == 0))
    reads = inside.group_by("producer").agg(pl.len().alias("_reads"))
    return (
        splits.unique("producer")
        .join(reads, on="producer", how="left")
        .select(
            "producer",
            (pl.col("_reads").fill_null(0) < pl.col("_pieces")).fill_null(False).alias("_returned"),
        )
    )
