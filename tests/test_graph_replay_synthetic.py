"""Each matching mode of `relations.graph_replay`, on replay/capture pairs derived from the
bundled SGLang decode pair (`fixtures/serving/sglang_decode/`) by one documented edit:

- drop a kernel from the replay (a dropped GPU activity): the rest pair by name scan;
- rename one replayed kernel: it pairs by position between its neighbours;
- move 40 kernels onto a second stream, 15 µs later (they now interleave with the first
  stream's): each stream pairs by name scan;
- split the capture into three PIECEWISE graphs and the replay into three launches;
- give kernels and captured launches a `graph node id` and swap two replayed kernels;
- remove the graph launch call: its kernels have no launch, and `info` says why.

The capture keeps only its `nn.Module` Python frames (the rest of `with_stack` is 54k
events no attribution reads). Expected ops come from the raw capture JSON, as in
`test_graph_replay.py`.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

import traceq
from traceq.relations.graph_replay import (
    CaptureFile,
    align,
    kernels_without_launch,
    needed_files,
)

BASE = Path(__file__).resolve().parent.parent / "fixtures" / "serving" / "sglang_decode"


def _read(path: Path) -> dict:
    with gzip.open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def originals():
    replay = _read(BASE / "sglang_Qwen3-8B_decode.json.gz")
    capture = _read(BASE / "capture_traces" / "bs_32_rank0.json.gz")
    capture["traceEvents"] = [
        e
        for e in capture["traceEvents"]
        if e.get("cat") != "python_function" or e["name"].startswith("nn.Module: ")
    ]
    return replay, capture


def _graph_launch(doc: dict) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("name") == "hipGraphLaunch")


def _replayed(doc: dict) -> list[dict]:
    corr = _graph_launch(doc)["args"]["correlation"]
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    return sorted((e for e in kernels if e["args"]["correlation"] == corr), key=lambda e: e["ts"])


def _captured(doc: dict) -> list[dict]:
    events = doc["traceEvents"]
    begin = next(e for e in events if e.get("name") == "hipStreamBeginCapture")["ts"]
    end = next(e for e in events if e.get("name") == "hipStreamEndCapture")["ts"]
    launches = [
        e
        for e in events
        if e.get("cat") == "cuda_runtime" and "Launch" in e["name"] and begin <= e["ts"] <= end
    ]
    return sorted(launches, key=lambda e: e["ts"])


def _op_of(doc: dict, launch: dict) -> str | None:
    around = [
        e
        for e in doc["traceEvents"]
        if e.get("cat") == "cpu_op"
        and e["tid"] == launch["tid"]
        and e["ts"] <= launch["ts"] < e["ts"] + e["dur"]
    ]
    return min(around, key=lambda e: e["dur"])["name"] if around else None


def _write(tmp_path: Path, replay: dict, captures: list[tuple[dict, int, str]]):
    folder = tmp_path / "capture_traces"
    folder.mkdir()
    details = []
    for n, (doc, size, mode) in enumerate(captures):
        name = f"capture_{n}.json.gz"
        with gzip.open(folder / name, "wt") as f:
            json.dump(doc, f)
        details.append({"file": name, "batch_size": size, "mode": mode})
    (folder / "execution_details.json").write_text(json.dumps(details))
    path = tmp_path / "replay.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(replay, f)
    return traceq.load(path)


def _rows(trace):
    kernels = trace.kernels
    return kernels.filter(kernels["replay_method"].is_not_null()).sort("ts_ns")


def test_a_dropped_kernel_leaves_the_others_paired_by_name_scan(tmp_path, originals):
    replay, capture = copy.deepcopy(originals[0]), originals[1]
    dropped = _replayed(replay)[200]
    replay["traceEvents"].remove(dropped)
    rows = _rows(_write(tmp_path, replay, [(capture, 32, "FULL")]))
    expected = [_op_of(capture, c) for n, c in enumerate(_captured(capture)) if n != 200]
    assert rows["op_name"].to_list() == expected
    assert set(rows["replay_method"]) == {"capture-name-scan"}


def test_a_renamed_kernel_pairs_by_position_between_its_neighbours(tmp_path, originals):
    replay, capture = copy.deepcopy(originals[0]), originals[1]
    _replayed(replay)[200]["name"] = "renamed_kernel"
    rows = _rows(_write(tmp_path, replay, [(capture, 32, "FULL")]))
    expected = [_op_of(capture, c) for c in _captured(capture)]
    assert rows["op_name"].to_list() == expected
    renamed = rows.filter(rows["name"] == "renamed_kernel").row(0, named=True)
    assert renamed["replay_method"] == "capture-order"
    assert renamed["replay_confidence"] == pytest.approx(0.6)
    assert set(rows.filter(rows["name"] != "renamed_kernel")["replay_method"]) == {
        "capture-name-scan"
    }


def test_a_second_stream_pairs_each_stream_by_name_scan(tmp_path, originals):
    replay, capture = copy.deepcopy(originals[0]), originals[1]
    kernels = _replayed(replay)
    for kernel in kernels[100:140]:
        kernel["args"]["stream"] = 7
        kernel["ts"] += 15.0
    rows = _write(tmp_path, replay, [(capture, 32, "FULL")]).kernels
    rows = rows.filter(rows["replay_method"].is_not_null())
    by_event = dict(zip(rows["event"].to_list(), rows["op_name"].to_list(), strict=True))
    index = {id(e): n for n, e in enumerate(replay["traceEvents"])}
    captured = _captured(capture)
    for n, kernel in enumerate(kernels):
        assert by_event[index[id(kernel)]] == _op_of(capture, captured[n]), n
    assert set(rows["stream"]) == {3, 7}
    assert set(rows["replay_method"]) == {"capture-name-scan"}


def test_piecewise_graphs_pair_each_launch_with_its_piece(tmp_path, originals):
    replay, capture = copy.deepcopy(originals[0]), copy.deepcopy(originals[1])
    cuts = [180, 360]
    launches = _captured(capture)
    begin = next(e for e in capture["traceEvents"] if e.get("name") == "hipStreamBeginCapture")
    end = next(e for e in capture["traceEvents"] if e.get("name") == "hipStreamEndCapture")
    for cut in cuts:  # end a piece after launch cut-1, begin the next before launch cut
        stop = launches[cut - 1]["ts"] + launches[cut - 1]["dur"]
        capture["traceEvents"].append({**end, "ts": stop + 0.01, "dur": 0.01})
        capture["traceEvents"].append({**begin, "ts": stop + 0.03, "dur": 0.01})
    graph = _graph_launch(replay)
    kernels = _replayed(replay)
    for piece, (low, high) in enumerate([(0, 180), (180, 360), (360, len(kernels))]):
        correlation = 900_000 + piece
        replay["traceEvents"].append(
            {**graph, "ts": graph["ts"] + piece, "dur": 0.5, "args": {"correlation": correlation}}
        )
        for kernel in kernels[low:high]:
            kernel["args"]["correlation"] = correlation
    replay["traceEvents"].remove(graph)
    trace = _write(tmp_path, replay, [(capture, 32, "PIECEWISE")])
    rows = _rows(trace)
    assert rows["op_name"].to_list() == [_op_of(capture, c) for c in launches]
    assert set(rows["replay_method"]) == {"capture-order"}
    from traceq.reports.summary import summary

    graphs = summary(trace)["graphs"]
    assert graphs["graph_launches"] == 3
    assert graphs["captures"] == [
        {"source": "capture_0.json.gz", "batch_size": 32, "mode": "PIECEWISE"}
    ]


def test_graph_node_ids_pair_kernels_whatever_their_order(tmp_path, originals):
    replay, capture = copy.deepcopy(originals[0]), copy.deepcopy(originals[1])
    launches = _captured(capture)
    kernels = _replayed(replay)
    for n, (launch, kernel) in enumerate(zip(launches, kernels, strict=True)):
        launch["args"]["graph node id"] = 5000 + 3 * n
        kernel["args"]["graph node id"] = 5000 + 3 * n
    kernels[10]["ts"], kernels[11]["ts"] = kernels[11]["ts"], kernels[10]["ts"]
    rows = _write(tmp_path, replay, [(capture, 32, "FULL")]).kernels
    rows = rows.filter(rows["replay_method"].is_not_null())
    assert set(rows["replay_method"]) == {"graph-node-id"}
    index = {id(e): n for n, e in enumerate(replay["traceEvents"])}
    by_event = dict(zip(rows["event"].to_list(), rows["op_name"].to_list(), strict=True))
    for launch, kernel in zip(launches, kernels, strict=True):
        assert by_event[index[id(kernel)]] == _op_of(capture, launch)


def test_kernels_of_a_missing_graph_launch_are_counted_with_a_reason(tmp_path, originals):
    replay = copy.deepcopy(originals[0])
    graph = _graph_launch(replay)
    replay["traceEvents"].remove(graph)
    path = tmp_path / "replay.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(replay, f)
    orphans = kernels_without_launch(traceq.load(path))
    kernels = _replayed({"traceEvents": [graph, *originals[0]["traceEvents"]]})
    assert orphans["kernels"] == len(kernels)
    assert orphans["us"] == pytest.approx(sum(k["dur"] for k in kernels), abs=0.01)
    assert list(orphans["reasons"]) == ["launch missing (dropped CPU buffer or flows)"]


def test_the_capture_is_picked_by_the_smallest_batch_size_at_least_the_steps():
    files = [CaptureFile(Path(f"bs{n}"), n, "FULL") for n in (8, 16, 32, 64)]
    assert [f.batch_size for f in needed_files(files, [20])] == [32]
    assert [f.batch_size for f in needed_files(files, [16, 33])] == [16, 64]
    assert [f.batch_size for f in needed_files(files, [])] == [8, 16, 32, 64]


def test_unnamed_captured_launches_pair_by_order_when_counts_agree():
    """CUDA's launch calls do not name their kernel: order and count decide."""
    replayed = ((0, "a", None), (0, "b", None), (0, "Memcpy", None))
    assert align(replayed, ((None, None), (None, None), ("Memcpy", None))) == (
        (0, "capture-order-unnamed"),
        (1, "capture-order-unnamed"),
        (2, "capture-order-unnamed"),
    )
    assert align(replayed[:2], (("x", None),))[0] == (-1, "launch")
