"""The built-in zoo, as the ``traceq.zoo`` entry point ``builtin`` sees it.

Every module listed here holds one ``ENTRY``. A module whose optional dependency is
missing (Triton on a machine without it) becomes an exception in ``ENTRIES``, which
discovery reports as a problem instead of losing the whole zoo.
"""

from __future__ import annotations

import importlib

from zoo.registry import Entry

MODULES: tuple[str, ...] = (
    "zoo.gemm_bias_act.reference",
    "zoo.gemm_bias_act.triton",
    "zoo.gemm_bias_act.compile",
    "zoo.gemm_bias_act.addmm_activation",
    "zoo.glu.reference",
    "zoo.glu.triton",
    "zoo.glu.compile",
    "zoo.glu.liger",
    "zoo.dual_gemm_glu.reference",
    "zoo.dual_gemm_glu.triton",
    "zoo.dual_gemm_glu.compile",
    "zoo.mlp.reference",
    "zoo.mlp.triton",
    "zoo.mlp.compile",
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
