"""`traceq.load_job`: ranks, world size and process groups from the files' heads; odd jobs
(missing, duplicate, rank-less, GPU-less ranks, mixed schemas, a corrupt rank) load and
say so; traces load lazily."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

import traceq
from traceq.job.ranks import HEAD_BYTES, HEAD_STEP, distributed_info, head, head_distributed_info

REPO = Path(__file__).resolve().parent.parent
SLOW_JOB = REPO / "fixtures" / "jobs" / "ddp_gloo_slow2"
SHARED = REPO.parent / "shared" / "traces"
HTA = SHARED / "hta" / "tests" / "data"
needs_shared = pytest.mark.skipif(not HTA.is_dir(), reason="../shared/traces is not here")


def test_recorded_job_ranks_world_and_process_groups():
    job = traceq.load_job(SLOW_JOB)
    assert job.ranks == [0, 1, 2, 3]
    assert set(job.rank_sources.values()) == {"distributedInfo"}
    assert job.world_size == 4
    assert job.missing_ranks == []
    groups = job.process_groups
    assert groups["pg"].to_list() == ["0"]
    assert groups["ranks"].to_list() == [[0, 1, 2, 3]]
    assert groups["backend"].to_list() == ["cpu:gloo,cuda:gloo"]


def test_listing_reads_heads_and_loads_no_trace():
    job = traceq.load_job(SLOW_JOB)
    _ = job.ranks, job.world_size, job.process_groups
    assert job._traces == {}
    trace = job.trace(2)
    assert trace.rank == 2 and job._traces.keys() == {2}


def test_head_distributed_info_is_the_full_decode():
    path = SLOW_JOB / "rank-1.pt.trace.json.gz"
    with gzip.open(path) as f:
        full = json.loads(f.read())["distributedInfo"]
    assert distributed_info(head(path)) == full


@pytest.mark.parametrize("padding", [0, HEAD_STEP * 3, HEAD_BYTES])
def test_distributed_info_is_read_as_far_as_it_reaches(tmp_path, padding):
    """Found early, it stops early; found past the first steps, it still is found; past
    the head's limit, it is not (as a whole-head read would say)."""
    info = {"rank": 3, "world_size": 8, "backend": "nccl"}
    doc = {"schemaVersion": 1, "pad": "x" * padding, "distributedInfo": info, "traceEvents": []}
    path = tmp_path / "rank.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    expected = info if padding < HEAD_BYTES else {}
    assert head_distributed_info(str(path)) == distributed_info(head(str(path))) == expected
    assert len(head(str(path))) == min(HEAD_BYTES, len(json.dumps(doc)))


@needs_shared
def test_distributed_info_of_shared_ranks_is_the_whole_head_reading():
    for path in sorted(HTA.glob("*/*.json.gz")):
        assert head_distributed_info(str(path)) == distributed_info(head(str(path))), path


def test_glob_and_list_sources_give_the_same_ranks():
    by_glob = traceq.load_job(str(SLOW_JOB / "rank-[13].pt.trace.json.gz"))
    by_list = traceq.load_job(
        [SLOW_JOB / "rank-3.pt.trace.json.gz", SLOW_JOB / "rank-1.pt.trace.json.gz"]
    )
    assert by_glob.ranks == by_list.ranks == [1, 3]
    assert "2 of 4 ranks have no trace: 0, 2" in by_glob.notes()


def test_empty_directory_is_one_clear_error(tmp_path):
    with pytest.raises(traceq.TraceFileError, match=r"holds no \.json"):
        traceq.load_job(tmp_path)


def test_duplicate_rank_is_noted_and_the_first_kept(tmp_path):
    for name in ("a.json.gz", "b.json.gz"):
        shutil.copy(SLOW_JOB / "rank-0.pt.trace.json.gz", tmp_path / name)
    job = traceq.load_job(tmp_path)
    assert job.ranks == [0]
    assert any("rank 0 appears 2 times (a.json.gz, b.json.gz)" in n for n in job.notes())


def test_corrupt_rank_is_reported_and_the_others_analyzed(tmp_path):
    for rank in (0, 1, 2):
        shutil.copy(SLOW_JOB / f"rank-{rank}.pt.trace.json.gz", tmp_path)
    data = (SLOW_JOB / "rank-3.pt.trace.json.gz").read_bytes()
    (tmp_path / "rank-3.pt.trace.json.gz").write_bytes(data[: len(data) // 2])
    job = traceq.load_job(tmp_path, engine="serial")
    assert job.ranks == [0, 1, 2, 3]  # rank 3 from its file name: its head is readable
    frames = job.frames
    assert sorted(frames.ranks["rank"].to_list()) == [0, 1, 2]
    assert any(n.startswith("rank 3: ") and "truncated gzip" in n for n in job.notes())


@needs_shared
def test_rank_from_file_name_then_order(tmp_path):
    shutil.copy(HTA / "rank_unavailable" / "rank_not_found.json.gz", tmp_path / "worker7.json.gz")
    shutil.copy(
        HTA / "distributed_info_unavailable" / "distributed_info_not_found.json.gz",
        tmp_path / "x.json.gz",
    )
    job = traceq.load_job(tmp_path)
    assert job.rank_sources == {7: "file name", 0: "order"}
    assert any(
        "x.json.gz: no rank in distributedInfo or the file name; rank 0 by order" in n
        for n in job.notes()
    )


@needs_shared
def test_sampled_ranks_of_a_128_rank_job():
    job = traceq.load_job(HTA / "trace_filter")
    assert job.ranks == [0, 1] and job.world_size == 128
    assert len(job.missing_ranks) == 126
    assert "126 of 128 ranks have no trace: 2, 3, 4, 5, 6, 7, 8, 9 ..." in job.notes()


@needs_shared
def test_gpu_and_non_gpu_ranks_and_mixed_schemas_load(tmp_path):
    shutil.copy(HTA / "df_index_resolver" / "df_index_resolver.json.gz", tmp_path)  # rank 1, GPU
    shutil.copy(HTA / "rank_non_gpu" / "rank_non_gpu.json.gz", tmp_path)  # rank 0, no GPU
    samples = SHARED / "kineto_tb_plugin" / "tb_plugin" / "samples" / "resnet50_num_workers_0"
    old = sorted(samples.glob("*.json.gz"))[0]
    shutil.copy(old, tmp_path / "rank5.json.gz")  # the 2021 schema, rank from the name
    job = traceq.load_job(tmp_path, engine="serial")
    assert job.ranks == [0, 1, 5]
    frames = job.frames
    ranks = dict(
        zip(frames.ranks["rank"].to_list(), frames.ranks["has_gpu"].to_list(), strict=True)
    )
    assert ranks == {0: False, 1: True, 5: True}
    notes = job.notes()
    assert "no GPU activity in rank 0: measured on the host" in notes
    assert "mixed schemas across ranks: kineto, kineto-2021" in notes
