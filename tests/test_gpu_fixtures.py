"""The GPU side on the bundled real GPU traces (`fixtures/gpu/`), so it runs on every machine.

The three traces are copied unchanged from facebookresearch/HolisticTraceAnalysis
tests/data (MIT, `fixtures/gpu/LICENSE-hta`; upstream paths and checksums in
`fixtures/gpu/sources.json`):
- `hta-alexnet-a100`: critical_path/alexnet, PARAM AlexNet forward on an A100 (launches,
  ac2g flows, `cuda_sync`, stream waits, pageable host->device copies, fp32 sgemm);
- `hta-sampled_rank-0`: timeline_analysis/sampled_rank-0, a sampled excerpt of rank 0 of
  a 128-rank training job (NCCL kernels, launch-bound stretches, `aten::item` syncs,
  pageable copies both ways, no flow events: kernels link by correlation alone);
- `hta-event_sync-a100`: critical_path/cuda_event_sync (every kind of CUDA sync, a
  device->pageable copy, single-block kernels).

Every expected number is recomputed here from the raw JSON (stdlib `json`, exact integer
ns), not from traceq's frames, and checked against each rule's documented model; only
device constants (SM count, bandwidth) come from the trace's device properties or the
device model.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import (
    GPU_FIXTURES,
    GPU_SOURCES,
    RAW_GPU_CATS,
    SHARED_TRACES,
    Raw,
    gpu_fixture,
    split_copies,
    write_json,
)

import traceq
from traceq.analyze import analysis, analyze
from traceq.rules.finding import Finding

ALEXNET = gpu_fixture("hta-alexnet-a100")
SAMPLED = gpu_fixture("hta-sampled_rank-0")
EVENT_SYNC = gpu_fixture("hta-event_sync-a100")
SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize"}
NCCL = re.compile(r"^nccl(Dev)?Kernel_")
PAGEABLE = re.compile(r"^Memcpy (HtoD|DtoH) \(.*Pageable.*\)")


@pytest.fixture(scope="module")
def raw() -> Callable[[Path], Raw]:
    cache: dict[Path, Raw] = {}

    def get(path: Path) -> Raw:
        if path not in cache:
            cache[path] = Raw(path)
        return cache[path]

    return get


def only(findings: list[Finding], rule: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule]


# -- provenance ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GPU_SOURCES))
def test_bundled_traces_are_small_unchanged_copies_with_their_license(name: str) -> None:
    entry = GPU_SOURCES[name]
    data = (GPU_FIXTURES / name).read_bytes()
    assert len(data) == entry["bytes"] < 300_000
    assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    sources = json.loads((GPU_FIXTURES / "sources.json").read_text())["sources"]
    license_file = GPU_FIXTURES / sources[entry["source"]]["license_file"]
    assert license_file.read_text().startswith("MIT License")
    shared = SHARED_TRACES / entry["shared"]
    if shared.is_file():  # the very bytes of the public file
        assert shared.read_bytes() == data


def test_together_they_carry_the_gpu_side(raw) -> None:
    """Counted from the raw events: what the issue asks the bundled traces to hold."""
    counts: dict[str, Counter] = {}
    for path in (ALEXNET, SAMPLED, EVENT_SYNC):
        r = raw(path)
        c: Counter = Counter()
        for i, e in enumerate(r.events):
            cat, name, args = e.get("cat"), str(e.get("name")), e.get("args", {})
            if cat in RAW_GPU_CATS and r.launch_of(i) is not None:
                c["launched"] += 1
            c["ac2g flows"] += cat == "ac2g"
            c["cuda_sync"] += cat == "cuda_sync"
            c["stream waits"] += isinstance(args, dict) and "wait_on_stream" in args
            c["pageable copies"] += cat == "gpu_memcpy" and bool(PAGEABLE.match(name))
            c["nccl kernels"] += cat == "kernel" and bool(NCCL.match(name))
        counts[path.name] = c
    assert counts[ALEXNET.name] >= Counter(
        {"launched": 98, "ac2g flows": 500, "cuda_sync": 41, "stream waits": 20}
    )
    assert counts[ALEXNET.name]["pageable copies"] == 16
    assert counts[SAMPLED.name]["nccl kernels"] == 10
    assert counts[SAMPLED.name]["ac2g flows"] == 0  # linked by correlation alone
    assert counts[SAMPLED.name]["pageable copies"] == 24
    assert counts[EVENT_SYNC.name]["cuda_sync"] == 4
    assert counts[EVENT_SYNC.name]["pageable copies"] == 1


@pytest.mark.parametrize("path", [ALEXNET, SAMPLED, EVENT_SYNC], ids=lambda p: p.name)
def test_kernels_link_to_their_launch_and_op(raw, path: Path) -> None:
    """Not `{} == {}`: every GPU activity with a launch in the file is linked to that call,
    and most to the op around it (the full comparison runs in test_load_linking)."""
    r = raw(path)
    expected = {k: r.launch_of(k) for k in r.gpu()}
    linked = {k: v for k, v in expected.items() if v is not None}
    assert len(linked) >= 4
    kernels = traceq.load(path).kernels
    got = dict(zip(kernels["event"].to_list(), kernels["runtime_event"].to_list(), strict=True))
    assert got == expected
    with_op = kernels.filter(pl.col("op_event").is_not_null()).height
    assert with_op >= len(linked) // 2


# -- TQ201 launch-bound -------------------------------------------------------------------


def test_tq201_finds_the_launch_bound_stretches_of_the_sampled_rank(raw) -> None:
    r = raw(SAMPLED)
    trace = traceq.load(SAMPLED)
    findings = analyze(trace, select="TQ201")
    assert len(findings) == 4 and {f.step for f in findings} == {551, 552}
    for finding in findings:
        kernels = sorted(finding.kernels, key=r.start)
        assert len({r.events[k]["args"]["device"] for k in kernels}) == 1
        idle, reach, starved = 0, r.end(kernels[0]), 0
        for prev, k in itertools.pairwise(kernels):
            gap = max(0, r.start(k) - reach)
            idle += gap
            launch = r.launch_of(k)
            # starved: the launch call began only after the previous kernel had started
            starved += launch is not None and r.start(launch) >= r.start(prev) and gap >= 1000
            reach = max(reach, r.end(k))
        span = reach - r.start(kernels[0])
        assert finding.time_us == pytest.approx(idle / 1000)
        assert finding.est_saving_us == pytest.approx(idle / 1000 - (len(kernels) - 1) * 1.0)
        assert finding.evidence["idle_share"] == pytest.approx(idle / span)
        assert idle / span >= 0.3 and len(kernels) >= 20
        assert starved >= 0.5 * (len(kernels) - 1)


def test_tq201_is_silent_where_the_queue_stays_full() -> None:
    """AlexNet's forward: the kernels queue up behind the copies, nothing starves long."""
    assert analyze(traceq.load(ALEXNET), select="TQ201") == []


# -- TQ202 host-sync ----------------------------------------------------------------------


def _expected_syncs(r: Raw, min_saving_ns: int = 5000) -> dict[int, tuple[int, int]]:
    """sync call -> (wait, bubble) in ns for each sync that TQ202's model reports: the
    CPU's time in the call, and the GPU's idle time until the next activity starts."""
    pageable_dtoh = {
        r.launch_of(i)
        for i in r.where(lambda e: str(e["name"]).startswith("Memcpy DtoH (Device -> Pageable)"))
    }
    calls = r.where(lambda e: e.get("cat") == "cuda_runtime" and e["name"] in SYNC_CALLS) + sorted(
        c for c in pageable_dtoh if c is not None
    )
    gpu = r.gpu()
    found = {}
    for call in calls:
        end = r.end(call)
        after = [r.start(k) for k in gpu if r.start(k) >= end]
        if not after:
            continue
        reach = max((r.end(k) for k in gpu if r.start(k) <= end), default=0)
        wait, bubble = r.dur(call), max(0, min(after) - max(end, reach))
        if min(wait, bubble) >= min_saving_ns:
            found[call] = (wait, bubble)
    return found


@pytest.mark.parametrize("path", [ALEXNET, EVENT_SYNC], ids=lambda p: p.name)
def test_tq202_reports_each_sync_with_its_wait_and_refill_bubble(raw, path: Path) -> None:
    r = raw(path)
    findings = analyze(traceq.load(path), select="TQ202")
    expected = _expected_syncs(r)
    assert len(expected) >= 2
    assert {f.evidence["sync_event"]: f for f in findings}.keys() == expected.keys()
    for finding in findings:
        wait, bubble = expected[finding.evidence["sync_event"]]
        assert finding.evidence["wait_us"] == pytest.approx(wait / 1000)
        assert finding.evidence["bubble_us"] == pytest.approx(bubble / 1000)
        assert finding.est_saving_us == pytest.approx(min(wait, bubble) / 1000)


def test_tq202_names_the_op_behind_the_sync(raw) -> None:
    """AlexNet's input copies (`aten::to`, pageable) wait in cudaStreamSynchronize."""
    r = raw(ALEXNET)
    findings = analyze(traceq.load(ALEXNET), select="TQ202")
    by_culprit = Counter(f.evidence["op_names"][0] for f in findings)
    streams = [f for f in findings if f.evidence["sync_call"] == "cudaStreamSynchronize"]
    assert by_culprit["aten::to"] == len(streams) > 0
    for finding in streams:
        call = finding.evidence["sync_event"]
        (top,) = [o for o in finding.ops if r.events[o]["name"] == "aten::to"]
        assert r.start(top) <= r.start(call) and r.end(call) <= r.end(top)


# -- TQ203 memcpy -------------------------------------------------------------------------


def test_tq203_counts_the_host_time_of_pageable_copies(raw) -> None:
    """The sampled rank's pageable uploads (`aten::to`) block the host; its 1-byte
    device->pageable reads (`aten::item`) cost less than the 10 µs threshold."""
    r = raw(SAMPLED)
    findings = analyze(traceq.load(SAMPLED), select="TQ203")
    assert len(findings) == 2 and {f.step for f in findings} == {551, 552}
    pageable = set(r.where(lambda e: bool(PAGEABLE.match(str(e["name"])))))
    for finding in findings:
        assert set(finding.kernels) <= pageable
        (name,) = {r.events[k]["name"] for k in finding.kernels}
        assert finding.evidence["copy_name"] == name
        blocked = sum(min(r.dur(r.launch_of(k)), r.dur(k)) for k in finding.kernels)
        assert finding.est_saving_us == pytest.approx(blocked / 1000)
        assert blocked >= 10_000
        assert finding.evidence["bytes"] == sum(
            r.events[k]["args"]["bytes"] for k in finding.kernels
        )


def test_tq203_reports_many_small_copies_that_one_copy_would_do(raw, tmp_path: Path) -> None:
    """The sampled rank uploads four pinned buffers per step: too few to flag. Issued as
    16 pieces each (64 copies of 32-49 kB per step), they are the rule's "many small
    copies": saving = Σ copy time − (median copy + Σ bytes / pinned bandwidth), here the
    default 12 GB/s (no device properties, no pinned copy of 1 MiB to measure one)."""
    name = "Memcpy HtoD (Pinned -> Device)"
    original = analyze(traceq.load(SAMPLED), select="TQ203")
    assert not [f for f in original if f.evidence["copy_name"] == name]
    doc = split_copies(raw(SAMPLED).document, name, 16)
    path = write_json(doc, tmp_path / "split.json")
    r = Raw(path)
    small = [f for f in analyze(traceq.load(path), select="TQ203") if f.severity == "info"]
    assert len(small) == 2 and {f.step for f in small} == {551, 552}
    for finding in small:
        copies = sorted(finding.kernels, key=r.start)
        assert len(copies) == 64 and {r.events[k]["name"] for k in copies} == {name}
        durations = sorted(r.dur(k) for k in copies)
        median = (durations[31] + durations[32]) / 2
        total_bytes = sum(r.events[k]["args"]["bytes"] for k in copies)
        assert finding.evidence["median_bytes"] < 65536
        batched_us = median / 1000 + total_bytes / (12.0 * 1e3)
        assert finding.est_saving_us == pytest.approx(sum(durations) / 1000 - batched_us)
        assert finding.time_us == pytest.approx(sum(durations) / 1000)


# -- TQ301 fp32-gemm, TQ302 low-occupancy, NCCL -------------------------------------------


def test_tq301_finds_alexnets_fp32_sgemm_on_an_a100(raw) -> None:
    r = raw(ALEXNET)
    # the GEMM site; AlexNet's fp32 cuDNN convolution (`*_scudnn_*`) is a finding of its own
    findings = analyze(traceq.load(ALEXNET), select="TQ301")
    (finding,) = [f for f in findings if f.evidence["decoded"].get("category") == "gemm"]
    launches = r.where(lambda e: e["name"] == "ampere_sgemm_32x32_sliced1x4_tn")
    time_us = sum(r.dur(k) for k in launches) / 1000
    assert sorted(finding.kernels) == launches and len(launches) == 6
    assert finding.time_us == pytest.approx(time_us)
    # A100: TF32 is 8x fp32 at peak, capped at 4x; no shapes, so no memory floor
    assert finding.est_saving_us == pytest.approx(time_us - time_us / 4)
    assert finding.dtype == "fp32"


def _kernel_groups(r: Raw) -> tuple[dict[tuple[str, int], list[int]], int]:
    """Kernels by (name, blocks), and the total kernel time (ns), from the raw events."""
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    total = 0
    for k in r.where(lambda e: e.get("cat") == "kernel"):
        args = r.events[k]["args"]
        groups[(r.events[k]["name"], math.prod(args.get("grid", [1])))].append(k)
        total += r.dur(k)
    return groups, total


def test_tq302_never_reports_single_block_kernels(raw) -> None:
    """cuda_event_sync's spin and reduce kernels are 73 % and 22 % of its kernel time, on
    one block of 108 SMs: serial by construction (a spin, a reduction's last pass), so
    TQ302 leaves them alone."""
    r = raw(EVENT_SYNC)
    groups, total = _kernel_groups(r)
    heavy = {key for key, ks in groups.items() if sum(r.dur(k) for k in ks) >= 0.05 * total}
    assert len(heavy) == 2 and {blocks for _, blocks in heavy} == {1}
    assert analyze(traceq.load(EVENT_SYNC), select="TQ302") == []


COPY_KERNEL = "void at::native::copy_kernel_vectorized<16>(char*, long)"


def _sampled_on_an_a100(raw) -> dict[str, Any]:
    doc = copy.deepcopy(raw(SAMPLED).document)
    doc["deviceProperties"] = raw(ALEXNET).document["deviceProperties"]
    return doc


def test_tq302_leaves_nccl_kernels_alone(raw, tmp_path: Path) -> None:
    """Given the A100's properties, the sampled rank's SendRecv kernels (16 blocks on 108
    SMs, 65 % of the kernel time, milliseconds each) are a small grid by the numbers, but
    communication kernels use few blocks on purpose."""
    doc = _sampled_on_an_a100(raw)
    groups, total = _kernel_groups(Raw(doc))
    nccl = [key for key in groups if NCCL.match(key[0])]
    assert len(nccl) == 1 and nccl[0][1] == 16
    assert sum(Raw(doc).dur(k) for k in groups[nccl[0]]) / total > 0.6
    assert analyze(traceq.load(write_json(doc, tmp_path / "a100.json")), select="TQ302") == []


def test_tq302_flags_the_same_small_grid_when_it_is_compute(raw, tmp_path: Path) -> None:
    """The same launches renamed to a copy kernel: a partial wave of 16 blocks on 108
    SMs. Saving = Σ (duration − floor) × (1 − 16 / 108), floor = the shortest kernel."""
    doc = _sampled_on_an_a100(raw)
    for event in doc["traceEvents"]:
        if NCCL.match(str(event.get("name"))):
            event["name"] = COPY_KERNEL
    r = Raw(doc)
    groups, total = _kernel_groups(r)
    launches = groups[(COPY_KERNEL, 16)]
    floor = min(r.dur(k) for ks in groups.values() for k in ks if r.dur(k) > 0)
    (finding,) = analyze(traceq.load(write_json(doc, tmp_path / "copy.json")), select="TQ302")
    assert sorted(finding.kernels) == sorted(launches) and len(launches) == 10
    time = sum(r.dur(k) for k in launches)
    assert finding.time_us == pytest.approx(time / 1000)
    assert finding.evidence["share"] == pytest.approx(time / total)
    saving = sum(max(0, r.dur(k) - floor) for k in launches) * (1 - 16 / 108)
    assert finding.est_saving_us == pytest.approx(saving / 1000)


# -- TQ105 parallel-gemms: the saving --------------------------------------------------------

ITEMSIZE = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8}


def _gpu_time_under(r: Raw, op: int) -> int:
    """GPU time of the activities launched from inside `op` (its thread, its span)."""
    tid, start, end = r.events[op]["tid"], r.start(op), r.end(op)
    return sum(
        r.dur(k)
        for k in r.gpu()
        if (call := r.launch_of(k)) is not None
        and r.events[call]["tid"] == tid
        and start <= r.start(call) <= end
    )


def test_tq105_saving_is_a_launch_and_an_input_read_per_merged_gemm(raw) -> None:
    """(n − 1) × (launch + shared input bytes / bandwidth), capped at the GPU time of all
    but the longest GEMM; input bytes, GEMM times and the launch overhead from the raw
    file, the bandwidth from the device model (this trace names no GPU)."""
    r = raw(SAMPLED)
    result = analysis(traceq.load(SAMPLED), select="TQ105")
    # no device properties: the table's default bandwidth, and the launch overhead this
    # trace measures (the median cudaLaunchKernel call)
    bandwidth_gbs = result.device.memory_bandwidth_gbs
    launches = sorted(r.dur(i) for i in r.where(lambda e: e["name"] == "cudaLaunchKernel"))
    launch_median_us = statistics.median(launches) / 1000
    assert result.findings
    for finding in result.findings:
        gemms = finding.ops
        x_index = [1 if r.events[g]["name"] == "aten::addmm" else 0 for g in gemms]
        shapes = {
            tuple(r.events[g]["args"]["Input Dims"][i]) for g, i in zip(gemms, x_index, strict=True)
        }
        (shape,) = shapes
        assert list(shape) == finding.evidence["x_shape"]
        dtype = r.events[gemms[0]]["args"]["Input type"][x_index[0]]
        x_bytes = math.prod(shape) * ITEMSIZE[dtype]
        times = [_gpu_time_under(r, g) / 1000 for g in gemms]
        assert finding.evidence["op_time_us"] == pytest.approx(times)
        launch = finding.evidence["launch_overhead_us"]
        assert launch == pytest.approx(launch_median_us)
        modeled = (len(gemms) - 1) * (launch + x_bytes / (bandwidth_gbs * 1e3))
        assert finding.est_saving_us == pytest.approx(min(modeled, sum(times) - max(times)))


def test_tq105_groups_no_backward_gemms_by_input_shape_alone(raw) -> None:
    """A GEMM an autograd node runs reads a gradient or a saved tensor, never a graph
    input: "graph input, same shape" grouped `grad.mm(W)` of two heads of this rank, each
    reading its own head's gradient (35 such findings before). A backward group needs a
    producer both GEMMs read. Autograd nodes are found in the raw JSON: a CPU event named
    `...Backward<n>` on the GEMM's thread whose span holds the GEMM."""
    r = raw(SAMPLED)
    nodes = defaultdict(list)
    for i in r.where(lambda e: e.get("ph") == "X" and re.search(r"Backward\d*$", e["name"])):
        nodes[r.events[i]["tid"]].append((r.start(i), r.end(i)))

    def in_backward(i: int) -> bool:
        start, end = r.start(i), r.end(i)
        return any(s <= start and end <= e for s, e in nodes[r.events[i]["tid"]])

    findings = analysis(traceq.load(SAMPLED), select="TQ105").findings
    backward = [f for f in findings if all(in_backward(g) for g in f.ops)]
    assert sum(len(v) for v in nodes.values()) > 100  # the rank runs its backward pass
    assert all(f.evidence["source"] is not None for f in backward)
