"""A KV cache's update read as written: `keys = cat([keys, k]); values = cat([values, v])`.

Hugging Face's caches (`DynamicCache`, `EncoderDecoderCache`) grow by two list ops in a
row in the attention call, keys first. Shape and order read them wrong (`matching` gives
twin list ops no pieces at all): `v` was made before `k`'s rotary embedding, so the most
recent value of the shape is `k`'s for both, and the empty caches of a first step (`[0]`)
are read newest first. Read as written instead:

- the empty pieces: the two most recent empty values made in the call, oldest to keys;
- the new pieces: the two most recent values of their shape in the call that no op has
  read yet, the one whose nearest GEMM (`k_proj`, `v_proj`; back through the edges) ran
  first to keys; where all come from one GEMM (GPT-2's fused `c_attn`: q, k and v), the
  two the attention does not read beside the cache, the first made to keys;
- the past (a larger cache, made in another forward call) is `loop_carried`'s;
- a sliding-window cache (`DynamicSlidingWindowLayer`: Mistral, Gemma 2/3, Qwen2) then
  keeps the window for the next call, `self.keys = full_keys[:, :, -w + 1:]`, and the
  same for values, and returns the full `keys, values` to the attention: `kept_windows`.

Reads: a KV cache's update, `keys = cat([keys, k]); values = cat([values, v])`, and a
sliding window kept. Appears in: every decoder with Hugging Face's caches (GPT-2, LLaMA,
Mistral, Mixtral, Qwen2/3, Gemma, T5's and Whisper's decoders); corpus entries whose edges
it changes: `gemma`, `gpt2`, `gpt2_generate`, `llama`, `llama_generate`, `llama_mha`,
`mistral`, `mixtral`, `qwen2`, `qwen3`, `t5`, `whisper`. On the ET corpus: +150 right, -14
wrong, -150 missed edges (without it: precision 0.993, recall 0.934;
`benchmarks/dataflow_ablation.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.matching import CONFIDENCE, THREAD, list_twins, shape_key, with_moved

if TYPE_CHECKING:
    from traceq.relations.dataflow.edges import Flow

EMPTY = "s0"
"""`shape_key` of an empty tensor (`torch.tensor([])`: a cache before its first step)."""
MAX_HOPS = 8
"""Edges walked back from a new piece to its projection (view, transpose, rotary ops)."""


def reads(edges: pl.DataFrame, flow: Flow) -> pl.DataFrame:
    """`kv_cache_reads` as a reader (`readers.READERS`)."""
    return kv_cache_reads(edges, flow.nodes, flow.aliases)


def kv_cache_reads(
    edges: pl.DataFrame, nodes: pl.DataFrame, aliases: pl.Series | None = None
) -> pl.DataFrame:
    """`edges` plus the pieces of twin list ops that update a KV cache (module docstring).

    `aliases`: events of ops that returned their input (`inferred.returned_inputs`: the
    `to` and `lift_fresh` of `torch.tensor([])`); they wrote nothing, so they are no piece.
    """
    twins = list_twins(nodes)
    if twins.height == 0 or edges.height == 0:
        return edges
    info = nodes.select("event", "_seq", *THREAD, "_call", "_top", "_out_shape", "kind")
    pairs = (
        twins.join(info, left_on="_first", right_on="event")
        .filter(pl.col("_call") != -1)
        .select("_first", "_second", "_seq", *THREAD, "_call", "_top")
    )
    slots = (
        pairs.select("_first", pl.concat_list("_first", "_second").alias("consumer"))
        .with_columns(pl.int_ranges(2).alias("_nth"))
        .explode("consumer", "_nth")
        .join(nodes.select(pl.col("event").alias("consumer"), "data_inputs"), on="consumer")
        .explode("data_inputs")
        .unnest("data_inputs")
        .drop_nulls("shape")
        .with_columns(shape_key(pl.col("shape")).alias("_key"))
    )
    # the pieces both ops read at one shape: an empty cache, or the new k and v
    both = slots.group_by("_first", "_key").agg(pl.col("_nth").n_unique().alias("_ops"))
    slots = slots.join(both.filter(pl.col("_ops") == 2), on=["_first", "_key"], how="semi")
    read = edges.join(
        info.select(pl.col("event").alias("consumer"), pl.col("_seq").alias("_rseq")),
        on="consumer",
    ).select("producer", "_rseq")
    values = (
        pairs.join(
            info.select(
                pl.col("event").alias("producer"),
                pl.col("_seq").alias("_pseq"),
                *THREAD,
                pl.col("_call").alias("_pcall"),
                "_top",
                pl.col("_out_shape").alias("_key"),
            ),
            on=[*THREAD, "_top"],
        )
        .filter(pl.col("_pseq") < pl.col("_seq"))
        .join(slots.select("_first", "_key").unique(), on=["_first", "_key"], how="semi")
    )
    values = values.filter(pl.col("_pcall") == pl.col("_call"))
    if aliases is not None:
        values = values.filter(~pl.col("producer").is_in(aliases.implode()))
    unread = values.join(read, on="producer", how="anti").vstack(
        values.join(read.group_by("producer").agg(pl.col("_rseq").min()), on="producer")
        .filter(pl.col("_rseq") > pl.col("_seq"))
        .drop("_rseq")
    )
    empty = unread.filter(pl.col("_key") == EMPTY)
    new = unread.filter(pl.col("_key") != EMPTY).unique(["_first", "producer"])
    new = new.join(_projections(new.select("producer").unique(), edges, info), on="producer")
    new = _one_projection(new, _read_beside(pairs, edges))
    picked = pl.concat(
        [
            _two_latest(empty.with_columns(pl.col("_pseq").alias("_origin")).unique()),
            _two_latest(new),
        ]
    )
    return kept_windows(_with_pieces(edges, picked, slots), nodes, twins)


WINDOW_OPS = ("aten::slice", "aten::narrow")
"""How a sliding-window cache cuts the window it keeps."""


def kept_windows(edges: pl.DataFrame, nodes: pl.DataFrame, twins: pl.DataFrame) -> pl.DataFrame:
    """`edges` with the windows a sliding-window cache keeps read as written.

    Right after the twin update, the cache slices each result, keys first, into the state
    it keeps, and returns the full results: two slices of one shape whose input has the
    twins' shape, the two ops after them in their call. Shape and order read the most
    recent value of the shape for both (the values' `cat` for the keys' slice, the keys'
    slice for the values'), and while the sequence is shorter than the window the slices
    are as long as the full results, so the attention read the slices (the ET corpus:
    Mistral, 8 wrong edges). So the i-th slice reads the i-th twin, and an op of the call
    that read a slice of the full shape reads the twin instead: the kept window is read
    by the next call, not this one.
    """
    if twins.height == 0:
        return edges
    info = nodes.select("event", "_seq", *THREAD, "_call", "name", "_out_shape", "data_inputs")
    order = info.select("event", "_seq", *THREAD, "_call")
    cuts = info.filter(pl.col("name").is_in(WINDOW_OPS)).select(
        pl.col("_seq").alias("_cut_seq"),
        *THREAD,
        "_call",
        pl.col("event").alias("_cut"),
        pl.col("_out_shape").alias("_cut_shape"),
        shape_key(pl.col("data_inputs").list.first().struct.field("shape")).alias("_cut_in"),
    )
    pairs = (
        twins.join(order.rename({"event": "_second"}), on="_second")
        .join(info.select(pl.col("event").alias("_first"), "_out_shape"), on="_first")
        .with_columns(pl.int_ranges(1, 3).alias("_nth"))
        .explode("_nth")
        .with_columns((pl.col("_seq") + pl.col("_nth")).alias("_cut_seq"))
        .join(cuts, on=["_cut_seq", *THREAD, "_call"])
        .filter(pl.col("_cut_in") == pl.col("_out_shape"))
        .filter(
            (pl.len().over("_first") == 2) & (pl.col("_cut_shape").n_unique().over("_first") == 1)
        )
        .select(
            pl.when(pl.col("_nth") == 1).then("_first").otherwise("_second").alias("_twin"),
            "_cut",
            "_call",
            (pl.col("_cut_shape") == pl.col("_out_shape")).alias("_whole"),
        )
    )
    if pairs.height == 0:
        return edges
    into_cut = edges.join(pairs, left_on="consumer", right_on="_cut", how="semi").filter(
        pl.col("input_index") == 0
    )
    cut_reads = into_cut.unique("consumer").join(
        pairs.select(pl.col("_cut").alias("consumer"), "_twin"), on="consumer"
    )
    whole = pairs.filter("_whole").select(pl.col("_cut").alias("producer"), "_twin", "_call")
    readers = (
        edges.join(whole, on="producer")
        .join(
            order.select(pl.col("event").alias("consumer"), pl.col("_call").alias("_rcall")),
            on="consumer",
        )
        .filter(pl.col("_rcall") == pl.col("_call"))
        .join(pairs, left_on="consumer", right_on="_cut", how="anti")
        .select(*edges.columns, "_twin")
    )
    moved = pl.concat([cut_reads.select(*edges.columns, "_twin"), readers])
    moved = moved.filter(pl.col("producer") != pl.col("_twin")).rename({"_twin": "_to"})
    return with_moved(edges, moved, "+kept-window")


def _two_latest(values: pl.DataFrame) -> pl.DataFrame:
    """The two most recent values per twin pair and shape, numbered `_nth` (keys 0, values
    1) by their projection's order (`_origin`); none where the two share a projection
    (`_one_projection` numbers those by when they were made)."""
    latest = (
        values.sort("_pseq", descending=True)
        .group_by("_first", "_key", maintain_order=True)
        .head(2)
    )
    two = latest.group_by("_first", "_key").agg(pl.col("_origin").n_unique().alias("_n"))
    return (
        latest.join(two.filter(pl.col("_n") == 2), on=["_first", "_key"], how="semi")
        .sort("_origin", "_pseq")
        .with_columns(pl.int_range(pl.len()).over("_first", "_key").alias("_nth"))
        .select("_first", "_key", "_nth", "producer")
    )


def _one_projection(new: pl.DataFrame, beside: pl.DataFrame) -> pl.DataFrame:
    """`new`, where all values of a twin pair's shape come from one GEMM (GPT-2's
    `c_attn`, split into q, k and v, all unread when the cache is updated): the two
    that nothing reads beside the cache (`_read_beside`: not the query), numbered in
    the order they were made (k's `view`/`transpose` before v's, in GPT-2's code old
    and new), or none if not exactly two are left."""
    one = new.group_by("_first", "_key").agg(pl.col("_origin").n_unique() == 1)
    one = one.filter(pl.col("_origin")).select("_first", "_key")
    alone = (
        new.join(one, on=["_first", "_key"], how="semi")
        .join(beside, on=["_first", "producer"], how="anti")
        .filter(pl.len().over("_first", "_key") == 2)
        .with_columns(pl.col("_pseq").alias("_origin"))
    )
    rest = new.join(one, on=["_first", "_key"], how="anti")
    return pl.concat([rest, alone.select(rest.columns)])


def _read_beside(pairs: pl.DataFrame, edges: pl.DataFrame) -> pl.DataFrame:
    """`_first`, `producer`: values read beside the cache, by an op that reads a twin's
    result too: the query of `sdpa(q, keys, values)`."""
    twin = pl.concat(
        [pairs.select("_first", pl.col(c).alias("producer")) for c in ("_first", "_second")]
    )
    readers = edges.join(twin, on="producer").select("_first", "consumer").unique()
    return (
        edges.join(readers, on="consumer")
        .join(twin, on=["_first", "producer"], how="anti")
        .select("_first", "producer")
        .unique()
    )


def _projections(values: pl.DataFrame, edges: pl.DataFrame, info: pl.DataFrame) -> pl.DataFrame:
    """`producer`, `_origin`: the `_seq` of the GEMM nearest each value back along the
    edges (the latest one at the fewest hops); values that reach none are left out."""
    back = edges.select(pl.col("consumer").alias("_at"), pl.col("producer").alias("_from"))
    kinds = info.select(pl.col("event").alias("_from"), "kind", pl.col("_seq").alias("_gseq"))
    frontier = values.select("producer", pl.col("producer").alias("_at"))
    found = []
    for _ in range(MAX_HOPS):
        step = frontier.join(back, on="_at").join(kinds, on="_from").unique(["producer", "_from"])
        gemm = step.filter(pl.col("kind") == shapes.GEMM)
        found.append(gemm.group_by("producer").agg(pl.col("_gseq").max().alias("_origin")))
        done = gemm.select("producer").unique()
        frontier = step.join(done, on="producer", how="anti").select(
            "producer", pl.col("_from").alias("_at")
        )
        if frontier.height == 0:
            break
    return pl.concat(found).unique("producer", keep="first", maintain_order=True)


def _with_pieces(edges: pl.DataFrame, picked: pl.DataFrame, slots: pl.DataFrame) -> pl.DataFrame:
    """`edges` plus one edge per picked value, into the slot of its twin op and shape."""
    if picked.height == 0:
        return edges
    added = picked.join(slots, on=["_first", "_key", "_nth"]).select(
        "producer",
        "consumer",
        pl.col("index").alias("input_index"),
        "shape",
        pl.lit(CONFIDENCE["contested"]).alias("confidence"),
        pl.lit("shape+kv-cache").alias("evidence"),
    )
    return pl.concat([edges, added.select(edges.columns)], how="vertical_relaxed")
