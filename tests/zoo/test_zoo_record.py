"""Recording an entry into a Kineto trace: the input of the closed-loop verify."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from traceq.zoo.errors import UnknownEntry, ZooUsageError
from traceq.zoo.record import record_trace
from traceq.zoo.registry import Zoo


def _events(path: Path) -> list[dict]:  # type: ignore[type-arg]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def test_split_reference_trace_has_steps_shapes_ops_and_the_module(
    builtin_zoo: Zoo, tmp_path: Path
) -> None:
    path = tmp_path / "split.json"
    recorded = record_trace(
        "gemm_bias_act",
        "gemm_bias_act.reference",
        (64, 128, 96),
        "float32",
        "cpu",
        "gelu",
        path,
        steps=3,
        zoo=builtin_zoo,
    )
    events = _events(path)
    names = Counter(e["name"] for e in events if e.get("ph") == "X")
    assert sum(n for name, n in names.items() if name.startswith("ProfilerStep#")) == 3
    assert names["aten::linear"] == 3 and names["aten::gelu"] == 3
    assert names["zoo:gemm_bias_act.reference"] == 3
    assert names["nn.Module: ZooBlock_0"] == 3
    linear = next(e for e in events if e["name"] == "aten::linear")
    assert linear["args"]["Input Dims"] == [[64, 128], [96, 128], [96]]
    assert recorded.op_counts["aten::gelu"] == 3 and recorded.with_stack


def test_fused_trace_shows_the_custom_op_by_name_with_shapes(
    builtin_zoo: Zoo, device: str, tmp_path: Path
) -> None:
    path = tmp_path / "fused.json.gz"
    recorded = record_trace(
        "mlp",
        "mlp.triton",
        (64, 128, 96),
        "bfloat16",
        device,
        "silu",
        path,
        steps=2,
        variant="gated",
        zoo=builtin_zoo,
    )
    events = _events(path)
    ops = [e for e in events if e["name"] == "zoo::mlp_triton"]
    assert len(ops) == 2
    assert ops[0]["args"]["Input Dims"][:3] == [[64, 128], [96, 128], [96, 128]]
    assert ops[0]["args"]["Input type"][0] == "c10::BFloat16"
    names = {e["name"] for e in events}
    assert "aten::gelu" not in names and "aten::silu" not in names
    # Interpreted Triton runs as Python: the Python tracer would take minutes on it.
    assert recorded.with_stack == (device == "cuda")


def test_record_refuses_what_the_entry_cannot_run(builtin_zoo: Zoo, tmp_path: Path) -> None:
    with pytest.raises(ZooUsageError, match="implements glu"):
        record_trace(
            "mlp",
            "glu.triton",
            (8, 8, 8),
            "float32",
            "cpu",
            "silu",
            tmp_path / "a.json",
            zoo=builtin_zoo,
        )
    with pytest.raises(ZooUsageError, match="float64 not supported"):
        record_trace(
            "glu",
            "glu.triton",
            (8, 8, 8),
            "float64",
            "cpu",
            "silu",
            tmp_path / "b.json",
            zoo=builtin_zoo,
        )
    with pytest.raises(UnknownEntry):
        record_trace(
            "glu",
            "glu.fast",
            (8, 8, 8),
            "float32",
            "cpu",
            "silu",
            tmp_path / "c.json",
            zoo=builtin_zoo,
        )
    with pytest.raises(ZooUsageError, match="variants"):
        record_trace(
            "glu",
            "glu.triton",
            (8, 8, 8),
            "float32",
            "cpu",
            "silu",
            tmp_path / "d.json",
            variant="gated",
            zoo=builtin_zoo,
        )
