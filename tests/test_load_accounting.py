"""Event accounting: every entry of `traceEvents` lands in exactly one place, none is lost.

Each check compares traceq with an independent count made by the stdlib `json` module over
the same file, using conftest's category table (`frame_of`: the loader's documented contract,
restated there rather than imported so that a change to the loader cannot silently move the
target).

Traces: the project's own `fixtures/` and every Kineto trace in `../shared/traces/`
(skipped when that folder is absent). Sources and licenses of the shared traces, per
`../shared/traces/INDEX.md`: HolisticTraceAnalysis test data (facebookresearch, MIT),
kineto tb_plugin samples (pytorch/kineto, BSD-3), PARAM et_replay inputs (facebookresearch,
MIT), TraceLens test traces (AMD-AGI, MIT), DeepView.Profile (CentML, Apache-2.0).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import PARTITION, assert_partition, frame_of
from traceq.cli.main import main

import traceq

if TYPE_CHECKING:
    from conftest import TraceCase

KERNEL_KINDS = {"kernel": "kernel", "mtia_ccp_events": "kernel"}
STEP = re.compile(r"^ProfilerStep#(\d+)$")
# Host calls that launch GPU work (CUDA, HIP): the ones that should each have an activity.
LAUNCH = re.compile(
    r"(?i)^(cuda|cu|hip|hipext)(\w*Launch\w*Kernel\w*|Memcpy\w*Async|Memset\w*Async)"
)


def args(event: dict[str, Any]) -> dict[str, Any]:
    return event.get("args") or {}


def int_or_none(value: Any) -> int | None:
    """Kineto writes ids as ints (and `stream 7`-style text in the 2021 schema)."""
    if value is None:
        return None
    match = re.search(r"-?\d+$", str(value).strip())
    return int(match.group()) if match else None


def expected_unlinked(raw: list[dict[str, Any]]) -> dict[str, int]:
    """What could not be linked, computed from the raw events alone."""
    frames = [frame_of(e) for e in raw]
    runtime_corr = {
        int_or_none(args(e).get("correlation"))
        for e, f in zip(raw, frames, strict=True)
        if f == "runtime"
    }
    runtime_corr.discard(None)
    gpu = [e for e, f in zip(raw, frames, strict=True) if f == "kernels"]
    gpu_corr = {int_or_none(args(e).get("correlation")) for e in gpu}
    launches = {
        int_or_none(args(e).get("correlation"))
        for e, f in zip(raw, frames, strict=True)
        if f == "runtime" and LAUNCH.match(str(e.get("name")))
    }
    launches.discard(None)
    points: dict[tuple[str, str], set[str]] = {}
    for e in raw:
        if e.get("ph") in ("s", "f"):
            points.setdefault((str(e.get("cat")), str(e.get("id"))), set()).add(e["ph"])
    counts = {
        "kernels_without_launch": sum(
            int_or_none(args(e).get("correlation")) not in runtime_corr for e in gpu
        ),
        "launches_without_kernel": len(launches - gpu_corr),
        "flows_without_end": sum("f" not in phases for phases in points.values()),
        "flows_without_start": sum("s" not in phases for phases in points.values()),
        "events_not_modeled": frames.count("other"),
    }
    return {k: v for k, v in counts.items() if v}


def test_events_has_one_row_per_trace_event_in_order(kineto_case: TraceCase) -> None:
    raw, events = kineto_case.raw_events, kineto_case.trace.events
    assert events.height == len(raw)
    assert events["event"].to_list() == list(range(len(raw)))
    assert events["ph"].to_list() == [e.get("ph") for e in raw]
    assert events["cat"].to_list() == [e.get("cat") for e in raw]
    assert events["name"].to_list() == [e.get("name") for e in raw]


def test_each_frame_holds_exactly_the_events_of_its_categories(kineto_case: TraceCase) -> None:
    assert_partition(kineto_case.trace, kineto_case.raw_events)


def test_partition_loses_no_event_and_counts_none_twice(kineto_case: TraceCase) -> None:
    trace = kineto_case.trace
    ids = pl.concat([trace.frames[name]["event"] for name in PARTITION])
    assert ids.len() == len(kineto_case.raw_events)
    assert ids.n_unique() == ids.len()


def test_steps_are_the_distinct_profiler_step_numbers(kineto_case: TraceCase) -> None:
    numbers = {
        int(match.group(1))
        for e in kineto_case.raw_events
        if e.get("ph") == "X"
        and e.get("cat") != "gpu_user_annotation"
        and (match := STEP.match(str(e.get("name"))))
    }
    assert kineto_case.trace.steps["step"].to_list() == sorted(numbers)


def test_unlinked_counts_match_an_independent_count(kineto_case: TraceCase) -> None:
    found = dict(kineto_case.trace.unlinked)
    found.pop("kernels_without_op", None)  # needs time nesting: checked in test_load_linking
    assert found == expected_unlinked(kineto_case.raw_events)


def test_info_json_matches_independent_counts(kineto_case: TraceCase) -> None:
    raw = kineto_case.raw_events
    result = CliRunner().invoke(main, ["info", str(kineto_case.path), "--format", "json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)

    frames = [frame_of(e) for e in raw]
    gpu = [e for e, f in zip(raw, frames, strict=True) if f == "kernels"]
    timed = [e for e in raw if e.get("ph") != "M" and "ts" in e]
    start = min(Decimal(str(e["ts"])) for e in timed)
    end = max(Decimal(str(e["ts"])) + Decimal(str(e.get("dur", 0))) for e in timed)
    by_category = Counter(e.get("cat") or f"ph:{e.get('ph')}" for e in raw)
    devices = {int_or_none(args(e)["device"] if "device" in args(e) else e.get("pid")) for e in gpu}
    expected_kernels = sum(str(e.get("cat")).lower() in KERNEL_KINDS for e in gpu)
    assert info["events"] == len(raw)
    assert info["by_category"] == dict(by_category)
    assert info["ops"] == frames.count("ops")
    assert info["kernels"] == expected_kernels
    assert len(info["steps"]) == len(kineto_case.trace.steps)
    assert {d["device"] for d in info["devices"]} == devices
    assert info["duration_us"] == float(round(end - start, 3))
    expected = expected_unlinked(raw)
    assert {k: v for k, v in info["unlinked"].items() if k != "kernels_without_op"} == expected
    cats = set(by_category)
    if cats & {"cpu_op", "kernel", "cuda_runtime"}:
        assert info["schema"] == "kineto"
    elif cats & {"Operator", "Kernel", "Runtime"}:
        assert info["schema"] == "kineto-2021"


@pytest.mark.shared
@pytest.mark.parametrize(
    "relpath",
    [
        "hta/tests/data/execution_trace/benchmark_simple_add_et.json.gz",
        "param/et_replay/tests/inputs/linear_et.json.gz",
    ],
)
def test_execution_trace_is_not_a_kineto_trace(
    relpath: str, shared_trace: Callable[[str], Path]
) -> None:
    with pytest.raises(traceq.TraceFormatError, match="no 'traceEvents'") as exc:
        traceq.load(shared_trace(relpath))
    assert "\n" not in str(exc.value)
