"""What each batch of the streaming decode decides on its own: which keys Polars parses
(`RARE_KEYS` only where msgspec saw one) and whether its times need their decimal text.
A batch deciding wrongly would drop a value or round a time, silently; each case puts the
odd event in a middle batch, so its neighbours decide the other way."""

from __future__ import annotations

import json

import msgspec
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from traceq.loader import decode as decode_module
from traceq.loader.decode import COMMON_SCHEMA, EVENT_SCHEMA, RARE_KEYS, decode, decode_stream

BATCH = 5


def _events(n: int, ts: int = 1000) -> list[dict[str, object]]:
    return [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 2, "ts": ts + i, "dur": 1}
        for i in range(n)
    ]


def _stream(events: list[dict[str, object]], monkeypatch: pytest.MonkeyPatch) -> pl.DataFrame:
    monkeypatch.setattr(decode_module, "BATCH", BATCH)
    data = json.dumps({"traceEvents": events}, indent=1).encode()
    return decode_stream([data[i : i + 64] for i in range(0, len(data), 64)]).events


@pytest.mark.parametrize("key", RARE_KEYS)
def test_a_rare_key_in_one_batch_is_kept(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    events = _events(3 * BATCH)
    value: object = 7.5 if EVENT_SCHEMA[key] == pl.Float64() else "kept"
    events[BATCH + 2][key] = value
    frame = _stream(events, monkeypatch)
    assert frame.height == 3 * BATCH
    assert frame[key].to_list() == [value if i == BATCH + 2 else None for i in range(3 * BATCH)]
    assert_frame_equal(frame, decode(json.dumps({"traceEvents": events}).encode()).events)


def test_polars_parses_the_rare_keys_only_for_a_batch_that_holds_one() -> None:
    plain = b'{"ph":"X","ts":1,"dur":2,"args":{"tts":3}}'  # a key of `args` is not an event's
    rare = b'{"ph":"X","ts":1,"dur":2,"tts":3}'
    for lines, schema in (([plain, plain], COMMON_SCHEMA), ([plain, rare], EVENT_SCHEMA)):
        batch = [msgspec.Raw(line) for line in lines]
        _, _, parsed = decode_module._read_args(b"\n".join(lines), batch, 0)
        assert parsed == schema


@pytest.mark.parametrize(
    ("ts", "dur", "rare", "float_times", "schema"),
    [
        ("1712195495519689", "3", False, False, COMMON_SCHEMA),
        ("1712195495519689.047", "3", False, True, COMMON_SCHEMA),
        ("1712195495519689", "0.5", False, True, COMMON_SCHEMA),
        ("1.7e15", "3", False, True, COMMON_SCHEMA),
        ("1712195495519689", "3", True, False, EVENT_SCHEMA),
        ("1712195495519689.047", "3", True, True, EVENT_SCHEMA),
        ("null", "null", False, False, COMMON_SCHEMA),
    ],
)
def test_each_batch_says_whether_a_time_was_written_with_a_fraction(
    ts: str, dur: str, rare: bool, float_times: bool, schema: dict[str, pl.DataType]
) -> None:
    """Integer times are read by a decoder that refuses any other number (no look at each
    event's times), fractions and exponents by the next one: both must say the same."""
    plain = b'{"ph":"X","ts":1,"dur":2,"args":{"x":1.5}}'
    extra = ',"tts":3' if rare else ""
    odd = f'{{"ph":"X","ts":{ts},"dur":{dur}{extra}}}'.encode()
    lines = [plain, odd, plain]
    batch = [msgspec.Raw(line) for line in lines]
    said, args, parsed = decode_module._read_args(b"\n".join(lines), batch, 0)
    assert (said, parsed) == (float_times, schema)
    assert args.to_list() == ['{"x":1.5}', None, '{"x":1.5}']


def test_fraction_times_in_one_batch_keep_their_exact_nanoseconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Epoch microseconds (above 2**43, where float64 keeps no three decimals): integers in
    every batch but one, whose times are written with a fraction."""
    base = 1_712_195_495_519_689
    events = _events(3 * BATCH, ts=base)
    events[BATCH + 1]["ts"] = "TS"
    events[BATCH + 1]["dur"] = "DUR"
    text = json.dumps({"traceEvents": events}, indent=1)
    text = text.replace('"TS"', f"{base}.047").replace('"DUR"', "0.001")
    monkeypatch.setattr(decode_module, "BATCH", BATCH)
    data = text.encode()
    frame = decode_stream([data[i : i + 64] for i in range(0, len(data), 64)]).events
    expected_ts = [(base + i) * 1000 for i in range(3 * BATCH)]
    expected_ts[BATCH + 1] = base * 1000 + 47
    expected_dur = [1000] * (3 * BATCH)
    expected_dur[BATCH + 1] = 1
    assert frame["ts_ns"].to_list() == expected_ts
    assert frame["dur_ns"].to_list() == expected_dur
