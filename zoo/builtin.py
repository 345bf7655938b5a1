"""The built-in zoo, as the ``traceq.zoo`` entry point ``builtin`` sees it.

Every module listed here holds one ``ENTRY``. A module whose optional dependency is
missing (Triton on a machine without it) becomes an exception in ``ENTRIES``, which
discovery reports as a problem instead of losing the whole zoo.
"""

from __future__ import annotations

import importlib

from traceq.zoo.registry import Entry

MODULES: tuple[str, ...] = (
    "traceq.zoo.gemm_bias_act.reference",
    "traceq.zoo.gemm_bias_act.triton",
    "traceq.zoo.gemm_bias_act.compile",
    "traceq.zoo.gemm_bias_act.addmm_activation",
    "traceq.zoo.glu.reference",
    "traceq.zoo.glu.triton",
    "traceq.zoo.glu.compile",
    "traceq.zoo.glu.liger",
    "traceq.zoo.dual_gemm_glu.reference",
    "traceq.zoo.dual_gemm_glu.triton",
    "traceq.zoo.dual_gemm_glu.compile",
    "traceq.zoo.mlp.reference",
    "traceq.zoo.mlp.triton",
    "traceq.zoo.mlp.compile",
    "traceq.zoo.rms_norm.reference",
    "traceq.zoo.rms_norm.triton",
    "traceq.zoo.rms_norm.functional",
    "traceq.zoo.rms_norm.compile",
    "traceq.zoo.add_rms_norm.reference",
    "traceq.zoo.add_rms_norm.triton",
    "traceq.zoo.add_rms_norm.compile",
    "traceq.zoo.rope.reference",
    "traceq.zoo.rope.triton",
    "traceq.zoo.rope.compile",
)


class EntryModuleUnavailable(ImportError):
    """A built-in entry module that could not be imported here."""


def load_entries(modules: tuple[str, ...] = MODULES) -> list[Entry | EntryModuleUnavailable]:
    loaded: list[Entry | EntryModuleUnavailable] = []
    for name in modules:
        try:
            loaded.append(importlib.import_module(name).ENTRY)
        except ImportError as error:
            loaded.append(EntryModuleUnavailable(f"{name}: {error}"))
    return loaded


ENTRIES: list[Entry | EntryModuleUnavailable] = load_entries()
