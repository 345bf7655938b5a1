"""Property: a trace of *valid* events with junk inside loads whole, links, and analyzes.

`test_load_properties` throws arbitrary JSON at the loader; most of it is rejected at
validation, so linking, nesting and the rules rarely see it. Here every event is valid
Kineto — a Python thread of nested CPU ops inside `ProfilerStep` windows, runtime calls
inside ops, kernels and copies on GPU streams, `ac2g` flows, `cuda_sync` events — and the
junk is where real traces put it: in `args` (shapes nested, negative, empty, huge or not
lists at all; dtypes that are not dtypes; grids of any length), in ids (correlations
duplicated, dangling, missing or huge; External ids shared), and in times (zero
durations, ties, sub-µs fractions, ns-resolution epochs, children that end after their
parent, kernels that start before their launch).

Invariants, each checked against the generated events themselves:
- it loads: a valid event is never rejected because of what its `args` hold;
- every event is accounted for once, in one frame, with its time to the exact ns;
- kernels link to the first runtime call with their correlation, as the raw events say;
- an op's parent is an op on its own thread that starts no later than it;
- `analyze` (every rule), the JSON report and the regression summary never raise.
"""

from __future__ import annotations

import io
import json
import math
from decimal import Decimal
from typing import Any

import polars as pl
import pytest
from conftest import assert_partition, dumps_exact
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_load_linking import expected_launches

import traceq
from traceq.analyze import analysis
from traceq.regression.summary import summarize
from traceq.reports import build_report, render

OP_NAMES = [
    "aten::linear",
    "aten::addmm",
    "aten::mm",
    "aten::matmul",
    "aten::gelu",
    "aten::mul",
    "aten::add_",
    "aten::addcdiv_",
    "aten::to",
    "aten::copy_",
    "aten::item",
    "aten::empty",
    "aten::view",
    "Optimizer.step#Adam.step",
    "autograd::engine::evaluate_function: AddmmBackward0",
]
KERNEL_NAMES = [
    "ampere_sgemm_32x32_sliced1x4_tn",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>()",
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)",
    "triton_poi_fused_add_mul_0",
    "Memcpy HtoD (Pageable -> Device)",
    "Memcpy DtoH (Device -> Pageable)",
    "Memset (Device)",
]
RUNTIME_NAMES = [
    "cudaLaunchKernel",
    "cudaMemcpyAsync",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cuLaunchKernel",
]
DTYPES = ["float", "c10::Half", "c10::BFloat16", "double", "int", "", "Scalar", "weird"]

small_ints = st.integers(min_value=-3, max_value=70000) | st.sampled_from([0, 1, 2**31, 2**62])
junk = st.recursive(
    st.none()
    | st.booleans()
    | small_ints
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=2)
    ),
    max_leaves=5,
)
# Shapes as profilers write them (a list per input, each a list of sizes), and as they
# should not: empty, scalars, nested deeper, sizes negative or huge, not lists at all.
shape = st.lists(small_ints, max_size=4)
shapes = st.lists(shape, max_size=4) | st.lists(st.lists(shape, max_size=2), max_size=2) | junk
# An id: mostly small (so they collide and match), sometimes junk.
ids = st.integers(0, 12) | st.sampled_from([None, -1, 2**53, "7", 3.0])


def us(ns: int) -> Decimal:
    """A time written the way profilers write them: µs, with up to 3 decimals."""
    return Decimal(ns) / 1000


@st.composite
def op_args(draw: st.DrawFn) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if draw(st.booleans()):
        args["Input Dims"] = draw(shapes)
    if draw(st.booleans()):
        args["Input type"] = draw(st.lists(st.sampled_from(DTYPES), max_size=4) | junk)
    if draw(st.booleans()):
        args["External id"] = draw(ids)
    if draw(st.integers(0, 3)) == 0:
        args["Concrete Inputs"] = draw(junk)
    if draw(st.integers(0, 3)) == 0:
        args["Input Strides"] = draw(shapes)
    if draw(st.integers(0, 4)) == 0:
        args[draw(st.text(max_size=5))] = draw(junk)
    return args


@st.composite
def op_tree(
    draw: st.DrawFn, start: int, end: int, depth: int, out: list[dict[str, Any]], tid: int
) -> None:
    """Nested ops in [start, end): siblings in order, children inside parents (or, now and
    then, ending a few hundred ns late, as rounded or skewed clocks write them)."""
    t = start
    for _ in range(draw(st.integers(1 if depth == 0 else 0, 4 if depth < 3 else 0))):
        if t >= end:
            break
        begin = draw(st.integers(t, end))
        finish = draw(st.integers(begin, end))
        late = draw(st.sampled_from([0, 0, 0, 1, 300]))
        out.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": draw(st.sampled_from(OP_NAMES)),
                "pid": 1,
                "tid": tid,
                "ts": us(begin),
                "dur": us(finish - begin + late),
                "args": draw(op_args()),
            }
        )
        draw(op_tree(begin, finish, depth + 1, out, tid))
        t = finish


@st.composite
def traces(draw: st.DrawFn) -> list[dict[str, Any]]:
    base = draw(st.sampled_from([0, 1_000_000, 1_682_725_898_079_292_000]))  # ns
    n_steps = draw(st.integers(0, 3))
    span = draw(st.integers(1, 200_000))
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 10, "args": {"name": "main"}},
    ]
    step_span = span // max(1, n_steps)
    for i in range(n_steps):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{i + 2}",
                "pid": 1,
                "tid": 10,
                "ts": us(base + i * step_span),
                "dur": us(step_span),
                "args": {"External id": draw(ids)},
            }
        )
    ops: list[dict[str, Any]] = []
    draw(op_tree(base, base + span, 0, ops, 10))
    if draw(st.booleans()):  # a second thread (autograd's), ops only
        draw(op_tree(base, base + span, 0, ops, 11))
    events += ops
    correlation = 0
    for op in [o for o in ops if o["tid"] == 10]:
        if draw(st.integers(0, 3)) == 0:
            continue
        start, dur = int(op["ts"] * 1000), int(op["dur"] * 1000)
        begin = draw(st.integers(start, start + dur))
        call_dur = draw(st.integers(0, start + dur - begin))
        correlation = draw(st.sampled_from([correlation + 1, correlation + 1, correlation, 0]))
        call = {
            "ph": "X",
            "cat": draw(st.sampled_from(["cuda_runtime", "cuda_runtime", "cuda_driver"])),
            "name": draw(st.sampled_from(RUNTIME_NAMES)),
            "pid": 1,
            "tid": 10,
            "ts": us(begin),
            "dur": us(call_dur),
            "args": {"correlation": correlation, "cbid": draw(junk)},
        }
        if draw(st.integers(0, 5)) == 0:
            del call["args"]["correlation"]
        events.append(call)
        if draw(st.integers(0, 4)) == 0:
            continue  # a call with no GPU activity
        name = draw(st.sampled_from(KERNEL_NAMES))
        cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
        cat = "gpu_memset" if name.startswith("Memset") else cat
        k_start = begin + draw(st.integers(-500, 50_000))  # before its launch, now and then
        stream = draw(st.sampled_from([7, 7, 20]))
        kernel_args: dict[str, Any] = {
            "correlation": draw(st.sampled_from([correlation, correlation, correlation + 1000])),
            "device": 0,
            "stream": stream,
            "External id": op["args"].get("External id", draw(ids)),
        }
        for key, value in (
            ("grid", st.lists(small_ints, max_size=4) | junk),
            ("block", st.lists(small_ints, max_size=4)),
            ("bytes", small_ints | junk),
            (
                "est. achieved occupancy %",
                small_ints | st.floats(allow_nan=False, allow_infinity=False),
            ),
            ("registers per thread", small_ints),
        ):
            if draw(st.booleans()):
                kernel_args[key] = draw(value)
        events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": us(k_start),
                "dur": us(draw(st.integers(0, 20_000))),
                "args": kernel_args,
            }
        )
        if draw(st.booleans()):  # the ac2g flow from the call to the kernel
            flow = {"cat": "ac2g", "name": "ac2g", "id": correlation}
            events.append({**flow, "ph": "s", "pid": 1, "tid": 10, "ts": us(begin)})
            if draw(st.integers(0, 5)):
                events.append(
                    {**flow, "ph": "f", "bp": "e", "pid": 0, "tid": stream, "ts": us(k_start)}
                )
        if call["name"].endswith("Synchronize") and draw(st.booleans()):
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_sync",
                    "name": "Stream Sync",
                    "pid": 0,
                    "tid": stream,
                    "ts": us(begin + call_dur),
                    "dur": 0,
                    "args": {"correlation": correlation, "stream": stream, "device": 0},
                }
            )
    order = draw(st.permutations(range(len(events))))  # files are not sorted by time
    return [events[i] for i in order]


def as_json(events: list[dict[str, Any]]) -> bytes:
    return dumps_exact({"traceEvents": events}).encode()


# Each example runs every rule: 50 examples by default (the `thorough` profile runs more).
@settings(
    max_examples=max(50, settings().max_examples // 2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(traces())
def test_valid_events_with_junk_inside_load_link_and_analyze(events: list[dict[str, Any]]) -> None:
    trace = traceq.load(io.BytesIO(as_json(events)))
    raw = json.loads(as_json(events), parse_float=Decimal)["traceEvents"]
    # every event in the one frame its ph and cat name, times exact to the ns
    assert trace.events.height == len(raw)
    assert_partition(trace, raw)
    timed = trace.events.filter(pl.col("ts_ns").is_not_null())
    for i, ts_ns, dur_ns in timed.select("event", "ts_ns", "dur_ns").iter_rows():
        assert ts_ns == int(Decimal(str(raw[i]["ts"])) * 1000)
        assert (dur_ns or 0) == int(Decimal(str(raw[i].get("dur", 0))) * 1000)
    cats = [e.get("cat") for e in raw]
    assert trace.ops.height == cats.count("cpu_op")
    assert trace.kernels.height == sum(c in ("kernel", "gpu_memcpy", "gpu_memset") for c in cats)
    # linking, as the raw events say
    launches = dict(zip(trace.kernels["event"], trace.kernels["runtime_event"], strict=True))
    assert launches == expected_launches(raw)
    event("kernels linked" if any(v is not None for v in launches.values()) else "none linked")
    # nesting: a parent is an op on the same thread that started no later
    ops = trace.ops.select("event", "tid", "ts_ns", "parent")
    by_event = {e: (tid, ts) for e, tid, ts, _ in ops.iter_rows()}
    for _, tid, ts, parent in ops.iter_rows():
        if parent is not None:
            assert by_event[parent][0] == tid and by_event[parent][1] <= ts
    # the rules, the report and the regression summary see it without failing
    result = analysis(trace)
    for finding in result.findings:
        assert math.isfinite(finding.est_saving_us) and finding.est_saving_us >= 0
    event(f"findings: {'some' if result.findings else 'none'}")
    json.loads(render(build_report(result, trace), "json"))
    summarize(trace, findings=False)


KERNEL = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1}
OP = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1}


@pytest.mark.parametrize(
    ("event", "column", "frame"),
    [
        ({**KERNEL, "args": {"grid": [1e300]}}, "grid", "kernels"),
        ({**KERNEL, "args": {"grid": "[-]"}}, "grid", "kernels"),
        ({**KERNEL, "args": {"block": "[1,,2]"}}, "block", "kernels"),
        ({**OP, "args": {"Input Dims": [[1e300]]}}, "shapes", "ops"),
        ({**OP, "args": {"Input Dims": "[[1][2]]"}}, "shapes", "ops"),
        ({**OP, "args": {"Input Strides": [[8, 1e40]]}}, "input_strides", "ops"),
        ({**OP, "args": {"Concrete Inputs": ["\t"]}}, "concrete_inputs", "ops"),
        ({**OP, "args": {"Input type": ["float\x1e"]}}, "input_types", "ops"),
        ({**OP, "args": {"Input type": '["a""b"]'}}, "input_types", "ops"),
        ({**OP, "args": {"Input type": ["\\0"]}}, "input_types", "ops"),
    ],
)
def test_a_list_the_json_decoder_cannot_read_is_null_not_a_crash(
    event: dict[str, Any], column: str, frame: str
) -> None:
    """Found by the property above: a grid, shape or dtype list whose text Polars cannot
    decode (`1e300` reads back as 301 digits; a tab is written back unescaped) made `load`
    raise Polars' ComputeError, not a `TraceError`. Such a value is now null (the event's
    `args` keep the text)."""
    trace = traceq.load(io.BytesIO(json.dumps({"traceEvents": [event]}).encode()))
    assert trace.frames[frame][column].to_list() == [None]


@pytest.mark.parametrize(
    "dims", [[[1, 2], [[3]]], [[1], [[]]], [[[1, 2]], [[3, 4]]]], ids=["nested", "empty", "deeper"]
)
def test_junk_shapes_leave_the_output_unknown_not_a_crash(dims: list[Any]) -> None:
    """Found by the property above: `aten::mm` with a shape nested one level too deep
    gave an "output shape" holding lists, and building the data-flow frame from it raised
    a TypeError inside `analyze`. The output of such a call is now unknown."""
    ops = [
        {**OP, "args": {"Input Dims": dims, "Input type": ["float", "float"]}},
        {**OP, "name": "aten::gelu", "ts": 3, "args": {"Input Dims": [[1, 2]]}},
    ]
    trace = traceq.load(io.BytesIO(json.dumps({"traceEvents": ops}).encode()))
    analysis(trace)
    assert trace.dataflow_ops.filter(pl.col("name") == "aten::mm")["output_shape"].to_list() == [
        None
    ]
