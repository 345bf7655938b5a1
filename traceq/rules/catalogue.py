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
    tq106_unfused_attention,
    tq107_unfused_norm,
    tq108_unfused_rotary,
    tq109_materialized_logits,
    tq110_conv_bias_batchnorm,
    tq201_launch_bound,
    tq202_host_sync,
    tq203_memcpy,
    tq204_dispatch_overhead,
    tq205_compile_overhead,
    tq206_unfused_optimizer,
    tq207_zeroed_grads,
    tq208_loop_indexing,
    tq209_sync_dataloader,
    tq210_idle_graph_replay,
    tq211_allocator_churn,
    tq212_cpu_fill_then_copy,
    tq301_fp32_gemm,
    tq302_low_occupancy,
    tq303_unaligned_half_gemm,
    tq304_gemm_far_from_roof,
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
    tq106_unfused_attention,
    tq107_unfused_norm,
    tq108_unfused_rotary,
    tq109_materialized_logits,
    tq110_conv_bias_batchnorm,
    tq201_launch_bound,
    tq202_host_sync,
    tq203_memcpy,
    tq204_dispatch_overhead,
    tq205_compile_overhead,
    tq206_unfused_optimizer,
    tq207_zeroed_grads,
    tq208_loop_indexing,
    tq209_sync_dataloader,
    tq210_idle_graph_replay,
    tq211_allocator_churn,
    tq212_cpu_fill_then_copy,
    tq301_fp32_gemm,
    tq302_low_occupancy,
    tq303_unaligned_half_gemm,
    tq304_gemm_far_from_roof,
    tq401_straggler,
    tq402_exposed_comm,
    tq403_imbalanced_collective,
    tq404_slow_collective,
)

RULES: list[Rule] = [module.RULE for module in MODULES]
