"""The overhead and kernel rules (TQ201–TQ207, TQ301, TQ302), each on a trace where its
pattern is present and one where it is absent.

Expected numbers are recomputed from the raw trace with the standard library's JSON
reader (event ids are indices into `traceEvents`), not from traceq's frames, and checked
against each rule's documented savings model.

Real traces (skipped when `../shared/traces` is absent), all copied unchanged:
- `kineto_tb_plugin/.../resnet50_num_workers_0/...`: pytorch/kineto tb_plugin sample, BSD-3.
- `tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz`: AMD-AGI/TraceLens,
  MIT.
- `hta/tests/data/critical_path/alexnet/...` and `hta/tests/data/rank_non_gpu/...`:
  facebookresearch/HolisticTraceAnalysis, MIT.
- `param/et_replay/tests/inputs/linear_kineto.json.gz`: facebookresearch/param, MIT.
Fixtures (`fixtures/*.pt.trace.json.gz`) are recorded by this project (`fixtures/record.py`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import traceq
from traceq.analyze import analyze
from traceq.rules.finding import Finding
from traceq.rules.tq204_dispatch_overhead import METADATA_OPS

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
RESNET = (
    "kineto_tb_plugin/tb_plugin/samples/resnet50_num_workers_0/"
    "worker0.1623143089861.pt.trace.json.gz"
)
QWEN = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
ALEXNET = "hta/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
RANK_NON_GPU = "hta/tests/data/rank_non_gpu/rank_non_gpu.json.gz"
LINEAR_KINETO = "param/et_replay/tests/inputs/linear_kineto.json.gz"
CPU_FIXTURES = sorted(FIXTURES.glob("*.pt.trace.json.gz"))
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


# -- the independent reference: raw events -----------------------------------------------


class Raw:
    """A trace as the stdlib reads it: events by id, times in exact integer ns."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.events: list[dict[str, Any]] = document["traceEvents"]

    @staticmethod
    def ns(value: Any) -> int:
        return int(Decimal(str(value)) * 1000)

    def start(self, event: int) -> int:
        return self.ns(self.events[event]["ts"])

    def dur(self, event: int) -> int:
        return self.ns(self.events[event].get("dur", 0))

    def end(self, event: int) -> int:
        return self.start(event) + self.dur(event)

    def where(self, test: Callable[[dict[str, Any]], bool]) -> list[int]:
        return [i for i, e in enumerate(self.events) if e.get("ph") == "X" and test(e)]

    def gpu(self) -> list[int]:
        return self.where(lambda e: str(e.get("cat", "")).lower() in GPU_CATS)


@pytest.fixture(scope="module")
def raw_of(read_json, shared_trace) -> Callable[[str], Raw]:
    cache: dict[str, Raw] = {}

    def get(relpath: str) -> Raw:
        if relpath not in cache:
            cache[relpath] = Raw(read_json(shared_trace(relpath), parse_float=Decimal))
        return cache[relpath]

    return get


def only(findings: list[Finding], rule: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule]


@pytest.mark.parametrize("path", CPU_FIXTURES, ids=[p.name for p in CPU_FIXTURES])
def test_gpu_rules_are_silent_on_cpu_only_traces(path: Path) -> None:
    """No GPU, no launch queue, copies, tensor cores or occupancy: nothing to report."""
    findings = analyze(traceq.load(path), select=["TQ201", "TQ203", "TQ206", "TQ301", "TQ302"])
    assert findings == []


# -- TQ201 launch-bound -------------------------------------------------------------------


def test_tq201_finds_the_launch_bound_stretch_of_each_resnet_step(load_shared, raw_of) -> None:
    trace = load_shared(RESNET)
    raw = raw_of(RESNET)
    findings = analyze(trace, select="TQ201")
    steps = trace.steps["step"].to_list()
    assert findings and {f.step for f in findings} == set(steps)
    for finding in findings:
        kernels = sorted(finding.kernels, key=raw.start)
        # consecutive on one device, all in the finding's step
        devices = {raw.events[k]["args"]["device"] for k in kernels}
        assert len(devices) == 1
        idle, reach = 0, raw.end(kernels[0])
        for k in kernels[1:]:
            idle += max(0, raw.start(k) - reach)
            reach = max(reach, raw.end(k))
        assert finding.time_us == pytest.approx(idle / 1000)
        assert finding.est_saving_us == pytest.approx(idle / 1000 - (len(kernels) - 1) * 1.0)
        span = reach - raw.start(kernels[0])
        assert finding.evidence["idle_share"] == pytest.approx(idle / span)
        assert idle / span >= 0.3 and len(kernels) >= 20


def test_tq201_leaves_the_gpu_bound_body_of_a_prefill_alone(load_shared) -> None:
    trace = load_shared(QWEN)
    findings = analyze(trace, select="TQ201")
    flagged = {k for f in findings for k in f.kernels}
    total_ns = trace.kernels["dur_ns"].sum()
    flagged_ns = trace.kernels.filter(trace.kernels["event"].is_in(list(flagged)))["dur_ns"].sum()
    # Only the warm-up stretch before the queue fills (31 of 1,707 activities) is flagged.
    assert len(flagged) < 0.05 * trace.kernels.height
    assert flagged_ns < 0.05 * total_ns


def test_tq201_thresholds_come_from_options(load_shared) -> None:
    trace = load_shared(RESNET)
    default = analyze(trace, select="TQ201")
    stricter = analyze(trace, select="TQ201", options={"TQ201": {"min_kernels": 100_000}})
    assert default and stricter == []


# -- TQ202 host-sync ----------------------------------------------------------------------


def test_tq202_measures_the_wait_and_the_refill_bubble_of_a_sync(load_shared, raw_of) -> None:
    trace = load_shared(QWEN)
    raw = raw_of(QWEN)
    findings = analyze(trace, select="TQ202")
    by_op = {f.evidence["op_names"][0]: f for f in findings}
    assert set(by_op) == {"aten::is_nonzero", "cudaDeviceSynchronize"}
    finding = by_op["aten::is_nonzero"]
    sync = finding.evidence["sync_event"]
    assert raw.events[sync]["name"] == "cudaStreamSynchronize"
    sync_end = raw.end(sync)
    gpu = raw.gpu()
    next_start = min(raw.start(k) for k in gpu if raw.start(k) >= sync_end)
    reach = max(raw.end(k) for k in gpu if raw.start(k) <= sync_end)
    wait = raw.dur(sync) / 1000
    bubble = max(0, next_start - max(sync_end, reach)) / 1000
    assert finding.evidence["wait_us"] == pytest.approx(wait)
    assert finding.evidence["bubble_us"] == pytest.approx(bubble)
    assert finding.est_saving_us == pytest.approx(min(wait, bubble))
    # the profiler's own cudaDeviceSynchronize outside any step is left out by default
    outside = [f for f in findings if f.step is None]
    assert outside == []


def test_tq202_reports_scalar_reads_on_a_cpu_only_trace(load_shared, raw_of) -> None:
    trace = load_shared(RANK_NON_GPU)
    raw = raw_of(RANK_NON_GPU)
    findings = analyze(trace, select="TQ202")
    items = raw.where(lambda e: e.get("name") == "aten::item")
    updates = raw.where(lambda e: str(e.get("name", "")).startswith("Optimizer.step#"))

    def in_update(i: int) -> bool:
        same = (u for u in updates if raw.events[u]["tid"] == raw.events[i]["tid"])
        return any(raw.start(u) <= raw.start(i) < raw.end(u) for u in same)

    # one of the five reads FusedAdam's host-side step counter: not a GPU drain
    assert len(items) == 5 and sum(map(in_update, items)) == 1
    items = [i for i in items if not in_update(i)]
    assert len(findings) == len(items) == 4
    assert {f.severity for f in findings} == {"info"}
    assert sorted(f.ops[0] for f in findings) == sorted(items)
    for finding in findings:
        assert finding.est_saving_us == pytest.approx(raw.dur(finding.ops[0]) / 1000)


def test_tq202_ignores_a_trailing_sync_with_no_work_after_it(load_shared) -> None:
    trace = load_shared(LINEAR_KINETO)
    syncs = trace.runtime.filter(trace.runtime["name"] == "cudaDeviceSynchronize")
    # the one sync returns after the last GPU activity has started: nothing refills
    assert syncs.height == 1 and syncs["end_ns"][0] > trace.kernels["ts_ns"].max()
    assert analyze(trace, select="TQ202") == []


@pytest.mark.parametrize("path", CPU_FIXTURES, ids=[p.name for p in CPU_FIXTURES])
def test_tq202_is_silent_without_syncs_or_scalar_reads(path: Path) -> None:
    assert analyze(traceq.load(path), select="TQ202") == []


def test_tq202_leaves_adams_host_step_counters_alone(read_json) -> None:
    """Adam(foreach=False) reads each parameter's step counter with `aten::item` inside
    `Optimizer.step`; the counters live on the host, so on a GPU these never drain it."""
    path = FIXTURES / "mlp_gelu-train_adam.pt.trace.json.gz"
    events = [e for e in read_json(path)["traceEvents"] if e.get("ph") == "X"]
    updates = [e for e in events if str(e.get("name", "")).startswith("Optimizer.step#Adam")]
    items = [e for e in events if e.get("name") == "aten::item"]

    def inside(e: dict) -> bool:
        return any(
            u["tid"] == e["tid"] and u["ts"] <= e["ts"] < u["ts"] + u["dur"] for u in updates
        )

    assert updates and items and all(inside(e) for e in items)  # the case is really there
    assert analyze(traceq.load(path), select="TQ202") == []


# -- TQ203 memcpy -------------------------------------------------------------------------


def test_tq203_counts_the_host_time_of_pageable_copies(load_shared, raw_of) -> None:
    trace = load_shared(ALEXNET)
    raw = raw_of(ALEXNET)
    (finding,) = analyze(trace, select="TQ203")
    copies = raw.where(lambda e: e.get("name") == "Memcpy HtoD (Pageable -> Device)")
    assert sorted(finding.kernels) == sorted(copies)
    calls = {
        e["args"]["correlation"]: i
        for i, e in enumerate(raw.events)
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    blocked = sum(
        min(raw.dur(calls[raw.events[c]["args"]["correlation"]]), raw.dur(c)) for c in copies
    )
    assert finding.est_saving_us == pytest.approx(blocked / 1000)
    assert finding.evidence["bytes"] == sum(raw.events[c]["args"]["bytes"] for c in copies)
    assert finding.time_us == pytest.approx(sum(raw.dur(c) for c in copies) / 1000)


def test_tq203_is_silent_when_copies_are_pinned(load_shared) -> None:
    trace = load_shared(QWEN)
    copies = trace.kernels.filter(trace.kernels["kind"] == "memcpy")["name"].to_list()
    assert copies == ["Memcpy DtoH (Device -> Pinned)"]
    assert analyze(trace, select="TQ203") == []


# -- TQ204 dispatch-overhead --------------------------------------------------------------


def _pure_metadata_ns(raw: Raw, start: int, end: int) -> int:
    return sum(raw.dur(i) for i in _pure_metadata_ops(raw, start, end))


def _pure_metadata_ops(raw: Raw, start: int, end: int) -> list[int]:
    """Outermost metadata ops in [start, end) with no other op nested inside them, from raw
    intervals on each thread (the reference for TQ204)."""
    ops = [i for i in raw.where(lambda e: e.get("cat") == "cpu_op") if start <= raw.start(i) < end]

    def inside(child: int, parent: int) -> bool:
        same = raw.events[child]["tid"] == raw.events[parent]["tid"]
        return (
            same
            and child != parent
            and raw.start(parent) <= raw.start(child)
            and raw.end(child) <= raw.end(parent)
        )

    def is_meta(i: int) -> bool:
        return raw.events[i]["name"] in METADATA_OPS

    pure = [i for i in ops if is_meta(i) and not any(inside(j, i) and not is_meta(j) for j in ops)]
    return [i for i in pure if not any(inside(i, j) for j in pure)]


def test_tq204_measures_no_work_ops_as_a_share_of_the_step(read_json) -> None:
    path = FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"
    trace = traceq.load(path)
    raw = Raw(read_json(path, parse_float=Decimal))
    findings = analyze(trace, select="TQ204")
    assert findings
    # CPU-only: the whole overhead is on the timeline, each op at its name's median
    everywhere = _pure_metadata_ops(raw, 0, 2**63)
    names = {raw.events[i]["name"] for i in everywhere}
    median = {
        n: statistics.median(raw.dur(i) for i in everywhere if raw.events[i]["name"] == n)
        for n in names
    }

    def typical_ns(step: dict) -> float:
        ops = _pure_metadata_ops(raw, step["ts_ns"], step["end_ns"])
        return sum(min(raw.dur(i), median[raw.events[i]["name"]]) for i in ops)

    for finding in findings:
        step = trace.steps.filter(trace.steps["step"] == finding.step).row(0, named=True)
        expected = _pure_metadata_ns(raw, step["ts_ns"], step["end_ns"])
        assert finding.time_us == pytest.approx(expected / 1000)
        assert finding.evidence["share"] == pytest.approx(expected / step["dur_ns"])
        assert finding.est_saving_us == pytest.approx(typical_ns(step) / 1000)
    # steps below the share threshold, measured or typical, are not reported
    for step in trace.steps.iter_rows(named=True):
        share = _pure_metadata_ns(raw, step["ts_ns"], step["end_ns"]) / step["dur_ns"]
        typical = typical_ns(step)
        reported = share >= 0.1 and typical / step["dur_ns"] >= 0.1 and typical >= 20_000
        assert reported == any(f.step == step["step"] for f in findings)


def test_tq204_is_silent_when_compiled_away() -> None:
    trace = traceq.load(FIXTURES / "geglu_mlp-compiled.pt.trace.json.gz")
    assert analyze(trace, select="TQ204") == []


def test_tq204_scales_gpu_trace_savings_by_gpu_idle_share(load_shared) -> None:
    trace = load_shared(RESNET)
    findings = analyze(trace, select="TQ204")
    assert findings
    busy = dict(trace.step_times().select("step", "gpu_ns").iter_rows())
    for finding in findings:
        window = finding.evidence["window_us"] * 1000
        idle_share = max(0.0, 1 - busy[finding.step] / window)
        assert finding.est_saving_us == pytest.approx(finding.time_us * idle_share)


# -- TQ205 compile-overhead ---------------------------------------------------------------


def test_tq205_reports_a_cold_compile_inside_the_step(read_json) -> None:
    path = FIXTURES / "geglu_mlp-compiled_cold.pt.trace.json.gz"
    trace = traceq.load(path)
    raw = Raw(read_json(path, parse_float=Decimal))
    (finding,) = analyze(trace, select="TQ205")
    (dynamo,) = raw.where(lambda e: e.get("name") == "dynamo")
    assert finding.ops == [dynamo]
    assert finding.evidence["kind"] == "compilation"
    assert finding.time_us == pytest.approx(raw.dur(dynamo) / 1000)
    assert finding.est_saving_us == finding.time_us
    compile_files = raw.where(lambda e: e.get("name") == "compile_file")
    assert finding.evidence["phases_us"]["compile_file"] == pytest.approx(
        sum(raw.dur(i) for i in compile_files) / 1000
    )


@pytest.mark.parametrize(
    "name", ["geglu_mlp-compiled", "geglu_mlp-eager", "swiglu_mlp-compiled", "linear-compiled"]
)
def test_tq205_is_silent_for_a_warm_compiled_model_and_eager_code(name: str) -> None:
    trace = traceq.load(FIXTURES / f"{name}.pt.trace.json.gz")
    assert analyze(trace, select="TQ205") == []


# -- TQ206 unfused-optimizer --------------------------------------------------------------

ELEMENTWISE_UPDATES = {"aten::add_", "aten::mul_"}
OLD_COPY_CATS = {"memcpy", "memset"}  # the 2021 schema's names; the GPU is busy with them too


def _optimizer_windows(raw: Raw) -> list[int]:
    return raw.where(lambda e: e.get("name") == "Optimizer.step#SGD.step")


def test_tq206_finds_resnets_per_tensor_sgd_update_in_every_step(load_shared, raw_of) -> None:
    trace, raw = load_shared(RESNET), raw_of(RESNET)
    findings = sorted(analyze(trace, select="TQ206"), key=lambda f: f.step)
    windows = sorted(_optimizer_windows(raw), key=raw.start)
    assert [f.step for f in findings] == trace.steps["step"].to_list() and len(windows) == 6
    for finding, window in zip(findings, windows, strict=True):
        start, end, tid = raw.start(window), raw.end(window), raw.events[window]["tid"]
        updates = raw.where(
            lambda e, start=start, end=end, tid=tid: (
                e.get("tid") == tid
                and e["name"] in ELEMENTWISE_UPDATES
                and start <= Raw.ns(e["ts"]) < end
            )
        )
        muls = [i for i in updates if raw.events[i]["name"] == "aten::mul_"]
        assert finding.ops == [window, *sorted(updates, key=raw.start)]
        assert finding.evidence["per_tensor_ops"] == len(updates) == 483
        assert finding.evidence["tensors"] == len(muls) == 161  # momentum: one mul_ each
        assert finding.evidence["ops_per_tensor"] == 3
        busy = sum(
            max(0, min(raw.end(k), end) - max(raw.start(k), start))
            for k in raw.where(lambda e: str(e.get("cat")).lower() in GPU_CATS | OLD_COPY_CATS)
            if raw.start(k) < end and raw.end(k) > start
        )
        assert finding.evidence["gpu_busy_us"] == pytest.approx(busy / 1000)
        assert finding.time_us == pytest.approx((end - start) / 1000)
        expected = (end - start - busy) * (1 - 3 / 483) / 1000
        assert finding.est_saving_us == pytest.approx(expected)
        assert "fused=True" in finding.fix and finding.severity == "warning"


def test_tq206_leaves_a_multi_tensor_update_alone(read_json, shared_trace, tmp_path) -> None:
    """The same trace with one `_foreach_` op in each optimizer step: already batched."""
    document = read_json(shared_trace(RESNET))
    events = document["traceEvents"]
    raw = Raw(document)
    for window in _optimizer_windows(raw):
        start, end = raw.start(window), raw.end(window)
        first = next(
            e for e in events if e.get("name") == "aten::mul_" and start <= Raw.ns(e["ts"]) < end
        )
        first["name"] = "aten::_foreach_mul_"
    path = tmp_path / "foreach.json"
    path.write_text(json.dumps(document))
    assert analyze(traceq.load(path), select="TQ206") == []


def test_tq206_options_set_its_thresholds(load_shared) -> None:
    trace = load_shared(RESNET)
    assert analyze(trace, select="TQ206", options={"TQ206": {"min_ops": 484}}) == []
    assert analyze(trace, select="TQ206", options={"TQ206": {"min_us": 1e6}}) == []


# -- TQ207 zeroed-grads -------------------------------------------------------------------


def test_tq207_finds_resnets_zeroed_gradients_and_their_accumulation(load_shared, raw_of) -> None:
    trace, raw = load_shared(RESNET), raw_of(RESNET)
    findings = sorted(analyze(trace, select="TQ207"), key=lambda f: f.step)
    steps = sorted(raw.where(lambda e: str(e["name"]).startswith("ProfilerStep#")), key=raw.start)
    zero_grads = sorted(
        raw.where(lambda e: e["name"] == "Optimizer.zero_grad#SGD.zero_grad"), key=raw.start
    )
    assert len(findings) == len(steps) == len(zero_grads) == 6
    for finding, step, window in zip(findings, steps, zero_grads, strict=True):
        start, end, tid = raw.start(window), raw.end(window), raw.events[window]["tid"]
        zeros = raw.where(
            lambda e, start=start, end=end, tid=tid: (
                e["name"] == "aten::zero_"
                and e.get("tid") == tid
                and start <= Raw.ns(e["ts"]) < end
            )
        )
        nodes = raw.where(
            lambda e, step=step: (
                str(e["name"]).endswith("AccumulateGrad")
                and raw.start(step) <= Raw.ns(e["ts"]) < raw.end(step)
            )
        )
        adds = [
            i
            for node in nodes
            for i in raw.where(
                lambda e, node=node: (
                    e["name"] == "aten::add_"
                    and e.get("tid") == raw.events[node]["tid"]
                    and raw.start(node) <= Raw.ns(e["ts"]) < raw.end(node)
                )
            )
        ]
        assert finding.evidence["zeroing_ops"] == len(zeros) == 161
        assert finding.evidence["accumulate_adds"] == len(adds) == 161
        assert set(finding.ops) == {window, *zeros, *adds}
        busy = sum(
            max(0, min(raw.end(k), end) - max(raw.start(k), start))
            for k in raw.where(lambda e: str(e.get("cat")).lower() in GPU_CATS | OLD_COPY_CATS)
            if raw.start(k) < end and raw.end(k) > start
        )
        assert finding.evidence["gpu_busy_us"] == pytest.approx(busy / 1000)
        accumulate = finding.evidence["accumulate_us"]
        assert 0 < accumulate < finding.evidence["span_us"]
        expected = (end - start - busy) / 1000 + accumulate
        assert finding.est_saving_us == pytest.approx(expected)
        assert "set_to_none=True" in finding.fix


def test_tq207_is_silent_when_gradients_are_set_to_none() -> None:
    """The recorded training step calls `zero_grad(set_to_none=True)`: nothing is zeroed."""
    trace = traceq.load(FIXTURES / "mlp_gelu-train.pt.trace.json.gz")
    ranges = trace.annotations.filter(pl.col("name") == "Optimizer.zero_grad#SGD.zero_grad")
    assert ranges.height == 3  # the rule sees the ranges ...
    assert analyze(trace, select="TQ207") == []  # ... with nothing zeroed in them


def test_tq207_options_set_its_thresholds(load_shared) -> None:
    trace = load_shared(RESNET)
    assert analyze(trace, select="TQ207", options={"TQ207": {"min_tensors": 162}}) == []
    assert analyze(trace, select="TQ207", options={"TQ207": {"min_us": 1e6}}) == []


# -- TQ301 fp32-gemm ----------------------------------------------------------------------


def test_tq301_finds_fp32_simt_gemms_on_a_tensor_core_gpu(load_shared, raw_of) -> None:
    trace = load_shared(LINEAR_KINETO)
    raw = raw_of(LINEAR_KINETO)
    findings = analyze(trace, select="TQ301")
    by_kernel = {f.evidence["kernel"]: f for f in findings}
    assert set(by_kernel) == {
        "volta_sgemm_64x64_tn",
        "volta_sgemm_128x64_nn",
        "volta_sgemm_128x128_nt",
    }
    # RTX 2080 Ti: fp16 tensor cores (53.8 TFLOPS with fp32 accumulate, the Turing
    # whitepaper) vs fp32 13.4: 4.01x, capped at max_speedup 4
    ratio = min(53.8 / 13.4, 4.0)
    for name, finding in by_kernel.items():
        launches = raw.where(lambda e, n=name: e.get("name") == n)
        time = sum(raw.dur(k) for k in launches) / 1000
        # no launch of these is stalled (over 4x its site's median): all count as measured
        typical = time
        assert sorted(finding.kernels) == sorted(launches)
        assert finding.time_us == pytest.approx(time)
        # no shapes recorded: no memory floor, the peak ratio alone
        assert finding.est_saving_us == pytest.approx(typical - typical / ratio)
        assert finding.dtype == "fp32"
        assert "autocast" in finding.fix


def test_tq301_is_silent_for_a_bf16_model(load_shared) -> None:
    trace = load_shared(QWEN)
    assert analyze(trace, select="TQ301") == []


# -- TQ302 low-occupancy ------------------------------------------------------------------


def test_tq302_leaves_resnets_add_kernel_alone(load_shared, raw_of) -> None:
    """Its median launch has 4 blocks on 80 SMs, but those launches are 1-block scalar
    updates of about 1 µs: the kernel's time is in launches of 25k-100k blocks. Grouped by
    name with the median grid this was once a "95% saving" (see test_rules_trust.py for
    the partial-wave model on kernels that do run small grids)."""
    trace = load_shared(RESNET)
    raw = raw_of(RESNET)
    kernels = raw.where(lambda e: str(e.get("cat", "")).lower() == "kernel")
    adds = [k for k in kernels if "AddFunctor<float>" in raw.events[k]["name"]]
    small = [k for k in adds if math.prod(raw.events[k]["args"]["grid"]) <= 40]
    assert sum(raw.dur(k) for k in small) < 0.1 * sum(raw.dur(k) for k in adds)
    assert analyze(trace, select="TQ302") == []


def test_tq302_leaves_tuned_library_gemms_alone(load_shared) -> None:
    # The sgemm kernels here run at 24% occupancy by design, on grids that fill the GPU.
    trace = load_shared(LINEAR_KINETO)
    assert analyze(trace, select="TQ302") == []


def test_tq104_leaves_per_parameter_updates_to_tq206(load_shared) -> None:
    """ResNet's SGD step (`mul_`, `add_`, `add_` per tensor) and autograd's `AccumulateGrad`
    `add_`s share shapes across parameters but no data: once 264 false TQ104 chains."""
    trace = load_shared(RESNET)
    assert analyze(trace, select="TQ104") == []
    tq206 = analyze(trace, select="TQ206")
    assert sum(f.evidence["per_tensor_ops"] for f in tq206) == 6 * 483


def test_tq206_and_tq207_from_the_command_line(shared_trace) -> None:
    """The same findings reach the CLI: JSON per step, and `--fail-on warning` exits 1."""
    from click.testing import CliRunner
    from traceq.cli.main import main

    path = str(shared_trace(RESNET))
    args = ["analyze", path, "--select", "TQ206,TQ207", "--no-config"]
    result = CliRunner().invoke(main, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    found = json.loads(result.stdout)["findings"]
    assert sorted((f["rule"], f["step"]) for f in found) == sorted(
        (rule, step) for rule in ("TQ206", "TQ207") for step in range(5, 11)
    )
    assert CliRunner().invoke(main, [*args, "--fail-on", "warning"]).exit_code == 1


def test_tied_evidence_is_the_same_every_run(load_shared) -> None:
    """TQ201's top ops break ties by name and TQ302's module takes the first of equally
    common ones: findings (and the regression keys built from them) do not flicker."""
    trace = load_shared(RESNET)
    for finding in analyze(trace, select="TQ201"):
        top = [(-op["kernels"], op["name"]) for op in finding.evidence["top_ops"]]
        assert top == sorted(top)
    runs = [[(f.rule, f.module, f.message) for f in analyze(trace)] for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
