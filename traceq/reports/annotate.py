"""Write a copy of a trace that shows traceq's results in Perfetto UI or chrome://tracing.

The copy keeps every original event byte for byte, except that events on the critical
path get `args.critical: true` and events a finding names get
`args.traceq_findings: ["TQ102 split-gemm-activation", ...]`. It adds flow events
(`cat: "critical_path"`) that draw the path as arrows from point to point, and one instant
marker per finding (`cat: "traceq_finding"`) at its first op, so both can be searched and
clicked in the viewer.
"""

from __future__ import annotations

import gzip
import os
from collections import defaultdict
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import polars as pl

from traceq.errors import TraceError, TraceFormatError
from traceq.loader.source import read_bytes
from traceq.relations.critical_path import Region
from traceq.relations.critical_path import critical_path as find_critical_path

if TYPE_CHECKING:
    from traceq.trace import Trace

PATH_CATEGORY = "critical_path"
FINDING_CATEGORY = "traceq_finding"
_BOM = b"\xef\xbb\xbf"
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw] | list[msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[msgspec.Raw])
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])


class Finding(Protocol):
    """What `annotate` reads from a finding (the analyzer's `Finding` has these)."""

    rule: str
    name: str
    message: str
    ops: list[int]
    kernels: list[int]


def annotate(
    trace: Trace,
    out_path: str | os.PathLike[str],
    *,
    critical_path: bool = True,
    findings: Iterable[Finding] | None = None,
    region: Region = None,
) -> Path:
    """Write the annotated copy of `trace` (read again from `trace.source`) to `out_path`
    (gzipped when it ends in `.gz`) and return its path."""
    top, events = _read(trace)
    args: dict[int, dict[str, Any]] = defaultdict(dict)
    added: list[dict[str, Any]] = []
    if critical_path:
        path = find_critical_path(trace, region)
        for event in path.critical_events:
            args[event]["critical"] = True
        added += _path_flows(path.edges, trace, events)
    for finding in findings or []:
        label = f"{finding.rule} {finding.name}"
        named = [*finding.ops, *finding.kernels]
        for event in named:
            args[event].setdefault("traceq_findings", []).append(label)
        if named:
            added.append(_marker(finding, label, trace, events))
    out = [_with_args(raw, args[i]) if i in args else raw for i, raw in enumerate(events)]
    out += [msgspec.Raw(msgspec.json.encode(event)) for event in added]
    document: Any = out if isinstance(top, list) else {**top, "traceEvents": out}
    data = msgspec.json.encode(document)
    target = Path(out_path)
    if target.suffix == ".gz":
        data = gzip.compress(data, compresslevel=6, mtime=0)
    target.write_bytes(data)
    return target


def _read(trace: Trace) -> tuple[dict[str, msgspec.Raw] | list, list[msgspec.Raw]]:
    source = Path(trace.source)
    if not source.is_file():
        raise TraceError(f"{trace.source}: annotate needs the trace file to copy from")
    data = memoryview(read_bytes(source))
    if data[:3] == _BOM:  # as the loader does: editors on Windows write one
        data = data[3:]
    try:
        top = _TOP.decode(data)
        if isinstance(top, list):
            return top, top
        return top, _EVENTS.decode(top["traceEvents"])
    except (msgspec.DecodeError, KeyError) as exc:  # the file changed since it was loaded
        raise TraceFormatError(f"{trace.source}: cannot copy the trace: {exc}") from None


def _with_args(raw: msgspec.Raw, extra: dict[str, Any]) -> msgspec.Raw:
    """The event with keys added to its `args`; every other value keeps its exact text."""
    event = _FIELDS.decode(raw)
    merged: dict[str, Any] = _FIELDS.decode(event["args"]) if "args" in event else {}
    for key, value in extra.items():
        if isinstance(value, list) and key in merged:
            value = [*msgspec.json.decode(merged[key]), *value]
        merged[key] = value
    event["args"] = msgspec.Raw(msgspec.json.encode(merged))
    return msgspec.Raw(msgspec.json.encode(event))


def _us(ns: int) -> msgspec.Raw:
    """Exact microseconds as JSON text (a float64 would round ns-resolution times)."""
    return msgspec.Raw(str(Decimal(ns) / 1000).encode())


def _where(event: int, events: list[msgspec.Raw]) -> tuple[Any, Any]:
    """The event's pid and tid, as written (numbers or strings)."""
    fields = _FIELDS.decode(events[event])
    return fields.get("pid"), fields.get("tid")


def _path_flows(
    edges: pl.DataFrame, trace: Trace, events: list[msgspec.Raw]
) -> list[dict[str, Any]]:
    """One flow (start + end event) per path edge between two different events.

    A flow point binds to the slice enclosing it on its thread, so a point at an event's
    end is placed 1 ns inside it.
    """
    spans = dict(
        pl.concat(
            [
                trace.ops.select("event", "ts_ns", "end_ns"),
                trace.runtime.select("event", "ts_ns", "end_ns"),
                trace.kernels.select("event", "ts_ns", "end_ns"),
            ]
        )
        .select(pl.col("event").cast(pl.Int64), pl.struct("ts_ns", "end_ns"))
        .iter_rows()
    )

    def point(event: int, start: bool) -> int:
        ts, end = spans[event]["ts_ns"], spans[event]["end_ns"]
        return ts if start else max(ts, end - 1)

    flows: list[dict[str, Any]] = []
    crossing = edges.filter(pl.col("src_event") != pl.col("dst_event"))
    for k, row in enumerate(crossing.iter_rows(named=True)):
        common = {"cat": PATH_CATEGORY, "name": row["type"], "id": k}
        details = {"cause": row["cause"], "weight_us": row["weight_ns"] / 1000, "critical": True}
        src_pid, src_tid = _where(row["src_event"], events)
        dst_pid, dst_tid = _where(row["dst_event"], events)
        flows.append(
            {
                **common,
                "ph": "s",
                "pid": src_pid,
                "tid": src_tid,
                "ts": _us(point(row["src_event"], row["src_start"])),
                "args": details,
            }
        )
        flows.append(
            {
                **common,
                "ph": "f",
                "bp": "e",
                "pid": dst_pid,
                "tid": dst_tid,
                "ts": _us(point(row["dst_event"], row["dst_start"])),
                "args": details,
            }
        )
    return flows


def _marker(finding: Finding, label: str, trace: Trace, events: list[msgspec.Raw]) -> dict:
    """An instant event at the start of the finding's first op (or kernel)."""
    first = (finding.ops or finding.kernels)[0]
    row = trace.events.filter(pl.col("event") == first)
    if row.height == 0:
        raise TraceError(f"finding {label} names event {first}, which is not in the trace")
    pid, tid = _where(first, events)
    return {
        "ph": "i",
        "s": "t",
        "cat": FINDING_CATEGORY,
        "name": label,
        "pid": pid,
        "tid": tid,
        "ts": _us(int(row["ts_ns"][0])),
        "args": {
            "message": finding.message,
            "ops": list(finding.ops),
            "kernels": list(finding.kernels),
        },
    }
