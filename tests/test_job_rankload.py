"""The job map's light load (`traceq.job.rankload`, `traceq.job.rankread`): what the lean
reader reads is what the loader reads, every column it builds is the one `traceq.load`
builds, a rank's summary is the same either way, a frame it skipped is built on demand,
a file the reader leaves to the loader is read by the loader, and `analyze_job` with only
job rules gives the findings of the full load."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import traceq
from traceq.job.rankload import RankFrames, RankTrace, load_for_map, load_rank
from traceq.job.rankread import Unread, read_frame, read_rank
from traceq.job.summary import summarize
from traceq.loader.load import read_events
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


def _shared(sub: str):
    return pytest.param(
        HTA / sub,
        marks=pytest.mark.skipif(not (HTA / sub).exists(), reason="../shared/traces is not here"),
        id=sub.split("/")[0],
    )


READER = RANKS + [
    _shared(sub)
    for sub in (
        "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",  # decimal times
        "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
        "rank_non_gpu/rank_non_gpu.json.gz",
    )
]


@pytest.mark.parametrize("path", READER)
def test_the_lean_reader_reads_what_the_loader_reads(path):
    if not Path(path).exists():
        pytest.skip("not here")
    lean, loaded = read_rank(path), read_events(path, None, lambda _: None)
    events = loaded.events
    assert lean.metadata == loaded.metadata
    assert_frame_equal(lean.phases, events.select("event", "ph", "cat"))
    assert_frame_equal(lean.read, read_frame(events))
    collective = events.join(lean.collective_args, on="event", how="semi")
    assert_frame_equal(lean.collective_args, collective.select("event", "args"))
    # every event is read or counted
    assert lean.read.height + lean.unread["events"].sum() == events.height
    unread_cats = lean.unread.filter(pl.col("ph") == "X")["cat"].cast(pl.String)
    assert (
        unread_cats.str.to_lowercase()
        .is_in(["cpu_op", "cuda_runtime", "kernel", "user_annotation"])
        .sum()
        == 0
    )


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
    assert isinstance(light, RankTrace)
    right = summarize(light, 1, "distributedInfo")
    device = run(light, Config(select=("TQ4",))).device  # no trace rule: the device model
    assert not light.frames.complete  # the summary and the device model read no other frame
    assert light.full.trace is None  # ... nor the raw events or another event's args
    assert right.events == left.events > right.events - right.unread["events"].sum() > 0
    assert left.unread.height == 0
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


def test_a_lean_rank_loads_the_file_for_anything_it_did_not_read():
    path = RANKS[0]
    full, light = traceq.load(path, cache=False), load_rank(path)
    assert isinstance(light, RankTrace)
    assert_frame_equal(light.select("events", "event", "cat"), full.events.select("event", "cat"))
    assert light.full.trace is None
    ops = light.ops.select("event")
    assert_frame_equal(light.with_args(ops), full.with_args(ops))  # ops' args: not read
    assert light.full.trace is not None
    assert_frame_equal(light.events, full.events)


def _trace(tmp_path, events, name="rank-0.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def _events(ts=5_000.0, external_id=7, name="aten::mm"):
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1}
    op = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1}
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1}
    kernel = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL"}
    return [
        {**step, "ts": ts, "dur": 100.0},
        {**op, "ts": ts + 1.5, "dur": 50.25, "args": {"External id": external_id}},
        {**launch, "ts": ts + 2.125, "dur": 3.0, "args": {"correlation": 9, "External id": 7}},
        {**kernel, "pid": 0, "tid": 7, "ts": ts + 9.0, "dur": 20.0, "args": {
            "correlation": 9, "device": 0, "Collective name": "allreduce", "dtype": "Float"}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 9, "pid": 1, "tid": 1, "ts": ts + 2.5},
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "events",
    [
        _events(),
        _events(ts=1_712_195_495_519_689.047),  # float64 rounds: times from the decimal text
        _events(external_id="7"),  # text: the loader's `as_int` reads it
        _events(external_id=2**64),  # beyond 64 bits: the loader reads null
    ],
    ids=["plain", "decimal-times", "text-id", "huge-id"],
)
def test_a_rank_reads_the_same_lean_or_by_the_loader(tmp_path, events):
    path = _trace(tmp_path, events)
    full, light = traceq.load(path, cache=False), load_rank(path)
    lean = isinstance(light, RankTrace)
    assert lean == (events[1]["args"]["External id"] == 7)  # else the loader read it
    for name in LIGHT:
        assert_frame_equal(light.frames[name], full.frames[name].select(light.frames[name].columns))
    left, right = summarize(full, 0, "order"), summarize(light, 0, "order")
    for name in SUMMARY:
        assert_frame_equal(getattr(left, name), getattr(right, name))
    assert right.collectives["collective"].to_list() == ["allreduce"]
    assert right.unread["events"].sum() == (2 if lean else 0)


@pytest.mark.parametrize(
    ("event", "args"),
    [
        (2, ["correlation", 9]),  # a runtime call's `args` as a list
        (4, "a flow's args as text"),  # an event the map does not read: the loader rejects
        (5, {"name": "python", "External id": "7"}),  # the loader's `as_int` reads it
    ],
    ids=["read-list", "unread-text", "unread-text-id"],
)
def test_an_args_of_another_type_on_any_event_goes_to_the_loader(tmp_path, event, args):
    """Every event's `args` is decoded, in one batch from its raw text, as the whole
    events were: a file whose `args` the loader would reject or read its own way is the
    loader's, whichever event holds it."""
    events = _events()
    events[event]["args"] = args
    with pytest.raises(Unread, match="not an object, or a key of another type"):
        read_rank(_trace(tmp_path, events))


def test_a_rank_the_loader_rejects_is_its_error_naming_the_file(tmp_path):
    path = _trace(tmp_path, _events(name="aten::\u0007mm"))
    with pytest.raises(Unread):
        read_rank(path)
    with pytest.raises(traceq.TraceError, match=r"rank-0\.json.*control character in 'name'"):
        load_rank(path)


def test_mapping_lean_ranks_holds_no_rank_after_its_map():
    """A lean rank is freed when its map returns, without waiting for the garbage
    collector: its frames are not held in a reference cycle (they were: +3.5 MB a rank)."""
    import gc
    import weakref

    gc.disable()
    try:
        trace = load_rank(RANKS[0])
        summarize(trace, 0, "distributedInfo")
        gone = weakref.ref(trace)
        del trace
        assert gone() is None
    finally:
        gc.enable()
