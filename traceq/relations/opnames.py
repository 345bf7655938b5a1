"""An op's name without its namespace, overload and in-place suffix: the one spelling every
stage uses to ask what an op is.

Apart from data flow's shape rules (`relations.dataflow.shapes`, which re-exports it) so
that what only reads op names (`traceq info`'s notices, the rules' op classes) does not
import the data-flow machinery with it.
"""

from __future__ import annotations

import re
from typing import overload

import polars as pl

NAMESPACE = r"^\w+::"
"""An op name's namespace (`aten::`, `zoo::`)."""
OVERLOAD = r"\..*$"
"""An op name's overload (`.Tensor`)."""
IN_PLACE_SUFFIX = r"([a-z0-9])_$"
"""The `_` of an in-place op (`add_`), not of a dunder (`__and__`)."""


@overload
def base_name(name: str, *, aten_only: bool = ..., in_place: bool = ...) -> str: ...
@overload
def base_name(
    name: pl.Expr | None = ..., *, aten_only: bool = ..., in_place: bool = ...
) -> pl.Expr: ...
def base_name(
    name: str | pl.Expr | None = None, *, aten_only: bool = False, in_place: bool = True
) -> str | pl.Expr:
    """`aten::add_.Tensor` -> `add_`: the op without its namespace and overload; the one
    spelling of it for the Python code that reads one op's name (a `str`) and for the
    frames' joins and filters (an expression; default: the `name` column).

    `in_place=False` drops the in-place `_` too (`add_` -> `add`: the rules' fusion ops
    count `x.add_(b)` as an add); `aten_only` drops only the `aten::` namespace, so that
    another library's op (`zoo::glu`, `c10d::allreduce_`) is never taken for aten's."""
    namespace = "^aten::" if aten_only else NAMESPACE
    if isinstance(name, str):
        op = re.sub(OVERLOAD, "", re.sub(namespace, "", name, count=1), count=1)
        return op if in_place else re.sub(IN_PLACE_SUFFIX, r"\1", op)
    name = pl.col("name") if name is None else name
    op = name.str.replace(namespace, "").str.replace(OVERLOAD, "")
    return op if in_place else op.str.replace(IN_PLACE_SUFFIX, "$1")
