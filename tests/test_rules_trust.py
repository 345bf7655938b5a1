"""Findings a performance engineer can trust (issue 10, items 10–12): TQ205 does not call a
region run once per iteration a graph break, TQ302 leaves latency-bound, 1-block and
communication kernels alone and estimates a partial wave, and a report counts each µs of
saving once.

Expected numbers are recomputed from the raw trace with the standard library's JSON
reader (event ids are indices into `traceEvents`).

Real traces (skipped when `../shared/traces` is absent), all copied unchanged:
- `tracelens/tests/traces/h100/*` (BERT-small, ViT on H100) and
  `tracelens/tests/traces/perf_model/normalization/normalization_layer_test.json.gz`
  (MI300X): AMD-AGI/TraceLens, MIT.
- `hta/tests/data/{triton_example,critical_path/cuda_event_sync,trace_file_list,
  nccl_parser_config}/...`: facebookresearch/HolisticTraceAnalysis, MIT.
- `kineto_tb_plugin/.../resnet50_num_workers_0/...`: pytorch/kineto tb_plugin sample, BSD-3.
Fixtures (`fixtures/*.pt.trace.json.gz`) are recorded by this project (`fixtures/record.py`).
"""

from __future__ import annotations

import math
import statistics
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import traceq
from traceq.analyze import analysis, analyze
from traceq.reports import build_report
from traceq.rules.finding import Finding
from traceq.rules.tq302_low_occupancy import COMM_KERNEL

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DYNAMIC = FIXTURES / "graph_break_mlp-compiled_dynamic.pt.trace.json.gz"
LOOP = FIXTURES / "linear-compiled_loop.pt.trace.json.gz"
BERT = "tracelens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz"
VIT = "tracelens/tests/traces/h100/Falconsai_nsfw_image_detection__1016002.json.gz"
NORM = "tracelens/tests/traces/perf_model/normalization/normalization_layer_test.json.gz"
RESNET = (
    "kineto_tb_plugin/tb_plugin/samples/resnet50_num_workers_0/"
    "worker0.1623143089861.pt.trace.json.gz"
)
NCCL = "hta/tests/data/nccl_parser_config/nccl_data.json.gz"
TINY_KERNELS = [
    BERT,  # flash attention 9.3 µs, layer norm 3 µs, a GEMM 8 µs, an add 1.6 µs: 4 before
    "hta/tests/data/triton_example/triton_example.json.gz",  # one 1.8 µs, 1-block kernel
    "hta/tests/data/critical_path/cuda_event_sync/event_sync_trace.json.gz",  # 1-block spins
    "hta/tests/data/trace_file_list/inference_rank_1.json.gz",  # 4-5 µs elementwise kernels
]
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


def ns(value: Any) -> int:
    return int(Decimal(str(value)) * 1000)


def complete(document: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, e) for i, e in enumerate(document["traceEvents"]) if e.get("ph") == "X"]


def step_of(events: list[tuple[int, dict]], step: int) -> tuple[int, int]:
    (window,) = [
        e
        for _, e in events
        if e["name"] == f"ProfilerStep#{step}" and e.get("cat") in ("user_annotation", "cpu_op")
    ]
    return ns(window["ts"]), ns(window["ts"]) + ns(window["dur"])


# -- TQ205: a frame id that repeats is the next iteration, not a graph break ----------------


def test_tq205_is_silent_on_a_compiled_loop_without_profiler_steps(read_json) -> None:
    """Five iterations of one compiled region in one window: once "5 compiled regions"."""
    events = complete(read_json(LOOP, parse_float=Decimal))
    regions = [e["name"] for _, e in events if e["name"].startswith("Torch-Compiled Region")]
    assert regions == ["Torch-Compiled Region: 0/0"] * 5
    assert not any(e["name"].startswith("ProfilerStep#") for _, e in events)
    assert analyze(traceq.load(LOOP), select="TQ205") == []


def test_tq205_reports_both_recompilations_of_a_new_batch_size(read_json) -> None:
    """Step 3 brings batch 16 after 32: Dynamo compiles frame 0 and its resume frame 1
    again (`Torch-Compiled Region: 0/1`, `1/1`); step 4's batch 8 reuses those graphs."""
    events = complete(read_json(DYNAMIC, parse_float=Decimal))
    start, end = step_of(events, 3)
    compiles = [i for i, e in events if e["name"] == "dynamo" and start <= ns(e["ts"]) < end]
    findings = [
        f for f in analyze(traceq.load(DYNAMIC), select="TQ205") if f.evidence["kind"] != "per-call"
    ]
    assert len(compiles) == 2
    assert sorted(f.ops[0] for f in findings) == compiles
    by_event = dict(events)
    for finding in findings:
        assert finding.evidence["kind"] == "recompilation" and finding.step == 3
        assert finding.time_us == pytest.approx(ns(by_event[finding.ops[0]]["dur"]) / 1000)
        assert finding.est_saving_us == finding.time_us
    step4 = step_of(events, 4)
    assert not [e for _, e in events if e["name"] == "dynamo" and ns(e["ts"]) >= step4[0]]


def test_tq205_per_call_overhead_of_a_graph_break(read_json) -> None:
    """Each call runs two regions, the resume frame's inside the frame that broke. The
    overhead is the outermost lookups and regions less the graph calls (and the resume
    frame's recompile) they hold; merging the two regions saves half of it."""
    events = complete(read_json(DYNAMIC, parse_float=Decimal))
    findings = {
        f.step: f
        for f in analyze(traceq.load(DYNAMIC), select="TQ205")
        if f.evidence["kind"] == "per-call"
    }
    assert sorted(findings) == [2, 4]  # step 3 is the recompile's: overhead under 10%
    for step, finding in findings.items():
        start, end = step_of(events, step)
        inside = [e for _, e in events if start <= ns(e["ts"]) < end]
        outermost = [
            e
            for e in inside
            if e["name"].startswith(("Torch-Compiled Region", "TorchDynamo Cache Lookup"))
            and not any(
                o is not e
                and o["name"].startswith("Torch-Compiled Region")
                and ns(o["ts"]) <= ns(e["ts"]) < ns(o["ts"]) + ns(o["dur"])
                for o in inside
            )
        ]
        graph = [e for e in inside if e["name"].startswith("## Call CompiledFxGraph")]
        overhead = sum(ns(e["dur"]) for e in outermost) - sum(ns(e["dur"]) for e in graph)
        assert finding.evidence["regions"] == 2 and finding.evidence["region_runs"] == 2
        assert finding.time_us == pytest.approx(overhead / 1000)
        # One run per frame and lookup: the typical call is the call itself.
        assert finding.est_saving_us == pytest.approx(overhead / 1000 / 2)
        assert finding.evidence["share"] == pytest.approx(overhead / (end - start))


# -- TQ302: what a kernel engineer would accept ----------------------------------------------


@pytest.mark.parametrize("relpath", TINY_KERNELS)
def test_tq302_is_silent_on_latency_bound_and_one_block_kernels(relpath, load_shared) -> None:
    assert analyze(load_shared(relpath), select="TQ302") == []


def test_tq302_does_not_take_the_median_grid_of_a_kernel_for_all_its_launches(
    load_shared,
) -> None:
    """ResNet's add kernel: 1,116 one-block launches (1 µs each) make the median grid
    small, but its time is in launches of 25k-100k blocks. Once a 95% "saving"."""
    assert analyze(load_shared(RESNET), select="TQ302") == []


def test_tq302_ignores_communication_kernels(load_shared) -> None:
    """Even with every threshold off, no NCCL kernel is called under-filled."""
    trace = load_shared(NCCL)
    everything = {"min_share": 0.0, "min_kernel_us": 0.0, "max_grid_fill": 1.0}
    findings = analyze(trace, select="TQ302", options={"TQ302": everything})
    names = set(trace.kernels["name"].to_list())
    assert any(name.startswith("ncclKernel") for name in names)
    assert not [f for f in findings if "nccl" in f.evidence["kernel"].lower()]


@pytest.mark.parametrize(
    "name",
    [
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, ...)",
        "void multimem_all_reduce_kernel<float>(float*, unsigned long)",
        "void sglang::cross_device_reduce_2stage<half, 4>(...)",
        "void rcclGenericKernel<1, false>(ncclDevComm*)",
    ],
)
def test_tq302_knows_communication_kernels_by_name(name: str) -> None:
    import re

    assert re.search(COMM_KERNEL, name)


@pytest.mark.parametrize(
    "name",
    [
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ...>>(...)",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>",
        "triton_per_fused_native_layer_norm_0",
    ],
)
def test_tq302_compute_kernels_are_not_communication(name: str) -> None:
    import re

    assert not re.search(COMM_KERNEL, name)


def test_tq302_partial_wave_saving_recomputed_from_the_raw_trace(
    load_shared, read_json, shared_trace
):
    """MI300X (304 CUs) layer norms over 8 rows launch 8 blocks, 14-26 µs each."""
    trace = load_shared(NORM)
    events = complete(read_json(shared_trace(NORM), parse_float=Decimal))
    kernels = [(i, e) for i, e in events if str(e.get("cat", "")).lower() == "kernel"]
    total = sum(ns(e["dur"]) for _, e in kernels)
    floor = min(ns(e["dur"]) for _, e in kernels if ns(e["dur"]) > 0)
    sms = trace.device_properties[0]["numSms"]
    findings = analyze(trace, select="TQ302")
    assert findings
    for finding in findings:
        launches = [e for i, e in kernels if i in set(finding.kernels)]
        blocks = {math.prod(e["args"]["grid"]) for e in launches}
        assert len(blocks) == 1 and {e["name"] for e in launches} == {finding.evidence["kernel"]}
        (b,) = blocks
        time = sum(ns(e["dur"]) for e in launches)
        assert 2 <= b <= sms / 2
        assert time / len(launches) >= 10_000  # not latency-bound
        assert finding.time_us == pytest.approx(time / 1000)
        assert finding.evidence["share"] == pytest.approx(time / total)
        expected = sum(max(0, ns(e["dur"]) - floor) for e in launches) * (1 - b / sms)
        assert finding.est_saving_us == pytest.approx(expected / 1000)
        assert finding.est_saving_us < finding.time_us


def test_tq302_a_library_conv_on_a_third_of_the_sms(load_shared) -> None:
    """ViT's patch-embedding conv: one cuDNN/CUTLASS launch of 48 CTAs on 132 SMs, 98 µs:
    a real partial wave (split-K or a smaller tile fills the GPU)."""
    (finding,) = analyze(load_shared(VIT), select="TQ302")
    assert "cutlass" in finding.evidence["kernel"] and finding.evidence["blocks"] == 48
    assert finding.evidence["sms"] == 132


# -- savings counted once --------------------------------------------------------------------


def gpu_idle_ns(events: list[tuple[int, dict]], start: int, end: int) -> int:
    """The window less the union of GPU activity in it."""
    busy, reach = 0, start
    spans = sorted(
        (ns(e["ts"]), ns(e["ts"]) + ns(e.get("dur", 0)))
        for _, e in events
        if str(e.get("cat", "")).lower() in GPU_CATS
    )
    for s, e in spans:
        s, e = max(s, reach), min(e, end)
        if e > s:
            busy += e - s
            reach = e
    return end - start - busy


@pytest.mark.parametrize(("relpath", "sum_exceeds_idle"), [(VIT, True), (BERT, False)])
def test_launch_bound_and_dispatch_overhead_count_one_idle_gap_once(
    relpath, sum_exceeds_idle, load_shared, read_json, shared_trace
) -> None:
    """TQ201 saves the idle gaps of a launch-bound stretch; TQ204 the GPU idle share of its
    whole step: partly the same gaps. TQ201 is counted first; TQ204 only for the step's
    idle time that TQ201 did not take. On the ViT trace the two estimates add up to more
    than the step's GPU idle time (the old total); the counted total never does."""
    trace = load_shared(relpath)
    events = complete(read_json(shared_trace(relpath), parse_float=Decimal))
    result = analysis(trace, select=["TQ201", "TQ204"])
    report = build_report(result, trace)
    counted = dict(zip((f.rule for f in result.findings), report.counted(), strict=True))
    (tq201,) = [f for f in result.findings if f.rule == "TQ201"]
    (tq204,) = [f for f in result.findings if f.rule == "TQ204"]
    assert tq201.step == tq204.step
    start, end = step_of(events, tq204.step)
    idle = gpu_idle_ns(events, start, end) / 1000
    assert (tq201.est_saving_us + tq204.est_saving_us > idle) == sum_exceeds_idle
    assert counted["TQ201"] == pytest.approx(tq201.est_saving_us)
    left = idle - tq201.est_saving_us
    # claims are whole ns per idle gap: ~100 gaps, < 0.5 µs of rounding
    assert counted["TQ204"] == pytest.approx(min(tq204.est_saving_us, left), abs=0.5)
    assert report.summary()["est_saving_us"] <= idle + 1e-6
    assert report.summary()["est_saving_us_sum"] == pytest.approx(
        tq201.est_saving_us + tq204.est_saving_us
    )


def test_two_findings_on_one_op_count_its_time_once() -> None:
    """Two rules naming one op (TQ104 and TQ203 on one copy, say) save its µs once."""
    trace = traceq.load(FIXTURES / "mlp_gelu-eager.pt.trace.json.gz")
    result = analysis(trace, select="TQ102")
    gelu = next(f for f in result.findings)
    op = gelu.ops[-1]
    dur_us = trace.ops.filter(trace.ops["event"] == op)["dur_ns"][0] / 1000
    twins = [
        Finding("TQX", "x", "info", "a", ops=[op], time_us=dur_us, est_saving_us=dur_us),
        Finding("TQY", "y", "info", "b", ops=[op], time_us=dur_us, est_saving_us=dur_us * 0.5),
    ]
    result.findings[:] = twins
    report = build_report(result, trace)
    assert report.counted() == [pytest.approx(dur_us), 0.0]
    assert report.summary()["est_saving_us"] == pytest.approx(dur_us)
    assert report.summary()["est_saving_us_sum"] == pytest.approx(1.5 * dur_us)


def test_dispatch_overhead_on_a_cpu_trace_is_not_set_by_one_slow_op(read_json) -> None:
    """swiglu_mlp-eager, step 2: one `aten::t` took 35.8 µs (its median is 1.4 µs), so the
    step's no-work ops measure 77 µs, 11% of it. Counted at each name's median they are
    under 10%: not reported. Every estimate is Σ min(op, its name's median)."""
    path = FIXTURES / "swiglu_mlp-eager.pt.trace.json.gz"
    trace = traceq.load(path)
    raw = read_json(path, parse_float=Decimal)["traceEvents"]
    everything = analyze(trace, select="TQ204", options={"TQ204": {"min_share": 0, "min_us": 0}})
    ops = [i for f in everything for i in f.ops]
    medians = {
        name: statistics.median(ns(raw[i]["dur"]) for i in ops if raw[i]["name"] == name)
        for name in {raw[i]["name"] for i in ops}
    }
    for finding in everything:
        typical = sum(min(ns(raw[i]["dur"]), medians[raw[i]["name"]]) for i in finding.ops)
        assert finding.est_saving_us == pytest.approx(typical / 1000)
        assert finding.time_us == pytest.approx(sum(ns(raw[i]["dur"]) for i in finding.ops) / 1000)
    step2 = next(f for f in everything if f.step == 2)
    assert step2.evidence["share"] >= 0.1  # measured, it would have been reported
    assert 2 not in {f.step for f in analyze(trace, select="TQ204")}


interval_lists = st.lists(
    st.tuples(st.integers(0, 200), st.integers(0, 40)).map(lambda p: (p[0], p[0] + p[1])),
    max_size=12,
)


def as_ns_set(intervals: list[tuple[int, int]]) -> set[int]:
    return {t for s, e in intervals for t in range(s, e)}


@given(interval_lists, interval_lists)
def test_interval_difference_and_insert_match_sets(a, b) -> None:
    """The claim bookkeeping, against plain sets of nanoseconds."""
    from traceq.reports.savings import _difference, _insert, _merge

    def arrays(intervals):
        return _merge(
            np.array([s for s, _ in intervals], np.int64),
            np.array([e for _, e in intervals], np.int64),
        )

    left, right = arrays(a), arrays(b)
    free = _difference(left, right)
    assert as_ns_set(list(zip(*free, strict=True))) == as_ns_set(a) - as_ns_set(b)
    both = _insert(right, free)
    assert np.all(both[0][1:] >= both[1][:-1])  # still disjoint and sorted
    assert as_ns_set(list(zip(*both, strict=True))) == as_ns_set(a) | as_ns_set(b)
