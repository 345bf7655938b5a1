"""Collectives and per-step breakdowns of real ranks, checked against numbers recomputed
here from the raw JSON with the stdlib (no traceq code): NCCL kernels by their names and
arguments, message sizes, NCCL's bus-bandwidth formula, cross-rank waits, interval unions."""

from __future__ import annotations

import gzip
import json
from bisect import bisect_right
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

import traceq
from traceq.relations.breakdown import step_breakdown
from traceq.relations.collectives import rank_collectives

REPO = Path(__file__).resolve().parent.parent
HTA = REPO.parent / "shared" / "traces" / "hta" / "tests" / "data"
SLOW_JOB = REPO / "fixtures" / "jobs" / "ddp_gloo_slow2"
needs_shared = pytest.mark.skipif(not HTA.is_dir(), reason="../shared/traces is not here")
DTYPE = {"Float": 4, "Long": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Byte": 1}


def ns(value) -> int:
    return int(Decimal(str(value)) * 1000)


def raw(path: Path) -> dict:
    with gzip.open(path) as f:
        return json.loads(f.read())


def raw_steps(doc: dict) -> list[tuple[int, int, int]]:
    return sorted(
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), int(e["name"].split("#")[1]))
        for e in doc["traceEvents"]
        if e.get("ph") == "X"
        and str(e.get("name", "")).startswith("ProfilerStep#")
        and e.get("cat") != "gpu_user_annotation"
    )


def step_at(steps, t: int):
    i = bisect_right([s[0] for s in steps], t) - 1
    return steps[i][2] if i >= 0 and t < steps[i][1] else None


def raw_gpu_work(doc: dict):
    """(step by the launch's time, type, start, end) of every GPU activity."""
    steps = raw_steps(doc)
    launches = {
        e["args"]["correlation"]: ns(e["ts"])
        for e in doc["traceEvents"]
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    out = []
    for e in doc["traceEvents"]:
        cat = e.get("cat")
        if e.get("ph") != "X" or cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        start = ns(e["ts"])
        launch = launches.get(e["args"].get("correlation"))
        step = step_at(steps, launch) if launch is not None else None
        if step is None:
            step = step_at(steps, start)
        kind = (
            "COMM"
            if e["name"].startswith(("ncclKernel_", "ncclDevKernel_"))
            else ("MEM" if cat != "kernel" else "COMP")
        )
        out.append((step, kind, start, start + ns(e["dur"])))
    return out


def union(intervals) -> int:
    total, reach = 0, None
    for a, b in sorted(intervals):
        if reach is None or a > reach:
            total += b - a
            reach = b
        elif b > reach:
            total += b - reach
            reach = b
    return total


@needs_shared
def test_nccl_kernels_sizes_and_busbw_match_the_raw_args():
    path = HTA / "nccl_parser_config" / "nccl_data.json.gz"
    doc = raw(path)
    kernels = sorted(
        (
            e
            for e in doc["traceEvents"]
            if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_")
        ),
        key=lambda e: ns(e["ts"]),
    )
    calls = rank_collectives(traceq.load(path), 0)
    assert calls.height == len(kernels) == 21
    expect_bytes = [
        max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"]) * DTYPE[e["args"]["dtype"]]
        for e in kernels
    ]
    assert calls["bytes"].to_list() == expect_bytes
    assert calls["collective"].to_list() == [e["args"]["Collective name"] for e in kernels]
    assert set(calls["algorithm"].to_list()) == {"RING"} and set(calls["protocol"]) == {"LL"}
    matched = traceq.load_job(path, engine="serial").frames.collectives
    # One rank of two: the transfer is the kernel's duration; NCCL: allreduce ×2(n-1)/n = 1.
    for row, e in zip(matched.iter_rows(named=True), kernels, strict=True):
        gbs = expect_bytes[kernels.index(e)] / ns(e["dur"])
        factor = {"allreduce": 2 * (2 - 1) / 2, "broadcast": 1.0}[e["args"]["Collective name"]]
        assert row["busbw_gbs"] == pytest.approx(gbs * factor, rel=1e-9)


@needs_shared
def test_ddp_rank_2020_nccl_kernels_named_by_the_kernel_only():
    path = HTA / "df_index_resolver" / "df_index_resolver.json.gz"
    calls = rank_collectives(traceq.load(path), 1)
    assert calls.height == 2020
    assert set(calls["collective"]) == {"allreduce"}
    assert set(calls["dtype"]) == {"float"}
    assert calls["bytes"].null_count() == 2020  # this Kineto wrote no message sizes


@needs_shared
def test_ddp_rank_step_breakdown_matches_interval_unions_of_the_raw_json():
    path = HTA / "df_index_resolver" / "df_index_resolver.json.gz"
    work = raw_gpu_work(raw(path))
    frame = step_breakdown(traceq.load(path))
    assert frame["step"].to_list() == sorted({w[0] for w in work if w[0] is not None})
    for row in frame.iter_rows(named=True):
        mine = [w for w in work if w[0] == row["step"]]

        def of(*kinds, mine=mine):
            return [(a, b) for _, k, a, b in mine if k in kinds]

        assert row["compute_ns"] == union(of("COMP"))
        assert row["comm_ns"] == union(of("COMM"))
        assert row["memcpy_ns"] == union(of("MEM"))
        span = max(b for *_, b in mine) - min(a for _, _, a, _ in mine)
        assert row["span_ns"] == span
        assert row["idle_ns"] == span - union(of("COMP", "COMM", "MEM"))
        assert row["exposed_comm_ns"] == union(of("COMP", "COMM")) - union(of("COMP"))


@needs_shared
def test_sampled_ranks_waits_and_last_rank_match_the_raw_json():
    """trace_filter's two ranks of a 128-rank job: SendRecv kernels matched by step and
    order, each rank's wait = the later start − its own start (their clocks agree: the
    alignment is measured and, below its own spread, not applied)."""
    job = traceq.load_job(HTA / "trace_filter", engine="serial")
    frames = job.frames
    assert frames.alignment["applied_ns"].to_list() == [0, 0]
    starts: dict[tuple, dict[int, tuple[int, int]]] = {}
    for rank in (0, 1):
        doc = raw(HTA / "trace_filter" / f"sampled_rank-{rank}.json.gz")
        comm = sorted((a, b, s) for s, k, a, b in raw_gpu_work(doc) if k == "COMM")
        seen: dict = {}
        for a, b, step in comm:
            seq = seen.get(step, 0)
            seen[step] = seq + 1
            starts.setdefault((step, seq), {})[rank] = (a, b)
    matched = frames.collectives
    both = {k: v for k, v in starts.items() if len(v) == 2}
    assert len(both) >= 5
    assert matched.filter(pl.col("ranks_seen") == 2).height == 2 * len(both)
    for (step, seq), by_rank in both.items():
        last = max(by_rank, key=lambda r: by_rank[r][0])
        rows = matched.filter((pl.col("step") == step) & (pl.col("seq") == seq)).sort("rank")
        assert rows["last_rank"].unique().to_list() == [last]
        for row in rows.iter_rows(named=True):
            start, end = by_rank[row["rank"]]
            expect = min(max(0, by_rank[last][0] - start), end - start)
            assert row["wait_ns"] == expect


def test_gloo_collectives_are_the_worker_thread_ranges():
    doc = raw(SLOW_JOB / "rank-0.pt.trace.json.gz")
    gloo = sorted(ns(e["ts"]) for e in doc["traceEvents"] if e.get("name") == "gloo:all_reduce")
    calls = rank_collectives(traceq.load(SLOW_JOB / "rank-0.pt.trace.json.gz"), 0)
    assert calls["ts_ns"].to_list() == gloo
    assert set(calls["collective"]) == {"allreduce"} and set(calls["on"]) == {"cpu"}
    assert calls.group_by("step").len()["len"].to_list() == [2, 2, 2, 2]


def test_job_step_time_is_the_slowest_rank_per_step():
    frames = traceq.load_job(SLOW_JOB, engine="serial").frames
    per_rank = {}
    for rank in range(4):
        for s, e, step in raw_steps(raw(SLOW_JOB / f"rank-{rank}.pt.trace.json.gz")):
            per_rank.setdefault(step, []).append(e - s)
    assert frames.step_time["dur_ns"].to_list() == [max(v) for _, v in sorted(per_rank.items())]


def test_todays_and_old_nccl_kernel_names_are_collectives():
    """NCCL ≥ 2.19 names kernels `ncclDevKernel_*` (HTA#360: not recognised there); the old
    ones are `ncclKernel_*`; RCCL's are `rcclKernel_*`. Collective, algorithm, protocol and
    dtype come from the name when the kernel carries no arguments."""
    import io

    names = {
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL": ("allreduce", "RING", "LL", "f32"),
        "ncclDevKernel_AllGather_RING_LL128": ("allgather", "RING", "LL128", None),
        "ncclDevKernel_ReduceScatter_Sum_bf16_NVLS_TREE_SIMPLE": (
            "reducescatter",
            "NVLS_TREE",
            "SIMPLE",
            "bf16",
        ),
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)": (
            "allreduce",
            "RING",
            "LL",
            "float",
        ),
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)": ("sendrecv", None, None, None),
        "rcclKernel_Broadcast_RING_SIMPLE_Sum_int8_t": ("broadcast", "RING", "SIMPLE", "int8_t"),
    }
    events = [
        {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 10 * i, "dur": 5,
         "args": {"device": 0, "stream": 7, "correlation": i}}
        for i, name in enumerate(names)
    ]  # fmt: skip
    events.append({"ph": "X", "cat": "kernel", "name": "volta_sgemm_128x64_nn", "pid": 0,
                   "tid": 7, "ts": 100, "dur": 5, "args": {"device": 0, "stream": 7}})  # fmt: skip
    trace = traceq.load(io.BytesIO(json.dumps({"traceEvents": events}).encode()))
    calls = rank_collectives(trace, 0)
    got = calls.select("collective", "algorithm", "protocol", "dtype").rows()
    assert got == list(names.values())


@needs_shared
def test_clock_skew_is_measured_from_collective_ends_and_removed(tmp_path):
    """The same real rank twice, rank 1's clock 500 µs ahead: the offset is found exactly,
    applied, and the waits it would fake vanish; with align="none" they are 500 µs."""
    with gzip.open(HTA / "nccl_parser_config" / "nccl_data.json.gz") as f:
        doc = json.loads(f.read())
    for rank in (0, 1):
        doc["distributedInfo"]["rank"] = rank
        if rank == 1:
            for e in doc["traceEvents"]:
                if "ts" in e:
                    e["ts"] = float(Decimal(str(e["ts"])) + 500)
        with gzip.open(tmp_path / f"rank-{rank}.json.gz", "wt") as f:
            json.dump(doc, f)
    aligned = traceq.load_job(tmp_path, engine="serial")
    frames = aligned.frames
    assert frames.alignment["offset_ns"].to_list() == [0, 500_000]
    assert frames.alignment["applied_ns"].to_list() == [0, 500_000]
    assert frames.collectives["wait_ns"].max() == 0
    assert any("clocks aligned" in n and "rank 1 shifted" in n for n in aligned.notes())
    raw_clocks = traceq.load_job(tmp_path, engine="serial", align="none").frames.collectives
    waits = raw_clocks.filter(pl.col("rank") == 0)["wait_ns"]
    durations = raw_clocks.filter(pl.col("rank") == 0)["dur_ns"]
    assert (waits == durations.clip(upper_bound=500_000)).all()
