"""What a trace was recorded without, and what that costs the findings: said once.

`torch.profiler` records input shapes, the Python stack and the module tree only when
asked (`record_shapes`, `with_stack`, `with_modules`), and an Execution Trace only beside
it. Without shapes the fusion rules cannot size an op (nor match a GEMM's operands),
without stacks a finding has no source line, without modules no layer to name. Rather
than findings "on [?]" that "moved 0.0 KiB", an analysis says what is missing, what that
costs, and the option that records it (`traceq.profile` records all of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from traceq.loader.companions import ET_SUFFIXES, execution_trace_beside
from traceq.relations.opnames import base_name
from traceq.rules.op_classes import GEMM_OPERANDS

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

__all__ = ["ET_SUFFIXES", "Notice", "execution_trace_beside", "notices"]


@dataclass(frozen=True)
class Notice:
    """One thing the trace lacks: `kind` (shapes, stacks, modules, execution_trace), what
    that costs, and how to record it. `findings`: whether findings are poorer without it
    (an analysis shows those; `info` shows all)."""

    kind: str
    message: str
    findings: bool = True

    def __str__(self) -> str:
        return self.message


def notices(trace: LoadedTrace) -> list[Notice]:
    """What `trace` lacks, in the order it costs findings most: shapes, stacks, modules,
    then an Execution Trace beside it."""
    found: list[Notice] = []
    # only the columns read: on a cached trace `info` decodes no frame whole
    ops = trace.select("ops", "event", "name", "parent", "input_dims", "module")
    if ops.height:
        shaped = pl.col("input_dims").is_not_null()
        gemms = ops.filter(base_name(aten_only=True, in_place=False).is_in(list(GEMM_OPERANDS)))
        # one GEMM per call: `aten::linear` and the `aten::addmm` inside it are one
        gemms = gemms.filter(
            ~pl.col("parent").is_in(gemms["event"].cast(pl.Int64).implode()).fill_null(False)
        )
        seen = int(gemms.select(shaped.sum()).item() or 0) if gemms.height else 0
        if not ops.select(shaped.any()).item():
            sized = (
                f"fusion rules see the shapes of {seen} of {gemms.height:,} GEMMs"
                if gemms.height
                else ""
            )
            found.append(
                Notice(
                    "shapes",
                    "no input shapes: "
                    + (f"{sized}, and " if sized else "")
                    + "no finding can say its shapes, dtype or bytes moved; "
                    "record with `record_shapes=True`",
                )
            )
        elif seen < gemms.height:
            found.append(
                Notice(
                    "shapes",
                    f"input shapes on part of the trace: fusion rules see {seen:,} of "
                    f"{gemms.height:,} GEMMs; record with `record_shapes=True`",
                )
            )
        if trace.select("python", "event").height == 0:
            found.append(
                Notice(
                    "stacks",
                    "no Python stacks: findings cannot name the source line that issued "
                    "their ops; record with `with_stack=True`",
                )
            )
        if ops.select(pl.col("module").is_null().all()).item():
            found.append(
                Notice(
                    "modules",
                    "no module hierarchy: findings cannot name their layer "
                    "(`layers.*.mlp`) nor group repeated layers; record with `with_modules=True`",
                )
            )
    found.extend(_dataflow_notice(trace))
    return found


def _dataflow_notice(trace: LoadedTrace) -> list[Notice]:
    """Which data flow the fusion rules saw: exact from the Execution Trace `traceq.load`
    read (shown with the findings, as is an ET that could not be used), or inferred."""
    used = getattr(trace, "dataflow_source", None)  # a `Trace`, once data flow was asked for
    et_file = getattr(trace, "execution_trace_file", None)
    if used is not None and used.execution_trace is not None:
        return [Notice("execution_trace", f"data flow: {used}")]
    if et_file is not None:  # recorded; read when data flow is first asked for
        return []
    beside = execution_trace_beside(trace.source)
    if beside is not None and hasattr(trace, "execution_trace_file"):  # loaded without it
        return [
            Notice(
                "execution_trace",
                f"data flow: inferred from shapes and order; {beside.name} beside it was not "
                "read (`--no-et`, `execution_trace=False`)",
                findings=False,
            )
        ]
    if beside is not None:
        return []
    return [
        Notice(
            "execution_trace",
            "no Execution Trace beside it: data flow between ops is inferred from shapes "
            "and order; record one with `traceq.profile(..., execution_trace=True)`",
            findings=False,
        )
    ]
