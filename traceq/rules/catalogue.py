"""The built-in rules, in code order. Codes are part of traceq's interface: never reused.

Installed as the `builtin` entry point of the `traceq.rules` group, so the built-ins are
discovered by the same path as third-party rules.
"""

from __future__ import annotations

import importlib

from traceq.rules.base import Rule

MODULES = (
    "tq101_split_matmul_bias",
    "tq102_split_gemm_activation",
    "tq103_unfused_glu",
    "tq104_pointwise_chain",
    "tq105_parallel_gemms",
    "tq201_launch_bound",
    "tq202_host_sync",
    "tq203_memcpy",
    "tq204_dispatch_overhead",
    "tq205_compile_overhead",
    "tq301_fp32_gemm",
    "tq302_low_occupancy",
)


def _load() -> list[Rule]:
    # TODO(lead): the fusion modules (TQ101-TQ105) are being written in parallel; until they
    # land a missing one is skipped. Once all exist, import them plainly so a broken
    # built-in fails loudly.
    rules = []
    for name in MODULES:
        try:
            module = importlib.import_module(f"traceq.rules.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"traceq.rules.{name}":
                raise
            continue
        rules.append(module.RULE)
    return rules


RULES: list[Rule] = _load()
