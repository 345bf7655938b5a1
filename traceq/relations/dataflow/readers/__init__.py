"""Readers: each reads one idiom that shape and order read wrong, as the models write it.

Shape matching (`matching`) gives each input the most recent value of its shape; some
code reads otherwise (a KV cache's `cat`s, rotary embeddings of `q` and `k`, a backward
node's formulas). A reader takes the edges so far and returns them with that idiom's
reads set right: `reader(edges, flow) -> edges` (`edges.Flow`: the ops, their matching
keys, the trace). Each module's docstring says which idiom it reads, in which models it
appears and what it changed on the Execution-Trace corpus (`benchmarks/dataflow_ablation.py`
measures each by leaving it out).

`READERS` is the order `inferred.inferred_edges` runs them in; a later reader sees what the
earlier ones set (the KV cache reads the twins set right; the rotary reads the cache's
pieces). Adding a reader: one module with a `reads(edges, flow)`, its test, one line here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from traceq.relations.dataflow.readers import (
    accumulated_gradients,
    attention_operands,
    backward_reads,
    bias_gelu,
    bias_gelu_backward,
    blend,
    ddp_reducer,
    foreach_adam,
    gradients,
    indexing,
    kv_cache,
    list_pieces,
    lookups,
    loop_carried,
    normalized,
    optimizer_steps,
    parameter_order,
    repeats,
    rotary,
    saved_inputs,
    saved_operands,
    scalars,
    shortcuts,
    sibling_projections,
    softmax_backward,
    twins,
    unsized_views,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import polars as pl

    from traceq.relations.dataflow.edges import Flow

    Reader = Callable[[pl.DataFrame, Flow], pl.DataFrame]

READERS: tuple[Reader, ...] = (
    twins.reads,
    sibling_projections.reads,
    normalized.reads,
    shortcuts.reads,
    scalars.reads,  # weighted sums
    bias_gelu.reads,  # Megatron's written-out tanh GELU
    blend.reads,
    kv_cache.reads,
    rotary.reads,
    list_pieces.reads,  # attention's query beside a KV cache's pieces
    indexing.reads,
    attention_operands.reads,  # written-out attention's key and value
    repeats.reads,
    lookups.reads,
    loop_carried.reads,
    ddp_reducer.reads,  # bucket views
    backward_reads.reads,
    gradients.reads,  # input buffers
    accumulated_gradients.reads,  # a norm's weight and bias gradients
    optimizer_steps.reads,  # SGD's add_(param, grad)
    parameter_order.reads,  # ... in model.parameters() order
    foreach_adam.reads,  # Adam's tensor lists
    saved_operands.reads,  # a GEMM backward's saved operands
    saved_inputs.reads,  # a norm's and a product's backward
    softmax_backward.reads,  # a softmax's backward: gradient, then saved output
    bias_gelu_backward.reads,  # Megatron's bias_gelu_back
    unsized_views.reads,
)
"""Every reader, in the order they run."""
