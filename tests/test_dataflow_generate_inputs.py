"""What `generate` hands each decode step, and a sliding-window cache, against the ET corpus.

Between forward calls `generate` grows two values of one shape, the position ids and
`input_ids`, each by a `cat` (`loop_carried`), and reads their ends: the next position
is made from a slice of the positions (`loop_carried.tail_reads`), and each model input
is sliced and cloned for the next call by the same code, run once per input
(`repeats`). The forward then reads the two clones in the order they were made
(`repeats.repeated_results`). Mistral's sliding-window cache slices the window it keeps
right after its update, keys first, and hands the full keys and values to the attention
(`kv_cache.kept_windows`). Each test fails on the code before these rules: every slice
of the position ids read `input_ids`, both models' first reader of the input ids read the
position ids, and Mistral's slices and attention read each other.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import corpus_et, corpus_trace, edges_into

from traceq.relations.dataflow.execution_trace import tensor_edges

GENERATE = ("gpt2_generate", "llama_generate")
STEPS = 4  # `max_new_tokens`: a prefill and three decode steps


def _host(name: str, op: str) -> pl.Series:
    """Events of `generate`'s own ops (outside any module call) named `op`."""
    ops = corpus_trace(name).dataflow_ops
    return ops.filter((pl.col("name") == op) & pl.col("module").is_null())["event"]


@pytest.mark.parametrize("name", GENERATE)
def test_slices_of_the_carried_values_read_the_cat_the_et_says(name: str) -> None:
    """Every host-side slice of a value a `cat` grew (the position ids or `input_ids`:
    the end for the next position, the stopping criteria's last token, each model
    input's `[:, -1:]`) reads that cat."""
    trace, et = corpus_trace(name), corpus_et(name)
    cats = _host(name, "aten::cat")
    exact = tensor_edges(trace, et).filter(pl.col("producer").is_in(cats.implode()))
    slices = exact.filter(pl.col("consumer").is_in(_host(name, "aten::slice").implode()))
    # after each forward but the last: the next position's (none after the prefill: its
    # positions are no cat), the stopping check's, and the two inputs' of the next call;
    # after the last, the next position's and the stopping check's
    assert slices.height == 3 + 4 * (STEPS - 2) + 2
    inferred, exact_pairs = edges_into(trace, et, slices["consumer"])
    assert inferred == exact_pairs


@pytest.mark.parametrize("name", GENERATE)
def test_each_forward_reads_the_input_ids_clone_first(name: str) -> None:
    """`model(input_ids=ids[:, -1:].clone(), position_ids=pos[:, -1:].clone())`: the
    decode step's first reader of the clones (GPT-2's `input_ids.view`, LLaMA's
    `embed_tokens`) reads the first clone, and no edge out of a clone is wrong."""
    trace, et = corpus_trace(name), corpus_et(name)
    clones = _host(name, "aten::clone")
    exact = tensor_edges(trace, et).filter(pl.col("producer").is_in(clones.implode()))
    readers = exact.join(
        trace.dataflow_ops.select(pl.col("event").alias("consumer"), "module"), on="consumer"
    ).filter(pl.col("module").is_not_null())
    inferred, exact_pairs = edges_into(trace, et, readers["consumer"])
    from_clones = {(p, c) for p, c in inferred if p in set(clones)}
    assert from_clones <= exact_pairs
    first = readers.sort("consumer").group_by("producer").first()
    firsts = {(p, c) for p, c in first.select("producer", "consumer").iter_rows()}
    assert len(from_clones & firsts) >= STEPS  # the prefill's and each decode step's


def test_sliding_window_cache_keeps_its_window_and_returns_the_full_cache() -> None:
    """Mistral: `full = cat([keys, k]); self.keys = full[:, :, -w + 1:]` and the same for
    values, then `sdpa(q, full_keys, full_values)`: the edges into the attention and into
    every slice of the attention calls are the ET's."""
    trace, et = corpus_trace("mistral"), corpus_et("mistral")
    ops = trace.dataflow_ops
    attention = ops.filter(
        pl.col("module").str.contains("Attention").fill_null(False)
        & pl.col("name").is_in(["aten::slice", "aten::scaled_dot_product_attention"])
    )["event"]
    inferred, exact = edges_into(trace, et, attention)
    cats = set(ops.filter(pl.col("name") == "aten::cat")["event"])
    kept = {(p, c) for p, c in exact if p in cats}
    assert len(kept) == 2 * 2 * 2  # 2 layers: keys and values, each to a slice and sdpa
    assert inferred == exact
