"""The norm and RoPE patterns (``rms_norm``, ``add_rms_norm``, ``rope``) through the one check
harness, as torch ops, and through the closed loop that proves TQ107 and TQ108 gone.

Tiny shapes: on a machine without a GPU the Triton entries run in the interpreter. Numerics
are the harness's (float64 reference, per-dtype bounds); nothing here compares by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from traceq.zoo.check import POISON_OUT, check
from traceq.zoo.patterns import ERROR_BOUNDS
from traceq.zoo.registry import NO_ACTIVATION, Zoo
from traceq.zoo.verify import plan_finding, verify

import traceq
from traceq.analyze import analyze

IDIOM_CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus_idioms"

IDIOMS = ("rms_norm", "add_rms_norm", "rope")

#: M, K, N: 40 rows of 96 (rms_norm); 40 tokens, 4 heads of dim 96 (rope). The harness adds
#: a ragged case (odd row width / head dim 71) and a batched one (2 × 21 rows).
SHAPE = (40, 4, 96)

FAST = {"reference", "triton", "functional"}


def _triton_or_skip(zoo: Zoo, pattern: str, device: str) -> None:
    ok, reason = zoo.get(f"{pattern}.triton").available(device)
    if not ok:
        pytest.skip(f"{pattern}.triton cannot run here: {reason}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("pattern", IDIOMS)
def test_fused_entries_match_float64_within_the_dtype_bound(
    builtin_zoo: Zoo, device: str, pattern: str, dtype: str
) -> None:
    _triton_or_skip(builtin_zoo, pattern, device)
    report = check(pattern, SHAPE, dtype, device, zoo=builtin_zoo, select=FAST, timing=False)
    assert report.passed, [(e.entry, [(c.case, c.error) for c in e.cases]) for e in report.failures]
    assert report.bound == ERROR_BOUNDS[dtype]
    triton = report.entry(f"{pattern}.triton")
    assert triton.status == "pass" and triton.poisoning == POISON_OUT
    assert [c.case for c in triton.cases] == ["main", "ragged", "3-D"]
    assert triton.max_rel_error is not None and 0 < triton.max_rel_error < report.bound


def test_patterns_without_an_activation_run_with_none_whatever_is_asked(
    builtin_zoo: Zoo, device: str
) -> None:
    assert set(IDIOMS) <= NO_ACTIVATION
    report = check("rms_norm", (8, 1, 32), "float32", device, "silu", zoo=builtin_zoo,
                   select={"reference"}, timing=False)  # fmt: skip
    assert report.act == "none" and report.passed


def test_f_rms_norm_is_checked_but_marked_not_fused_on_the_cpu(builtin_zoo: Zoo) -> None:
    report = check("rms_norm", (8, 1, 32), "bfloat16", "cpu", zoo=builtin_zoo,
                   select={"functional"}, timing=False)  # fmt: skip
    functional = report.entry("rms_norm.functional")
    assert functional.status == "pass" and "not fused on CPU" in functional.note


def test_rope_takes_hf_strided_q_and_k_and_grouped_kv_heads(builtin_zoo: Zoo, device: str) -> None:
    _triton_or_skip(builtin_zoo, "rope", device)
    from traceq.zoo.rope.reference import apply_rotary_pos_emb
    from traceq.zoo.rope.triton import rope

    g = torch.Generator().manual_seed(3)
    # HF: q_proj(x).view(B, S, H, D).transpose(1, 2); 4 query heads, 2 kv heads; cos [1, S, D]
    q = torch.randn(2, 5, 4, 6, generator=g).to(device).transpose(1, 2)
    k = torch.randn(2, 5, 2, 6, generator=g).to(device).transpose(1, 2)
    angles = torch.randn(1, 5, 3, generator=g).to(device)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    q_out, k_out = rope(q, k, cos, sin)
    q_ref, k_ref = apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())
    assert torch.allclose(q_out.double(), q_ref, atol=1e-5)
    assert torch.allclose(k_out.double(), k_ref, atol=1e-5)


OPS = {
    "rms_norm_triton": [(6, 16), (16,), "none"],
    "add_rms_norm_triton": [(6, 16), (6, 16), (16,), "none"],
    "rope_triton": [(1, 2, 3, 8), (1, 2, 3, 8), (1, 3, 8), (1, 3, 8), "none"],
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_custom_op_schema_and_fake_kernel_agree_with_the_real_one(
    builtin_zoo: Zoo, device: str, name: str
) -> None:
    _triton_or_skip(builtin_zoo, name.removesuffix("_triton"), device)
    g = torch.Generator().manual_seed(1)
    args = tuple(
        torch.randn(spec, generator=g).to(device) if isinstance(spec, tuple) else spec
        for spec in OPS[name]
    )
    results = torch.library.opcheck(
        getattr(torch.ops.zoo, name), args, test_utils=("test_schema", "test_faketensor")
    )
    assert set(results.values()) == {"SUCCESS"}, results


@pytest.mark.parametrize(
    ("pattern", "ops_per_step"), [("rms_norm", 1), ("add_rms_norm", 1), ("rope", 1)]
)
def test_verify_shows_the_idiom_rule_gone_with_the_triton_kernel(
    builtin_zoo: Zoo, device: str, pattern: str, ops_per_step: int
) -> None:
    _triton_or_skip(builtin_zoo, pattern, device)
    result = verify(pattern, shape=(16, 2, 32), device=device, zoo=builtin_zoo)
    rule = "TQ108" if pattern == "rope" else "TQ107"
    assert result.status == "gone", result.summary
    assert [c.to_dict() for c in result.checks] == [
        {"rule": rule, "split": 3, "fused": 0, "gone": True}
    ]
    assert result.fused is not None and result.fused.entry == f"{pattern}.triton"
    assert result.fused.top_level_ops == {f"zoo::{pattern}_triton": 3 * ops_per_step}
    assert result.act == "none"


def test_a_layernorm_finding_is_unsupported_not_an_error(builtin_zoo: Zoo) -> None:
    trace = traceq.load(IDIOM_CORPUS / "written_out_layernorm.pt.trace.json.gz")
    layer = [f for f in analyze(trace, select=["TQ107"]) if f.evidence["norm"] == "LayerNorm"]
    assert layer
    result = verify(layer[0], trace=trace, device="cpu", zoo=builtin_zoo)
    assert result.status == "unsupported" and "only RMSNorm" in result.reason


def test_corpus_findings_plan_add_rms_norm_and_rope_at_their_shapes(builtin_zoo: Zoo) -> None:
    trace = traceq.load(IDIOM_CORPUS / "written_out_fp32.pt.trace.json.gz")
    plans = {
        (f.rule, f.evidence.get("residual_add") is not None): plan_finding(
            f, trace=trace, device="cpu", zoo=builtin_zoo
        )
        for f in analyze(trace, select=["TQ107", "TQ108"])
    }
    with_add, alone, rotary = (
        plans[("TQ107", True)],
        plans[("TQ107", False)],
        plans[("TQ108", False)],
    )
    assert with_add is not None and with_add.pattern == "add_rms_norm"
    assert alone is not None and alone.pattern == "rms_norm"
    assert with_add.shape == alone.shape == (24, 1, 64)  # [2, 12, 64]: 24 rows of 64
    assert rotary is not None and rotary.pattern == "rope"
    assert rotary.shape == (24, 4, 16)  # [2, 4, 12, 16]: 24 tokens, 4 heads of 16
