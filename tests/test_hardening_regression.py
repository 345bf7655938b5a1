"""Op metrics named as `torch.profiler`'s `key_averages()` names ops: every op at any depth.

`op:NAME` measures the instances of NAME wherever they run, their total time, an instance
nested inside another of the same name counted once (through the outer one). Every expected
number is recomputed here from the raw JSON with the stdlib `json` module and a brute-force
nesting of the events, never from traceq's frames.
"""

from __future__ import annotations

import gzip
import importlib
import json
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from traceq.cli.main import main

import traceq
from traceq.regression.check import check
from traceq.regression.diff import diff
from traceq.regression.summary import summarize

for _module in ("scipy.stats", "traceq.regression.check", "traceq.regression.render"):
    importlib.import_module(_module)  # before pytester drops modules (see test_pytest_plugin)

pytest_plugins = ["pytester"]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TRAIN = FIXTURES / "mlp_gelu-train.pt.trace.json.gz"
EAGER = FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"
COMPILED = FIXTURES / "geglu_mlp-compiled.pt.trace.json.gz"
# facebookresearch/param (MIT): Linear+ReLU MLP training on an RTX 2080 Ti, 8.7k kernels.
PARAM = "param/et_replay/tests/inputs/linear_kineto.json.gz"


def _raw(path: Path) -> dict[str, Any]:
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return json.load(f, parse_float=Decimal)


def _ns(value: Any) -> int:
    return int(Decimal(value) * 1000)


def _ops(document: dict[str, Any]) -> list[dict[str, Any]]:
    """CPU ops with their position in `traceEvents` and times in ns."""
    return [
        {**e, "i": i, "t0": _ns(e["ts"]), "t1": _ns(e["ts"]) + _ns(e["dur"])}
        for i, e in enumerate(document["traceEvents"])
        if e.get("ph") == "X" and e.get("cat") == "cpu_op"
    ]


def _inside(inner: dict[str, Any], outer: dict[str, Any]) -> bool:
    same_thread = (inner["pid"], inner["tid"]) == (outer["pid"], outer["tid"])
    return same_thread and outer["t0"] <= inner["t0"] and inner["t1"] <= outer["t1"]


def _outermost(ops: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The instances of `name` not inside another instance of `name` (brute force)."""
    named = [op for op in ops if op["name"] == name]
    return [op for op in named if not any(o is not op and _inside(op, o) for o in named)]


def _steps(document: dict[str, Any]) -> list[tuple[int, int]]:
    return sorted(
        (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
        for e in document["traceEvents"]
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    )


def _cpu_per_step(document: dict[str, Any], name: str) -> tuple[float, float]:
    """Per-step means of the outermost instances' count and total duration (ns)."""
    steps = _steps(document)
    counts, times = [0] * len(steps), [0] * len(steps)
    for op in _outermost(_ops(document), name):
        for k, (t0, t1) in enumerate(steps):
            if t0 <= op["t0"] < t1:
                counts[k] += 1
                times[k] += op["t1"] - op["t0"]
    return sum(counts) / len(steps), sum(times) / len(steps)


def test_op_totals_match_the_raw_json_at_any_depth() -> None:
    """Leaf ops nested two deep (`aten::mm`), ops nested in themselves (`aten::div_`,
    `aten::mse_loss_backward`) and outermost ones, on the training fixture."""
    document = _raw(TRAIN)
    ops = _ops(document)
    summary = summarize(traceq.load(TRAIN), findings=False)
    totals = {
        row["group"]: (row["count"], row["time_ns"])
        for row in summary.totals("op_total").iter_rows(named=True)
    }
    names = ["aten::mm", "aten::div_", "aten::mse_loss_backward", "aten::addmm", "aten::linear"]
    for name in names:
        instances = _outermost(ops, name)
        every = [op for op in ops if op["name"] == name]
        expected = (len(instances), sum(op["t1"] - op["t0"] for op in instances))
        assert totals[name] == expected, name
        if name in ("aten::div_", "aten::mse_loss_backward"):
            assert len(every) > len(instances)  # the nested ones are not counted again
    assert set(totals) == {op["name"] for op in ops}  # every op, at any depth


def test_check_metric_op_measures_a_nested_op(tmp_path: Path) -> None:
    """`aten::mm` runs only inside `aten::linear` in the eager GeGLU trace: the metric
    measures it there, per step, as the raw JSON gives it."""
    document = _raw(EAGER)
    mm = [op for op in _ops(document) if op["name"] == "aten::mm"]
    linear = [op for op in _ops(document) if op["name"] == "aten::linear"]
    assert mm and all(any(_inside(op, outer) for outer in linear) for op in mm)
    _, time_ns = _cpu_per_step(document, "aten::mm")
    base = tmp_path / "base.json"
    saved = CliRunner().invoke(main, ["baseline", "save", str(EAGER), "-o", str(base)])
    assert saved.exit_code == 0, saved.output
    args = ["check", str(EAGER), "--baseline", str(base), "--metric", "op:aten::mm"]
    result = CliRunner().invoke(main, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    (metric,) = json.loads(result.stdout)["metrics"]
    assert metric["metric"] == "op:aten::mm" and metric["groups"] == ["aten::mm"]
    assert metric["base"] == pytest.approx(time_ns) and metric["new"] == pytest.approx(time_ns)


def _warp(document: dict[str, Any], name: str, factor: Decimal) -> dict[str, Any]:
    """Stretch time inside every instance of `name` by `factor` on its thread: a monotonic
    warp of every timestamp there, so parents grow with the op and nesting holds."""
    spans: dict[tuple[Any, Any], list[tuple[int, int]]] = defaultdict(list)
    for op in _outermost(_ops(document), name):
        spans[op["pid"], op["tid"]].append((op["t0"], op["t1"]))

    def warp(thread: tuple[Any, Any], t: int) -> Decimal:
        grown = sum(max(0, min(t, t1) - t0) for t0, t1 in spans.get(thread, []))
        return Decimal(t) + (factor - 1) * grown

    events = []
    for event in document["traceEvents"]:
        thread = (event.get("pid"), event.get("tid"))
        if thread in spans and "ts" in event:
            t0 = _ns(event["ts"])
            start = warp(thread, t0)
            event = {**event, "ts": start / 1000}
            if "dur" in event:
                event["dur"] = (warp(thread, t0 + _ns(event["dur"])) - start) / 1000
        events.append(event)
    return {**document, "traceEvents": events}


def _write(document: dict[str, Any], path: Path) -> Path:
    path.write_bytes(msgspec.json.Encoder(decimal_format="number").encode(document))
    return path


# The eager trace's three steps spend 62-87 µs in aten::mm: too few steps to judge the
# noise, so the gate fails only on a slowdown beyond its limit on every step pair.
# 1.6x clears that (62 x 1.6 > 87 x 1.05); 1.3x did not.
SLOWER = Decimal("1.6")


def test_a_nested_op_made_60_percent_slower_fails_and_is_named(tmp_path: Path) -> None:
    document = _raw(EAGER)
    slower = _write(_warp(document, "aten::mm", SLOWER), tmp_path / "slower.json")
    base_time = _cpu_per_step(document, "aten::mm")[1]
    new_time = _cpu_per_step(_raw(slower), "aten::mm")[1]
    assert new_time / base_time == pytest.approx(1.6, abs=1e-4)
    result = check(str(slower), str(EAGER), max_regress="5%", metrics=["op:aten::mm"])
    (metric,) = result.metrics
    assert result.failed and metric.verdict == "regressed"
    assert metric.change.base == pytest.approx(base_time)
    assert metric.change.rel == pytest.approx(0.6, abs=1e-4)
    args = ["check", str(slower), "--baseline", str(EAGER), "--metric", "op:aten::mm"]
    cli = CliRunner().invoke(main, args)
    assert cli.exit_code == 1 and "aten::mm" in cli.stdout
    # The same trace against itself passes.
    same = CliRunner().invoke(main, ["check", str(EAGER), "--baseline", str(EAGER), *args[4:]])
    assert same.exit_code == 0, same.output


def test_diff_by_op_measures_mm_in_both_eager_and_compiled() -> None:
    """Eager runs `aten::mm` inside `aten::linear`; compiled runs it as the op called. Its
    row compares the two, as the raw JSON gives them, instead of 'appeared'."""
    result = diff(traceq.load(EAGER), traceq.load(COMPILED), by="op", findings=False)
    row = result.row("aten::mm")
    for side, path in (("base", EAGER), ("new", COMPILED)):
        count, time_ns = _cpu_per_step(_raw(path), "aten::mm")
        assert row[f"{side}_count"] == pytest.approx(count) and count > 0
        assert row[f"{side}_ns"] == pytest.approx(time_ns)
    assert row["status"] == "changed"


@pytest.mark.parametrize("name", ["aten::mm", "aten::addmm"])  # addmm: inside aten::linear
def test_gpu_op_metric_is_the_kernels_launched_under_the_op(
    shared_trace: Callable[[str], Path], name: str
) -> None:
    """On a GPU trace `op:aten::mm` is the device time of the GPU activities (kernels,
    memsets, memcpys) launched (through the runtime call with their correlation id) from
    inside an `aten::mm`, each once."""
    path = shared_trace(PARAM)
    document = _raw(path)
    ops = _ops(document)
    mm = [op for op in ops if op["name"] == name]
    runtime = {
        e["args"]["correlation"]: e
        for e in document["traceEvents"]
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for op in mm:
        by_thread[op["pid"], op["tid"]].append(op)
    expected = 0
    for event in document["traceEvents"]:
        if event.get("cat") not in ("kernel", "gpu_memset", "gpu_memcpy"):
            continue
        launch = runtime.get(event["args"].get("correlation"))
        if launch is None:
            continue
        at = _ns(launch["ts"])
        under = [op for op in by_thread[launch["pid"], launch["tid"]] if op["t0"] <= at < op["t1"]]
        if under:
            expected += _ns(event["dur"])
    assert expected > 0
    result = check(str(path), str(path), metrics=[f"op:{name}"])
    (metric,) = result.metrics
    assert metric.change.base == pytest.approx(expected)  # no steps: one whole-trace sample
    assert not result.failed


PLUGIN_TEST = """
def test_mm(traceq_regression):
    traceq_regression.check({trace!r}, max_regress="5%", metrics=["op:aten::mm"])
"""


def test_the_pytest_plugin_checks_a_nested_op(pytester: pytest.Pytester, tmp_path: Path) -> None:
    slower = _write(_warp(_raw(EAGER), "aten::mm", SLOWER), tmp_path / "slower.json")
    pytester.makepyfile(test_mm=PLUGIN_TEST.format(trace=str(EAGER)))
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)  # writes it
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    pytester.makepyfile(test_mm=PLUGIN_TEST.format(trace=str(slower)))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert "op:aten::mm" in result.stdout.str() or "aten::mm" in result.stdout.str()


# -- findings matched by what they are about ---------------------------------------------


def _gemm_mkn(document: dict[str, Any], name: str) -> set[str]:
    """M×K×N of every `name` GEMM in the raw JSON, from its `Input Dims` (input rows folded
    into M; `linear` weights are [N, K], `mm`'s second operand [K, N])."""
    found = set()
    for op in _ops(document):
        if op["name"] != name:
            continue
        x, w = op["args"]["Input Dims"][:2]
        n = w[0] if name == "aten::linear" else w[1]
        m = 1
        for d in x[:-1]:
            m *= d
        found.add(f"{m}x{x[-1]}x{n}")
    return found


@pytest.mark.parametrize("model", ["geglu_mlp", "swiglu_mlp"])
def test_a_finding_renamed_by_compile_is_neither_gone_nor_new(model: str, tmp_path: Path) -> None:
    """TQ105 (parallel GEMMs) fires on `aten::linear` [4, 16, 64] in eager and on `aten::mm`
    [64, 64] after torch.compile: the same GEMMs, M=64, K=64, N=128 (from the raw JSON)."""
    eager, compiled = (
        FIXTURES / f"{model}-{side}.pt.trace.json.gz" for side in ("eager", "compiled")
    )
    assert _gemm_mkn(_raw(eager), "aten::linear") >= {"64x64x128"}
    assert _gemm_mkn(_raw(compiled), "aten::mm") >= {"64x64x128"}
    before = {f.rule: f for f in traceq.analyze(traceq.load(eager))}
    after = {f.rule: f for f in traceq.analyze(traceq.load(compiled))}
    assert before["TQ105"].evidence["op_names"][0] == "aten::linear"
    assert after["TQ105"].evidence["op_names"][0] == "aten::mm"
    result = diff(traceq.load(eager), traceq.load(compiled), findings=True)
    assert result.findings is not None
    assert result.findings["appeared"] == []
    assert "TQ105" not in {f["rule"] for f in result.findings["disappeared"]}
    assert "TQ103" in {f["rule"] for f in result.findings["disappeared"]}  # compile fused it
    base = tmp_path / "eager.json"
    CliRunner().invoke(main, ["baseline", "save", str(eager), "-o", str(base)])
    args = ["--metric", "step", "--max-regress", "9000%", "--fail-on-new-findings"]
    gate = CliRunner().invoke(main, ["check", str(compiled), "--baseline", str(base), *args])
    assert gate.exit_code == 0, gate.output
    # A finding that is really new still fails the gate: compiled first, eager after.
    back = tmp_path / "compiled.json"
    CliRunner().invoke(main, ["baseline", "save", str(compiled), "-o", str(back)])
    worse = CliRunner().invoke(main, ["check", str(eager), "--baseline", str(back), *args])
    assert worse.exit_code == 1 and "TQ103" in worse.output


def test_a_limit_over_100_percent_is_read_once() -> None:
    """`--max-regress 500%` is 5.0, not 0.05 (the CLI used to parse it twice)."""
    compiled = FIXTURES / "swiglu_mlp-compiled.pt.trace.json.gz"
    eager = FIXTURES / "swiglu_mlp-eager.pt.trace.json.gz"
    step = check(str(compiled), str(eager), metrics=["step"]).metrics[0].change
    assert 0.5 < step.rel < 5  # compiled runs slower on a CPU, by less than 500 %
    args = ["check", str(compiled), "--baseline", str(eager), "--metric", "step"]
    result = CliRunner().invoke(main, [*args, "--max-regress", "500%", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["max_regress"] == 5.0


def test_the_pytest_plugin_reports_an_unwritable_baseline_in_one_line(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_mm=PLUGIN_TEST.format(trace=str(EAGER)))
    (pytester.path / "__traceq_baselines__").write_text("a file where the folder goes")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*traceq: cannot write *__traceq_baselines__*test_mm.json: *"])
    assert "Traceback" not in result.stdout.str() and "OSError" not in result.stdout.str()
