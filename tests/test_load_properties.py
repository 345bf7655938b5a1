"""Property: whatever an event holds, `traceq.load` returns all of it or raises `TraceError`.

Hypothesis builds events whose fields take any JSON type (missing, wrong types, nested
junk, huge and negative numbers, unicode, control characters), wraps them in a trace, and
loads it. A returned `Trace` must have exactly one `events` row per generated event and
must account for each in one frame; any failure must be a `TraceError` with a one-line
message, never another exception escaping from the decoder, Polars or numpy.
"""

from __future__ import annotations

import io
import json
from typing import Any

from conftest import assert_partition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import traceq

FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s", "args")
ARG_KEYS = (
    "correlation",
    "External id",
    "device",
    "stream",
    "grid",
    "block",
    "Input Dims",
    "Input type",
    "Concrete Inputs",
    "Python id",
    "Python parent id",
    "name",
    "bytes",
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
junk = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
# Plausible values mixed with junk, so that many events get past validation into linking.
plausible: dict[str, st.SearchStrategy[Any]] = {
    "ph": st.sampled_from(["X", "i", "s", "f", "t", "C", "M", "B", "E", "Z"]),
    "cat": st.sampled_from(
        [
            "cpu_op",
            "kernel",
            "cuda_runtime",
            "gpu_memcpy",
            "user_annotation",
            "gpu_user_annotation",
            "python_function",
            "cuda_sync",
            "ac2g",
            "Operator",
            "Kernel",
            "Runtime",
            "mtia_ccp_events",
            "weird",
        ]
    ),
    "name": st.sampled_from(
        [
            "aten::mm",
            "cudaLaunchKernel",
            "ProfilerStep#3",
            "nn.Module: M_0",
            "thread_name",
            "ac2g",
            "hipMemcpyAsync",
        ]
    ),
    "pid": st.integers(min_value=0, max_value=3),
    "tid": st.integers(min_value=0, max_value=3) | st.just("stream 7"),
    "ts": st.integers(min_value=0, max_value=10**6) | st.decimals(0, 10**6, places=3).map(float),
    "dur": st.integers(min_value=0, max_value=1000),
    "id": st.integers(min_value=0, max_value=5),
    "bp": st.just("e"),
    "s": st.sampled_from(["t", "p", "g"]),
}


@st.composite
def argss(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        return draw(junk)
    keys = draw(st.lists(st.sampled_from(ARG_KEYS), max_size=5, unique=True))
    return {key: draw(st.integers(0, 5) | junk) for key in keys}


@st.composite
def events(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 20)) == 0:
        return draw(junk)  # not an object at all
    event = {}
    for field in FIELDS:
        choice = draw(st.integers(0, 5))
        if choice == 0:
            continue  # missing
        if field == "args":
            event[field] = draw(argss())
        elif choice == 1 or field not in plausible:
            event[field] = draw(junk)
        else:
            event[field] = draw(plausible[field])
    return event


def load_json(document: Any) -> traceq.Trace:
    return traceq.load(io.BytesIO(json.dumps(document).encode()))


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events(), max_size=12))
def test_malformed_events_load_completely_or_raise_trace_error(generated: list[Any]) -> None:
    try:
        trace = load_json({"traceEvents": generated})
    except traceq.TraceError as exc:
        assert "\n" not in str(exc)
        return
    assert trace.events.height == len(generated)
    assert_partition(trace, generated)
    trace.unlinked  # noqa: B018 - computing the counts must not fail either


@given(junk)
def test_any_json_document_loads_or_raises_trace_error(document: Any) -> None:
    try:
        load_json(document)
    except traceq.TraceError as exc:
        assert "\n" not in str(exc)
