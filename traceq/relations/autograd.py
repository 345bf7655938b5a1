"""How the profiler names autograd's work: the one place the relations and rules read it.

Each node the engine runs leaves two ranges: the engine's frame around it
(`autograd::engine::evaluate_function: AddmmBackward0`: the node, then the input-buffer
adds of what it returned) and, inside, the node itself (`AddmmBackward0`). A trace with
names stripped calls both `<backward op>`. `is_node` says whether a range is one of
these; the rest are properties of a node: whether a range is the frame (`is_frame`),
which node a frame runs (`framed_node`), and whether the node runs one of PyTorch's
derivative formulas (`is_formula`), whose reads are known.
"""

from __future__ import annotations

import polars as pl

ENGINE_FRAME = "autograd::engine::evaluate_function:"
"""The engine's range around each node it runs: `evaluate_function: AddmmBackward0`."""
ANONYMISED_NODE = "<backward op>"
"""What a trace with names stripped (HTA's anonymised test traces) calls a node."""
_NODE = r"Backward\d*$"
"""A node's own name: `AddmmBackward0`, a custom Function's `MyFnBackward`, TorchScript's
`DifferentiableGraphBackward`."""
_FORMULA = r"Backward\d+$"
"""A derivative formula's node: numbered by overload (`AddmmBackward0`)."""


def _name(name: pl.Expr | None) -> pl.Expr:
    return pl.col("name") if name is None else name


def is_node(name: pl.Expr | None = None) -> pl.Expr:
    """True for a range of an autograd node (default: the `name` column): the node
    (`AddmmBackward0`, a custom `autograd.Function`'s `MyFnBackward`), the engine's frame
    around any node (`AccumulateGrad`'s included), or an anonymised `<backward op>`. The
    ops inside are the backward pass's work."""
    name = _name(name)
    return (
        name.str.contains(_NODE)
        | name.str.starts_with(f"{ENGINE_FRAME} ")
        | (name == ANONYMISED_NODE)
    )


def is_frame(name: pl.Expr | None = None) -> pl.Expr:
    """True for the engine's frame around a node (`is_node`), not the node's own range."""
    return _name(name).str.starts_with(ENGINE_FRAME)


def framed_node(name: pl.Expr | None = None) -> pl.Expr:
    """The node an engine's frame runs (`AddmmBackward0`); null for any other range."""
    name = _name(name)
    return pl.when(is_frame(name)).then(name.str.strip_prefix(f"{ENGINE_FRAME} "))


def is_formula(name: pl.Expr | None = None) -> pl.Expr:
    """True for a node (or its frame) of PyTorch's derivative formulas (`AddmmBackward0`),
    numbered by overload: its ops read the gradient and what its forward op saved, as the
    formula says. Not a custom `autograd.Function`'s or TorchScript's node: their backward
    is any code, whose ops read each other."""
    return _name(name).str.contains(_FORMULA)
