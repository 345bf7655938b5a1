"""The built-in rules, in code order. Codes are part of traceq's interface: never reused.

Installed as the `builtin` entry point of the `traceq.rules` group, so the built-ins are
discovered by the same path as third-party rules. Imported plainly: a broken built-in
must fail loudly, not vanish from the catalogue.
"""

from __future__ import annotations

from traceq.rules import (
    tq101_split_matmul_bias,
    tq102_split_gemm_activation,
    tq103_unfused_glu,
    tq104_pointwise_chain,
    tq105_parallel_gemms,
    tq201_launch_bound,
    tq202_host_sync,
    tq203_memcpy,
    tq204_dispatch_overhead,
    tq205_compile_overhead,
    tq206_unfused_optimizer,
    tq207_zeroed_grads,
    tq301_fp32_gemm,
    tq302_low_occupancy,
    tq401_straggler,
    tq402_exposed_comm,
    tq403_imbalanced_collective,
    tq404_slow_collective,
)
from traceq.rules.base import Rule

MODULES = (
    tq101_split_matmul_bias,
    tq102_split_gemm_activation,
    tq103_unfused_glu,
    tq104_pointwise_chain,
    tq105_parallel_gemms,
    tq201_launch_bound,
    tq202_host_sync,
    tq203_memcpy,
    tq204_dispatch_overhead,
    tq205_compile_overhead,
    tq206_unfused_optimizer,
    tq207_zeroed_grads,
    tq301_fp32_gemm,
    tq302_low_occupancy,
    tq401_straggler,
    tq402_exposed_comm,
    tq403_imbalanced_collective,
    tq404_slow_collective,
)

RULES: list[Rule] = [module.RULE for module in MODULES]
