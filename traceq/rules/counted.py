"""Each µs saved once: a total (an `Analysis`'s, a report's) counts the time findings save
from, not their sum.

Two rules can name the same time. TQ201 (launch-bound) and TQ204 (dispatch overhead) both
save the GPU's idle gaps in a step; TQ104 (pointwise chain) and TQ203 (memcpy) can both
list one copy; TQ102 and TQ105 can share a GEMM. Summing their estimates counts those µs
twice, and a total could exceed the trace it came from.

What a finding saves from is a set of intervals on the trace's clock:

- `evidence["saves_from"] == "gpu_idle"`: the GPU's idle time inside
  `evidence["window_ns"]` ([start, end]), when none of the device's kernels, copies or
  memsets run (on `evidence["device"]` when given, else on every device);
- `evidence["saves_from"] == "gpu_idle+own"`: both, the idle time inside the window and
  the time of its own kernels (or ops): TQ207 saves the GPU's wait through `zero_grad`
  and the `add_` kernels backward then runs;
- otherwise the time of its kernels, or of its ops when it names no kernels (on a GPU
  trace a finding saves GPU time; its ops' CPU time runs while the GPU does other work,
  or idles, which is the GPU-idle findings' to count).

Attribution order: findings that save from their own kernels or ops come first (the most
specific fix), then the GPU-idle ones from the narrowest window to the widest (TQ201's
launch-bound region before TQ204's whole step); ties go to the larger estimate. Each
finding counts its estimate, at most the time of its intervals that no earlier finding
claimed, and claims that much of it, spread evenly over those free intervals (where in
its kernels a fusion saves its 5 µs the trace cannot say). So the counted total never
exceeds the union of the intervals, which lies inside the trace. A finding that names no
events (a plugin's) counts its estimate, up to the trace time not yet claimed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from traceq.rules.finding import Finding
    from traceq.trace import Trace

Intervals = tuple[np.ndarray, np.ndarray]  # disjoint, sorted: starts, ends (ns)
EMPTY: Intervals = (np.zeros(0, np.int64), np.zeros(0, np.int64))


def counted_savings(findings: list[Finding], trace: Trace) -> list[float]:
    """Per finding (in the given order), the µs of its estimate the report's total counts."""
    if not findings:
        return []
    clock = _Clock(trace)
    claims = [clock.claim(f) for f in findings]
    order = sorted(
        range(len(findings)),
        key=lambda i: (claims[i][0], claims[i][1], -findings[i].est_saving_us, i),
    )
    counted = [0.0] * len(findings)
    claimed = EMPTY
    for i in order:
        estimate = max(0.0, findings[i].est_saving_us)
        intervals = claims[i][2]
        if intervals is None:  # names no events: bounded by the trace time still free
            free_us = max(0.0, clock.duration_ns - _length(claimed)) / 1000
            counted[i] = min(estimate, free_us)
            continue
        free = _difference(intervals, claimed)
        free_ns = _length(free)
        if free_ns <= 0:
            continue
        counted[i] = min(estimate, free_ns / 1000)
        if counted[i] <= 0:
            continue  # a finding that saves nothing (TQ303's) claims nothing
        # Claim as much as was counted, spread evenly over the free time.
        share = counted[i] * 1000 / free_ns
        taken = (free[0], free[0] + np.ceil((free[1] - free[0]) * share).astype(np.int64))
        claimed = _insert(claimed, taken)
    return counted


class _Clock:
    """Event times and GPU busy intervals of one trace, looked up by the claims."""

    def __init__(self, trace: Trace) -> None:
        events = trace.events.select("event", "ts_ns", "dur_ns").drop_nulls("ts_ns")
        size = int(events["event"].max() or 0) + 1 if events.height else 0
        self.start = np.zeros(size, np.int64)
        self.end = np.zeros(size, np.int64)
        ids = events["event"].to_numpy().astype(np.int64)
        self.start[ids] = events["ts_ns"].to_numpy()
        self.end[ids] = self.start[ids] + events["dur_ns"].fill_null(0).to_numpy()
        self.known = np.zeros(size, bool)
        self.known[ids] = True
        self.duration_ns = int(trace.duration_ns or 0)
        self._kernels = trace.kernels.select("device", "ts_ns", "end_ns").drop_nulls(
            ["ts_ns", "end_ns"]
        )
        self._busy: dict[object, Intervals] = {}

    def claim(self, finding: Finding) -> tuple[int, int, Intervals | None]:
        """(order class, window width, intervals) of what `finding` saves from."""
        evidence = finding.evidence or {}
        window = evidence.get("window_ns")
        saves_from = evidence.get("saves_from")
        own = self.own(finding)
        if saves_from in ("gpu_idle", "gpu_idle+own") and window:
            start, end = int(window[0]), int(window[1])
            idle = self.idle(start, end, evidence.get("device"))
            if saves_from == "gpu_idle+own" and own is not None:
                idle = _merge(np.concatenate([idle[0], own[0]]), np.concatenate([idle[1], own[1]]))
            return 1, end - start, idle
        return 0, 0, own

    def own(self, finding: Finding) -> Intervals | None:
        """The time of a finding's kernels (of its ops when it names no kernels); None when
        it names no known event."""
        ids = np.asarray(finding.kernels or finding.ops, dtype=np.int64)
        ids = ids[(ids >= 0) & (ids < len(self.known))]
        ids = ids[self.known[ids]]
        if ids.size == 0:
            return None
        return _merge(self.start[ids], self.end[ids])

    def busy(self, device: object) -> Intervals:
        if device not in self._busy:
            kernels = self._kernels
            if device is not None:
                kernels = kernels.filter(pl.col("device") == device)
            self._busy[device] = _merge(
                kernels["ts_ns"].to_numpy().astype(np.int64),
                kernels["end_ns"].to_numpy().astype(np.int64),
            )
        return self._busy[device]

    def idle(self, start: int, end: int, device: object) -> Intervals:
        """[start, end] less the device's busy intervals."""
        starts, ends = self.busy(device)
        inside = (ends > start) & (starts < end)
        s, e = np.clip(starts[inside], start, end), np.clip(ends[inside], start, end)
        gap_starts = np.concatenate([[start], e])
        gap_ends = np.concatenate([s, [end]])
        keep = gap_ends > gap_starts
        return gap_starts[keep].astype(np.int64), gap_ends[keep].astype(np.int64)


def _merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """The union of intervals as disjoint, sorted ones (empty ones dropped)."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    breaks = np.flatnonzero(starts[1:] > reach[:-1]) + 1
    first = np.concatenate([[0], breaks])
    last = np.concatenate([breaks - 1, [starts.size - 1]])
    return starts[first], reach[last]


def _length(intervals: Intervals) -> int:
    return int((intervals[1] - intervals[0]).sum())


def _insert(b: Intervals, pieces: Intervals) -> Intervals:
    """b with `pieces` (disjoint from b, sorted) added: still disjoint and sorted, without
    re-sorting all of b. Empty pieces are dropped: a zero-length interval beside a claimed
    one would leave two equal endpoints, which `_inside` cannot order."""
    wide = pieces[1] > pieces[0]
    pieces = (pieces[0][wide], pieces[1][wide])
    at = np.searchsorted(b[0], pieces[0])
    return np.insert(b[0], at, pieces[0]), np.insert(b[1], at, pieces[1])


def _difference(a: Intervals, b: Intervals) -> Intervals:
    """a less b, both disjoint and sorted: the elementary segments between all their
    endpoints that lie in a and not in b (only b's intervals within a's hull matter)."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    lo = np.searchsorted(b[1], a[0][0], side="right")
    hi = np.searchsorted(b[0], a[1][-1], side="left")
    b = (b[0][lo:hi], b[1][lo:hi])
    if b[0].size == 0:
        return a
    cuts = np.unique(np.concatenate([a[0], a[1], b[0], b[1]]))
    starts, ends = cuts[:-1], cuts[1:]
    keep = _inside(starts, a) & ~_inside(starts, b)
    return _merge(starts[keep], ends[keep])


def _inside(points: np.ndarray, intervals: Intervals) -> np.ndarray:
    """Whether each point lies in one of the (half-open) intervals."""
    i = np.searchsorted(intervals[0], points, side="right") - 1
    j = np.clip(i, 0, None)
    return (i >= 0) & (points < intervals[1][j])
