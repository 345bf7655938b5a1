"""Outputs of multi-output ops read outside their module call (`relations/pieces.py`).

DiT's `AdaLayerNormZero` splits its conditioning with `emb.chunk(6)`, uses two pieces and
returns four to the transformer block; a Mixture of Experts router returns the indices of
its `topk`, unread, to the experts' dispatch, which sorts them, counts them (`histc`) and
runs one grouped GEMM per expert (`_grouped_mm`), then `act(gate) * up` of its `chunk`.
Edges are checked against the Execution Trace's tensor ids; each test fails on the code
before `pieces.py` (and, for the routing, before the output shapes of `topk`, `sort`,
`histc` and `_grouped_mm`).
"""

from __future__ import annotations

import polars as pl
from conftest import corpus_et, corpus_trace

import traceq
from traceq.relations.dataflow.execution_trace import tensor_edges


def _pairs(frame: pl.DataFrame) -> set[tuple[int, int]]:
    return set(frame.select("producer", "consumer").iter_rows())


def _into(trace: traceq.Trace, frame: pl.DataFrame, consumers: pl.Series) -> set:
    return _pairs(frame.filter(pl.col("consumer").is_in(consumers.implode())))


def test_dit_blocks_read_the_adaln_pieces_their_norm_returned() -> None:
    """The block's own `unsqueeze`s of `gate_msa`, `shift_mlp`, `scale_mlp`, `gate_mlp`
    (in the block's call, after the norm's call ended) read the norm's `chunk`."""
    trace, et = corpus_trace("dit"), corpus_et("dit")
    ops = trace.dataflow_ops
    unsqueezes = ops.filter(
        (pl.col("name") == "aten::unsqueeze")
        & pl.col("module").str.contains(r"BasicTransformerBlock_\d+$")
    )["event"]
    assert unsqueezes.len() == 4 * 2 * 2  # four pieces, two blocks, two denoising steps
    exact = _into(trace, tensor_edges(trace, et), unsqueezes)
    chunks = set(ops.filter(pl.col("name") == "aten::chunk")["event"].to_list())
    assert len(exact) == 16 and {p for p, _ in exact} <= chunks
    assert _into(trace, trace.dataflow, unsqueezes) == exact


def test_mixtral_routing_reads_topk_sort_histc_and_grouped_mm() -> None:
    """Every edge inferred out of the routing ops is the ET's, and they are most of them:
    the ET's others go into `index`/`index_put_` arguments Kineto records no shape for,
    and into the `to` of `sort`'s values (passed over for `sorted // k`, just after)."""
    trace, et = corpus_trace("mixtral"), corpus_et("mixtral")
    ops = trace.dataflow_ops
    routing = ops.filter(
        pl.col("name").is_in(["aten::topk", "aten::sort", "aten::histc", "aten::_grouped_mm"])
    )["event"]
    assert routing.len() == 5 * 2  # two MoE layers
    exact = _pairs(tensor_edges(trace, et).filter(pl.col("producer").is_in(routing.implode())))
    inferred = _pairs(trace.dataflow.filter(pl.col("producer").is_in(routing.implode())))
    assert len(exact) == 22
    assert inferred <= exact
    assert len(inferred) >= 16


def test_mixtral_glu_reads_act_gate_and_the_up_piece() -> None:
    """`act(gate) * up` of `gate, up = h.chunk(2)`: the `mul` reads the activation and the
    chunk, not the chunk twice."""
    trace, et = corpus_trace("mixtral"), corpus_et("mixtral")
    ops = trace.dataflow_ops
    muls = ops.filter(
        (pl.col("name") == "aten::mul") & pl.col("module").str.contains(r"MixtralExperts_\d+$")
    )
    silus = set(ops.filter(pl.col("name") == "aten::silu")["event"].to_list())
    glu = [
        event
        for event in muls["event"].to_list()
        if {p for p, _ in _into(trace, tensor_edges(trace, et), pl.Series([event]))} & silus
    ]
    assert len(glu) == 2
    glu_muls = pl.Series(glu)
    assert _into(trace, trace.dataflow, glu_muls) == _into(trace, tensor_edges(trace, et), glu_muls)
