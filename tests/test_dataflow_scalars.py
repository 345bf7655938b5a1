"""Data flow through 0-d tensors (`traceq.relations.scalars`), checked against the raw ET.

The diffusion entries of the Execution Trace corpus run a DDIM scheduler step after each
model call: arithmetic on 0-d tensors (`alphas_cumprod[t]`, `(1 - a) ** 0.5`, ...) and a
weighted sum of the latents. Every inferred edge tested here is checked against the ET
JSON read with json and gzip alone: the producer's ET node wrote the very tensor (id and
storage) the consumer's ET node read at that argument.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from typing import Any

import polars as pl
import pytest
from conftest import corpus_paths

import traceq
from traceq.relations.dataflow import dataflow, module_calls
from traceq.relations.dataflow.execution_trace import load_execution_trace
from traceq.relations.dataflow.readers.scalars import EVIDENCE, weighted_sum_reads
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.op_classes import classify
from traceq.rules.tq104_pointwise_chain import pointwise_chains

DIFFUSION = ("unet", "dit")


@cache
def _loaded(name: str) -> traceq.Trace:
    return traceq.load(corpus_paths(name)[0], execution_trace=False)


@cache
def _et_nodes(name: str) -> dict[int, dict[str, Any]]:
    """The raw ET's op nodes by `rf_id` (the Kineto op's `Record function id`)."""
    with gzip.open(corpus_paths(name)[1], "rt") as f:
        nodes = json.load(f)["nodes"]
    by_rf = {}
    for node in nodes:
        attrs = {a["name"]: a["value"] for a in node.get("attrs", [])}
        if "rf_id" in attrs and node["name"].startswith("aten::"):
            by_rf[attrs["rf_id"]] = node
    return by_rf


def _tensor(value: Any) -> tuple[int, int] | None:
    """(tensor id, storage id) of an ET value `[id, storage, offset, numel, itemsize,
    device]`; None for a non-tensor (a Python scalar)."""
    if isinstance(value, list) and len(value) == 6 and isinstance(value[0], int):
        return value[0], value[1]
    return None


def _rf_ids(trace: traceq.Trace) -> dict[int, int]:
    ops = trace.ops.select(pl.col("event").cast(pl.Int64), "record_function_id")
    return dict(ops.drop_nulls().iter_rows())


def _wrote_what_was_read(name: str, producer: int, consumer: int, index: int) -> bool:
    """The ET: `producer`'s node output the tensor `consumer`'s node read at `index`."""
    rf, nodes = _rf_ids(_loaded(name)), _et_nodes(name)
    p, c = nodes[rf[producer]], nodes[rf[consumer]]
    read = _tensor(c["inputs"]["values"][index])
    return read is not None and read in {_tensor(v) for v in p["outputs"]["values"]}


def _scheduler_ops(name: str) -> pl.DataFrame:
    """The ops outside every module call (the scheduler's), with their names and shapes."""
    trace = _loaded(name)
    ops = trace.dataflow_ops
    calls = module_calls(trace, ops).select("event", "_top")
    return ops.join(calls, on="event", how="left").filter(pl.col("_top").is_null())


@pytest.mark.parametrize(
    ("name", "count"),
    [
        # per DDIM step: 6 powers used as coefficients, 2 `prev_timestep >= 0` tests
        ("unet", 16),
        ("dit", 16),
        # `torch.tensor(pad / eos / ...)` built 3 times (3 steps each), 9 stopping tests
        ("gpt2_generate", 18),
        ("llama_generate", 18),
        ("mistral", 6),
        ("clip", 1),  # `logit_scale.exp()` then `.to(...)`
    ],
)
def test_every_inferred_0d_edge_is_the_ets(name: str, count: int) -> None:
    """The 0-d reads data flow infers (a tested bool, a power used as a coefficient, the
    steps of `torch.tensor(v)`) are the ET's, argument for argument."""
    scalar = _loaded(name).dataflow.filter(pl.col("evidence").str.starts_with(EVIDENCE))
    assert scalar.height == count
    for producer, consumer, index in scalar.select("producer", "consumer", "input_index").rows():
        assert _wrote_what_was_read(name, producer, consumer, index), (producer, consumer)
    if name in DIFFUSION:
        pairs = {
            (p.removeprefix("aten::"), c.removeprefix("aten::"))
            for p, c in scalar.select("producer_name", "consumer_name").rows()
        }
        assert pairs == {("pow", "mul"), ("pow", "div"), ("pow", "sub"), ("ge", "is_nonzero")}


def _et_producers(name: str, consumer: int) -> set[int]:
    """The ops (events) whose ET nodes last wrote, before `consumer` ran, the tensors its
    ET node read."""
    trace = _loaded(name)
    rf, nodes = _rf_ids(trace), _et_nodes(name)
    read = {_tensor(v) for v in nodes[rf[consumer]]["inputs"]["values"]} - {None}
    ops = trace.dataflow_ops.sort("ts_ns")
    start = dict(ops.select("event", "ts_ns").iter_rows())
    last: dict[tuple[int, int], int] = {}
    for event in ops["event"].to_list():
        if start[event] >= start[consumer] or event not in rf or rf[event] not in nodes:
            continue
        for value in nodes[rf[event]]["outputs"]["values"]:
            if _tensor(value) in read:
                last[_tensor(value)] = event
    return set(last.values())


@pytest.mark.parametrize("name", DIFFUSION)
def test_the_latents_update_reads_both_weighted_terms(name: str) -> None:
    """`prev_sample = a ** 0.5 * x0 + c ** 0.5 * eps` (the scheduler's `add` of two `mul`s,
    by the ET): the add reads the two products, and the second product reads `x0` (the
    `clamp`), not the first product, once per DDIM step."""
    edges = _loaded(name).dataflow
    names = dict(_loaded(name).dataflow_ops.select("event", "name").iter_rows())
    adds = _scheduler_ops(name).filter(pl.col("name") == "aten::add")["event"].to_list()
    updates = [
        a
        for a in adds
        if len(p := _et_producers(name, a)) == 2 and {names[e] for e in p} == {"aten::mul"}
    ]
    assert len(updates) == 2
    for add in updates:
        into = edges.filter(pl.col("consumer") == add)
        assert set(into["producer"]) == _et_producers(name, add)
        second = into["producer"].max()
        tensor_in = edges.filter((pl.col("consumer") == second) & (pl.col("shape").list.len() > 0))
        assert tensor_in["producer_name"].to_list() == ["aten::clamp"]
        producer, index = tensor_in.select("producer", "input_index").row(0)
        assert _wrote_what_was_read(name, producer, second, index)


def _input_reading(name: str, producer: int, consumer: int) -> int | None:
    """The argument at which `consumer` read what `producer` wrote (the ET), or None."""
    rf, nodes = _rf_ids(_loaded(name)), _et_nodes(name)
    wrote = {_tensor(v) for v in nodes[rf[producer]]["outputs"]["values"]} - {None}
    for i, value in enumerate(nodes[rf[consumer]]["inputs"]["values"]):
        if _tensor(value) in wrote:
            return i
    return None


@cache
def _tq104(name: str, exact: bool) -> frozenset[frozenset[int]]:
    kineto, et = corpus_paths(name)
    trace = traceq.load(kineto, execution_trace=False)
    if exact:
        frame = load_execution_trace(et)
        trace.__dict__["dataflow"] = dataflow(trace, trace.dataflow_ops, execution_trace=frame)
    found = run(trace, Config(select=["TQ104"])).findings
    return frozenset(frozenset(f.ops) for f in found)


@pytest.mark.parametrize("name", DIFFUSION)
def test_tq104_leaves_0d_arithmetic_alone_and_agrees_with_the_et(name: str) -> None:
    """The ET links the scheduler's 0-d ops into chains of 3 and more (`1 - a`, `** 0.5`,
    `/`, ...); TQ104 reports none of them, on either data flow, and its findings on
    inferred data flow are the ET-based ones, the weighted sum of each step included."""
    rf, nodes = _rf_ids(_loaded(name)), _et_nodes(name)
    ops = _scheduler_ops(name)
    zero_d = {
        e
        for e in ops["event"].to_list()
        if e in rf
        and (outs := nodes[rf[e]]["outputs"]["shapes"])
        and all(s == [] for s in outs)
        and nodes[rf[e]]["name"] in ("aten::rsub", "aten::pow", "aten::mul", "aten::div")
    }
    assert len(zero_d) >= 24  # 12 or more per DDIM step
    linked = sum(
        1 for c in zero_d for p in zero_d if p != c and _input_reading(name, p, c) is not None
    )
    assert linked >= 16
    got, truth = _tq104(name, exact=False), _tq104(name, exact=True)
    assert got == truth
    assert not any(chain & zero_d for chain in truth)
    names = dict(_loaded(name).dataflow_ops.select("event", "name").iter_rows())
    update = [
        c for c in truth if sorted(names[e] for e in c) == ["aten::add", "aten::mul", "aten::mul"]
    ]
    assert len(update) == 2  # each DDIM step's `a * x0 + b * eps`


def test_a_0d_chain_is_no_tq104_chain_but_a_0d_coefficient_is_read() -> None:
    """`(1 - a) ** 0.5 * 2` on 0-d `a` (ops 1-3) is no chain; `c * x + 1` then `exp`, with
    `c` 0-d and x a tensor (ops 4-6), is one."""
    s = [2, 4]

    def op(event: int, name: str, shapes: list[list[int]], out: list[int]) -> dict[str, Any]:
        return {
            "event": event,
            "name": name,
            "shapes": shapes,
            "input_types": ["float"] * len(shapes),
            "concrete_inputs": [""] * len(shapes),
            "dtype": "float",
            "data_inputs": [{"index": i, "shape": d} for i, d in enumerate(shapes)],
            "output_shape": out,
            "module": None,
            "n_kernels": 0,
            "ts_ns": 1000 * event,
            "step": 1,
            "pid": 1,
            "tid": 1,
        }

    rows = [
        op(1, "aten::rsub", [[]], []),
        op(2, "aten::pow", [[]], []),
        op(3, "aten::mul", [[]], []),
        op(4, "aten::mul", [[], s], s),
        op(5, "aten::add", [s], s),
        op(6, "aten::exp", [s], s),
    ]
    frame = classify(pl.DataFrame(rows))
    edges = pl.DataFrame(
        {
            "producer": [1, 2, 3, 4, 5],
            "consumer": [2, 3, 4, 5, 6],
            "input_index": [0, 0, 0, 0, 0],
            "confidence": [0.9] * 5,
        }
    )
    chains = pointwise_chains(frame, edges, pl.Series([], dtype=pl.Int64), min_ops=3)
    assert chains["ops"].to_list() == [[4, 5, 6]]


ARANGE_ENTRIES = ("dit", "gpt2", "gpt2_generate", "t5", "whisper", "mixtral")


@pytest.mark.parametrize("name", ARANGE_ENTRIES)
def test_arange_has_the_shape_the_et_recorded(name: str) -> None:
    """`torch.arange(n)`, `arange(start, end)`, with a `dtype` (recorded as a Scalar too):
    every top-level `arange` gets the output shape its ET node wrote, and its readers
    (position ids, timestep frequencies) their edge."""
    trace = _loaded(name)
    rf, nodes = _rf_ids(trace), _et_nodes(name)
    aranges = trace.dataflow_ops.filter(pl.col("name") == "aten::arange")
    assert aranges.height > 0
    for event, shape in aranges.select("event", "output_shape").rows():
        assert [shape] == nodes[rf[event]]["outputs"]["shapes"], event
    read = trace.dataflow.filter(pl.col("producer").is_in(aranges["event"].implode()))
    assert read.height > 0
    for producer, consumer, index in read.select("producer", "consumer", "input_index").rows():
        assert _wrote_what_was_read(name, producer, consumer, index), (producer, consumer)


def _weighted_sum_nodes(coefficient: str) -> pl.DataFrame:
    """x0 (1), eps (2), `a * eps` (4), `b * x0` (6), their sum (7); 3 and 5 make the
    0-d coefficients. `coefficient` is how the profiler recorded them."""
    s = [1, 4, 8, 8]
    rows = [
        (1, "aten::clamp", [s], ["float"], s),
        (2, "aten::add", [s, s], ["float", "float"], s),
        (3, "aten::pow", [[]], ["float"], []),
        (4, "aten::mul", [[], s], [coefficient, "float"], s),
        (5, "aten::pow", [[]], ["float"], []),
        (6, "aten::mul", [[], s], [coefficient, "float"], s),
        (7, "aten::add", [s, s], ["float", "float"], s),
    ]
    return pl.DataFrame(
        [
            {
                "event": e,
                "name": n,
                "data_inputs": [{"index": i, "shape": d} for i, d in enumerate(dims)],
                "input_types": types,
                "_out_shape": "s" + ",".join(map(str, out)),
            }
            for e, n, dims, types, out in rows
        ]
    )


def test_a_weighted_sum_reads_both_products_only_for_0d_tensor_coefficients() -> None:
    """Shape and order read `b * (a * eps)` beside x0; the products are the sum's operands
    when the coefficients are 0-d tensors (`float`), not wrapped Python floats (`double`)."""
    s = [1, 4, 8, 8]
    read = [(1, 4, 1), (4, 6, 1), (2, 7, 0), (6, 7, 1), (3, 4, 0), (5, 6, 0)]
    edges = pl.DataFrame(
        [
            {
                "producer": p,
                "consumer": c,
                "input_index": i,
                "shape": [] if p in (3, 5) else s,
                "confidence": 0.9,
                "evidence": "shape+order",
            }
            for p, c, i in read
        ]
    )
    rewired = weighted_sum_reads(edges, _weighted_sum_nodes("float"))
    pairs = set(rewired.select("producer", "consumer", "input_index").rows())
    assert pairs == {(1, 6, 1), (4, 7, 0), (6, 7, 1), (3, 4, 0), (5, 6, 0)}
    kept = weighted_sum_reads(edges, _weighted_sum_nodes("double"))
    assert set(kept.select("producer", "consumer", "input_index").rows()) == set(read)
