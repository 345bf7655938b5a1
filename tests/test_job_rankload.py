"""The job map's light load (`traceq.job.rankload`): every column it builds is the one
`traceq.load` builds, a rank's summary is the same either way, a frame it skipped is built
on demand, and `analyze_job` with only job rules gives the findings of the full load."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import traceq
from traceq.job.rankload import RankFrames, load_for_map, load_rank
from traceq.job.summary import summarize
from traceq.rules.config import Config
from traceq.rules.engine import run

REPO = Path(__file__).resolve().parent.parent
JOBS = REPO / "fixtures" / "jobs"
HTA = REPO.parent / "shared" / "traces" / "hta" / "tests" / "data"
LIGHT = ("ops", "runtime", "kernels", "annotations", "steps")
SUMMARY = ("step_ns", "breakdown", "kernel_types", "collectives", "ranges")

RANKS = [JOBS / "ddp_gloo_slow2" / "rank-2.pt.trace.json.gz"] + [
    pytest.param(
        HTA / sub,
        marks=pytest.mark.skipif(not (HTA / sub).exists(), reason="../shared/traces is not here"),
        id=sub.split("/")[0],
    )
    for sub in (
        "nccl_parser_config/nccl_data.json.gz",  # A100 DDP, collective args on the kernels
        "df_index_resolver/df_index_resolver.json.gz",  # 2,020 NCCL kernels, op args only
        "trace_filter/sampled_rank-1.json.gz",
    )
]


@pytest.mark.parametrize("path", RANKS)
def test_light_frames_are_columns_of_the_full_frames(path):
    full, light = traceq.load(path, cache=False), load_rank(path)
    assert isinstance(light.frames, RankFrames) and not light.frames.complete
    for name in LIGHT:
        columns = light.frames[name].columns
        assert set(columns) <= set(full.frames[name].columns), name
        assert_frame_equal(light.frames[name], full.frames[name].select(columns))
    assert light.frames["ops"].height + light.frames["kernels"].height > 0
    assert not light.frames.complete  # nothing above asked for a skipped frame


@pytest.mark.parametrize("path", RANKS)
def test_a_rank_summary_is_the_same_from_the_light_load(path):
    left = summarize(traceq.load(path, cache=False), 1, "distributedInfo")
    light = load_rank(path)
    right = summarize(light, 1, "distributedInfo")
    device = run(light, Config(select=("TQ4",))).device  # no trace rule: the device model
    assert not light.frames.complete  # the summary and the device model read no other frame
    assert device == run(traceq.load(path, cache=False), Config(select=("TQ4",))).device
    for name in SUMMARY:
        assert_frame_equal(getattr(left, name), getattr(right, name))
    assert (left.events, left.steps, left.has_gpu, left.schema) == (
        right.events,
        right.steps,
        right.has_gpu,
        right.schema,
    )


def test_a_skipped_frame_is_built_on_demand_as_the_full_load_builds_it():
    path = RANKS[0]
    full, light = traceq.load(path, cache=False), load_rank(path)
    assert_frame_equal(light.flows, full.flows)
    assert light.frames.complete
    for name in full.frames:  # from then on every frame is the full one
        assert_frame_equal(light.frames[name], full.frames[name])


@pytest.mark.parametrize(
    "look",
    [list, len, lambda f: "python" in f, lambda f: f.get("syncs"), lambda f: dict(f.items())],
    ids=["iter", "len", "in", "get", "items"],
)
def test_any_look_at_the_whole_mapping_links_the_whole_trace(look):
    full, light = traceq.load(RANKS[0], cache=False), load_rank(RANKS[0])
    assert not light.frames.complete
    look(light.frames)
    assert light.frames.complete
    assert sorted(light.frames) == sorted(full.frames)
    assert_frame_equal(
        light.sql("select count(*) as n from flows"), full.sql("select count(*) as n from flows")
    )


def test_bad_rank_is_one_error_naming_the_file(tmp_path):
    bad = tmp_path / "rank-0.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1}')
    with pytest.raises(traceq.TraceError, match=r"rank-0\.json"):
        load_rank(bad)


def test_the_light_load_serves_only_a_cold_map_without_trace_rules(monkeypatch, tmp_path):
    path = str(RANKS[0])
    monkeypatch.setenv("TRACEQ_CACHE", "0")
    assert isinstance(load_for_map(path, rules=False).frames, RankFrames)
    assert not isinstance(load_for_map(path, rules=True).frames, RankFrames)
    monkeypatch.setenv("TRACEQ_CACHE", "1")  # cached loads are faster still: kept
    monkeypatch.setenv("TRACEQ_CACHE_DIR", str(tmp_path))
    assert not isinstance(load_for_map(path, rules=False).frames, RankFrames)


def test_job_rules_find_the_same_with_the_light_load(monkeypatch):
    monkeypatch.setenv("TRACEQ_CACHE", "0")
    job = traceq.load_job(JOBS / "ddp_gloo_slow2", engine="serial")
    light = traceq.analyze_job(job, select=["TQ4"])
    monkeypatch.setattr("traceq.job.rankload.load_rank", lambda p: traceq.load(p, cache=False))
    job = traceq.load_job(JOBS / "ddp_gloo_slow2", engine="serial")
    full = traceq.analyze_job(job, select=["TQ4"])
    assert [f.to_dict() for f in light.findings] == [f.to_dict() for f in full.findings]
    assert light.devices == full.devices
    assert any(f.rule == "TQ401" for f in light.findings)
    assert_frame_equal(light.frames.collectives, full.frames.collectives)
    assert pl.DataFrame(light.frames.breakdown).height > 0
