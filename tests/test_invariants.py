"""Invariants every analysis keeps, on every fixture and every Kineto trace in
`../shared/traces` (sources and licenses: its INDEX.md; skipped cleanly without it):

- no finding saves more than it costs (`est_saving_us <= time_us`);
- a report's total, each µs counted once, never exceeds the time it is taken from: the
  trace's span, and, for the GPU-idle savings (TQ201 launch-bound, TQ204 dispatch
  overhead), the GPU's idle time in each step;
- TQ302 never fires on latency-bound kernels (under 10 µs mean), 1-block kernels or
  communication kernels.

Times are recomputed from the raw JSON (stdlib reader, exact `Decimal`s), not from
traceq's frames.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

import pytest
from conftest import TraceCase

from traceq.analyze import analysis
from traceq.reports import build_report
from traceq.reports.model import Report

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
# Written here, apart from the rule's own pattern, from the kernels' documented names.
COMMUNICATION = re.compile(
    r"(?i)^(void )?(nccl|rccl)|ncclDevKernel|multimem_all_reduce|cross_device_reduce|allreduce"
    r"|all_reduce"
)


def ns(value: Any) -> int:
    return int(Decimal(str(value)) * 1000)


@pytest.fixture(scope="module")
def report_of() -> Any:
    cache: dict[str, Report] = {}

    def get(case: TraceCase) -> Report:
        if case.label not in cache:
            cache.clear()  # one trace at a time: kineto_case runs them in order
            cache[case.label] = build_report(analysis(case.trace), case.trace)
        return cache[case.label]

    return get


def timed(case: TraceCase) -> list[tuple[int, dict[str, Any]]]:
    return [
        (i, e)
        for i, e in enumerate(case.raw_events)
        if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e
    ]


def test_no_finding_saves_more_than_it_costs(kineto_case: TraceCase, report_of) -> None:
    report = report_of(kineto_case)
    for finding, counted in zip(report.findings, report.counted(), strict=True):
        assert finding.est_saving_us <= finding.time_us * (1 + 1e-9) + 1e-6, finding.message
        assert 0 <= counted <= finding.est_saving_us + 1e-6


def test_the_counted_total_fits_in_the_trace(kineto_case: TraceCase, report_of) -> None:
    report = report_of(kineto_case)
    events = [e for e in kineto_case.raw_events if isinstance(e, dict) and e.get("ph") != "M"]
    starts = [ns(e["ts"]) for e in events if "ts" in e]
    if not starts:
        assert report.findings == []
        return
    ends = [ns(e["ts"]) + ns(e.get("dur", 0)) for e in events if "ts" in e]
    span_us = (max(ends) - min(starts)) / 1000
    assert report.summary()["est_saving_us"] <= span_us + 1e-6


def test_gpu_idle_savings_fit_in_each_steps_idle_time(kineto_case: TraceCase, report_of) -> None:
    report = report_of(kineto_case)
    idle_savers = [
        (f, c)
        for f, c in zip(report.findings, report.counted(), strict=True)
        if f.evidence.get("saves_from") == "gpu_idle" and f.step is not None
    ]
    if not idle_savers:
        return
    events = timed(kineto_case)
    gpu = sorted(
        (ns(e["ts"]), ns(e["ts"]) + ns(e.get("dur", 0)))
        for _, e in events
        if str(e.get("cat", "")).lower() in GPU_CATS
    )
    windows = {
        int(e["name"].split("#")[1]): (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for _, e in events
        if str(e.get("name", "")).startswith("ProfilerStep#")
        and e.get("cat") in ("user_annotation", "cpu_op", "Operator")
    }
    for step in {f.step for f, _ in idle_savers}:
        start, end = windows[step]
        busy, reach = 0, start
        for s, e in gpu:
            s, e = max(s, reach), min(e, end)
            if e > s:
                busy += e - s
                reach = e
        idle_us = (end - start - busy) / 1000
        counted = sum(c for f, c in idle_savers if f.step == step)
        assert counted <= idle_us + 1e-6, f"step {step}"


def test_tq302_only_on_kernels_that_fill_few_sms_for_long(
    kineto_case: TraceCase, report_of
) -> None:
    findings = [f for f in report_of(kineto_case).findings if f.rule == "TQ302"]
    if not findings:
        return
    raw = kineto_case.raw_events
    for finding in findings:
        launches = [raw[k] for k in finding.kernels]
        mean_ns = sum(ns(e["dur"]) for e in launches) / len(launches)
        assert mean_ns >= 10_000, finding.message
        assert not any(COMMUNICATION.search(e["name"]) for e in launches), finding.message
        grids = [e.get("args", {}).get("grid") for e in launches]
        assert all(g is None or math.prod(g) > 1 for g in grids), finding.message
