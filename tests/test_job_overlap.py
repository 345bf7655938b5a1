"""The overlap achievable (`hideable_comm_ns`) and TQ402's saving built on it: hand-made
intervals with known answers, a plain-Python greedy over every recorded and shared rank,
backward starts read from the raw JSON, and the recorded gloo jobs' TQ402 savings."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import polars as pl
import pytest

import traceq
from traceq.relations.breakdown import (
    BACKWARD_OP,
    backward_starts,
    hideable_comm,
    step_breakdown,
    typed_intervals,
)
from traceq.relations.collectives import step_waits

REPO = Path(__file__).resolve().parent.parent
JOBS = REPO / "fixtures" / "jobs"
HTA = REPO.parent / "shared" / "traces" / "hta" / "tests" / "data"
needs_shared = pytest.mark.skipif(not HTA.is_dir(), reason="../shared/traces is not here")

GLOO_RANKS = sorted(JOBS.glob("ddp_gloo_*/rank-*.json.gz"))
GPU_RANKS = [
    HTA / "nccl_parser_config" / "nccl_data.json.gz",
    HTA / "df_index_resolver" / "df_index_resolver.json.gz",
]


def work(rows: list[tuple[int, str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=["step", "type", "ts_ns", "end_ns"], orient="row")


def hidden(rows, backward: dict[int, int] | None = None) -> dict[int, int]:
    starts = pl.DataFrame(
        {"step": list((backward or {}).keys()), "backward_ns": list((backward or {}).values())},
        schema={"step": pl.Int64, "backward_ns": pl.Int64},
    )
    frame = hideable_comm(work(rows), starts)
    return dict(zip(frame["step"].to_list(), frame["hideable_comm_ns"].to_list(), strict=True))


def test_exposed_comm_is_hidden_only_by_idle_compute_before_it_in_its_phase():
    rows = [
        # step 1: 10 of compute, then 20 of exposed comm: 10 of it could hide.
        (1, "COMP", 0, 10), (1, "COMM", 10, 30),
        # step 2: forward compute (0-40) cannot hide the gradient allreduce (backward from
        # 50), nor can the optimizer (70-100) that follows it: 5 of backward compute can.
        (2, "COMP", 0, 40), (2, "COMP", 50, 55), (2, "COMM", 55, 70), (2, "COMP", 70, 100),
        # step 3: compute already beside comm (5-10) hides nothing more; 5 idle before does.
        (3, "COMP", 0, 10), (3, "COMM", 5, 20), (3, "MEM", 0, 20),
        # step 4: two stretches (6, then 3) share 4 + 2 of idle compute: 6 hidden in all.
        (4, "COMP", 0, 4), (4, "COMM", 4, 10), (4, "COMP", 10, 12), (4, "COMM", 12, 15),
        # step 5: communication alone: nothing to hide it.
        (5, "COMM", 0, 8),
    ]  # fmt: skip
    assert hidden(rows, {2: 50}) == {1: 10, 2: 5, 3: 5, 4: 6, 5: 0}
    assert hidden(rows)[2] == 15  # with no backward known, the whole step is one phase


def greedy(intervals, backward: int | None) -> int:
    """The same model, plainly: a sweep over the intervals' ends in time order, a compute
    budget per phase spent on exposed communication as it comes."""
    edges: dict[int, list[int]] = {}
    for kind, a, b in intervals:
        for t, sign in ((a, 1), (b, -1)):
            d = edges.setdefault(t, [0, 0])
            d[kind == "COMP"] += sign
    if backward is not None:
        edges.setdefault(backward, [0, 0])
    times = sorted(edges)
    comm = comp = total = budget = 0
    for a, b in itertools.pairwise(times):
        if a == backward:
            budget = 0  # forward compute cannot hide backward's communication
        comm, comp = comm + edges[a][0], comp + edges[a][1]
        if comp and not comm:
            budget += b - a
        elif comm and not comp:
            used = min(budget, b - a)
            total, budget = total + used, budget - used
    return total


def raw_backward_starts(path: Path) -> dict[int, int]:
    """Per ProfilerStep window, the first autograd node's start, from the raw JSON."""
    with gzip.open(path) as f:
        events = json.loads(f.read())["traceEvents"]
    ns = lambda us: round(us * 1000)  # noqa: E731
    steps = [
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), int(e["name"].split("#")[1]))
        for e in events
        if e.get("ph") == "X"
        and str(e.get("name", "")).startswith("ProfilerStep#")
        and e.get("cat") != "gpu_user_annotation"
    ]
    out: dict[int, int] = {}
    for e in events:
        if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith(BACKWARD_OP):
            t = ns(e["ts"])
            for a, b, step in steps:
                if a <= t < b:
                    out[step] = min(out.get(step, t), t)
    return out


@pytest.mark.parametrize("path", GLOO_RANKS, ids=lambda p: f"{p.parent.name}-{p.name[:6]}")
def test_gloo_ranks_backward_starts_are_the_raw_jsons(path):
    trace = traceq.load(path)
    starts = backward_starts(trace, "cpu")
    assert dict(starts.iter_rows()) == raw_backward_starts(path)
    assert starts.height == trace.steps.height  # every training step has a backward


@pytest.mark.parametrize(
    "path",
    GLOO_RANKS + [pytest.param(p, marks=needs_shared) for p in GPU_RANKS],
    ids=lambda p: f"{p.parent.name}-{p.name[:6]}",
)
def test_hideable_comm_is_the_plain_greedy(path):
    """The breakdown's `hideable_comm_ns` counts only compute independent of the collective
    (`traceq.relations.overlap`): the plain sweep below over the same intervals, with
    forward activation collectives (TP all-reduce, ...) hidden by nothing."""
    from traceq.relations.overlap import ACTIVATION_COLLECTIVES, backward_bounds, comm_kinds

    trace = traceq.load(path)
    on = "gpu" if trace.kernels.height else "cpu"
    intervals = typed_intervals(trace)
    bounds = {s: (a, b) for s, a, b in backward_bounds(trace, on).iter_rows()}
    kinds = comm_kinds(trace)
    frame = step_breakdown(trace)
    for row in frame.iter_rows(named=True):
        mine = [
            (k, a, b)
            for s, k, a, b in intervals.iter_rows()
            if s == row["step"] and k in ("COMM", "COMP")
        ]
        start, end = bounds.get(row["step"], (None, None))
        bound = [
            ("BOUND", a, b)
            for s, a, b, c in kinds.iter_rows()
            if s == row["step"] and c in ACTIVATION_COLLECTIVES and (start is None or a < start)
        ]
        assert row["hideable_comm_ns"] == independent_greedy(mine + bound, start, end)
        assert 0 <= row["hideable_comm_ns"] <= row["exposed_comm_ns"]


def independent_greedy(intervals, start: int | None, end: int | None) -> int:
    """Forward (before `start`): a budget of free compute spent on later exposed
    communication, in time order. Backward (from `start`): the same in reverse time order,
    compute counted only before `end` (after it the optimizer consumes the reduction).
    Exposed time beside a BOUND (forward activation) collective is never hidden."""
    edges: dict[int, list[int]] = {}
    for kind, a, b in intervals:
        for t, sign in ((a, 1), (b, -1)):
            d = edges.setdefault(t, [0, 0, 0])
            d[{"COMM": 0, "COMP": 1, "BOUND": 2}[kind]] += sign
    for t in (start, end):
        if t is not None:
            edges.setdefault(t, [0, 0, 0])
    times = sorted(edges)
    segments, state = [], [0, 0, 0]
    for a, b in itertools.pairwise(times):
        state = [x + d for x, d in zip(state, edges[a], strict=True)]
        segments.append((a, b, *state))
    forward = [s for s in segments if start is None or s[0] < start]
    backward = [s for s in reversed(segments) if start is not None and s[0] >= start]

    def sweep(segs) -> int:
        total = budget = 0
        for a, b, comm, comp, bound in segs:
            if comp and not comm and (end is None or start is None or a < end or a < start):
                budget += b - a
            elif comm and not comp and not bound:
                used = min(budget, b - a)
                total, budget = total + used, budget - used
        return total

    return sweep(forward) + sweep(backward)


@pytest.mark.parametrize("name", ["ddp_gloo_slow2", "ddp_gloo_balanced"])
def test_tq402_saving_is_the_overlap_achievable_not_all_compute(name):
    job = traceq.load_job(JOBS / name, engine="serial")
    findings = traceq.analyze_job(job, select=["TQ402"]).findings
    # DDP's all-reduces follow the backward that produced their gradients, and the optimizer
    # consumes them: no independent compute is left to hide them (tests/test_rules_precision).
    assert findings == [], f"{name}: no overlap is achievable"
    frames = job.frames
    waits = step_waits(frames.collectives).group_by("rank", "step").agg(pl.col("wait_ns").sum())
    steps = frames.breakdown.join(waits, on=["rank", "step"], how="left").fill_null(0)
    for finding in findings:
        mine = steps.filter(pl.col("rank") == finding.evidence["rank"])
        room = (pl.col("exposed_comm_ns") - pl.col("wait_ns")).clip(lower_bound=0)
        achievable = mine.select(pl.min_horizontal(room, "hideable_comm_ns").sum()).item()
        upper = mine.select(pl.min_horizontal(room, "compute_ns").sum()).item()  # the old one
        assert finding.est_saving_us == pytest.approx(achievable / 1e3)
        assert finding.evidence["hideable_us"] == pytest.approx(
            mine["hideable_comm_ns"].sum() / 1e3
        )
        assert finding.est_saving_us < upper / 1e3  # forward and optimizer compute excluded
