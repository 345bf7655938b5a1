"""A graph replay's ops are ops of the replay: copied from the capture trace into
`trace.ops` (`relations.replayed_ops`), so data flow, the roofline, the rules and the
critical path see them, on the two bundled serving traces (`fixtures/serving/`: vLLM FULL
graphs and SGLang decode, both MI300X).

Expected ops are recomputed from the raw capture JSON with the stdlib: every `cpu_op` on
the capturing thread that starts between `hipStreamBeginCapture` and
`hipStreamEndCapture`, with its `Input Dims`."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

import traceq
from traceq.relations.graph_replay import Capture
from traceq.relations.replayed_ops import captured_ops

SERVING = Path(__file__).resolve().parent.parent / "fixtures" / "serving"
CASES = {
    "vllm_decode_full": "graph_execution.json.gz",
    "sglang_decode": "sglang_Qwen3-8B_decode.json.gz",
}


def raw_captured_ops(path: Path) -> list[tuple[str, str]]:
    """(name, Input Dims as JSON) of each op the capture ran, in time order."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    begin = next(e for e in events if e.get("name", "").endswith("StreamBeginCapture"))
    end = next(e for e in events if e.get("name", "").endswith("StreamEndCapture"))
    ops = [
        e
        for e in events
        if e.get("cat") == "cpu_op"
        and e["tid"] == begin["tid"]
        and begin["ts"] <= e["ts"] < end["ts"] + end["dur"]
    ]
    ops.sort(key=lambda e: (e["ts"], -e["dur"]))
    return [(e["name"], json.dumps(e["args"].get("Input Dims"))) for e in ops]


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    folder = SERVING / request.param
    trace = traceq.load(folder / CASES[request.param])
    capture = next((folder / "capture_traces").glob("*.json.gz"))
    return request.param, trace, capture


def replayed(trace) -> pl.DataFrame:
    return trace.ops.filter(pl.col("replayed")).sort("event")


def test_replayed_ops_are_the_captures_ops_with_their_shapes(case):
    _, trace, capture = case
    ops = replayed(trace)
    expected = raw_captured_ops(capture)
    got = [
        (name, json.dumps(json.loads(dims)) if dims is not None else "null")
        for name, dims in ops.select("name", "input_dims").iter_rows()
    ]
    assert ops.height == len(expected)
    assert Counter(got) == Counter(expected)
    assert [name for name, _ in got] == [name for name, _ in expected]


def test_replayed_ops_have_new_ids_and_no_cpu_time(case):
    _, trace, _ = case
    ops = replayed(trace)
    recorded_max = trace.select("events", "event")["event"].max()
    assert ops["event"].min() == recorded_max + 1
    assert ops["event"].n_unique() == ops.height
    assert (ops["dur_ns"] == 0).all()
    launch = trace.runtime.filter(pl.col("name").str.contains("GraphLaunch")).row(0, named=True)
    assert ops["ts_ns"].is_between(launch["ts_ns"], launch["end_ns"]).all()
    assert ops["ts_ns"].is_sorted()
    assert set(ops["tid"]) == {launch["tid"]}
    parents = ops.filter(pl.col("parent").is_not_null())  # copied nesting: within the copy
    assert parents["parent"].is_in(ops["event"].cast(pl.Int64).implode()).all()
    assert (parents["parent"] < parents["event"].cast(pl.Int64)).all()


def test_replayed_kernels_point_at_their_replayed_op(case):
    _, trace, _ = case
    kernels = trace.kernels.filter(pl.col("replay_method").is_not_null())
    ops = trace.ops.select(pl.col("event").cast(pl.Int64).alias("op_event"), "name", "replayed")
    joined = kernels.join(ops, on="op_event", how="left")
    assert joined["replayed"].all()
    assert (joined["name_right"] == joined["op_name"]).all()


def test_data_flow_among_replayed_ops_is_the_captures_own(case):
    """Edges between the copies, mapped back to the capture's events, against the data
    flow of the capture trace itself: the same on vLLM; most of it on SGLang, whose 508
    module calls scope the capture's matching (not copied: see `relations.replayed_ops`)."""
    name, trace, capture = case
    template = captured_ops([Capture(traceq.load(capture, capture=False), capture.name)])
    ops = replayed(trace)
    to_capture = pl.DataFrame(
        {"event": ops["event"].cast(pl.Int64), "captured": template["capture_event"]}
    )
    edges = trace.dataflow.join(
        to_capture.rename({"event": "producer", "captured": "p"}), on="producer"
    ).join(to_capture.rename({"event": "consumer", "captured": "c"}), on="consumer")
    mine = set(zip(edges["p"], edges["c"], strict=True))
    own = traceq.load(capture, capture=False).dataflow
    inside = template["capture_event"].implode()
    own = own.filter(pl.col("producer").is_in(inside) & pl.col("consumer").is_in(inside))
    theirs = set(zip(own["producer"], own["consumer"], strict=True))
    assert len(mine) > 100
    share = len(mine & theirs) / len(theirs)
    assert share == 1.0 if name == "vllm_decode_full" else share > 0.8


def test_roofline_has_rows_for_replayed_ops(case):
    _, trace, _ = case
    ops = replayed(trace)["event"].cast(pl.Int64)
    rows = trace.roofline.filter(pl.col("event").is_in(ops.implode()))
    replayed_ns = trace.kernels.filter(pl.col("replay_method").is_not_null())["dur_ns"].sum()
    assert rows.height > 200
    assert rows["time_us"].sum() * 1000 >= 0.99 * replayed_ns
    assert rows["modelled"].any()  # Inductor's kernels (vLLM), the embedding (SGLang)


def test_fusion_rules_see_replayed_ops_with_their_gpu_time(case):
    from traceq.rules.base import Context
    from traceq.rules.catalogue import RULES
    from traceq.rules.op_groups import fusion_ops

    _, trace, _ = case
    analysis = traceq.analyze(trace)
    rule = next(r for r in RULES if r.code == "TQ105")
    ops = fusion_ops(Context(trace, rule, dict(rule.defaults), analysis.device))
    ids = replayed(trace)["event"].cast(pl.Int64).implode()
    inside = ops.filter(pl.col("event").is_in(ids))
    replayed_ns = trace.kernels.filter(pl.col("replay_method").is_not_null())["dur_ns"].sum()
    assert inside["time_ns"].sum() >= 0.99 * replayed_ns


def test_critical_path_includes_the_replayed_kernels(case):
    _, trace, _ = case
    path = trace.critical_path()
    kernels = set(trace.kernels.filter(pl.col("replay_method").is_not_null())["event"].to_list())
    assert kernels <= set(path.critical_events)
    ops = set(replayed(trace)["event"].to_list())
    assert not ops & set(path.events["event"].to_list())  # they took no CPU time


def test_analyze_and_critical_path_print_the_graph_share(case):
    from traceq.cli.main import main

    name, trace, _ = case
    path = str(SERVING / name / CASES[name])
    runner = CliRunner()
    for command in (["analyze", path], ["critical-path", path]):
        result = runner.invoke(main, command)
        assert result.exit_code == 0, result.output
        assert result.output.count("graph replays: 1 launch replayed") == 1
        assert "ops attributed to 100.0% of it" in result.output
    result = runner.invoke(main, ["analyze", path, "--format", "json"])
    graphs = json.loads(result.output)["summary"]["trace"]["graphs"]
    assert graphs["replayed_ops"] == replayed(trace).height
    result = runner.invoke(main, ["critical-path", path, "--format", "json"])
    assert json.loads(result.output)["graphs"]["attributed_share"] >= 0.99


def test_idle_graph_replay_is_reported_on_sglang_only(case):
    name, trace, _ = case
    found = [f for f in traceq.analyze(trace, select=["TQ210"])]
    if name == "vllm_decode_full":  # the GPU is busy 100% of the step
        assert found == []
        return
    (finding,) = found
    assert finding.evidence["gpu_idle_share"] == pytest.approx(0.979, abs=0.001)
    assert finding.evidence["replay_busy_share"] > 0.9
    assert finding.evidence["longest_cpu"]["name"] == "aten::copy_"
    assert "idle 97.9%" in finding.message
    assert finding.est_saving_us == pytest.approx(finding.evidence["gpu_busy_us"])
    assert "overlap" in finding.fix


def test_without_capture_no_op_is_copied():
    trace = traceq.load(SERVING / "sglang_decode" / CASES["sglang_decode"], capture=False)
    assert "replayed" not in trace.ops.columns
