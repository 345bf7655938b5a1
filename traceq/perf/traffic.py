"""Memory traffic of an op: bytes per element of each dtype, elements of each shape, and the
bytes each tensor input moves.

The traffic model every saving rests on: fused ops are memory-bound, so what a fusion saves
follows the bytes it no longer moves. Counted from the trace's own `Input type` and
`Input Dims`; a dtype the profiler spells in a way not listed here counts as fp32 (4 bytes),
the default dtype.
"""

from __future__ import annotations

import polars as pl

#: Bytes per element of the dtype strings the profiler writes in `Input type`.
ITEMSIZE: dict[str, int] = {
    "double": 8,
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4,
}


def numel(shape: pl.Expr) -> pl.Expr:
    """Elements of a shape list ([] is a 0-d tensor: 1 element)."""
    return shape.list.eval(pl.element().product()).list.first().cast(pl.Int64)


def itemsize(dtype: pl.Expr) -> pl.Expr:
    """Bytes per element of a profiler dtype string; 4 when unknown (fp32 is the default)."""
    return dtype.replace_strict(ITEMSIZE, default=4, return_dtype=pl.Int64)


def input_bytes(ops: pl.DataFrame) -> pl.DataFrame:
    """One row per tensor input of each op: `event`, `input_index`, `bytes`."""
    return (
        ops.select("event", "data_inputs", "itemsize")
        .explode("data_inputs")
        .drop_nulls("data_inputs")
        .unnest("data_inputs")
        .filter(pl.col("shape").list.len() > 0)
        .select(
            "event",
            pl.col("index").alias("input_index"),
            (numel(pl.col("shape")) * pl.col("itemsize")).alias("bytes"),
        )
    )
