"""`diff`: per-group deltas, fusions, dispatch changes and findings between two traces.

Real pairs: `trace_diff/{control,test}` (A100 rank 3/8 vs V100 rank 1/2, partly different
models) and `trace_compare/{base,test}`, from facebookresearch/HolisticTraceAnalysis (MIT),
under ../shared/traces/hta/tests/data/. Fixtures: the GeGLU MLP recorded eager and with
`torch.compile` (fixtures/README.md). Expected numbers come from the frames (`trace.ops`,
`trace.kernels`, `kernels_of`) or the stdlib `json`, not from the diff's own code.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

import traceq
from traceq.regression.diff import diff
from traceq.regression.errors import RegressionError
from traceq.regression.render import render_diff

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CONTROL = "hta/tests/data/trace_diff/control/control.json.gz"
TEST = "hta/tests/data/trace_diff/test/test.json.gz"


def per_step_mean(frame: pl.DataFrame, steps: list[int]) -> float:
    """Mean over `steps` of the summed `dur_ns` of `frame`'s rows in each (0 where none)."""
    sums = frame.filter(pl.col("step").is_in(steps)).group_by("step").agg(pl.col("dur_ns").sum())
    return float(sums["dur_ns"].sum()) / len(steps)


@pytest.fixture(scope="module")
def geglu() -> tuple[traceq.Trace, traceq.Trace]:
    return (
        traceq.load(FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"),
        traceq.load(FIXTURES / "geglu_mlp-compiled.pt.trace.json.gz"),
    )


@pytest.fixture(scope="module")
def real_pair(load_shared: Any) -> tuple[traceq.Trace, traceq.Trace]:
    return load_shared(CONTROL), load_shared(TEST)


# -- eager vs compiled GeGLU ---------------------------------------------------------------
def test_gelu_and_mul_become_one_fused_op(geglu: tuple[traceq.Trace, traceq.Trace]) -> None:
    eager, compiled = geglu
    result = diff(eager, compiled, findings=False)
    (fusion,) = result.fusions
    assert sorted(fusion.parts) == ["aten::gelu", "aten::mul"]
    assert "fused" in fusion.fused and fusion.fused.endswith("gelu_mul_0")
    steps = eager.steps["step"].to_list()
    parts = eager.ops.filter(pl.col("name").is_in(["aten::gelu", "aten::mul"]))
    assert fusion.base_ns == pytest.approx(per_step_mean(parts, steps))
    fused = compiled.ops.filter(pl.col("name") == fusion.fused)
    assert fusion.new_ns == pytest.approx(per_step_mean(fused, compiled.steps["step"].to_list()))
    assert (fusion.base_calls, fusion.new_calls) == (2, 1)
    assert {"aten::gelu", "aten::mul"} <= set(result.disappeared())
    assert fusion.fused in result.appeared()


def test_the_report_says_which_ops_were_fused(geglu: tuple[traceq.Trace, traceq.Trace]) -> None:
    result = diff(*geglu, findings=False)
    fused = result.fusions[0].fused
    for fmt in ("text", "markdown"):
        text = render_diff(result, fmt, width=200)
        assert "aten::gelu + aten::mul" in text
        assert fused in text
    data = json.loads(render_diff(result, "json"))
    assert data["fusions"][0]["parts"] == result.fusions[0].parts


def test_op_times_are_per_step_means_of_the_frames(
    geglu: tuple[traceq.Trace, traceq.Trace],
) -> None:
    eager, compiled = geglu
    result = diff(eager, compiled, findings=False)
    gelu = result.row("aten::gelu")
    ops = eager.ops.filter(pl.col("name") == "aten::gelu")
    assert gelu["base_ns"] == pytest.approx(per_step_mean(ops, eager.steps["step"].to_list()))
    assert gelu["new_ns"] == 0 and gelu["status"] == "disappeared"
    # Each op is measured at any depth, as key_averages() does: aten::mm runs inside
    # aten::linear in the eager trace and on its own in the compiled one, and is in both.
    mm = result.row("aten::mm")
    assert mm["status"] == "changed" and mm["base_count"] == mm["new_count"] > 0


def test_traces_of_different_lengths_compare_per_step(tmp_path: Path) -> None:
    source = FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"
    with gzip.open(source, "rt") as f:
        document = json.load(f)
    document["traceEvents"] = [
        e for e in document["traceEvents"] if e.get("name") != "ProfilerStep#4"
    ]
    shorter = tmp_path / "geglu-two-steps.json"
    shorter.write_text(json.dumps(document))
    base, new = traceq.load(source), traceq.load(shorter)
    assert new.steps.height == base.steps.height - 1
    result = diff(base, new, findings=False)
    assert result.per_step
    assert any("3 vs 2 steps" in note for note in result.notes)
    row = result.row("aten::linear")
    linear = pl.col("name") == "aten::linear"
    assert row["base_ns"] == pytest.approx(
        per_step_mean(base.ops.filter(linear), base.steps["step"].to_list())
    )
    assert row["new_ns"] == pytest.approx(
        per_step_mean(new.ops.filter(linear), new.steps["step"].to_list())
    )


def test_diff_by_step_lines_steps_up_in_order(geglu: tuple[traceq.Trace, traceq.Trace]) -> None:
    eager, compiled = geglu
    result = diff(eager, compiled, by="step", findings=False)
    assert result.groups.height == eager.steps.height
    assert result.groups["base_ns"].to_list() == [float(v) for v in eager.steps["dur_ns"]]
    assert result.groups["new_ns"].to_list() == [float(v) for v in compiled.steps["dur_ns"]]


def test_a_cpu_only_trace_cannot_be_diffed_by_kernel(
    geglu: tuple[traceq.Trace, traceq.Trace],
) -> None:
    with pytest.raises(RegressionError, match="no kernels"):
        diff(*geglu, by="kernel", findings=False)


def test_findings_that_disappear_when_compiled(geglu: tuple[traceq.Trace, traceq.Trace]) -> None:
    pytest.importorskip("traceq.analyze")
    result = diff(*geglu, findings=True)
    assert result.findings is not None
    gone = {f["rule"] for f in result.findings["disappeared"]}
    assert "TQ103" in gone  # the unfused GeGLU (gelu, then mul) is fused by Inductor
    assert "TQ103" not in {f["rule"] for f in result.findings["appeared"]}


# -- real GPU traces -------------------------------------------------------------------------
@pytest.mark.shared
def test_small_real_pair_counts_match_the_stdlib(shared_trace: Any) -> None:
    paths = [
        shared_trace(f"hta/tests/data/trace_compare/{side}/{side}.json.gz")
        for side in ("base", "test")
    ]
    result = diff(*(traceq.load(p) for p in paths), by="kernel", findings=False)
    counts = []
    for path in paths:
        with gzip.open(path, "rt") as f:
            events = json.load(f)["traceEvents"]
        windows = [
            (e["ts"], e["ts"] + e["dur"])
            for e in events
            if str(e.get("name", "")).startswith("ProfilerStep#")
        ]
        # A kernel belongs to the step its launch (matched by correlation id) was made in,
        # or, with no launch recorded, the step it started in.
        launches = {
            e["args"]["correlation"]: e["ts"]
            for e in events
            if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
        }
        counts.append(
            Counter(
                e["name"]
                for e in events
                if e.get("ph") == "X"
                and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                and any(
                    start <= launches.get(e["args"].get("correlation"), e["ts"]) < end
                    for start, end in windows
                )
            )
        )
    assert len(windows) == 2
    # Two steps each: per-step mean counts are the in-step counts over 2.
    for row in result.groups.iter_rows(named=True):
        assert row["base_count"] * 2 == counts[0][row["group"]]
        assert row["new_count"] * 2 == counts[1][row["group"]]
    assert result.groups["delta_count"].sum() * 2 == counts[1].total() - counts[0].total()


@pytest.mark.shared
@pytest.mark.slow
def test_kernel_deltas_match_an_independent_sum_over_the_frames(
    real_pair: tuple[traceq.Trace, traceq.Trace],
) -> None:
    control, test = real_pair
    result = diff(control, test, by="kernel", findings=False)
    top = result.groups.head(8)
    for row in top.iter_rows(named=True):
        name = pl.col("name") == row["group"]
        base = per_step_mean(control.kernels.filter(name), control.steps["step"].to_list())
        new = per_step_mean(test.kernels.filter(name), test.steps["step"].to_list())
        assert row["base_ns"] == pytest.approx(base), row["group"]
        assert row["new_ns"] == pytest.approx(new), row["group"]
        assert row["delta_ns"] == pytest.approx(new - base)
    deltas = top["delta_ns"].abs().to_numpy()
    assert np.all(deltas[:-1] >= deltas[1:])  # sorted by impact
    gpu = result.totals[1].change
    assert gpu.base == pytest.approx(control.step_times()["gpu_ns"].mean())
    assert gpu.new == pytest.approx(test.step_times()["gpu_ns"].mean())


@pytest.mark.shared
@pytest.mark.slow
def test_different_devices_are_compared_by_op(
    real_pair: tuple[traceq.Trace, traceq.Trace],
) -> None:
    result = diff(*real_pair, findings=False)
    assert result.by == "op"
    assert any("different devices" in n and "A100" in n and "V100" in n for n in result.notes)
    row = result.row("aten::linear")
    control, test = real_pair
    assert row["base_ns"] == pytest.approx(
        control.kernels_of("aten::linear")["dur_ns"].sum() / control.steps.height
    )
    assert row["new_ns"] == pytest.approx(
        test.kernels_of("aten::linear")["dur_ns"].sum() / test.steps.height
    )


@pytest.mark.shared
@pytest.mark.slow
def test_dispatch_changes_name_the_kernels_each_op_ran(
    real_pair: tuple[traceq.Trace, traceq.Trace],
) -> None:
    control, test = real_pair
    result = diff(control, test, findings=False)
    dims = "[[1024, 1024], [1024, 1705]]"  # the two weight-gradient GEMMs of one Linear
    mm = result.dispatch.filter(
        (pl.col("op") == "aten::mm") & (pl.col("shapes") == dims.replace(" ", ""))
    )
    assert mm["call"].to_list() == [0, 1]  # same shapes, told apart by their order in a step
    for row in mm.iter_rows(named=True):
        assert "library cutlass → cublas" in row["change"]
        assert "dtype tf32 → fp32" in row["change"]
        for trace, impl in ((control, row["base_impl"]), (test, row["new_impl"])):
            # The most common kernel sequence of that call in each step, from the loader's
            # own op → kernel links.
            calls = trace.ops.filter(
                (pl.col("name") == "aten::mm") & (pl.col("input_dims") == dims)
            ).with_columns((pl.col("ts_ns").rank("ordinal").over("step") - 1).alias("call"))
            sequences = Counter(
                tuple(trace.kernels_of(int(event)).sort("ts_ns")["name"].to_list())
                for event in calls.filter(pl.col("call") == row["call"])["event"]
            )
            assert list(sequences.most_common(1)[0][0]) == impl
