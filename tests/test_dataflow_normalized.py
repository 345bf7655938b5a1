"""A tensor divided by its own norm, against the Execution Trace (`clip`).

CLIP normalizes its image and its text embedding, two projections of one shape made one
after the other: `x / x.pow(2).sum(-1, keepdim=True).pow(0.5)`, twice. Each division read
its own embedding, but the first `pow` of each norm read the most recent value of the
shape: the text embedding for the image's norm, the image's normalized result for the
text's (2 wrong edges, 2 missed). Fails on the code before `normalized_reads`.
"""

from __future__ import annotations

import polars as pl
from conftest import corpus_et, corpus_trace, edges_into

ENTRY = "clip"


def test_each_norm_reads_the_embedding_its_division_divides() -> None:
    trace, et = corpus_trace(ENTRY), corpus_et(ENTRY)
    ops = trace.dataflow_ops.filter(pl.col("module") == "CLIPModel_0")
    norms = ops.filter(pl.col("name").is_in(["aten::pow", "aten::sum", "aten::div"]))["event"]
    inferred, exact = edges_into(trace, et, norms)
    assert len(exact) == 10  # two of: pow(x), sum, pow(0.5), x / norm (two reads)
    assert inferred == exact
