"""Edges into the backward pass against the Execution Trace (`ddp_train`).

A backward node's ops (`MseLossBackward0`'s `mse_loss_backward`, `GeluBackward0`'s
`gelu_backward`, `AddmmBackward0`'s `mm`s) read the gradient and what the forward op saved.
For a GEMM, GELU or a loss that is the forward op's inputs, never its result, so the edge
from the forward op by the autograd sequence number (`fwdbwd`) was wrong each time in the
corpus (5 of 5); the loss's backward reads the seed gradient `ones_like(loss)` instead.
Both tests fail on the code before `dataflow.SAVES_RESULT` and
`scalars.gradient_seed_edges`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest
from conftest import FIXTURES, SHARED_TRACES, Raw, corpus_et, corpus_trace

import traceq
from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.execution_trace import tensor_edges
from traceq.relations.dataflow.readers import backward_reads, ddp_reducer
from traceq.rules.config import Config
from traceq.rules.engine import run

ENTRY = "ddp_train"


def _edges_into(names: list[str]) -> tuple[set, set]:
    trace, et = corpus_trace(ENTRY), corpus_et(ENTRY)
    ops = trace.dataflow_ops.filter(pl.col("name").is_in(names))["event"].implode()
    key = ["producer", "consumer"]
    exact = set(
        tensor_edges(trace, et).filter(pl.col("consumer").is_in(ops)).select(key).iter_rows()
    )
    inferred = set(trace.dataflow.filter(pl.col("consumer").is_in(ops)).select(key).iter_rows())
    return inferred, exact


def test_the_loss_backward_reads_the_seed_gradient_and_the_losss_input() -> None:
    inferred, exact = _edges_into(["aten::mse_loss_backward", "aten::ones_like"])
    assert len(exact) == 3  # loss -> ones_like; ones_like, the prediction -> backward
    assert inferred == exact


def test_no_edge_rests_on_the_sequence_number_where_the_backward_reads_inputs() -> None:
    """Every edge from a forward op into its backward node (`fwdbwd`) is the ET's: the
    corpus's GEMMs, GELU and loss make none (their backward reads their inputs)."""
    trace, et = corpus_trace(ENTRY), corpus_et(ENTRY)
    key = ["producer", "consumer"]
    exact = set(tensor_edges(trace, et).select(key).iter_rows())
    fwdbwd = set(trace.dataflow.filter(pl.col("evidence") == "fwdbwd").select(key).iter_rows())
    assert fwdbwd <= exact


def _siblings(trace: traceq.Trace, nodes: tuple[str, ...]) -> set[tuple[int, int]]:
    """Inferred edges between two ops directly under one autograd node named in `nodes`,
    neither of them a view: two gradients of one product, by the node's formula."""
    ops = trace.dataflow_ops.filter(pl.col("kind") != shapes.VIEW)
    names = trace.ops.select(pl.col("event").cast(pl.Int64).alias("parent"), "name")
    under = ops.join(names.filter(pl.col("name").is_in(nodes)), on="parent").select(
        "event", "parent"
    )
    return set(
        trace.dataflow.join(under.rename({"event": "producer"}), on="producer")
        .join(under.rename({"event": "consumer"}), on="consumer")
        .filter(pl.col("parent") == pl.col("parent_right"))
        .select("producer", "consumer")
        .iter_rows()
    )


def test_the_two_gemms_of_an_addmm_backward_read_each_other_no_value() -> None:
    """`AddmmBackward0` runs `grad.mm(mat2.t())` and `mat1.t().mm(grad)`: shape and order
    read the second GEMM as consuming the first; the ET says neither reads the other."""
    trace, et = corpus_trace(ENTRY), corpus_et(ENTRY)
    exact = set(tensor_edges(trace, et).select("producer", "consumer").iter_rows())
    between = _siblings(corpus_trace(ENTRY), ("AddmmBackward0",))
    assert not between & exact  # the ET has no such edge
    assert not between


GPU_TRAINING = [
    FIXTURES / "gpu" / "hta-sampled_rank-0.json.gz",
    SHARED_TRACES / "hta/tests/data/trace_diff/control/control.json.gz",
]


@pytest.mark.parametrize("path", GPU_TRAINING, ids=lambda p: p.parent.name + "/" + p.name)
def test_no_gradient_of_a_product_reads_another_on_gpu_training_traces(path: Path) -> None:
    """HTA's training traces: `MulBackward0`'s `grad * other` and `grad * self` were read as
    a chain (`mul -> mul`), and TQ104 reported it as pointwise ops to fuse (48 findings on
    `trace_diff/control`)."""
    if not path.exists():
        pytest.skip(f"{path} is not here (../shared is only on the workplace's machines)")
    trace = traceq.load(path, cache=False)
    assert trace.ops.filter(pl.col("name") == "MulBackward0").height > 0
    assert not _siblings(trace, tuple(backward_reads.ONE_OP_FORMULAS))
    findings = [set(f.ops) for f in run(trace, Config(select=["TQ104"])).findings]
    under = trace.dataflow_ops.join(
        trace.ops.filter(pl.col("name") == "MulBackward0").select(
            pl.col("event").cast(pl.Int64).alias("parent")
        ),
        on="parent",
    )
    gradients_of = [set(p) for p in under.group_by("parent").agg("event")["event"].to_list()]
    assert not [(g, f) for g in gradients_of for f in findings if len(g & f) > 1]


def test_no_edge_leaves_what_ddps_reducer_writes_into_a_bucket() -> None:
    """`reducer::mul_out` scales each gradient into its bucket view, read next by the
    bucket's allreduce: the ET has no edge out of it, and shape and order had five (into
    the next parameter's scaling, the `copy_` back into `.grad`, the optimizer's `add_`)."""
    trace, et = corpus_trace(ENTRY), corpus_et(ENTRY)
    frames = trace.ops.filter(pl.col("name").str.contains(ddp_reducer.BUCKET_WRITE))
    written = trace.dataflow_ops.join(
        frames.select(pl.col("event").cast(pl.Int64).alias("parent")), on="parent", how="semi"
    )["event"]
    assert written.len() == 4  # one per parameter of the two Linear layers
    out_of = pl.col("producer").is_in(written.implode())
    assert tensor_edges(trace, et).filter(out_of).height == 0
    assert trace.dataflow.filter(out_of).height == 0


@pytest.mark.parametrize(
    "path",
    [
        FIXTURES / "gpu" / "hta-sampled_rank-0.json.gz",
        SHARED_TRACES / "hta/tests/data/mtia_trace_single_rank/mtia_rank_0.json.gz",
    ],
    ids=lambda p: p.name,
)
def test_no_pointwise_chain_strings_ddps_per_parameter_scalings_together(path: Path) -> None:
    """On GPU training ranks TQ104 reported `reducer::mul_out` after `reducer::mul_out`
    (each scaling another parameter's gradient) as a chain to fuse: 9 such findings, up to
    16 ops long. The reducer frames are read from the raw JSON here: a CPU event named
    `torch::distributed::reducer::...` on the op's thread whose span holds it."""
    if not path.exists():
        pytest.skip(f"{path} is not here (../shared is only on the workplace's machines)")
    raw = Raw(path)
    frames = defaultdict(list)
    for i in raw.where(
        lambda e: e.get("ph") == "X" and e["name"].startswith("torch::distributed::reducer::")
    ):
        frames[raw.events[i]["tid"]].append((raw.start(i), raw.end(i)))

    def scaling(i: int) -> bool:
        start, end = raw.start(i), raw.end(i)
        inside = [(s, e) for s, e in frames[raw.events[i]["tid"]] if s <= start and end <= e]
        return bool(inside) and raw.events[i]["name"] == "aten::mul"

    assert sum(map(len, frames.values())) >= 19
    findings = run(traceq.load(path, cache=False), Config(select=["TQ104"])).findings
    assert not [f.ops for f in findings if sum(map(scaling, f.ops)) > 1]
