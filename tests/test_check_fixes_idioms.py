"""`traceq analyze --check-fixes` proves the idiom fixes too: on a recorded block with HF's
written-out RMSNorm (after a residual add) and RoPE, the zoo's `add_rms_norm` and `rope`
kernels make TQ107 and TQ108 go away, recorded at the findings' own shapes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

if not torch.cuda.is_available():  # before any zoo kernel module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from traceq.cli.main import main

TRACE = (
    Path(__file__).resolve().parent.parent
    / "fixtures"
    / "corpus_idioms"
    / "written_out_fp32.pt.trace.json.gz"
)


def test_check_fixes_proves_tq107_and_tq108_gone_on_the_written_out_block() -> None:
    result = CliRunner().invoke(
        main,
        ["analyze", str(TRACE), "--select", "TQ107,TQ108", "--check-fixes", "--format", "json"],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output[result.output.index("{") :])
    checks = {g["rule"]: g["fix_check"] for g in payload["groups"]}
    assert set(checks) == {"TQ107", "TQ108"}

    norm = checks["TQ107"]
    assert norm["status"] == "gone" and norm["pattern"] == "add_rms_norm"
    assert norm["checks"] == [{"rule": "TQ107", "split": 3, "fused": 0, "gone": True}]
    assert norm["requested_shape"] == [24, 1, 64] and norm["scale"] == 1
    assert norm["fused"]["top_level_ops"] == {"zoo::add_rms_norm_triton": 3}

    rope = checks["TQ108"]
    assert rope["status"] == "gone" and rope["pattern"] == "rope"
    assert rope["checks"] == [{"rule": "TQ108", "split": 3, "fused": 0, "gone": True}]
    assert rope["requested_shape"] == [24, 4, 16]
    assert rope["fused"]["top_level_ops"] == {"zoo::rope_triton": 3}
    # the split reference is HF's apply_rotary_pos_emb: mul, neg, cat, mul, add per tensor
    assert rope["split"]["top_level_ops"]["aten::cat"] == 6
