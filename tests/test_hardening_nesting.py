"""Op nesting holds when real clocks move events by fractions of a µs.

Each CPU op of a real trace is moved, whole, by its own random amount of up to ±`shift` ns,
written back exactly (Decimal µs, so no float rounding hides the move) and loaded again: a
child that ended less than 2 × `shift` before its parent's end may now end after it. The op
tree (`parent`, `depth`) must be the one of the unmoved trace. `shift` (at most 250 ns) is
chosen from the raw JSON so that the unmoved tree stays the right answer: below half of
every gap between a child's start and its parent's start or end, and of every gap between
one op's end and the next sibling's start, so no child leaves its parent and no sibling
starts inside the one before it.
"""

from __future__ import annotations

import gzip
import itertools
import json
import random
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pytest

import traceq
from traceq.relations.nesting import parents

FIXTURES = Path(__file__).parents[1] / "fixtures"
MAX_SHIFT_NS = 250
BERT = "tracelens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz"


def _read(path: Path) -> dict[str, Any]:
    with gzip.open(path) as f:
        return json.load(f, parse_float=Decimal)


def _shifted(document: dict[str, Any], most: int, seed: int) -> tuple[dict[str, Any], int]:
    """A copy with each `cpu_op` moved by its own amount; and how many ops were moved."""
    rng = random.Random(seed)
    events = []
    moved = 0
    for event in document["traceEvents"]:
        if event.get("cat") == "cpu_op" and event.get("ph") == "X":
            shift = Decimal(rng.randint(-most, most)) / 1000
            event = {**event, "ts": Decimal(event["ts"]) + shift}
            moved += 1
        events.append(event)
    return {**document, "traceEvents": events}, moved


def _write(document: dict[str, Any], path: Path) -> Path:
    path.write_bytes(msgspec.json.Encoder(decimal_format="number").encode(document))
    return path


def _tree(trace: traceq.Trace) -> pl.DataFrame:
    return trace.ops.select("event", "parent", "depth").sort("event")


def _safe_shift_ns(document: dict[str, Any], trace: traceq.Trace) -> int:
    """The largest move (≤ MAX_SHIFT_NS) that keeps every child's start inside its parent and
    every op's start after its previous sibling's end, from the raw JSON's times."""
    raw = document["traceEvents"]
    ts = {i: Decimal(e["ts"]) * 1000 for i, e in enumerate(raw) if "ts" in e}
    end = {i: ts[i] + Decimal(e.get("dur", 0)) * 1000 for i, e in enumerate(raw) if "ts" in e}
    gaps = []
    for child, parent in (
        trace.ops.filter(pl.col("parent").is_not_null()).select("event", "parent").rows()
    ):
        gaps += [ts[child] - ts[parent], end[parent] - ts[child]]
    siblings = trace.ops.sort("ts_ns").group_by("pid", "tid", "parent").agg("event")
    for events in siblings["event"]:
        gaps += [ts[b] - end[a] for a, b in itertools.pairwise(events)]
    return min(MAX_SHIFT_NS, int(min(gaps) - 1) // 2)


def _check_tree_survives_the_shift(path: Path, tmp_path: Path) -> None:
    document = _read(path)
    original = traceq.load(path)
    most = _safe_shift_ns(document, original)
    assert most >= 100  # "a few hundred ns" between a child and its parent
    for seed in range(3):
        moved_document, moved = _shifted(document, most, seed)
        assert moved == original.ops.height
        moved_path = _write(moved_document, tmp_path / f"shifted-{seed}.json")
        shifted = traceq.load(moved_path)
        # The shift did reach the loaded trace, and left some child ending after its parent.
        assert not shifted.ops["ts_ns"].equals(original.ops["ts_ns"])
        ops = shifted.ops.sort("event")
        group = ops.select(pl.struct("pid", "tid").rank("dense")).to_series().to_numpy()
        exact = parents(group, ops["ts_ns"].to_numpy(), ops["end_ns"].to_numpy(), tolerance=0)
        events = ops["event"].to_numpy()
        exact_parent = np.where(exact >= 0, events[np.maximum(exact, 0)], -1)
        original_parent = _tree(original)["parent"].fill_null(-1).to_numpy()
        assert (exact_parent != original_parent).sum() > 0, "the shift broke no exact nesting"
        assert _tree(shifted).equals(_tree(original)), f"seed {seed}"


@pytest.mark.parametrize("name", ["mlp_gelu-train", "swiglu_mlp-eager"])
def test_op_tree_survives_sub_microsecond_shifts_on_a_bundled_trace(
    name: str, tmp_path: Path
) -> None:
    _check_tree_survives_the_shift(FIXTURES / f"{name}.pt.trace.json.gz", tmp_path)


def test_op_tree_survives_sub_microsecond_shifts_on_a_real_gpu_trace(
    shared_trace: Callable[[str], Path], tmp_path: Path
) -> None:
    """TraceLens's BERT-small forward on an H100 (AMD-AGI/TraceLens, MIT)."""
    _check_tree_survives_the_shift(shared_trace(BERT), tmp_path)
