"""TQ4xx on real jobs: the recorded gloo DDP job with rank 2 slowed by a 40 ms sleep in its
forward (and the same job with no rank slowed), and HTA's real NCCL ranks."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

import traceq
from traceq.rules.catalogue import RULES

REPO = Path(__file__).resolve().parent.parent
JOBS = REPO / "fixtures" / "jobs"
HTA = REPO.parent / "shared" / "traces" / "hta" / "tests" / "data"
needs_shared = pytest.mark.skipif(not HTA.is_dir(), reason="../shared/traces is not here")


def manifest(name: str) -> dict:
    return json.loads((JOBS / name / "manifest.json").read_text())


@pytest.fixture(scope="module")
def slow():
    return traceq.analyze_job(traceq.load_job(JOBS / "ddp_gloo_slow2", engine="serial"))


@pytest.fixture(scope="module")
def balanced():
    return traceq.analyze_job(traceq.load_job(JOBS / "ddp_gloo_balanced", engine="serial"))


def test_tq4_rules_are_job_rules_documented_like_the_others():
    codes = {r.code: r for r in RULES if r.code.startswith("TQ4")}
    assert sorted(codes) == ["TQ401", "TQ402", "TQ403", "TQ404"]
    for rule in codes.values():
        assert rule.scope == "job"
        for section in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
            assert section in rule.doc


def test_straggler_names_the_slowed_rank_and_the_wait_it_causes(slow):
    info = manifest("ddp_gloo_slow2")
    (finding,) = [f for f in slow.findings if f.rule == "TQ401"]
    assert finding.evidence["rank"] == info["slow_rank"] == 2
    assert finding.evidence["steps"] == info["profiled_steps"]
    # The others wait about the injected delay per step (plus the slow rank's other noise).
    for wait_us in finding.evidence["wait_us_per_step"]:
        assert 0.8 * info["delay_ms"] * 1e3 <= wait_us <= 1.6 * info["delay_ms"] * 1e3
    where = finding.evidence["extra_time"]
    sleep = next(w for w in where if w["name"] == "slow_rank_sleep")
    assert sleep["extra_us"] == pytest.approx(info["delay_ms"] * 1e3, rel=0.1)
    assert "slow_rank_sleep" in finding.message and "rank 2" in finding.message
    # Evidence event ids are rank 2's own gloo collectives.
    with gzip.open(JOBS / "ddp_gloo_slow2" / "rank-2.pt.trace.json.gz") as f:
        doc = json.loads(f.read())
    names = {doc["traceEvents"][e]["name"] for e in finding.evidence["events"][2]}
    assert names == {"gloo:all_reduce"}
    assert finding.est_saving_us == pytest.approx(sum(finding.evidence["wait_us_per_step"]))


def test_fsdp_straggler_names_the_slowed_rank_and_its_sleep():
    """FSDP2 (`fully_shard` per Linear and the root) over gloo, rank 1 slowed by a 40 ms
    sleep in its forward: the others wait for it in FSDP's all-gathers; the sleep is its
    extra time, as long as the rank's own `slow_rank_sleep` ranges in the raw JSON."""
    info = manifest("fsdp_gloo_slow1")
    assert info["parallel"] == "fsdp"
    job = traceq.load_job(JOBS / "fsdp_gloo_slow1", engine="serial")
    (finding,) = traceq.analyze_job(job, select=["TQ401"]).findings
    assert finding.evidence["rank"] == info["slow_rank"] == 1
    steps = finding.evidence["steps"]
    assert len(steps) >= 3 and set(steps) <= set(info["profiled_steps"])
    for wait_us in finding.evidence["wait_us_per_step"]:
        assert wait_us >= 0.8 * info["delay_ms"] * 1e3
    with gzip.open(JOBS / "fsdp_gloo_slow1" / "rank-1.pt.trace.json.gz") as f:
        events = json.loads(f.read())["traceEvents"]
    windows = {
        int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")
    }
    slept = [
        e["dur"]
        for e in events
        if e.get("name") == "slow_rank_sleep"
        and any(windows[s][0] <= e["ts"] < windows[s][1] for s in steps)
    ]
    assert len(slept) == len(steps)
    sleep = next(w for w in finding.evidence["extra_time"] if w["name"] == "slow_rank_sleep")
    assert sleep["extra_us"] == pytest.approx(sum(slept) / len(steps), rel=1e-6)
    assert sleep["others_us"] == 0
    names = {events[e]["name"] for e in finding.evidence["events"][1]}
    assert names <= {"gloo:all_gather", "gloo:all_reduce"} and "gloo:all_gather" in names


def test_nothing_fires_on_the_fsdp_job_with_no_rank_slowed():
    assert manifest("fsdp_gloo_balanced")["slow_rank"] is None
    job = traceq.load_job(JOBS / "fsdp_gloo_balanced", engine="serial")
    assert traceq.analyze_job(job, select=["TQ4"]).findings == []
    assert job.frames.collectives["collective"].unique().sort().to_list() == [
        "allgather",
        "allreduce",  # FSDP's reduce-scatter runs as gloo's allreduce
    ]


def test_no_straggler_when_no_rank_is_slowed(balanced):
    assert manifest("ddp_gloo_balanced")["slow_rank"] is None
    assert [f for f in balanced.findings if f.rule == "TQ401"] == []


def test_slowed_rank_waits_least(slow):
    calls = slow.frames.collectives
    waits = calls.group_by("rank").agg(pl.col("wait_ns").sum()).sort("rank")["wait_ns"].to_list()
    assert waits[2] == min(waits) == 0
    assert set(calls["last_rank"]) == {2}


@needs_shared
def test_slow_collective_against_the_best_of_its_size_class():
    job = traceq.load_job(HTA / "nccl_parser_config", engine="serial")
    result = traceq.analyze_job(job, select=["TQ404"])
    calls = job.frames.collectives.with_columns(
        pl.col("bytes").log(2).floor().cast(pl.Int64).alias("cls")
    )
    for finding in result.findings:
        ev = finding.evidence
        cls = calls.filter(
            (pl.col("collective") == ev["collective"])
            & (pl.col("cls") == ev["size_class_bytes"].bit_length() - 1)
        )
        assert cls.height >= 3
        assert ev["best_busbw_gbs"] == pytest.approx(cls["busbw_gbs"].max())
        assert ev["busbw_gbs"] < 0.5 * ev["best_busbw_gbs"]
    assert result.findings, "nccl_parser_config has allreduces at a third of their best busbw"


@needs_shared
def test_exposed_comm_of_the_ddp_rank():
    job = traceq.load_job(HTA / "df_index_resolver", engine="serial")
    (finding,) = traceq.analyze_job(job, select=["TQ402"]).findings
    breakdown = job.frames.breakdown
    assert finding.evidence["rank"] == 1
    assert finding.evidence["exposed_us"] == pytest.approx(breakdown["exposed_comm_ns"].sum() / 1e3)


def test_per_rank_rules_run_in_the_map_and_say_their_rank(slow):
    per_rank = [f for f in slow.findings if not f.rule.startswith("TQ4")]
    assert per_rank, "the CPU MLP has single-trace findings (e.g. TQ102 Linear+GELU)"
    assert {f.evidence["rank"] for f in per_rank} == {0, 1, 2, 3}
    assert all(f.message.startswith(f"rank {f.evidence['rank']}: ") for f in per_rank)


def test_single_trace_analysis_skips_job_rules():
    trace = traceq.load(JOBS / "ddp_gloo_slow2" / "rank-0.pt.trace.json.gz")
    assert not [f for f in traceq.analyze(trace) if f.rule.startswith("TQ4")]


@pytest.mark.slow
def test_a_fresh_recording_names_its_slowed_rank(tmp_path):
    """Record a new job (rank 1 slowed by 60 ms) and find it: the recorder and the rule
    agree on today's PyTorch, not only on the bundled traces. One torch thread per rank, as
    the bundled jobs were recorded, so four ranks on two cores do not fight over threads."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys

    script = REPO / "fixtures" / "record_job.py"
    command = [sys.executable, str(script), "--out", str(tmp_path), "--slow-rank", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [*command, "--delay-ms", "60"], check=True, capture_output=True, timeout=600, env=env
    )
    result = traceq.analyze_job(traceq.load_job(tmp_path), select=["TQ401"])
    (finding,) = result.findings
    assert finding.evidence["rank"] == 1
    mean_wait = sum(finding.evidence["wait_us_per_step"]) / len(finding.evidence["steps"])
    assert 0.8 * 60e3 <= mean_wait <= 1.6 * 60e3


@needs_shared
def test_imbalanced_message_sizes_name_the_collective_and_its_seq(tmp_path):
    """Two ranks from HTA's nccl_parser_config rank; rank 1 sends twice the elements in
    its 4th collective: TQ403 reports that call, by size, with its sequence number."""
    with gzip.open(HTA / "nccl_parser_config" / "nccl_data.json.gz") as f:
        doc = json.loads(f.read())
    kernels = sorted(
        (e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "ncclKernel" in e["name"]),
        key=lambda e: e["ts"],
    )
    target = kernels[3]
    for rank in (0, 1):
        doc["distributedInfo"]["rank"] = rank
        if rank == 1:
            target["args"]["In msg nelems"] *= 2
            target["args"]["Out msg nelems"] *= 2
        with gzip.open(tmp_path / f"rank-{rank}.json.gz", "wt") as f:
            json.dump(doc, f)
    job = traceq.load_job(tmp_path, engine="serial")
    findings = traceq.analyze_job(job, select=["TQ403"]).findings
    by_size = [f for f in findings if f.evidence["imbalanced_by_size"]]
    (finding,) = by_size
    calls = job.frames.collectives
    expected = calls.filter(pl.col("bytes") != pl.col("bytes").min().over("instance"))
    assert expected.height == 1 and expected["rank"].to_list() == [1]
    assert finding.evidence["collective"] == target["args"]["Collective name"]
    assert expected["seq"][0] in finding.evidence["seq"]


def test_balanced_cpu_job_has_no_imbalanced_collective(balanced):
    """No rank is slowed: the ranks' time after arrival in gloo's allreduce varies by
    milliseconds from call to call on a loaded host (the slowest rank changes, its excess
    is within its own spread), and a host-measured collective's time is the scheduler's:
    TQ403 says nothing (before: "3 allreduce calls ... rank 0 is slowest most often")."""
    assert [f for f in balanced.findings if f.rule == "TQ403"] == []


def test_slowed_job_still_names_its_straggler_and_no_imbalance(slow):
    assert [f.evidence["rank"] for f in slow.findings if f.rule == "TQ401"] == [2]
    assert [f for f in slow.findings if f.rule == "TQ403"] == []


def _nccl_pair(tmp_path: Path, slower: float | None) -> Path:
    """Two ranks from HTA's nccl_parser_config rank (3 steps, 15 allreduces); with
    `slower`, rank 1 takes that many times as long in every allreduce (same start)."""
    with gzip.open(HTA / "nccl_parser_config" / "nccl_data.json.gz") as f:
        doc = json.loads(f.read())
    for rank in (0, 1):
        doc["distributedInfo"]["rank"] = rank
        if rank == 1 and slower is not None:
            for e in doc["traceEvents"]:
                if e.get("cat") == "kernel" and "ncclKernel_AllReduce" in e["name"]:
                    e["dur"] *= slower
        with gzip.open(tmp_path / f"rank-{rank}.json.gz", "wt") as f:
            json.dump(doc, f)
    return tmp_path


@needs_shared
def test_a_persistently_slower_rank_is_a_time_imbalance(tmp_path):
    """Rank 1 takes 4× as long in every allreduce of 3 steps (a slow link): slowest in all
    of them, 1.6× the two ranks' median, its excess steady from call to call: reported, by
    time, with the saving (Σ 4d − 2.5d over the raw kernel durations d) recomputed."""
    with gzip.open(HTA / "nccl_parser_config" / "nccl_data.json.gz") as f:
        doc = json.loads(f.read())
    durations = [
        e["dur"]
        for e in doc["traceEvents"]
        if e.get("cat") == "kernel" and "ncclKernel_AllReduce" in e["name"]
    ]
    job = traceq.load_job(_nccl_pair(tmp_path, 4.0), engine="serial", align="none")
    findings = traceq.analyze_job(job, select=["TQ403"]).findings
    (finding,) = findings
    assert not finding.evidence["imbalanced_by_size"]
    assert finding.evidence["collective"] == "allreduce"
    assert finding.evidence["ranks"] == [1] and len(set(finding.evidence["steps"])) == 3
    assert "slowest in 100% of the calls over 3 steps" in finding.message
    assert len(durations) == 15
    assert finding.est_saving_us == pytest.approx(sum(1.5 * d for d in durations), rel=1e-4)


@needs_shared
def test_identical_ranks_have_no_time_imbalance(tmp_path):
    job = traceq.load_job(_nccl_pair(tmp_path, None), engine="serial", align="none")
    assert traceq.analyze_job(job, select=["TQ403"]).findings == []


def test_text_report_of_a_job_says_it_is_a_job():
    """The header says what was read — a job, its ranks, how they were found, the events
    of all ranks (counted from the raw files) — not one trace's `kineto trace, ...`."""
    from click.testing import CliRunner
    from traceq.cli.main import main

    folder = JOBS / "ddp_gloo_slow2"
    events = 0
    for path in sorted(folder.glob("rank-*.json.gz")):
        with gzip.open(path) as f:
            events += len(json.loads(f.read())["traceEvents"])
    args = ["analyze", str(folder), "--select", "TQ401", "--engine", "serial"]
    header = CliRunner().invoke(main, args).output.splitlines()[1]
    assert header.startswith(
        f"job of 4 ranks (rank from distributedInfo), kineto traces, {events:,} events, "
        "0 GPU activities, 4 steps; device model: CPU"
    ), header
    files = [str(p) for p in sorted(folder.glob("rank-*.json.gz"))[:2]]
    args = ["analyze", *files, "--select", "TQ401", "--engine", "serial"]
    header = CliRunner().invoke(main, args).output.splitlines()[1]
    assert header.startswith("job of 2 of 4 ranks (rank from distributedInfo), kineto traces")
