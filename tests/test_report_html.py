"""`traceq report` and the HTML renderer without a browser: the numbers the charts draw,
recomputed from the raw JSON, the page's self-containment, the CLI's errors.

The browser checks (scripts ran, charts drew, no request) are in test_report_html_browser.py.
Real traces: TraceLens's Qwen1.5-0.5B prefill on H100 (AMD-AGI/TraceLens, MIT) and HTA's
sampled two-rank directory `trace_filter` (facebookresearch/HolisticTraceAnalysis, MIT).
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from traceq.cli.main import main

import traceq
from traceq.analyze import analysis as run_analysis
from traceq.reports import timeline
from traceq.reports.html import MAX_GROUPS, anchor, render_trace
from traceq.reports.model import build_report, group_findings
from traceq.reports.timeline import Coverage

pytest.importorskip("plotly", reason="HTML reports need plotly (the report extra)")

ROOT = Path(__file__).resolve().parent.parent
CPU = ROOT / "fixtures" / "geglu_mlp-eager.pt.trace.json.gz"
QWEN = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
# Bundled in fixtures/gpu (HTA's test data, MIT): these run on every machine.
ALEXNET = "hta/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
JOB = "hta/tests/data/trace_filter"
JOBS = ROOT / "fixtures" / "jobs" / "ddp_gloo_slow2"


def ns(value: object) -> int:
    """A Kineto microsecond value as exact integer ns (as traceq reads it)."""
    return int(Decimal(str(value)) * 1000)


def union_within(intervals: list[tuple[int, int]], a: int, b: int) -> int:
    """Plain-Python reference: covered length of [a, b) by a union of intervals."""
    clipped = sorted((max(s, a), min(e, b)) for s, e in intervals if min(e, b) > max(s, a))
    total, reach = 0, None
    for s, e in clipped:
        if reach is None or s > reach:
            total += e - s
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total


def raw(path: Path, read_json) -> tuple[list[dict], list[dict], list[dict]]:
    events = read_json(path)["traceEvents"]
    timed = [e for e in events if e.get("ph") == "X"]
    steps = [
        e
        for e in timed
        if str(e.get("name", "")).startswith("ProfilerStep#")
        and e.get("cat") != "gpu_user_annotation"
    ]
    ops = [e for e in timed if e.get("cat") in ("cpu_op", "Operator")]
    gpu = [
        e for e in timed if str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    return steps, ops, gpu


def spans(events: list[dict]) -> list[tuple[int, int]]:
    return [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in events]


# -- numbers ----------------------------------------------------------------------------


@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 50)), max_size=30),
    st.lists(st.tuples(st.integers(-10, 260), st.integers(0, 100)), min_size=1, max_size=10),
)
def test_coverage_matches_a_plain_union(intervals, windows):
    pairs = [(s, s + d) for s, d in intervals]
    cover = Coverage.of(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    a = np.array([w[0] for w in windows])
    b = a + np.array([w[1] for w in windows])
    got = cover.within(a, b).tolist()
    assert got == [union_within(pairs, int(x), int(y)) for x, y in zip(a, b, strict=True)]


def test_step_breakdown_of_a_cpu_trace_from_the_raw_json(read_json):
    """No GPU: each step is CPU-bound exactly where a cpu_op runs, idle elsewhere."""
    steps, ops, _ = raw(CPU, read_json)
    got = timeline.step_breakdown(traceq.load(CPU))
    assert got.height == len(steps) == 3
    host = spans(ops)
    for row, step in zip(
        got.iter_rows(named=True), sorted(steps, key=lambda e: e["ts"]), strict=True
    ):
        a, b = ns(step["ts"]), ns(step["ts"]) + ns(step["dur"])
        assert row["dur_ns"] == b - a
        assert row["compute"] == row["communication"] == row["memcpy"] == 0
        assert row["cpu_bound"] == union_within(host, a, b)
        assert row["idle"] == (b - a) - row["cpu_bound"]
        assert row["cpu_bound"] > 0


@pytest.mark.parametrize("name", [QWEN, ALEXNET])
def test_step_breakdown_of_a_gpu_trace_from_the_raw_json(name, shared_trace, read_json):
    path = shared_trace(name)
    steps, ops, gpu = raw(path, read_json)
    got = timeline.step_breakdown(traceq.load(path))
    windows = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in steps)
    if not windows:  # no ProfilerStep: the whole trace, first timestamp to last end
        timed = [e for e in read_json(path)["traceEvents"] if e.get("ph") not in ("M", None)]
        ends = [ns(e["ts"]) + (ns(e["dur"]) if "dur" in e else 0) for e in timed]
        windows = [(min(ns(e["ts"]) for e in timed), max(ends))]
    assert got.height == len(windows)
    for row, (a, b) in zip(got.iter_rows(named=True), windows, strict=True):
        kinds = [e for e in gpu if str(e["cat"]).lower() == "kernel" and "nccl" not in e["name"]]
        assert row["compute"] == union_within(spans(kinds), a, b)
        busy = union_within(spans(gpu), a, b)
        assert row["compute"] + row["communication"] + row["memcpy"] == busy
        assert row["cpu_bound"] == union_within(spans(gpu) + spans(ops), a, b) - busy
        assert sum(row[c] for c in timeline.CATEGORIES) == row["dur_ns"]
    if name == QWEN:
        assert got["compute"][0] / got["dur_ns"][0] > 0.8  # a prefill on an H100: mostly GEMMs
    else:
        assert got["memcpy"].sum() > 0 and got["compute"].sum() > 0  # pageable uploads, GEMMs


def test_stream_utilization_bins_add_up_to_the_busy_time(shared_trace, read_json):
    path = shared_trace(QWEN)
    _, _, gpu = raw(path, read_json)
    starts, lanes = timeline.stream_utilization(traceq.load(path), bins=50)
    assert lanes["stream"].unique().to_list() == [7]
    whole = union_within(spans(gpu), -(2**62), 2**62)
    edges = np.append(starts, max(ns(e["ts"]) + ns(e["dur"]) for e in gpu))
    busy = float((lanes["busy"].to_numpy() * np.diff(edges)).sum())
    assert busy == pytest.approx(whole, rel=1e-9)


def test_top_kernels_and_module_time_from_the_raw_json(shared_trace, read_json):
    path = shared_trace(QWEN)
    _, _, gpu = raw(path, read_json)
    trace = traceq.load(path)
    top = timeline.top_kernels(trace, 3)
    by_name: dict[str, int] = {}
    for e in gpu:
        by_name[e["name"]] = by_name.get(e["name"], 0) + ns(e["dur"])
    expected = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    assert list(zip(top["name"], top["total_ns"], strict=True)) == expected
    assert top.row(0, named=True)["library"] == "cublas"
    assert top.row(0, named=True)["dtype"] == "bf16"
    _, tree = timeline.module_tree(trace)
    roots = tree.filter(tree["parent"] == "")
    assert roots["total_ns"].sum() == sum(by_name.values())  # every kernel in one root


# -- the page ---------------------------------------------------------------------------


def render(path: Path | str) -> tuple[str, traceq.Trace, list]:
    trace = traceq.load(path)
    analysis = traceq.analyze(trace)
    from traceq.analyze import analysis as run

    text = render_trace(trace, build_report(run(trace), trace))
    return text, trace, analysis


def figure_specs(text: str) -> list[dict]:
    blocks = re.findall(
        r'<script type="application/json" class="figure"[^>]*>(.*?)</script>', text, re.S
    )
    return [json.loads(b.replace("<\\/", "</")) for b in blocks]


def test_cpu_page_is_self_contained_with_every_finding(tmp_path):
    text, _, findings = render(CPU)
    groups = group_findings(findings)
    assert groups, "the GeGLU fixture has findings"
    for number, group in enumerate(groups[:MAX_GROUPS], 1):
        section = re.search(
            rf'<article class="finding" id="{anchor(number)}">(.*?)</article>', text, re.S
        )
        assert section and group.rule in section.group(1)
    assert text.count('class="finding"') == min(len(groups), MAX_GROUPS)
    # one inline plotly.js, no external script, style, font or image
    assert text.count("<script src") == 0 and "<link" not in text
    assert len(re.findall(r"Plotly\.newPlot", text)) >= 1
    assert "@import" not in text and "url(" not in text.split("</style>")[0]
    # the savings chart draws exactly the groups' savings, largest first, in the axis' unit
    # (µs here: every saving of this small CPU trace is under a millisecond)
    spec = figure_specs(text)[0]
    savings = spec["data"][0]["x"]
    assert spec["layout"]["xaxis"]["title"]["text"] == "estimated saving (µs)"
    assert savings == pytest.approx([g.est_saving_us for g in groups[:MAX_GROUPS]])
    assert savings == sorted(savings, reverse=True)
    assert not any("`" in label for label in spec["data"][0]["y"])  # code spans unquoted
    assert len(text.encode()) < 6e6


def test_gpu_page_draws_kernels_streams_modules_and_critical_path(shared_trace):
    text, trace, _ = render(shared_trace(QWEN))
    specs = figure_specs(text)
    kinds = [s["data"][0]["type"] for s in specs]
    assert "treemap" in kinds and "scatter" in kinds
    # savings, steps, streams, critical path, kernels, ops, modules, roofline
    assert len(specs) == 8
    crit = trace.critical_path()
    drawn = next(s for s in specs if "gpu compute" in (s["data"][0].get("y") or []))
    assert dict(zip(drawn["data"][0]["y"], drawn["data"][0]["x"], strict=True))[
        "gpu compute"
    ] == pytest.approx(crit.breakdown_ns["gpu_compute"] / 1e6)
    assert "NVIDIA H100" in text


@pytest.mark.slow
def test_a_large_trace_gives_a_page_of_a_few_mb(shared_trace, tmp_path):
    """216k events, 19k kernels on 2 streams: the timeline stays 400 bins per stream."""
    path = shared_trace("hta/tests/data/df_index_resolver/df_index_resolver.json.gz")
    out = traceq.report(path, tmp_path / "big.html")
    size = out.stat().st_size
    assert size < 6e6
    specs = figure_specs(out.read_text())
    streams = next(s for s in specs if s["data"][0]["type"] == "scatter")
    assert {len(d["y"]) for d in streams["data"]} == {400}


def test_job_directory_shows_every_rank(shared_traces, tmp_path):
    directory = shared_traces / JOB
    if not directory.is_dir():
        pytest.skip(f"{directory} is absent")
    out = traceq.report(directory, tmp_path / "job.html")
    text = out.read_text()
    ranks = [traceq.load(p) for p in sorted(directory.glob("*.json.gz"))]
    assert sorted(t.rank for t in ranks) == [0, 1]
    assert '<section id="job">' in text
    steps = next(
        s
        for s in figure_specs(text)
        if s["data"][0]["type"] == "scatter" and s["data"][0].get("mode") == "lines+markers"
    )
    for series, trace in zip(steps["data"], sorted(ranks, key=lambda t: t.rank), strict=True):
        assert series["name"] == f"rank {trace.rank}"
        assert series["y"] == pytest.approx((trace.steps["dur_ns"] / 1e6).to_list())
    # the skew row: per step, slowest minus fastest rank, and the slowest's name
    by_rank = {t.rank: dict(zip(t.steps["step"], t.steps["dur_ns"], strict=True)) for t in ranks}
    for step in sorted(by_rank[0]):
        times = {r: d[step] / 1e6 for r, d in by_rank.items()}
        slowest = max(times, key=times.get)
        spread = times[slowest] - min(times.values())
        assert f"{spread:.3f} (rank {slowest})" in text


def test_report_accepts_a_job_a_list_of_traces_or_files(tmp_path):
    """A `Job`, a list of rank `Trace`s (a job of the files they came from) or of files:
    each is the job page; one trace is not."""
    paths = sorted(JOBS.glob("rank-*.json.gz"))[:2]
    traces = [traceq.load(p) for p in paths]
    job = traceq.load_job(paths, engine="serial")
    for name, source in (("a", traces), ("b", [str(p) for p in paths]), ("c", job)):
        text = traceq.report(source, tmp_path / f"{name}.html").read_text()
        assert 'id="job"' in text and "job of 2 of 4 ranks" in text, name
    assert 'id="job"' not in traceq.report(traces[0], tmp_path / "d.html").read_text()
    with pytest.raises(TypeError):
        traceq.report([1, 2], tmp_path / "e.html")


def test_import_traceq_does_not_import_plotly():
    code = "import sys, traceq; traceq.report; assert 'plotly' not in sys.modules, 'plotly'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- command line -------------------------------------------------------------------------


def test_cli_writes_the_page(tmp_path):
    out = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["report", str(CPU), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert "wrote" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.json.gz"], "no such file"),
        ([str(CPU), "-o", "/nonexistent-dir/r.html"], "cannot write /nonexistent-dir/r.html"),
        ([str(ROOT / "docs")], "holds no .json or .json.gz trace"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    if "-o" not in args:
        args = [*args, "-o", str(tmp_path / "r.html")]
    result = CliRunner().invoke(main, ["report", *args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceq: error:") and message in lines[0]


def test_check_and_diff_html(tmp_path):
    eager = str(ROOT / "fixtures" / "mlp_gelu-eager.pt.trace.json.gz")
    compiled = str(ROOT / "fixtures" / "mlp_gelu-compiled.pt.trace.json.gz")
    runner = CliRunner()
    diff = runner.invoke(main, ["diff", eager, compiled, "--format", "html"])
    assert diff.exit_code == 0
    specs = figure_specs(diff.output)
    assert len(specs) == 1
    result = traceq.diff(traceq.load(eager), traceq.load(compiled))
    changed = result.groups.filter(result.groups["delta_ns"] != 0).head(25)
    assert specs[0]["data"][0]["x"] == pytest.approx((changed["delta_ns"] / 1e6).to_list())
    base = tmp_path / "base.json"
    assert runner.invoke(main, ["baseline", "save", eager, "-o", str(base)]).exit_code == 0
    check = runner.invoke(main, ["check", compiled, "--baseline", str(base), "--format", "html"])
    assert check.exit_code == 1  # compiled is slower on the CPU: the gate fails
    assert "FAIL" in check.output and "<table>" in check.output
    bars = figure_specs(check.output)[0]["data"][0]
    verdict = traceq.check(compiled, str(base))
    rels = [100 * m.change.rel for m in verdict.metrics if m.change.rel is not None]
    assert bars["x"] == pytest.approx(rels)


@pytest.mark.parametrize("command", ["report", "diff"])
def test_without_plotly_one_line_and_exit_2(command, tmp_path):
    """plotly is an extra: without it `report` and `--format html` name it, no traceback."""
    args = (
        ["report", str(CPU), "-o", str(tmp_path / "r.html")]
        if command == "report"
        else ["diff", str(CPU), str(CPU), "--format", "html"]
    )
    code = (
        "import sys; sys.modules['plotly'] = None\n"
        "from traceq.cli.main import main\n"
        f"main({args!r})"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceq: error: HTML reports need plotly")
    assert "traceq[report]" in lines[0]


def test_streams_past_the_sixteen_busiest_merge_into_one_lane(tmp_path):
    """20 streams: the 16 with the most kernel time are drawn, streams 0-3 become one lane
    whose bins are the busy share of the union of their kernels."""
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": f"k{s}",
            "pid": 0,
            "tid": s,
            "ts": 1000 + 10 * i + s,
            "dur": 5 + s,
            "args": {"device": 0, "stream": s, "correlation": 1000 * s + i},
        }
        for s in range(20)
        for i in range(10)
    ]
    path = tmp_path / "streams.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    starts, lanes = timeline.stream_utilization(traceq.load(path), bins=20)
    assert lanes["stream"].unique(maintain_order=True).to_list() == [*range(4, 20), None]
    edges = np.append(starts, max(e["ts"] + e["dur"] for e in events) * 1000)
    others = [(e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000) for e in events if e["tid"] < 4]
    expected = [
        union_within(others, int(a), int(b)) / (b - a) for a, b in itertools.pairwise(edges)
    ]
    got = lanes.filter(lanes["stream"].is_null())["busy"].to_list()
    assert got == pytest.approx(expected)


def test_cli_corrupt_trace_and_job_directory(tmp_path):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    result = CliRunner().invoke(main, ["report", str(bad), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2
    assert result.output.startswith("traceq: error:") and len(result.output.splitlines()) == 1
    job = tmp_path / "job"
    job.mkdir()
    for name in ("rank-0.json.gz", "rank-1.json.gz"):
        (job / name).write_bytes(CPU.read_bytes())
    out = tmp_path / "job.html"
    result = CliRunner().invoke(main, ["report", str(job), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "job of 2 ranks (rank from file name)" in text and 'id="job"' in text


def test_critical_path_of_a_large_trace_is_its_median_step(monkeypatch, shared_trace):
    """Past CRITICAL_PATH_EVENTS events the page draws one typical step's path."""
    from traceq.reports import html

    trace = traceq.load(shared_trace("hta/tests/data/trace_filter/sampled_rank-0.json.gz"))
    assert html.critical_region(trace) == (None, "the whole trace")
    monkeypatch.setattr(html, "CRITICAL_PATH_EVENTS", trace.events.height - 1)
    durations = sorted(zip(trace.steps["dur_ns"], trace.steps["step"], strict=True))
    median = durations[(len(durations) - 1) // 2][1]
    step, scope = html.critical_region(trace)
    assert step == median and scope.startswith(f"step {median}")
    text = html.render_trace(trace, build_report(run_analysis(trace), trace))
    assert f"Critical path of step {median}" in text


@pytest.mark.parametrize("where", ["missing directory", "a directory", "inside a file", "full"])
def test_cli_unwritable_output_is_one_line(where, tmp_path):
    """As every writing command (tests/test_hardening_cli.py): one line, exit 2."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a folder\n")
    out, reason = {
        "missing directory": (tmp_path / "missing" / "r.html", "does not exist"),
        "a directory": (tmp_path, "it is a directory"),
        "inside a file": (a_file / "r.html", "is not a directory"),
        "full": (Path("/dev/full"), "no space left on device"),
    }[where]
    if where == "full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    result = CliRunner().invoke(main, ["report", str(CPU), "-o", str(out)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"traceq: error: cannot write {out}: ")
    assert reason in lines[0]


def test_api_missing_directory_fails_before_the_load(tmp_path):
    with pytest.raises(traceq.TraceError, match="does not exist"):
        traceq.report(tmp_path / "missing.json.gz", tmp_path / "no" / "r.html")


def test_epoch_nanosecond_timestamps_give_finite_bins(shared_trace, tmp_path):
    """HTA's call_stack trace stamps events in ns since the epoch (~1.67e18, past float64's
    exact integers): every bin has a width, the busy time adds up to the one kernel's 45 µs,
    and the page holds no NaN (which is not JSON)."""
    trace = traceq.load(shared_trace("hta/tests/data/call_stack/backward_thread.json"))
    assert trace.kernels.height == 1 and trace.kernels["ts_ns"][0] > 2**53
    starts, lanes = timeline.stream_utilization(trace, bins=400)
    edges = np.append(starts, trace.kernels["end_ns"][0])
    assert (np.diff(edges) > 0).all()
    busy = lanes["busy"].to_numpy()
    assert np.isfinite(busy).all()
    assert float((busy * np.diff(edges)).sum()) == pytest.approx(45_000)
    blocks = re.findall(
        r'class="figure"[^>]*>(.*?)</script>',
        traceq.report(trace, tmp_path / "r.html").read_text(),
        re.S,
    )
    assert blocks and all(json.loads(b.replace("<\\/", "</")) for b in blocks)
    assert not any("NaN" in b for b in blocks)
