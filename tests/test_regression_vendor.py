"""Traces of one model on two vendors diff by op, not by kernel name.

Uses HTA's AlexNet critical-path trace (facebookresearch/HolisticTraceAnalysis, MIT;
bundled in fixtures/gpu, so it runs everywhere): the
"other vendor" copy is that trace with every kernel renamed the way hipBLASLt/ROCm name
theirs and the device called an MI300X — same ops, same times, other kernels.
"""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from conftest import shared_or_bundled

import traceq
from traceq.regression.diff import diff

ALEXNET = "hta/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[traceq.Trace, traceq.Trace]:
    source = shared_or_bundled(ALEXNET)
    data = json.loads(gzip.decompress(source.read_bytes()))
    renamed: dict[str, str] = {}
    for event in data["traceEvents"]:
        if event.get("cat") == "kernel":
            name = renamed.setdefault(event["name"], f"Cijk_Alik_Bljk_S_MT{len(renamed)}_ISA942")
            event["name"] = name
    for prop in data["deviceProperties"]:
        prop["name"] = "AMD Instinct MI300X"
    other = tmp_path_factory.mktemp("vendor") / "mi300x.json"
    other.write_text(json.dumps(data))
    return traceq.load(source), traceq.load(other)


def test_by_op_nothing_changed(pair: tuple[traceq.Trace, traceq.Trace]) -> None:
    base, new = pair
    result = diff(base, new, by="op", findings=False)
    groups = result.groups
    assert {"aten::conv2d", "aten::linear"} <= set(groups["group"])
    assert (groups["status"] == "same").all()
    assert groups["delta_ns"].abs().max() == 0
    assert any("different devices" in note for note in result.notes)


def test_by_kernel_every_kernel_changed_names(pair: tuple[traceq.Trace, traceq.Trace]) -> None:
    base, new = pair
    groups = diff(base, new, by="kernel", findings=False).groups
    renamed = groups.filter(pl.col("group").str.starts_with("Cijk_"))
    assert renamed.height == base.kernels.filter(pl.col("kind") == "kernel")["name"].n_unique()
    assert set(renamed["status"]) != {"same"}
