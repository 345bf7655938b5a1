"""``torch.compile`` of every reference through the same harness (slow: Inductor builds C++).

Each check compiles the 2-D graph, then once more with dynamic shapes when the ragged case
arrives; the 3-D case reuses it (the entry flattens rows). Deselect with ``-m "not slow"``.
"""

from __future__ import annotations

import pytest
from traceq.zoo.check import check
from traceq.zoo.registry import PATTERNS, Zoo

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_compiled_reference_matches_float64_and_is_timed(
    builtin_zoo: Zoo, device: str, pattern: str
) -> None:
    act = {"gemm_bias_act": "gelu_tanh", "glu": "silu", "dual_gemm_glu": "silu", "mlp": "gelu"}
    report = check(
        pattern,
        (64, 128, 96),
        "float32",
        device,
        act.get(pattern, "none"),  # the norms and RoPE have no activation
        zoo=builtin_zoo,
        select={"compile"},
        min_run_time=0.02,
    )
    compiled = report.entry(f"{pattern}.compile")
    assert compiled.status == "pass", [(c.case, c.error, c.rel_error) for c in compiled.cases]
    assert compiled.max_rel_error is not None and compiled.max_rel_error < 1e-5
    timed = compiled.timed_cases
    assert timed and all(c.speedup is not None and c.speedup > 0 for c in timed)
