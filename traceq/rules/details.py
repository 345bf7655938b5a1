"""What a fusion finding says about its ops: their rows, where they ran, their kernels decoded,
sizes and shapes as text."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import polars as pl

from traceq.kernel_names import decode
from traceq.rules.common import common_module

if TYPE_CHECKING:
    from traceq.rules.base import Context


DETAIL_COLUMNS = (
    "event",
    "name",
    "ts_ns",
    "step",
    "module",
    "shapes",
    "dtype",
    "output_shape",
    "kernel_events",
    "kernel_names",
    "time_ns",
    "traffic_bytes",
    "itemsize",
)


def details(ops: pl.DataFrame, events: Iterable[int]) -> dict[int, dict[str, Any]]:
    """The rows of `ops` for `events`, by event id: what a finding needs to describe them.

    Rules match patterns with joins; only the (few) ops that end up in findings are turned
    into Python values, once each.
    """
    wanted = pl.Series("event", sorted(set(events)), dtype=pl.Int64)
    rows = ops.filter(pl.col("event").is_in(wanted.implode())).select(DETAIL_COLUMNS)
    return {row["event"]: row for row in rows.iter_rows(named=True)}


def located(ctx: Context, rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The fields every fusion finding shares: where it is (step, module), what it is made
    of (ops, kernels, their names), and what it costs now (`time_us`: GPU time of the
    kernels on a GPU trace, CPU time of the ops on a CPU-only one)."""
    rows = sorted(rows, key=lambda r: (r["ts_ns"], r["event"]))
    kernel_names = [n for r in rows for n in r["kernel_names"]]
    evidence: dict[str, Any] = {
        "op_names": [r["name"] for r in rows],
        "kernel_names": kernel_names,
        "op_time_us": [round(r["time_ns"] / 1000, 3) for r in rows],
        "time_basis": "gpu kernels" if ctx.device.kind == "gpu" else "cpu ops",
    }
    decoded = decode_kernels(kernel_names)
    if decoded:
        evidence["decoded"] = decoded
    return {
        "step": rows[0]["step"],
        "module": common_module([r["module"] for r in rows]),
        "ops": [r["event"] for r in rows],
        "kernels": [k for r in rows for k in r["kernel_events"]],
        "dtype": next((r["dtype"] for r in rows if r["dtype"]), None),
        "time_us": sum(r["time_ns"] for r in rows) / 1000,
        "evidence": evidence,
    }


def decode_kernels(names: list[str]) -> list[str]:
    """One line per distinct kernel name saying what the name encodes (library, arch,
    dtype, tile, layout, epilogue, fused ops): evidence a reader can check, never the
    classification itself."""
    return [decode(name).describe() for name in dict.fromkeys(names)]


UNRECORDED = "shape not recorded"
"""What a message says where a trace has no input shapes (`record_shapes=False`): never
"[?]" or "0.0 KiB" moved (`rules.recorded` says once what is missing)."""


def mib(nbytes: float | None) -> str:
    if not nbytes or nbytes <= 0:  # bytes come from shapes: none recorded, none known
        return f"? bytes ({UNRECORDED})"
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.1f} KiB"


def shape_text(shape: list[int] | None) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]" if shape is not None else f"({UNRECORDED})"
