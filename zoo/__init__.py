"""The kernel zoo: reference and fused implementations of the MLP patterns traceq flags.

A finding is half an answer; the zoo proves the fix — same numbers (``check``), fewer
kernels and less time (``check``'s timings, ``record_trace``). Entries are found through
the ``traceq.zoo`` entry-point group (``discover``), the built-in ones included.

Set ``TRITON_INTERPRET=1`` before calling ``discover`` on a machine without a GPU: the
Triton entries' modules are imported then, and the flag is read at import. Names are
loaded on first use, so ``import traceq.zoo.registry`` stays free of torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traceq.zoo.check import CaseResult, CheckReport, EntryResult, check
    from traceq.zoo.errors import ZooError, ZooUsageError
    from traceq.zoo.patterns import parse_shape
    from traceq.zoo.record import RecordedTrace, record_trace
    from traceq.zoo.registry import (
        ACTIVATIONS,
        DTYPES,
        PATTERNS,
        Entry,
        PluginProblem,
        Zoo,
        discover,
    )

_EXPORTS: dict[str, str] = {
    "ACTIVATIONS": "traceq.zoo.registry",
    "DTYPES": "traceq.zoo.registry",
    "PATTERNS": "traceq.zoo.registry",
    "Entry": "traceq.zoo.registry",
    "PluginProblem": "traceq.zoo.registry",
    "Zoo": "traceq.zoo.registry",
    "discover": "traceq.zoo.registry",
    "ZooError": "traceq.zoo.errors",
    "ZooUsageError": "traceq.zoo.errors",
    "CaseResult": "traceq.zoo.check",
    "CheckReport": "traceq.zoo.check",
    "EntryResult": "traceq.zoo.check",
    "check": "traceq.zoo.check",
    "parse_shape": "traceq.zoo.patterns",
    "RecordedTrace": "traceq.zoo.record",
    "record_trace": "traceq.zoo.record",
}

__all__ = [
    "ACTIVATIONS",
    "DTYPES",
    "PATTERNS",
    "CaseResult",
    "CheckReport",
    "Entry",
    "EntryResult",
    "PluginProblem",
    "RecordedTrace",
    "Zoo",
    "ZooError",
    "ZooUsageError",
    "check",
    "discover",
    "parse_shape",
    "record_trace",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'zoo' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
