"""The ids an embedding lookup reads: not a value a sibling module call consumed.

A module that takes two id tensors of one shape and hands them to two submodules
(diffusers' `CombinedTimestepLabelEmbeddings`: `time_proj(timestep)`, then
`class_embedder(class_labels)`, the labels read by an `embedding`) leaves nothing in the
trace that says which tensor went where: the lookup's ids, a graph input, have no
producer, and shape and order read the timestep instead, the most recent value of the
shape (against the ET corpus: every DiT lookup, 6 wrong edges). What the trace does say is
that the timestep was read already, by an op of a sibling call (`timesteps[:, None]` in
`Timesteps`): the value was that call's argument. So where an `embedding`'s ids were read
earlier by an op whose module is neither the lookup's nor one enclosing it, the lookup
reads no producer: unknown beats wrong.

Two tables do not read one id tensor, yet shape and order give one value to two lookups
of sibling calls where one of them reads a graph input: BERT's `word_embeddings(input_ids)`
read the `token_type_ids` made just before it, the next lookup's ids; `generate`'s GPT-2
read `input_ids` for both `wte` and `wpe`. Which of the two reads the value is not
recorded (in BERT the second, in GPT-2 the first), so neither gets that edge (the ET
corpus: 7 wrong edges gone, 7 right ones with them).

Reads: an embedding lookup's ids: not a value a sibling module call read first. Appears in:
BERT (`word_embeddings` beside `token_type_ids`), DiT's label embedding, `generate`'s GPT-2
(`wte`, `wpe`); corpus entries whose edges it changes: `bert`, `bert_ensemble`, `dit`,
`gpt2_generate`. On the ET corpus: -7 right, -13 wrong, +7 missed edges (without it:
precision 0.993, recall 0.963; `benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow.matching import in_scope

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

LOOKUPS = ("aten::embedding", "aten::embedding_bag", "aten::_embedding_bag")
IDS = 1
"""The argument of a lookup that holds the ids (`embedding(weight, indices)`)."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`lookup_reads` as a reader (`readers.READERS`)."""
    return lookup_reads(edges, flow.nodes)


def lookup_reads(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """`edges` without those into a lookup's ids from a value a sibling call read first,
    or that a lookup of a sibling call read too."""
    if edges.height == 0:
        return edges
    info = nodes.select("event", "_seq", "_module", pl.col("name").is_in(LOOKUPS).alias("_lookup"))
    into_ids = (
        edges.filter(pl.col("input_index") == IDS)
        .join(info.filter("_lookup"), left_on="consumer", right_on="event")
        .select("producer", "consumer", "input_index", "_seq", "_module")
    )
    if into_ids.height == 0:
        return edges
    readers = edges.join(info, left_on="consumer", right_on="event").select(
        "producer", pl.col("_seq").alias("_rseq"), pl.col("_module").alias("_rmodule"), "_lookup"
    )
    enclosing = in_scope(pl.col("_module"), pl.col("_rmodule"))  # "" (no module) encloses all
    # read before by an op of a sibling call; or, by another lookup of a sibling call
    # either side: two tables read one id tensor, which of them does is not recorded
    other_lookup = pl.col("_lookup") & (pl.col("_rseq") != pl.col("_seq"))
    before = (pl.col("_rseq") < pl.col("_seq")) & ~pl.col("_lookup")
    taken = (
        into_ids.join(readers, on="producer")
        .filter((before | other_lookup) & ~enclosing)
        .select("producer", "consumer", "input_index")
        .unique()
    )
    return edges.join(taken, on=["producer", "consumer", "input_index"], how="anti")
