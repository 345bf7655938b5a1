"""The ops data flow is defined over: the *semantic* ops, one row each.

A semantic op is a dispatcher op not nested in another one (`aten::linear`, not the
`aten::addmm` inside it) or one of Inductor's fused kernels; ops run while Dynamo compiles
(on fake tensors) are none. Each row carries its kernels and what `shapes` derives from its
signature (kind, data inputs, output shape), computed once per distinct signature.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from traceq.relations.dataflow import shapes
from traceq.relations.dataflow.readers.indexing import index_results
from traceq.relations.dataflow.shapes import FUSED_KERNEL, NOT_SEMANTIC_NS, SEMANTIC_OP
from traceq.relations.vocabulary import NOT_TENSOR

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

COMPILING = r"(\(dynamo_timed\)$|^dynamo$|^entire_frame_compile$)"
"""Ranges Dynamo and Inductor record while compiling: the ops inside run on fake tensors."""
COMPILED_REGION = r"^(Torch-Compiled Region|CompiledFunction|## Call CompiledFxGraph)"
"""Non-semantic ops whose children run a compiled graph (buffers reinterpreted freely)."""
GEMM_CHILD = r"^aten::(linear|mm|addmm|matmul)$"
"""A custom op (not `aten::`/`prims::`, not an Inductor kernel) with one of these among its
children is a wrapper around a GEMM (vLLM's `rocm_unquantized_gemm`, aiter's `gemm_a16w16`
falling back to `torch.nn.functional.linear`): its children, not it, are the semantic ops,
so the GEMM is classed, costed and linked by what the profiler recorded for it."""
CORE_NS = ("aten::", "prims::")
_SIG_KEYS = ["name", "input_dims", "_types_text", "_concrete_text"]
_SIG_TEXT = [
    pl.col("input_types").list.join("\x1f").fill_null("").alias("_types_text"),
    pl.col("concrete_inputs").list.join("\x1f").fill_null("").alias("_concrete_text"),
]
"""The list arguments of a signature as text, so they can be join keys."""


def is_semantic(name: pl.Expr) -> pl.Expr:
    """True for dispatcher ops (`aten::*`, `zoo::*`, ...) and Inductor's fused kernels."""
    dispatcher = name.str.contains(SEMANTIC_OP)
    for ns in NOT_SEMANTIC_NS:
        dispatcher = dispatcher & ~name.str.starts_with(ns)
    return dispatcher | name.str.contains(FUSED_KERNEL)


def semantic_root(ops: pl.DataFrame) -> np.ndarray:
    """Position (in `ops`, sorted by event) of each op's outermost semantic ancestor-or-self,
    or -1; also -1 for ops run while compiling (Dynamo traces with fake tensors). A custom
    op wrapping a GEMM (`GEMM_CHILD`) is not semantic: its children are."""
    events = ops["event"].cast(pl.Int64).to_numpy()
    parent_event = ops["parent"].fill_null(-1).to_numpy()
    parent = np.where(parent_event >= 0, np.searchsorted(events, parent_event), -1)
    semantic = ops.select(is_semantic(pl.col("name")))["name"].to_numpy()
    semantic &= ~_gemm_wrappers(ops, parent, semantic)
    compiling = ops.select(pl.col("name").str.contains(COMPILING))["name"].to_numpy()
    root = np.where(semantic, np.arange(len(events)), -1)
    ancestor = parent.copy()
    live = np.flatnonzero(ancestor >= 0)
    while live.size:
        hit = semantic[ancestor[live]]
        root[live[hit]] = ancestor[live[hit]]
        compiling[live] |= compiling[ancestor[live]]
        ancestor[live] = parent[ancestor[live]]
        live = live[ancestor[live] >= 0]
    root[compiling] = -1
    return root


def _gemm_wrappers(ops: pl.DataFrame, parent: np.ndarray, semantic: np.ndarray) -> np.ndarray:
    """True for each semantic custom op with an aten GEMM (`GEMM_CHILD`) among its children."""
    name = pl.col("name")
    flags = ops.select(
        name.str.contains(GEMM_CHILD).alias("gemm"),
        (name.str.starts_with(CORE_NS[0]) | name.str.starts_with(CORE_NS[1])).alias("core"),
        name.str.contains(FUSED_KERNEL).alias("kernel"),
    )
    custom = semantic & ~flags["core"].to_numpy() & ~flags["kernel"].to_numpy()
    wrapper = np.zeros(len(parent), dtype=bool)
    children = np.flatnonzero(flags["gemm"].to_numpy() & (parent >= 0))
    wrapper[parent[children]] = True
    return wrapper & custom


def dataflow_ops(trace: LoadedTrace) -> pl.DataFrame:
    """The ops data flow is defined over, one row each, with their kernels and output shape.

    Columns: event, name, pid, tid, ts_ns, dur_ns, step, module, parent (enclosing
    non-semantic op, e.g. an autograd node), compiled (an Inductor kernel or an op of a
    compiled graph), input_dims, shapes, input_types, concrete_inputs, dtype, kind (gemm,
    activation, elementwise, ...; `shapes`), output_shape, data_inputs, kernel_events,
    kernel_names, gpu_ns, cpu_ns, n_kernels.
    """
    ops = trace.ops.sort("event")
    root = semantic_root(ops)
    positions = np.arange(ops.height)
    top = ops.filter(pl.Series(root == positions))
    root_event = ops["event"].cast(pl.Int64).gather(pl.Series(np.where(root >= 0, root, 0)))
    op_root = pl.DataFrame(
        {"op_event": ops["event"].cast(pl.Int64), "_root": root_event, "_ok": root >= 0}
    ).filter(pl.col("_ok"))
    kernels = (
        trace.kernels.select("event", "name", "ts_ns", "dur_ns", "op_event")
        .join(op_root, on="op_event", how="inner")
        .sort("ts_ns", "event")
        .group_by("_root")
        .agg(
            pl.col("event").cast(pl.Int64).alias("kernel_events"),
            pl.col("name").alias("kernel_names"),
            pl.col("dur_ns").sum().cast(pl.Int64).alias("gpu_ns"),
        )
    )
    frame = (
        top.with_columns(pl.col("event").cast(pl.Int64), *_SIG_TEXT)
        .join(_signatures(top), on=_SIG_KEYS, how="left", nulls_equal=True)
        .join(kernels, left_on="event", right_on="_root", how="left")
    )
    parents = ops.select(
        pl.col("event").cast(pl.Int64).alias("parent"), pl.col("name").alias("_pn")
    )
    frame = frame.join(parents, on="parent", how="left").with_columns(
        (
            (pl.col("kind") == shapes.FUSED)
            | pl.col("_pn").str.contains(COMPILED_REGION).fill_null(False)
        ).alias("compiled")
    )
    frame = index_results(frame, ops)
    dtype = pl.col("input_types").list.eval(pl.element().filter(~pl.element().is_in(NOT_TENSOR)))
    return frame.select(
        "event",
        "name",
        "pid",
        "tid",
        "ts_ns",
        "dur_ns",
        "step",
        "module",
        "parent",
        "compiled",
        "input_dims",
        "shapes",
        "input_types",
        "concrete_inputs",
        dtype.list.first().alias("dtype"),
        "kind",
        "output_shape",
        "data_inputs",
        pl.col("kernel_events").fill_null([]),
        pl.col("kernel_names").fill_null([]),
        pl.col("gpu_ns").fill_null(0),
        pl.col("dur_ns").alias("cpu_ns"),
        pl.col("kernel_events").list.len().fill_null(0).cast(pl.Int64).alias("n_kernels"),
    ).sort("event")


def _signatures(top: pl.DataFrame) -> pl.DataFrame:
    """Kind, data inputs and output shape per distinct op signature (Python, once each)."""
    unique = top.select(
        "name",
        "input_dims",
        "input_types",
        "concrete_inputs",
        *_SIG_TEXT,
    ).unique(_SIG_KEYS, maintain_order=True)
    kinds, outputs, inputs = [], [], []
    for name, dims, types, concrete in unique.select(
        "name", "input_dims", "input_types", "concrete_inputs"
    ).iter_rows():
        sig = shapes.signature(name, dims, types, concrete)
        kinds.append(sig.kind)
        outputs.append(sig.output)
        inputs.append([{"index": i, "shape": s} for i, s in sig.inputs])
    return unique.select(_SIG_KEYS).with_columns(
        pl.Series("kind", kinds, dtype=pl.String),
        pl.Series("output_shape", outputs, dtype=pl.List(pl.Int64)),
        pl.Series(
            "data_inputs",
            inputs,
            dtype=pl.List(pl.Struct({"index": pl.Int64, "shape": pl.List(pl.Int64)})),
        ),
    )
