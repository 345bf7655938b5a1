"""Baselines: a `Summary` as compact, versioned JSON, small enough to commit next to tests.

A baseline keeps per-step samples of every kernel, op and module group (what the noise
test needs), the op → kernel dispatch table, the findings, and whitelisted metadata
(device names, vendor, dtype, stack versions). It never holds the trace's free-form
metadata (host and user names, environment, job names), nor the trace's file name (the
profiler names files after the host), and it is plain JSON, never a pickle. `load_baseline`
checks the version and the shape of every field, so a damaged or foreign file fails with
a `BaselineError` that says what is wrong instead of a KeyError deep inside a check.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import textwrap
import zlib
from pathlib import Path
from typing import IO, Any

import polars as pl

from traceq.loader.decode import JSON_TYPES, json_type
from traceq.regression.dispatch import IMPL_SCHEMA, IMPL_SEP
from traceq.regression.errors import BaselineError
from traceq.regression.groups import DIMENSIONS, GROUP_SCHEMA, OP_TOTAL
from traceq.regression.summary import Summary, summarize
from traceq.trace import Trace
from traceq.version import __version__

VERSION_KEY = "traceq_baseline"
# 2 added the `op_total` groups (every op at any depth); a version 1 baseline still reads,
# and its op metrics fall back to the outermost-op groups (`check.op_dimension`).
# 3 stores each finding compact (`compact_finding`: its identity and numbers, no evidence,
# message or fix); a version 1 or 2 baseline's whole findings still read.
VERSION = 3
READABLE = (1, 2, 3)
FINDING_FIELDS = ("rule", "name", "severity", "step", "module", "time_us", "est_saving_us")
STORED = (*DIMENSIONS, OP_TOTAL)
MAX_BYTES = 256 << 20  # a baseline is kilobytes; refuse to inflate a mislabelled trace
BASES = ("gpu", "cpu")


def to_json(summary: Summary) -> dict[str, Any]:
    """The baseline document of a summary (plain JSON types only)."""
    return {
        VERSION_KEY: VERSION,
        "traceq_version": __version__,
        "basis": summary.basis,
        "metadata": summary.metadata,
        "steps": {
            "ids": summary.steps,
            "wall_ns": summary.step_wall_ns,
            "time_ns": summary.step_time_ns,
        },
        "total_wall_ns": summary.total_wall_ns,
        "groups": {dim: _groups_json(summary, dim) for dim in STORED},
        "dispatch": _dispatch_json(summary.dispatch),
        "findings": (
            None if summary.findings is None else [compact_finding(f) for f in summary.findings]
        ),
    }


def compact_finding(finding: dict[str, Any]) -> dict[str, Any]:
    """What a baseline keeps of a finding (`Finding.to_dict()`): what `check` and `diff`
    match it by (`identity`: `diff.finding_identity`, computed once here from the evidence
    it needs) and its numbers; not its evidence, message, model or fix, which are most of a
    finding's bytes and come back from the trace when wanted."""
    if "identity" in finding:  # already compact (a summary read from a baseline)
        return finding
    from traceq.regression.diff import finding_identity
    from traceq.rules.finding import Finding

    kept = {k: finding.get(k) for k in FINDING_FIELDS}
    for k in ("time_us", "est_saving_us"):
        kept[k] = round(float(kept[k] or 0.0), 3)
    return {**kept, "identity": finding_identity(Finding.from_dict(finding))}


def _dispatch_json(dispatch: pl.DataFrame) -> dict[str, Any]:
    """Kernel names are long and shared by many ops: store each once, and refer by index."""
    rows = dispatch.to_dicts()
    names: dict[str, int] = {}
    for row in rows:
        row["impl"] = [names.setdefault(n, len(names)) for n in row["impl"].split(IMPL_SEP)]
    return {"names": list(names), "ops": rows}


def _groups_json(summary: Summary, dim: str) -> dict[str, dict[str, Any]]:
    """Per group: per-step count and time (aligned with `steps.ids`) and whole-trace totals."""
    names = summary.group_names(dim)
    if not names:
        return {}
    totals = summary.totals(dim)
    total = dict(
        zip(totals["group"], zip(totals["count"], totals["time_ns"], strict=True), strict=True)
    )
    out: dict[str, dict[str, Any]] = {}
    if summary.has_steps:
        times = summary.samples(dim, names).astype(int).tolist()
        counts = summary.samples(dim, names, "count").astype(int).tolist()
    else:
        times = counts = [[] for _ in names]
    for name, t, c in zip(names, times, counts, strict=True):
        out[name] = {
            "count": c,
            "time_ns": t,
            "total_count": int(total[name][0]),
            "total_ns": int(total[name][1]),
        }
    return out


def dumps(document: dict[str, Any]) -> str:
    """JSON with one line per group, dispatch row, kernel name and finding: small, and a
    `git diff` of two baselines reads group by group."""

    def line(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))

    def block(items: list[str], open_: str, close: str) -> str:
        if not items:
            return open_ + close
        body = textwrap.indent(",\n".join(items), "  ")
        return f"{open_}\n{body}\n{close}"

    parts = []
    for key, value in document.items():
        if key == "groups":
            dims = [
                f"{line(dim)}: " + block([f"{line(n)}: {line(e)}" for n, e in m.items()], "{", "}")
                for dim, m in value.items()
            ]
            text = block(dims, "{", "}")
        elif key == "dispatch":
            names = block([line(n) for n in value["names"]], "[", "]")
            ops = block([line(r) for r in value["ops"]], "[", "]")
            text = block([f'"names": {names}', f'"ops": {ops}'], "{", "}")
        elif key == "findings" and value:
            text = block([line(f) for f in value], "[", "]")
        else:
            text = line(value)
        parts.append(f"{line(key)}: {text}")
    return block(parts, "{", "}")


def save_baseline(
    source: Trace | Summary, path: str | os.PathLike[str], findings: bool | None = None
) -> Summary:
    """Write the baseline of a trace (or summary) to `path` (gzip-compressed when the name
    ends in `.gz`: traces with many long kernel names give baselines of a few 100 kB)."""
    summary = source if isinstance(source, Summary) else summarize(source, findings=findings)
    data = (dumps(to_json(summary)) + "\n").encode("utf-8")
    if os.fspath(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)  # no timestamp: same summary, same bytes
    Path(path).write_bytes(data)
    return summary


def _open(path: str | os.PathLike[str]) -> IO[bytes]:
    """The file, decompressed on the fly when it is gzip (the caller closes it)."""
    with open(path, "rb") as f:
        compressed = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if compressed else open(path, "rb")


def read_head(path: str | os.PathLike[str], size: int = 256) -> bytes | None:
    """The first `size` bytes of the file, decompressed when it is gzip (only those are
    inflated, so a 2 GB trace is never read twice); None when they cannot be read (a missing
    file, a gzip corrupt or cut short there): then it is no baseline, and the loader says
    what is wrong with the file."""
    try:
        with _open(path) as f:
            return f.read(size)
    except (OSError, EOFError, zlib.error):
        return None


def is_baseline_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` starts like a baseline (checked on its first bytes)."""
    head = read_head(path)
    return (
        head is not None
        and re.match(rb'\s*\{\s*"' + VERSION_KEY.encode() + rb'"', head) is not None
    )


def load_baseline(path: str | os.PathLike[str]) -> Summary:
    """Read a baseline file; raises `BaselineError` on anything traceq did not write."""
    name = os.fspath(path)
    try:
        with _open(path) as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise BaselineError(f"larger than {MAX_BYTES >> 20} MiB: not a baseline", source=name)
        text = raw.decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise BaselineError(f"cannot read baseline: {exc}", source=name) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"not JSON ({exc})", source=name) from None
    try:
        return from_json(document, source=name)
    except BaselineError as exc:
        raise BaselineError(str(exc), source=name) from None


def from_json(document: Any, source: str = "") -> Summary:
    """A `Summary` from a baseline document, after checking its version and fields."""
    if not isinstance(document, dict) or VERSION_KEY not in document:
        raise BaselineError(f"not a traceq baseline (no {VERSION_KEY!r} field)")
    version = document[VERSION_KEY]
    if not isinstance(version, int) or isinstance(version, bool):
        raise BaselineError(f"{VERSION_KEY} must be an integer, not {version!r}")
    if version not in READABLE:
        newer = " (written by a newer traceq: upgrade)" if version > VERSION else ""
        raise BaselineError(
            f"baseline version {version} is not supported; this traceq reads versions "
            f"{', '.join(map(str, READABLE))}{newer}"
        )
    basis = _field(document, "basis", str)
    if basis not in BASES:
        raise BaselineError(f"basis must be one of {BASES}, not {basis!r}")
    steps = _field(document, "steps", dict)
    ids = _int_list(steps, "ids", "steps")
    wall = _int_list(steps, "wall_ns", "steps")
    times = _int_list(steps, "time_ns", "steps")
    if not len(ids) == len(wall) == len(times):
        raise BaselineError("steps.ids, steps.wall_ns and steps.time_ns differ in length")
    groups = _field(document, "groups", dict)
    metadata = _field(document, "metadata", dict)
    findings = document.get("findings")
    if findings is not None and not (
        isinstance(findings, list) and all(isinstance(f, dict) and "rule" in f for f in findings)
    ):
        raise BaselineError("findings must be null or an array of findings")
    return Summary(
        basis=basis,
        steps=ids,
        step_wall_ns=wall,
        step_time_ns=times,
        total_wall_ns=_int(document.get("total_wall_ns", sum(wall)), "total_wall_ns"),
        groups=_groups_frame(groups, ids),
        dispatch=_dispatch_frame(document.get("dispatch", {"names": [], "ops": []})),
        metadata=metadata,
        findings=findings,
        source=source,
    )


def _groups_frame(groups: dict[str, Any], steps: list[int]) -> pl.DataFrame:
    """The long (dim, group, step, count, time_ns) frame back from per-group arrays; time
    outside the steps comes back as the total minus the steps' sum, on a null step."""
    rows: dict[str, list[Any]] = {k: [] for k in GROUP_SCHEMA}

    def add(dim: str, name: str, step: int | None, count: int, time_ns: int) -> None:
        for key, value in zip(GROUP_SCHEMA, (dim, name, step, count, time_ns), strict=True):
            rows[key].append(value)

    for dim, members in groups.items():
        if dim not in STORED or not isinstance(members, dict):
            raise BaselineError(f"groups.{dim}: unknown dimension or not an object")
        for name, entry in members.items():
            where = f"groups.{dim}[{name!r}]"
            if not isinstance(entry, dict):
                raise BaselineError(f"{where} is not an object")
            counts = _int_list(entry, "count", where)
            times = _int_list(entry, "time_ns", where)
            if len(counts) != len(steps) or len(times) != len(steps):
                raise BaselineError(f"{where}: count/time_ns must hold one value per step")
            total_count = _int(entry.get("total_count", sum(counts)), f"{where}.total_count")
            total_ns = _int(entry.get("total_ns", sum(times)), f"{where}.total_ns")
            for step, count, time_ns in zip(steps, counts, times, strict=True):
                if count or time_ns:
                    add(dim, name, step, count, time_ns)
            outside = (total_count - sum(counts), total_ns - sum(times))
            if outside != (0, 0):
                add(dim, name, None, *outside)
    return pl.DataFrame(rows, schema=GROUP_SCHEMA)


def _dispatch_frame(dispatch: Any) -> pl.DataFrame:
    if not isinstance(dispatch, dict):
        raise BaselineError("dispatch must be an object with 'names' and 'ops'")
    names, entries = dispatch.get("names"), dispatch.get("ops")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BaselineError("dispatch.names must be an array of kernel names")
    if not isinstance(entries, list):
        raise BaselineError("dispatch.ops must be an array")
    rows = []
    for i, entry in enumerate(entries):
        impl = entry.get("impl") if isinstance(entry, dict) else None
        if not isinstance(impl, list) or not all(
            isinstance(k, int) and 0 <= k < len(names) for k in impl
        ):
            raise BaselineError(f"dispatch.ops[{i}] needs an 'impl' array of indices into names")
        rows.append({**entry, "impl": IMPL_SEP.join(names[k] for k in impl)})
    try:
        return pl.DataFrame(rows, schema=IMPL_SCHEMA) if rows else pl.DataFrame(schema=IMPL_SCHEMA)
    except (TypeError, pl.exceptions.PolarsError) as exc:
        raise BaselineError(f"dispatch: {exc}") from None


def _field(document: dict[str, Any], key: str, kind: type) -> Any:
    if key not in document:
        raise BaselineError(f"missing field {key!r}")
    value = document[key]
    if not isinstance(value, kind):
        raise BaselineError(f"{key} must be {JSON_TYPES[kind]}, not {json_type(value)}")
    return value


def _int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BaselineError(f"{where} must be an integer, not {value!r}")
    return value


def _int_list(container: dict[str, Any], key: str, where: str) -> list[int]:
    value = container.get(key)
    if not isinstance(value, list):
        raise BaselineError(f"{where}.{key} must be an array of integers")
    return [_int(v, f"{where}.{key}") for v in value]


def load_summary(
    path: str | os.PathLike[str], findings: bool | None = None, cache: bool | None = None
) -> Summary:
    """A baseline file or a full trace, whichever `path` holds, as a `Summary` (`cache` as
    `traceq.load`'s)."""
    if is_baseline_file(path):
        return load_baseline(path)
    from traceq.pipeline import load

    return summarize(load(path, cache=cache), findings=findings)
