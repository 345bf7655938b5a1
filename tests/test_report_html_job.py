"""The job section of `traceq report DIR`: the numbers its charts draw, recomputed from the
raw JSON of each rank (plain Python over the decoded events, not the Job code path).

Jobs: the recorded gloo DDP job `fixtures/jobs/ddp_gloo_slow2` (4 CPU ranks, rank 2 sleeps
40 ms in its forward), HTA's sampled two-rank NCCL job `trace_filter`, and a two-rank NCCL
job made from HTA's `nccl_parser_config` rank, whose collectives carry message sizes
(facebookresearch/HolisticTraceAnalysis, MIT).
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

import traceq

pytest.importorskip("plotly", reason="HTML reports need plotly (the report extra)")

ROOT = Path(__file__).resolve().parent.parent
SLOW = ROOT / "fixtures" / "jobs" / "ddp_gloo_slow2"
HTA = "hta/tests/data"


def ns(value: object) -> int:
    return int(Decimal(str(value)) * 1000)


def events(path: Path) -> list[dict]:
    with gzip.open(path, "rb") as f:
        return json.load(f)["traceEvents"]


def union(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for s, e in sorted(intervals):
        if reach is None or s > reach:
            total, reach = total + e - s, e
        elif e > reach:
            total, reach = total + e - reach, e
    return total


def figure_specs(text: str) -> list[dict]:
    blocks = re.findall(
        r'<script type="application/json" class="figure"[^>]*>(.*?)</script>', text, re.S
    )
    return [json.loads(b.replace("<\\/", "</")) for b in blocks]


def job_section(text: str) -> str:
    return text[text.index('<section id="job">') : text.index('<section id="findings">')]


def spec_titled(specs: list[dict], ytitle: str) -> dict:
    return next(
        s for s in specs if s["layout"].get("yaxis", {}).get("title", {}).get("text") == ytitle
    )


def raw_gloo_rank(path: Path) -> dict:
    """One gloo rank from its raw events: ProfilerStep windows, the `gloo:all_reduce` calls
    (step = the window holding their start; ordinal in the step by start), host compute."""
    timed = [e for e in events(path) if e.get("ph") == "X"]
    steps = {
        int(e["name"].split("#")[1]): (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in timed
        if e["name"].startswith("ProfilerStep#")
    }

    def step_of(ts: int) -> int | None:
        return next((s for s, (a, b) in steps.items() if a <= ts < b), None)

    calls: dict[int, list[tuple[int, int]]] = {}
    for e in sorted((e for e in timed if e["name"] == "gloo:all_reduce"), key=lambda e: e["ts"]):
        start = ns(e["ts"])
        calls.setdefault(step_of(start), []).append((start, start + ns(e["dur"])))
    return {"steps": steps, "calls": calls}


@pytest.fixture(scope="module")
def slow_page(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("job") / "job.html"
    traceq.report(traceq.load_job(SLOW, engine="serial"), out)
    return out.read_text()


def test_straggler_chart_shows_rank_2_causing_the_injected_wait(slow_page):
    manifest = json.loads((SLOW / "manifest.json").read_text())
    ranks = {r: raw_gloo_rank(SLOW / f"rank-{r}.pt.trace.json.gz") for r in range(4)}
    # From the raw JSON: per step and call, the last to arrive; each other rank's wait is
    # min(last start - its start, its duration); per step, each rank's waits for the same
    # late rank as one union; averaged over the other ranks.
    expected: dict[int, dict[int, float]] = {}
    for step in manifest["profiled_steps"]:
        per_call = list(zip(*(ranks[r]["calls"][step] for r in range(4)), strict=True))
        waits: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for call in per_call:
            last = max(range(4), key=lambda r: call[r][0])
            for r, (start, end) in enumerate(call):
                wait = min(call[last][0] - start, end - start)
                if r != last and wait > 0:
                    waits.setdefault((r, last), []).append((start, start + wait))
        for (_, last), spans in waits.items():
            expected.setdefault(last, {}).setdefault(step, 0.0)
            expected[last][step] += union(spans) / 3 / 1e6
    assert list(expected) == [manifest["slow_rank"]] == [2]
    chart = spec_titled(figure_specs(slow_page), "ms waited by each other rank")
    (bars,) = chart["data"]
    assert bars["name"] == "rank 2"
    assert bars["x"] == [f"step {s}" for s in manifest["profiled_steps"]]
    assert bars["y"] == pytest.approx([expected[2][s] for s in manifest["profiled_steps"]])
    delay = manifest["delay_ms"]
    assert all(0.9 * delay <= ms <= 1.3 * delay for ms in bars["y"])  # ≈ 40 ms per step
    # its table says the same, step by step
    section = job_section(slow_page)
    for s in manifest["profiled_steps"]:
        assert f"{expected[2][s]:.3f}" in section


def test_skew_heatmap_is_each_ranks_lateness_from_the_raw_json(slow_page):
    ranks = {r: raw_gloo_rank(SLOW / f"rank-{r}.pt.trace.json.gz") for r in range(4)}
    heat = next(s for s in figure_specs(slow_page) if s["data"][0]["type"] == "heatmap")
    trace = heat["data"][0]
    assert trace["y"] == [f"rank {r}" for r in range(4)]
    columns = []
    for step in sorted(ranks[0]["calls"]):
        for i in range(len(ranks[0]["calls"][step])):
            starts = [ranks[r]["calls"][step][i][0] for r in range(4)]
            columns.append([(s - min(starts)) / 1e6 for s in starts])
    assert len(trace["x"]) == len(columns) == 8
    for r in range(4):
        assert trace["z"][r] == pytest.approx([c[r] for c in columns], abs=1e-4)
    # rank 2 is the late one in every call, by about the injected 40 ms
    assert all(c[2] == max(c) and c[2] > 30 for c in columns)


def test_rank_breakdown_adds_up_and_matches_the_raw_json(slow_page):
    """Per rank: communication (the union of its gloo calls per step) and exposed
    communication (|comm ∪ compute| − |compute|, compute = the outermost other host ranges
    on every thread), from the raw events."""
    chart = next(
        s
        for s in figure_specs(slow_page)
        if s["data"][0]["type"] == "bar" and s["layout"]["xaxis"]["title"]["text"] == "rank"
    )
    exposed = next(d for d in chart["data"] if d["name"].startswith("communication"))
    for r in range(4):
        timed = [e for e in events(SLOW / f"rank-{r}.pt.trace.json.gz") if e.get("ph") == "X"]
        steps = [
            (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
            for e in timed
            if e["name"].startswith("ProfilerStep#")
        ]
        total = 0
        for a, b in steps:
            host = [
                e
                for e in timed
                if e.get("cat") in ("cpu_op", "user_annotation")
                and not e["name"].startswith("ProfilerStep#")
                and a <= ns(e["ts"]) < b
            ]
            comm = [
                (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
                for e in host
                if e["name"] == "gloo:all_reduce"
            ]
            compute = []
            by_thread: dict[tuple, list] = {}
            for e in host:
                if e["name"] != "gloo:all_reduce":
                    by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
            for items in by_thread.values():
                reach = None
                for e in sorted(items, key=lambda e: (ns(e["ts"]), -ns(e["dur"]))):
                    start, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
                    if reach is None or start >= reach:
                        compute.append((start, end))
                    reach = end if reach is None else max(reach, end)
            total += union(comm + compute) - union(compute)
        assert exposed["y"][r] == pytest.approx(total / 1e6)
    # the four parts add up to each rank's profiled wall time (or its busy time past it)
    sums = [sum(d["y"][r] for d in chart["data"]) for r in range(4)]
    for r in range(4):
        walls = [
            ns(e["dur"])
            for e in events(SLOW / f"rank-{r}.pt.trace.json.gz")
            if str(e.get("name", "")).startswith("ProfilerStep#")
        ]
        assert sums[r] >= sum(walls) / 1e6 - 1e-6


def test_job_findings_are_in_the_findings_section(slow_page):
    findings = slow_page[slow_page.index('<section id="findings">') :]
    assert "<code>TQ401</code> straggler" in findings
    assert "rank 2 is the last to arrive in 4 of 4 steps" in findings
    assert "job of 4 ranks (rank from distributedInfo)" in slow_page


def test_job_finding_evidence_and_saving_share(slow_page):
    """TQ401's section shows its rank, steps and sequence numbers (not empty op and kernel
    columns); the saving's share is of every rank's profiled time, from the raw steps."""
    manifest = json.loads((SLOW / "manifest.json").read_text())
    article = re.search(r'<article class="finding"[^>]*>.*?TQ401.*?</article>', slow_page, re.S)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", article.group(0))
    steps = ", ".join(map(str, manifest["profiled_steps"]))
    assert cells[:2] == ["2", steps] and cells[4] == "0, 1"
    profiled_us = sum(
        ns(e["dur"]) / 1e3
        for r in range(4)
        for e in events(SLOW / f"rank-{r}.pt.trace.json.gz")
        if str(e.get("name", "")).startswith("ProfilerStep#")
    )
    saving = re.search(
        r"<strong>([\d.,]+) ms</strong> \(([\d.]+)% of the ranks(?:'|&#x27;) profiled", slow_page
    )
    assert saving, "the facts give the saving's share of all ranks' profiled time"
    share = float(saving.group(1).replace(",", "")) * 1e3 / profiled_us * 100
    assert float(saving.group(2)) == pytest.approx(share, abs=0.1)


def test_page_stays_small(slow_page):
    assert len(slow_page.encode()) < 5.5e6  # plotly.js is 4.8 MB of it


@pytest.fixture(scope="module")
def sized_job(tmp_path_factory):
    """Two NCCL ranks from HTA's nccl_parser_config rank (the same rank twice): the
    collectives carry `In/Out msg nelems` and `dtype`, so bus bandwidth is known."""
    from tests.conftest import SHARED_TRACES

    path = SHARED_TRACES / HTA / "nccl_parser_config" / "nccl_data.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    with gzip.open(path) as f:
        doc = json.loads(f.read())
    folder = tmp_path_factory.mktemp("nccl")
    for rank in (0, 1):
        doc["distributedInfo"]["rank"] = rank
        with gzip.open(folder / f"rank-{rank}.json.gz", "wt") as f:
            json.dump(doc, f)
    return folder, doc


def test_bus_bandwidth_per_collective_from_the_raw_json(sized_job, tmp_path):
    folder, doc = sized_job
    text = traceq.report(traceq.load_job(folder, engine="serial"), tmp_path / "j.html").read_text()
    chart = spec_titled(figure_specs(text), "bus bandwidth (GB/s)")
    kernels = sorted(
        (e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "ncclKernel" in e["name"]),
        key=lambda e: e["ts"],
    )
    size = {"Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Double": 8, "Byte": 1}
    factor = {
        "allreduce": lambda n: 2 * (n - 1) / n,
        "allgather": lambda n: (n - 1) / n,
        "broadcast": lambda n: 1.0,
    }
    expected = []
    for e in kernels:
        a = e["args"]
        nbytes = max(a["In msg nelems"], a["Out msg nelems"]) * size[a["dtype"]]
        name = a["Collective name"].replace("_", "").lower()
        # both ranks are the same file: every rank arrives at once, transfer = duration
        expected.append(nbytes / ns(e["dur"]) * factor[name](a["Group size"]))
    drawn = sorted(y for d in chart["data"] for y in d["y"])
    assert drawn == pytest.approx(sorted(expected), rel=1e-3)
    assert len(drawn) == len(kernels) == 21


def test_hta_two_rank_job_page(shared_traces, tmp_path):
    """HTA's trace_filter: 2 of 128 ranks, NCCL without message sizes: straggler and skew
    charts from the raw kernels' start times, no bandwidth chart, the missing ranks noted."""
    folder = shared_traces / HTA / "trace_filter"
    job = traceq.load_job(folder, engine="serial")
    text = traceq.report(job, tmp_path / "j.html").read_text()
    assert "no bus bandwidth" in job_section(text)
    assert "126 of 128 ranks have no trace" in text
    heat = next(s for s in figure_specs(text) if s["data"][0]["type"] == "heatmap")["data"][0]
    assert heat["y"] == ["rank 0", "rank 1"]
    offsets = dict(
        zip(job.frames.alignment["rank"], job.frames.alignment["applied_ns"], strict=True)
    )
    # per rank, the NCCL kernels' starts in time order (each rank runs the same sequence)
    starts = {}
    for r, name in ((0, "sampled_rank-0.json.gz"), (1, "sampled_rank-1.json.gz")):
        kernels = [
            e
            for e in events(folder / name)
            if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")
        ]
        starts[r] = sorted(ns(e["ts"]) - offsets[r] for e in kernels)
    assert len(starts[0]) == len(starts[1]) == len(heat["x"])
    lateness = [
        [(s - min(pair)) / 1e6 for s in pair] for pair in zip(starts[0], starts[1], strict=True)
    ]
    for r in (0, 1):
        assert heat["z"][r] == pytest.approx([c[r] for c in lateness], abs=1e-4)


@pytest.mark.parametrize("how", ["glob", "files"])
def test_cli_reports_a_glob_or_several_files_as_a_job(how, tmp_path):
    out = tmp_path / "job.html"
    files = [str(p) for p in sorted(SLOW.glob("rank-*.json.gz"))[:3]]
    args = [str(SLOW / "rank-*.json.gz")] if how == "glob" else files
    result = CliRunner().invoke(main, ["report", *args, "-o", str(out), "--engine", "serial"])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    expected = 4 if how == "glob" else 3
    assert f"job of {expected} of 4 ranks" in text or f"job of {expected} ranks" in text
    heat = next(s for s in figure_specs(text) if s["data"][0]["type"] == "heatmap")
    assert len(heat["data"][0]["y"]) == expected
    assert statistics.mean(len(row) for row in heat["data"][0]["z"]) == 8
