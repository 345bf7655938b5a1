"""Timestamps are exact integer nanoseconds: `ts_ns == Decimal(ts text) * 1000`, always.

Kineto writes microseconds with up to three decimals; at epoch scale (1.7e15 us) a float64
cannot hold them, so the reference here is the stdlib decoding every number as a `Decimal`
from its text. Covered: ns-resolution epoch timestamps (HTA `ns_resolution_trace`), small
relative float timestamps (TraceLens Qwen trace), integer-microsecond traces (HTA alexnet)
and every other trace via `kineto_case`.

Sources and licenses (see ../shared/traces/INDEX.md): HolisticTraceAnalysis test data
(facebookresearch, MIT); TraceLens test traces (AMD-AGI, MIT); and, through `kineto_case`,
the other shared traces listed in test_load_accounting.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import traceq

if TYPE_CHECKING:
    from conftest import TraceCase

ReadJson = Callable[..., Any]

NS_RESOLUTION = "hta/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
RELATIVE_FLOAT = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
INTEGER_US = (
    "hta/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
)


def exact_ns(value: Any) -> int | None:
    """Microseconds (int or Decimal from the text) -> nanoseconds, nearest, ties away."""
    if value is None:
        return None
    return int((Decimal(value) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def expected_times(raw: list[dict[str, Any]], key: str) -> list[int | None]:
    return [exact_ns(e.get(key)) for e in raw]


def test_every_timestamp_and_duration_is_exact(kineto_case: TraceCase) -> None:
    raw, events = kineto_case.raw_events, kineto_case.trace.events
    assert events["ts_ns"].to_list() == expected_times(raw, "ts")
    assert events["dur_ns"].to_list() == expected_times(raw, "dur")


def test_ns_resolution_epoch_timestamps_are_exact_where_float64_is_not(
    shared_trace: Callable[[str], Path], read_json: ReadJson
) -> None:
    path = shared_trace(NS_RESOLUTION)
    raw = read_json(path, parse_float=Decimal)["traceEvents"]
    texts = [e["ts"] for e in raw if isinstance(e.get("ts"), Decimal)]
    assert len(texts) > 60_000
    # float64 rounds most of them: the case the loader must not fall for
    lost = sum(round(float(t) * 1000) != int(t * 1000) for t in texts)
    assert lost > len(texts) // 2
    ts_ns = traceq.load(path).events["ts_ns"].to_list()
    assert ts_ns == expected_times(raw, "ts")
    assert ts_ns[0] == 1712195495519689047 and str(raw[0]["ts"]) == "1712195495519689.047"


def test_relative_float_timestamps_are_exact(
    shared_trace: Callable[[str], Path], read_json: ReadJson
) -> None:
    path = shared_trace(RELATIVE_FLOAT)
    raw = read_json(path, parse_float=Decimal)["traceEvents"]
    assert all(isinstance(e["ts"], Decimal) for e in raw if "ts" in e)
    events = traceq.load(path).events
    assert events["ts_ns"].to_list() == expected_times(raw, "ts")
    assert events["dur_ns"].to_list() == expected_times(raw, "dur")


def test_integer_microsecond_timestamps_are_exact(
    shared_trace: Callable[[str], Path], read_json: ReadJson
) -> None:
    path = shared_trace(INTEGER_US)
    raw = read_json(path, parse_float=Decimal)["traceEvents"]
    assert all(isinstance(e["ts"], int) for e in raw if "ts" in e)
    events = traceq.load(path).events
    assert events["ts_ns"].to_list() == [None if "ts" not in e else e["ts"] * 1000 for e in raw]


def one_event_trace(ts_text: str, dur_text: str = "1", padding: int = 0) -> traceq.Trace:
    """A trace whose first event has the given timestamp text (and `padding` plain ones)."""
    first = (
        f'{{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":{ts_text},"dur":{dur_text}}}'
    )
    rest = [{"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 1, "s": "t"}] * padding
    body = ",".join([first, *(json.dumps(e) for e in rest)])
    return traceq.load(io.BytesIO(f'{{"traceEvents":[{body}]}}'.encode()))


@pytest.mark.parametrize(
    ("ts_text", "expected"),
    [
        ("1712195495519689.047", 1712195495519689047),
        ("1712195495519689.0466", 1712195495519689047),  # digits below 1 ns round
        ("1712195495519689.0465", 1712195495519689047),  # tie: away from zero
        ("1712195495519689.0464", 1712195495519689046),
        ("1712195495519689", 1712195495519689000),
        ("47151.395", 47151395),
        ("0.001", 1),
        ("-1.5", -1500),
        ("1.5e3", 1500000),
        ("3999999999999998.999", 3999999999999998999),
    ],
)
def test_timestamp_text_becomes_exact_nanoseconds(ts_text: str, expected: int) -> None:
    assert one_event_trace(ts_text).events["ts_ns"][0] == expected


def test_exactness_does_not_depend_on_trace_size() -> None:
    # one fractional timestamp among 150k integral ones, and float64 rounds it to an integer
    assert float("1712195495519689.047").is_integer()
    big = one_event_trace("1712195495519689.047", "1", padding=150_000)
    assert big.events["ts_ns"][0] == 1712195495519689047
    assert big.events["ts_ns"][1] == 1000
