"""The gate (`check`, `traceq check`) on real traces modified in known ways.

`trace_diff/control` (A100, 6 steps) from facebookresearch/HolisticTraceAnalysis (MIT),
under ../shared/traces/hta/tests/data/, is the baseline. Copies of it are written with one
kernel's every duration stretched by 20% (the check must fail and name that kernel), and
with every kernel and step jittered within ±2% (it must pass). Fixtures (fixtures/README.md)
cover CPU-only traces, the one-sample case and the CLI's exit codes.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner
from traceq.cli.main import main

import traceq
from traceq.regression.baseline import save_baseline
from traceq.regression.check import check
from traceq.regression.errors import RegressionError
from traceq.regression.summary import Summary, summarize

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CONTROL = "hta/tests/data/trace_diff/control/control.json.gz"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

pytestmark = [pytest.mark.shared, pytest.mark.slow]


def stretch_target(trace: traceq.Trace) -> str:
    """A kernel that runs in every step and holds 1-10 % of the GPU time (the largest such):
    big enough to be checked by default, small enough not to move the totals past 5 %."""
    total = trace.kernels["dur_ns"].sum()
    steps = trace.steps.height
    candidates = (
        trace.kernels.filter(pl.col("step").is_not_null())
        .group_by("name")
        .agg(pl.col("dur_ns").sum(), pl.col("step").n_unique().alias("steps"))
        .filter((pl.col("steps") == steps) & pl.col("dur_ns").is_between(0.01 * total, 0.1 * total))
        .sort("dur_ns", descending=True)
    )
    return str(candidates["name"][0])


def modified_copy(document: dict[str, Any], out: Path, change: Any) -> Path:
    """Write `document` with `change` applied to each event's duration, then undo it, so
    one decode of the (100k-event) trace serves every variant."""
    events = document["traceEvents"]
    original = [event.get("dur") for event in events]
    for event in events:
        change(event)
    out.write_text(json.dumps(document, separators=(",", ":")))
    for event, dur in zip(events, original, strict=True):
        if dur is not None:
            event["dur"] = dur
    return out


@pytest.fixture(scope="module")
def control(load_shared: Any) -> traceq.Trace:
    return load_shared(CONTROL)


@pytest.fixture(scope="module")
def baseline(control: traceq.Trace) -> Summary:
    return summarize(control, findings=False)


@pytest.fixture(scope="module")
def target(control: traceq.Trace) -> str:
    return stretch_target(control)


@pytest.fixture(scope="module")
def document(shared_trace: Any) -> dict[str, Any]:
    with gzip.open(shared_trace(CONTROL), "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def stretched(
    tmp_path_factory: pytest.TempPathFactory, document: dict[str, Any], target: str
) -> Summary:
    def stretch(event: dict[str, Any]) -> None:
        if event.get("cat") in GPU_CATS and event.get("name") == target:
            event["dur"] = round(event["dur"] * 1.2, 3)

    path = modified_copy(document, tmp_path_factory.mktemp("stretched") / "control.json", stretch)
    return summarize(traceq.load(path), findings=False)


@pytest.fixture(scope="module")
def noisy(tmp_path_factory: pytest.TempPathFactory, document: dict[str, Any]) -> Summary:
    rng = random.Random(2)

    def jitter(event: dict[str, Any]) -> None:
        timed = event.get("cat") in GPU_CATS or str(event.get("name", "")).startswith(
            "ProfilerStep#"
        )
        if timed and "dur" in event:
            event["dur"] = round(event["dur"] * rng.uniform(0.98, 1.02), 3)

    path = modified_copy(document, tmp_path_factory.mktemp("noisy") / "control.json", jitter)
    return summarize(traceq.load(path), findings=False)


def test_a_kernel_stretched_by_20_percent_fails_the_check_and_is_named(
    baseline: Summary, stretched: Summary, target: str
) -> None:
    result = check(stretched, baseline, max_regress="5%")
    assert result.failed
    regressed = {m.spec: m for m in result.regressions}
    metric = regressed[f"kernel:{target}"]
    assert metric.change.rel == pytest.approx(0.2, abs=1e-3)
    assert metric.change.significant and metric.change.p_value < 0.01  # 6 steps vs 6
    assert 0 < metric.change.ci_low < 0.2 < metric.change.ci_high
    # No other kernel changed, so no other kernel may be blamed.
    assert [s for s in regressed if s.startswith("kernel:")] == [f"kernel:{target}"]


def test_a_stretched_kernel_shows_in_the_groups_that_hold_it(
    control: traceq.Trace, baseline: Summary, stretched: Summary, target: str
) -> None:
    """Every other metric that regressed holds the stretched kernel: an op that launched it,
    a module it ran in, or the GPU total; the step's wall time (CPU) did not move."""
    result = check(stretched, baseline, max_regress="5%")
    holders = {"kernel": {target}, "gpu": {""}}
    for metric in result.regressions:
        kind = metric.spec.split(":")[0]
        if kind == "op":
            launched = {n for op in metric.groups for n in control.kernels_of(op)["name"]}
            assert target in launched, metric.spec
        elif kind == "module":
            under = control.kernels.filter(
                pl.col("module").fill_null("(no module)").is_in(metric.groups)
            )
            assert target in set(under["name"]), metric.spec
        else:
            assert kind in holders, metric.spec
    step = next(m for m in result.metrics if m.spec == "step")
    assert step.change.rel == 0


def test_noise_within_2_percent_passes(baseline: Summary, noisy: Summary) -> None:
    result = check(noisy, baseline, max_regress="5%")
    assert not result.failed, [m.spec for m in result.regressions]
    checked = [m for m in result.metrics if m.change.rel is not None]
    assert len(checked) > 10  # step, gpu and the groups over 1 %
    assert max(abs(m.change.rel) for m in checked) <= 0.02 + 1e-9
    assert {m.verdict for m in checked} <= {"no change", "within limit"}


def test_a_named_metric_is_the_only_one_checked(
    baseline: Summary, stretched: Summary, target: str
) -> None:
    result = check(stretched, baseline, metrics=["step", f"kernel:{target}"])
    assert [m.spec for m in result.metrics] == ["step", f"kernel:{target}"]
    assert [m.spec for m in result.regressions] == [f"kernel:{target}"]
    relaxed = check(stretched, baseline, max_regress="25%", metrics=[f"kernel:{target}"])
    assert not relaxed.failed and relaxed.metrics[0].verdict == "within limit"


def test_a_glob_metric_sums_the_kernels_it_matches(
    control: traceq.Trace, baseline: Summary
) -> None:
    result = check(baseline, baseline, metrics=["kernel:ampere_sgemm_*"])
    (metric,) = result.metrics
    sgemm = control.kernels.filter(
        pl.col("name").str.starts_with("ampere_sgemm_") & pl.col("step").is_not_null()
    )
    assert len(metric.groups) == sgemm["name"].n_unique() > 1
    assert metric.change.base == pytest.approx(sgemm["dur_ns"].sum() / control.steps.height)
    assert metric.verdict == "no change"


def test_unknown_metrics_are_bad_input(baseline: Summary) -> None:
    with pytest.raises(RegressionError, match="matches no kernel"):
        check(baseline, baseline, metrics=["kernel:no_such_kernel"])
    with pytest.raises(RegressionError, match="unknown metric"):
        check(baseline, baseline, metrics=["latency"])


def test_a_gpu_baseline_cannot_judge_a_cpu_trace(baseline: Summary) -> None:
    cpu = summarize(traceq.load(FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"), findings=False)
    with pytest.raises(RegressionError, match="record both with the same activities"):
        check(cpu, baseline)


# -- the CLI ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(
    tmp_path_factory: pytest.TempPathFactory,
    baseline: Summary,
    stretched: Summary,
    noisy: Summary,
) -> dict[str, Path]:
    """The summaries as baseline files: `traceq check` takes a baseline on either side."""
    folder = tmp_path_factory.mktemp("baselines")
    out = {}
    for name, summary in (("base", baseline), ("stretched", stretched), ("noisy", noisy)):
        out[name] = folder / f"{name}.json"
        save_baseline(summary, out[name])
    return out


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_cli_exits_1_and_names_the_regressed_kernel(files: dict[str, Path], target: str) -> None:
    result = run("check", str(files["stretched"]), "--baseline", str(files["base"]))
    assert result.exit_code == 1
    assert "FAIL" in result.output
    short = target.removeprefix("void ").split("(")[0][:40]
    assert short in result.output


def test_cli_exits_0_within_the_noise(files: dict[str, Path]) -> None:
    result = run("check", str(files["noisy"]), "--baseline", str(files["base"]))
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output


def test_cli_json_lists_every_regressed_metric(files: dict[str, Path], target: str) -> None:
    result = run(
        "check", str(files["stretched"]), "--baseline", str(files["base"]), "--format", "json"
    )
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["failed"] is True
    assert f"kernel:{target}" in data["regressed"]
    verdicts = {m["metric"]: m["verdict"] for m in data["metrics"]}
    assert {m for m, v in verdicts.items() if v == "regressed"} == set(data["regressed"])


def test_cli_exits_2_on_bad_input(files: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceq_baseline": 7}')
    result = CliRunner().invoke(main, ["check", str(files["noisy"]), "--baseline", str(broken)])
    assert result.exit_code == 2
    assert "traceq: error:" in result.output and "version 7" in result.output
    result = CliRunner().invoke(
        main, ["check", str(files["noisy"]), "--baseline", str(files["base"]), "--metric", "x:y"]
    )
    assert result.exit_code == 2
