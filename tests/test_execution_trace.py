"""Exact data flow from an Execution Trace companion (`traceq.relations.dataflow.execution_trace`).

Real pairs (skipped when ../shared/traces is absent):
- param/et_replay/tests/inputs/linear_et.json.gz + linear_kineto.json.gz:
  facebookresearch/param, MIT (ET schema 1.0.1, no `Record function id` in Kineto).
- hta/tests/data/execution_trace/benchmark_simple_add_et.json.gz + _trace.json.gz:
  facebookresearch/HolisticTraceAnalysis, MIT.
The recorded pair is made here with torch (CPU): ET schema 1.1.x-chakra.
Pair counts are checked against a stdlib count from the raw JSON.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl
import pytest
from conftest import SHARED_TRACES

import traceq
from traceq.relations.dataflow import dataflow, dataflow_ops
from traceq.relations.dataflow.execution_trace import (
    ET_SCHEMA,
    ExecutionTraceError,
    load_execution_trace,
    match_ops,
    tensor_edges,
)

LINEAR = ("param/et_replay/tests/inputs/linear_et.json.gz", "linear_kineto.json.gz")
SIMPLE_ADD = (
    "hta/tests/data/execution_trace/benchmark_simple_add_et.json.gz",
    "benchmark_simple_add_trace.json.gz",
)


def _pair(pair: tuple[str, str]) -> tuple[Path, Path]:
    et = SHARED_TRACES / pair[0]
    kineto = et.parent / pair[1]
    if not (et.is_file() and kineto.is_file()):
        pytest.skip(f"{pair[0]} not present")
    return et, kineto


def _raw(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _stdlib_pairs(et_path: Path, kineto_path: Path) -> int:
    """ET nodes paired with a Kineto cpu_op: per ET thread, the rf_id offset that makes the
    most names agree over all its nodes, then (rf_id + offset, name, thread) must exist."""
    kineto = [e for e in _raw(kineto_path)["traceEvents"] if e.get("cat") == "cpu_op"]
    has_rf = any("Record function id" in e.get("args", {}) for e in kineto)
    key = "Record function id" if has_rf else "External id"
    by_name = defaultdict(list)
    ops = set()
    for e in kineto:
        k = e["args"][key]
        by_name[e["name"]].append((k, e["tid"]))
        ops.add((k, e["name"], e["tid"]))
    threads = defaultdict(list)
    for node in _raw(et_path)["nodes"]:
        attrs = {a["name"]: a["value"] for a in node.get("attrs", [])}
        rf, tid = attrs.get("rf_id", node.get("rf_id")), attrs.get("tid", node.get("tid"))
        threads[tid].append((rf, node["name"]))
    paired = 0
    for nodes in threads.values():
        votes = Counter((k - rf, ktid) for rf, name in nodes for k, ktid in by_name.get(name, ()))
        if not votes:
            continue
        (offset, ktid), _ = votes.most_common(1)[0]
        paired += sum((rf + offset, name, ktid) in ops for rf, name in nodes)
    return paired


# -- loading ------------------------------------------------------------------------------


def test_old_schema_nodes_carry_tensor_ids() -> None:
    et_path, _ = _pair(SIMPLE_ADD)
    et = load_execution_trace(et_path)
    raw = _raw(et_path)["nodes"]
    assert et.height == len(raw)
    add = et.filter(pl.col("name") == "aten::add").row(0, named=True)
    raw_add = next(n for n in raw if n["id"] == add["et_id"])
    assert [t["tensor_id"] for t in add["inputs"]] == [v[0] for v in raw_add["inputs"][:2]]
    assert add["rf_id"] == raw_add["rf_id"]


def test_not_an_execution_trace_is_a_trace_error(tmp_path: Path) -> None:
    kineto = tmp_path / "kineto.json"
    kineto.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ExecutionTraceError, match="not a PyTorch Execution Trace") as info:
        load_execution_trace(kineto)
    assert isinstance(info.value, traceq.TraceError)
    assert "\n" not in str(info.value)
    broken = tmp_path / "broken.json"
    broken.write_text('{"nodes": [')
    with pytest.raises(ExecutionTraceError):
        load_execution_trace(broken)
    with pytest.raises(traceq.TraceError):
        load_execution_trace(tmp_path / "missing.json")


# -- pairing with the Kineto trace --------------------------------------------------------


@pytest.mark.parametrize("pair", [SIMPLE_ADD, LINEAR], ids=["simple_add", "linear"])
def test_pairs_as_many_ops_as_a_stdlib_count(pair: tuple[str, str]) -> None:
    et_path, kineto_path = _pair(pair)
    trace = traceq.load(kineto_path)
    matched = match_ops(trace, load_execution_trace(et_path))
    assert matched.height == _stdlib_pairs(et_path, kineto_path)
    assert matched["event"].is_unique().all() and matched["et_id"].is_unique().all()


def test_simple_add_reads_both_rand_outputs() -> None:
    et_path, kineto_path = _pair(SIMPLE_ADD)
    trace = traceq.load(kineto_path)
    edges = dataflow(trace, execution_trace=load_execution_trace(et_path))
    adds = edges.filter(pl.col("consumer_name") == "aten::add")
    assert adds.height == 4  # two calls, each reading both random tensors
    assert set(adds["producer_name"]) == {"aten::rand"}
    assert set(adds["input_index"]) == {0, 1}
    assert not adds["inferred"].any()


# -- a pair recorded here -----------------------------------------------------------------


@pytest.fixture(scope="module")
def geglu_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    torch = pytest.importorskip("torch")
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

    class GeGLU(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = torch.nn.Linear(16, 32)
            self.up = torch.nn.Linear(16, 32)
            self.down = torch.nn.Linear(32, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.nn.functional.gelu(self.gate(x)) * self.up(x))

    folder = tmp_path_factory.mktemp("geglu")
    et_path, kineto_path = folder / "et.json", folder / "kineto.json"
    model, x = GeGLU(), torch.randn(4, 16)
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    with (
        profile(
            activities=[ProfilerActivity.CPU],
            record_shapes=True,
            execution_trace_observer=observer,
        ) as prof,
        torch.no_grad(),
    ):
        model(x)
    prof.export_chrome_trace(str(kineto_path))
    return et_path, kineto_path


def _named(trace: traceq.Trace) -> dict[int, str]:
    """Semantic ops named as the model code names them: linears in call order."""
    ops = dataflow_ops(trace).sort("ts_ns")
    linears = ops.filter(pl.col("name") == "aten::linear")["event"].to_list()
    names = dict(zip(linears, ["gate", "up", "down"], strict=True))
    for event, name in ops.select("event", "name").iter_rows():
        names.setdefault(event, name.removeprefix("aten::"))
    return names


def test_recorded_geglu_edges_are_the_models(geglu_pair: tuple[Path, Path]) -> None:
    et_path, kineto_path = geglu_pair
    trace = traceq.load(kineto_path)
    edges = dataflow(trace, execution_trace=load_execution_trace(et_path))
    names = _named(trace)
    got = {(names[p], names[c]) for p, c in edges.select("producer", "consumer").iter_rows()}
    assert got == {("gate", "gelu"), ("gelu", "mul"), ("up", "mul"), ("mul", "down")}
    assert edges["inferred"].not_().all()
    assert set(edges["evidence"]) == {"tensor-id"}
    assert (edges["confidence"] == 1.0).all()
    assert edges["shape"].to_list() == [[4, 32]] * 4


def test_ops_the_et_lacks_keep_inferred_edges(geglu_pair: tuple[Path, Path]) -> None:
    et_path, kineto_path = geglu_pair
    trace = traceq.load(kineto_path)
    et = load_execution_trace(et_path)
    names = _named(trace)
    down = next(event for event, name in names.items() if name == "down")
    down_rf = trace.ops.filter(pl.col("event") == down)["record_function_id"].item()
    partial = et.filter(pl.col("rf_id") != down_rf)  # as if the ET missed the down GEMM
    edges = dataflow(trace, execution_trace=partial)
    into_down = edges.filter(pl.col("consumer") == down)
    assert into_down.height == 1 and into_down["inferred"].item()
    assert names[into_down["producer"].item()] == "mul"
    assert not edges.filter(pl.col("consumer") != down)["inferred"].any()
    assert tensor_edges(trace, partial).height == 3


def test_trace_with_execution_trace_gives_the_same_exact_edges(
    geglu_pair: tuple[Path, Path],
) -> None:
    et_path, kineto_path = geglu_pair
    trace = traceq.load(kineto_path)
    via_trace = trace.with_execution_trace(et_path)
    direct = dataflow(trace, execution_trace=load_execution_trace(et_path))
    key = ["producer", "consumer"]
    assert via_trace.select(key).sort(key).equals(direct.select(key).sort(key))
    assert set(via_trace["evidence"]) == {"tensor-id"}


def test_every_thread_pairs_with_the_same_iteration(tmp_path: Path) -> None:
    """Three iterations in the trace, one in the ET: each thread's offsets tie, one per
    iteration. Nearest-to-zero alone would pair the forward thread with iteration 1 (offset
    0) and the backward one with iteration 0 (offset -19): backward before forward."""
    forward, backward = ("aten::linear", "aten::relu", "aten::sum"), ("a", "b", "c")
    events = []
    for k in range(3):
        for i, name in enumerate(forward):
            ext, ts = 61 + 40 * k + i, 1000 * k + 10 * i
            events.append(_cpu_op(name, tid=10, ts=ts, external_id=ext))
        for i, name in enumerate(backward):
            ext, ts = 85 + 40 * k + i, 1000 * k + 500 + 10 * i
            events.append(_cpu_op(name, tid=20, ts=ts, external_id=ext))
    path = tmp_path / "three_iterations.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = traceq.load(path)
    et = pl.DataFrame(
        [(1 + i, name, None, 101 + i, 1, [], []) for i, name in enumerate(forward)]
        + [(4 + i, name, None, 104 + i, 2, [], []) for i, name in enumerate(backward)],
        schema=ET_SCHEMA,
        orient="row",
    )
    pairs = match_ops(trace, et).join(
        trace.ops.select(pl.col("event").cast(pl.Int64), "ts_ns"), on="event"
    )
    assert pairs.height == 6
    assert pairs["ts_ns"].min() >= 1_000_000 and pairs["ts_ns"].max() < 2_000_000  # iteration 1


def _cpu_op(name: str, *, tid: int, ts: int, external_id: int) -> dict:
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": 5,
        "args": {"External id": external_id},
    }


CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"


@pytest.mark.parametrize("model", ["unet", "dit", "t5"])
def test_exact_edges_join_a_write_and_a_read_of_one_storage(model: str) -> None:
    """The observer reuses a freed tensor's id for the next tensor at its address: an
    exact edge must be the same (tensor id, storage id) written by the producer (or a
    node under it) and read by the consumer, recomputed here from the raw ET JSON.
    Keyed by tensor id alone, 29 corpus edges joined tensors of different storages
    (UNet `conv2d -> div`, DiT `layer_norm -> add`, T5 `cat -> add`)."""
    et_path, trace_path = CORPUS / f"{model}.et.json.gz", CORPUS / f"{model}.pt.trace.json.gz"
    trace = traceq.load(trace_path, cache=False)
    et = load_execution_trace(et_path)
    edges = tensor_edges(trace, et)
    assert edges.height > 100
    raw = {node["id"]: node for node in _raw(et_path)["nodes"]}
    children: dict[int, list[int]] = defaultdict(list)
    for node in raw.values():
        children[node.get("ctrl_deps", -1)].append(node["id"])
    node_of = dict(match_ops(trace, et).select("event", "et_id").iter_rows())

    def written(et_id: int) -> set[tuple[int, int]]:
        out, todo = set(), [et_id]
        while todo:
            node = raw[todo.pop()]
            outputs = node["outputs"]
            for value, kind in zip(outputs["values"], outputs["types"], strict=True):
                items = value if kind.startswith("GenericList[Tensor") else [value]
                out |= {(v[0], v[1]) for v in items if isinstance(v, list) and len(v) > 1}
            todo.extend(children[node["id"]])
        return out

    for producer, consumer, index in edges.select("producer", "consumer", "input_index").rows():
        node = raw[node_of[consumer]]
        value = node["inputs"]["values"][index]
        kind = node["inputs"]["types"][index]
        read = {(v[0], v[1]) for v in (value if kind.startswith("GenericList") else [value])}
        assert read & written(node_of[producer]), (model, producer, consumer, index)
