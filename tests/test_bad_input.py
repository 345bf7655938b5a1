"""Bad input fails with the right `TraceError` subclass and one line a user can act on.

Every case is checked twice: `traceq.load` raises the named subclass with a one-line
message that says what is wrong, and `traceq info BAD` exits 2 with exactly one line on
stderr, `traceq: error: ...`, and no traceback. Recoverable oddities (a kernel with no
launch, a flow with one end, an unknown category) load and are counted instead.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

import traceq
from traceq import TraceFileError, TraceFormatError, TraceSchemaError, TraceTooLargeError

Maker = Callable[[Path], Path]


def event(**fields: Any) -> dict[str, Any]:
    base = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5}
    return {k: v for k, v in {**base, **fields}.items() if v is not ...}


def trace_json(*events: Any) -> bytes:
    return json.dumps({"schemaVersion": 1, "traceEvents": list(events)}).encode()


GOOD = trace_json(event(), event(ts=11, dur=1))
NESTED_60K = b'{"a": ' * 60_000 + b"1" + b"}" * 60_000


def write(data: bytes, name: str = "bad.json") -> Maker:
    def make(tmp: Path) -> Path:
        path = tmp / name
        path.write_bytes(data)
        return path

    return make


def corrupt_gzip() -> bytes:
    packed = bytearray(gzip.compress(GOOD * 20))
    packed[len(packed) // 2 : len(packed) // 2 + 8] = b"\xff" * 8
    return bytes(packed)


def zero_bomb(tmp: Path, gib: int = 2) -> Path:
    """`gib` GiB of zeros, gzipped: one 1 MiB member written 1024*gib times (gzip allows
    concatenated members), so the file is made without ever holding the expansion."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = packer.compress(bytes(1 << 20)) + packer.flush()
    path = tmp / "bomb.json.gz"
    with path.open("wb") as f:
        for _ in range(1024 * gib):
            f.write(member)
    return path


def directory(tmp: Path) -> Path:
    (tmp / "a_dir").mkdir()
    return tmp / "a_dir"


CASES: dict[str, tuple[Maker, type[traceq.TraceError], str]] = {
    "truncated gzip": (
        write(gzip.compress(GOOD)[:-12], "t.json.gz"),
        TraceFileError,
        "truncated gzip",
    ),
    "corrupt gzip": (write(corrupt_gzip(), "c.json.gz"), TraceFileError, "corrupt gzip"),
    "truncated JSON": (write(GOOD[:-7]), TraceFormatError, "truncated JSON"),
    "empty file": (write(b""), TraceFileError, "empty file"),
    "whitespace only": (write(b"  \n\t\r\n "), TraceFileError, "empty file"),
    "empty gzip": (write(gzip.compress(b""), "e.json.gz"), TraceFileError, "empty"),
    "object without traceEvents": (write(b'{"a": 1}'), TraceFormatError, "no 'traceEvents'"),
    "execution trace": (
        write(b'{"schema": "1.0.1", "pid": 7, "nodes": [], "start_ts": 0, "finish_ts": 1}'),
        TraceFormatError,
        "no 'traceEvents'",
    ),
    "JSON string": (write(b'"trace"'), TraceFormatError, "is a string"),
    "JSON number": (write(b"42"), TraceFormatError, "is a number"),
    "not JSON": (write(b"hello world"), TraceFormatError, "not valid JSON"),
    "gzip of text": (write(gzip.compress(b"hello"), "h.json.gz"), TraceFormatError, "not valid"),
    "traceEvents an object": (
        write(b'{"traceEvents": {"ph": "X"}}'),
        TraceSchemaError,
        "'traceEvents' is an object, not an array",
    ),
    "event a number": (
        write(trace_json(event(), 7)),
        TraceSchemaError,
        "event 1 is a number, not a JSON object",
    ),
    "event a list": (
        write(trace_json([event()])),
        TraceSchemaError,
        "event 0 is an array, not a JSON object",
    ),
    "ts a string": (
        write(trace_json(event(ts="10"))),
        TraceSchemaError,
        "event 0: 'ts' is a string, not a number or null",
    ),
    "dur a list": (
        write(trace_json(event(dur=[5]))),
        TraceSchemaError,
        "event 0: 'dur' is an array, not a number or null",
    ),
    "name a number": (
        write(trace_json(event(), event(name=3))),
        TraceSchemaError,
        "event 1: 'name' is a number, not a string or null",
    ),
    "pid an object": (
        write(trace_json(event(pid={"a": 1}))),
        TraceSchemaError,
        "'pid' is an object, not an integer, a string or null",
    ),
    "args a string": (
        write(trace_json(event(args="x=1"))),
        TraceSchemaError,
        "'args' that is not an object",
    ),
    "control character in name": (
        write(trace_json(event(name="aten::mm\x07"))),
        TraceSchemaError,
        r"event 0 \(aten::mm\?\) has a control character in 'name'",
    ),
    # `cat` and `ph` are Categorical: their distinct values are checked, the offender named
    "control character in cat": (
        write(trace_json(event(), event(), event(cat="cpu_op\x1b"))),
        TraceSchemaError,
        r"event 2 \(aten::mm\) has a control character in 'cat'",
    ),
    "cat a number": (
        write(trace_json(event(), event(cat=5))),
        TraceSchemaError,
        "event 1: 'cat' is a number, not a string or null",
    ),
    "raw control character in a string": (
        write(GOOD.replace(b"aten::mm", b"aten::\x01mm", 1)),
        TraceFormatError,
        "control character 0x01 inside a string at byte",
    ),
    "NaN literal": (
        write(GOOD.replace(b'"dur": 5', b'"dur": NaN')),
        TraceFormatError,
        "NaN at byte",
    ),
    "Infinity literal": (
        write(GOOD.replace(b'"ts": 10', b'"ts": -Infinity')),
        TraceFormatError,
        "-Infinity at byte",
    ),
    "number out of range": (
        write(GOOD.replace(b'"ts": 10', b'"ts": 1e999')),
        TraceSchemaError,
        "out of range",
    ),
    "timestamp beyond int64 ns": (
        write(trace_json(event(ts=10**22))),
        TraceSchemaError,
        "timestamp or duration beyond",
    ),
    "negative duration": (write(trace_json(event(dur=-3))), TraceSchemaError, "negative duration"),
    "an integer of 39 digits in args": (
        write(trace_json(event(), event(args={"Input Dims": [[-(2**127) - 1]]}))),
        TraceSchemaError,
        r"event 1 holds the integer -17014118346\.\.\.105729 \(39 digits\), beyond what",
    ),
    "missing ph": (write(trace_json(event(ph=...))), TraceSchemaError, "has no 'ph'"),
    "X without dur": (write(trace_json(event(dur=...))), TraceSchemaError, "without 'dur'"),
    "X without ts": (write(trace_json(event(ts=...))), TraceSchemaError, "has no 'ts'"),
    "invalid UTF-8": (
        write(GOOD.replace(b"aten::mm", b"aten::\xff\xfe", 1)),
        TraceSchemaError,
        "UTF-8",
    ),
    "arrays nested 100k deep in traceEvents": (
        write(b'{"traceEvents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        TraceFormatError,
        r"JSON nested too deeply: 100,001 levels .* at byte 100015 ",
    ),
    "objects nested 60k deep in args": (
        write(GOOD.replace(b'"dur": 5}', b'"dur": 5, "args": ' + NESTED_60K + b"}", 1)),
        TraceFormatError,
        "JSON nested too deeply: 60,003 levels",
    ),
    "objects nested 60k deep in a top-level key": (
        write(GOOD.replace(b'"schemaVersion": 1', b'"distributedInfo": ' + NESTED_60K, 1)),
        TraceFormatError,
        "JSON nested too deeply: 60,001 levels",
    ),
    "gzip bomb": (zero_bomb, TraceTooLargeError, "gzip expands more than"),
    "a directory": (directory, TraceFileError, "is a directory"),
    "a missing file": (lambda tmp: tmp / "nope.json", TraceFileError, "no such file"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_load_raises_the_specific_error_in_one_line(case: str, tmp_path: Path) -> None:
    make, error, message = CASES[case]
    path = make(tmp_path)
    with pytest.raises(error, match=message) as raised:
        traceq.load(path)
    text = str(raised.value)
    assert "\n" not in text and text.startswith(str(path))
    assert raised.value.__cause__ is None  # no chained traceback from a library underneath


@pytest.mark.parametrize("case", list(CASES))
def test_cli_prints_one_error_line_and_exits_2(case: str, tmp_path: Path) -> None:
    make, _, message = CASES[case]
    if case == "a directory":  # the CLI reads a directory as a job of traces (docs/jobs.md)
        message = "directory holds no .json or .json.gz trace"
    path = make(tmp_path)
    result = CliRunner().invoke(main, ["info", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"traceq: error: {path}: ")
    assert re.search(message, lines[0])
    assert "Traceback" not in result.output


def test_installed_command_reports_bad_input_without_traceback(tmp_path: Path) -> None:
    path = write(GOOD[:-7])(tmp_path)
    command = Path(sys.executable).parent / "traceq"
    if not command.exists():
        pytest.skip(f"no installed traceq command beside {sys.executable}")
    run = subprocess.run(
        [str(command), "info", str(path)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.splitlines() == [
        f"traceq: error: {path}: truncated JSON: the file ends mid-way "
        "(was the profiler stopped while writing?)"
    ]


def test_size_limit_applies_to_plain_and_gzipped_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = trace_json(*(event(ts=i) for i in range(200)))
    plain = write(body)(tmp_path)
    packed = write(gzip.compress(body), "g.json.gz")(tmp_path)
    assert packed.stat().st_size < 1000 < len(body)
    for path in (plain, packed):
        with pytest.raises(TraceTooLargeError, match="TRACEQ_MAX_BYTES"):
            traceq.load(path, max_bytes=len(body) - 1)
        assert traceq.load(path, max_bytes=len(body)).events.height == 200
    monkeypatch.setenv("TRACEQ_MAX_BYTES", "1000")
    result = CliRunner().invoke(main, ["info", str(packed)])
    assert result.exit_code == 2
    assert result.stderr.startswith("traceq: error: ")
    assert "decompresses to more than 1000 bytes" in result.stderr


def test_recoverable_oddities_load_and_are_counted() -> None:
    kernel = event(cat="kernel", name="k", pid=0, tid=7, args={"correlation": 99, "device": 0})
    launch = event(cat="cuda_runtime", name="cudaLaunchKernel", args={"correlation": 5})
    orphan_flow = {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 5, "pid": 1, "tid": 1, "ts": 10}
    unknown = event(cat="not_a_category", name="mystery")
    trace = traceq.load(io.BytesIO(trace_json(event(), kernel, launch, orphan_flow, unknown)))
    assert trace.events.height == 5
    assert trace.unlinked == {
        "kernels_without_launch": 1,
        "kernels_without_op": 1,
        "launches_without_kernel": 1,
        "flows_without_end": 1,
        "events_not_modeled": 1,
    }
    assert trace.other["event"].to_list() == [4]
    assert trace.other["cat"].to_list() == ["not_a_category"]
