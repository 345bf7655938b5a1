"""TQ201 on a decode step launched without CUDA graphs, from real data: the bundled vLLM
FULL-graph decode step (`fixtures/serving/vllm_decode_full/`, TraceLens, MIT) with its
`hipGraphLaunch` replaced by the capture's ops and launch calls, one per replayed kernel
(`fixtures/serving/make_eager_decode.py` says what is real and what is derived).

Every expected number is recomputed from the raw JSON (stdlib gzip + json, exact integer
ns: conftest's `Raw`), not through traceq.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FIXTURES, Raw
from traceq.cli.main import main

import traceq
from traceq.relations.inference import inference_steps

SERVING = FIXTURES / "serving"
EAGER = SERVING / "vllm_decode_eager" / "vllm_decode_eager.json.gz"
REPLAY = SERVING / "vllm_decode_full" / "graph_execution.json.gz"
SCRIPT = SERVING / "make_eager_decode.py"
GPU = {"kernel", "gpu_memcpy", "gpu_memset"}
LATENCY_NS = 5_000  # the script's LAUNCH_LATENCY_US


@pytest.fixture(scope="module")
def raw() -> Raw:
    return Raw(EAGER)


@pytest.fixture(scope="module")
def trace() -> traceq.Trace:
    return traceq.load(EAGER)


@pytest.fixture(scope="module")
def finding(trace):
    (found,) = traceq.analyze(trace, select="TQ201")
    return found


def _step(raw: Raw) -> int:
    """The vLLM step annotation (`execute_<tokens>_context_...`)."""
    (step,) = raw.where(lambda e: e.get("cat") == "user_annotation" and "_generation_" in e["name"])
    return step


def _gpu_in_step(raw: Raw) -> list[int]:
    """GPU activities whose launch call began inside the step, in start order."""
    step = _step(raw)
    inside = [
        g
        for g in raw.gpu()
        if raw.launch_of(g) is not None
        and raw.start(step) <= raw.start(raw.launch_of(g)) < raw.end(step)
    ]
    return sorted(inside, key=raw.start)


def _idle_ns(raw: Raw, activities: list[int]) -> int:
    """GPU idle time between consecutive activities (after the furthest end so far)."""
    idle, reach = 0, raw.end(activities[0])
    for k in activities[1:]:
        idle += max(0, raw.start(k) - reach)
        reach = max(reach, raw.end(k))
    return idle


# -- the derived trace ----------------------------------------------------------------------


def test_the_script_writes_the_committed_file_with_its_license(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_eager_decode", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.write(script.derive(), tmp_path / "eager.json.gz")
    assert (tmp_path / "eager.json.gz").read_bytes() == EAGER.read_bytes()
    assert EAGER.stat().st_size < 100_000
    entry = json.loads((SERVING / "sources.json").read_text())["derived"][
        "vllm_decode_eager/vllm_decode_eager.json.gz"
    ]
    assert entry["sha256"] == hashlib.sha256(EAGER.read_bytes()).hexdigest()
    license_file = EAGER.parent / "LICENSE-tracelens"
    assert "MIT License" in license_file.read_text()


def test_it_loads_as_one_eager_decode_step_of_32(trace) -> None:
    (step,) = inference_steps(trace).to_dicts()
    assert (step["engine"], step["phase"], step["batch_size"]) == ("vllm", "decode", 32)
    assert step["graph_launches"] == 0 and step["replayed_kernels"] == 0


def test_it_has_no_graph_launch(raw, trace) -> None:
    assert not raw.where(lambda e: "GraphLaunch" in str(e.get("name")))
    assert not trace.runtime["name"].str.contains("GraphLaunch").any()


def test_every_gpu_activity_has_its_own_launch_call_and_flow(raw, trace) -> None:
    gpu = raw.gpu()
    launches = {g: raw.launch_of(g) for g in gpu}
    assert None not in launches.values()
    assert len(set(launches.values())) == len(gpu) == 434
    names = Counter(raw.events[c]["name"] for c in launches.values())
    assert sum(n for name, n in names.items() if "LaunchKernel" in name) == 425
    assert names["hipMemcpyAsync"] == 9
    for g, call in launches.items():  # each starts after its call (by the launch latency)
        assert raw.start(g) >= raw.start(call) + LATENCY_NS
    flows = Counter((e["ph"], e["id"]) for e in raw.events if e.get("cat") == "ac2g")
    for g in gpu:
        corr = raw.events[g]["args"]["correlation"]
        assert flows["s", corr] == 1 and flows["f", corr] >= 1
    linked = dict(zip(trace.kernels["event"], trace.kernels["runtime_event"], strict=True))
    assert linked == launches
    assert trace.kernels["op_event"].null_count() == 0


def test_gpu_activities_keep_the_replays_names_and_durations(raw) -> None:
    replay = Raw(REPLAY)

    def activities(r: Raw) -> Counter:
        return Counter((r.events[g]["name"], r.dur(g)) for g in r.gpu())

    assert activities(raw) == activities(replay)


# -- TQ201 ----------------------------------------------------------------------------------


def test_tq201_names_cuda_graphs_for_the_eager_decode_step(finding) -> None:
    assert "in engine step 0 (decode, batch 32) waiting for launches" in finding.message
    assert finding.evidence["engine_step"] == 0
    assert "without CUDA graphs" in finding.fix
    assert "--enforce-eager" in finding.fix and "reduce-overhead" in finding.fix


def test_tq201_numbers_match_the_raw_trace(raw, finding) -> None:
    in_step = _gpu_in_step(raw)
    assert len(in_step) == 434  # every GPU activity of the trace was launched in the step
    start, end = finding.evidence["start_ns"], finding.evidence["end_ns"]
    region = [k for k in in_step if start <= raw.start(k) and raw.end(k) <= end]
    assert raw.start(region[0]) == start and max(raw.end(k) for k in region) == end
    assert sorted(finding.kernels) == sorted(region)
    assert finding.evidence["kernels"] == len(region) == 370
    idle = _idle_ns(raw, region)
    assert finding.time_us == pytest.approx(idle / 1000)
    assert finding.evidence["idle_share"] == pytest.approx(idle / (end - start))
    assert finding.est_saving_us == pytest.approx(idle / 1000 - (len(region) - 1) * 1.0)
    starved = sum(
        raw.start(raw.launch_of(k)) >= raw.start(prev) and raw.start(k) - raw.end(prev) >= 1000
        for prev, k in itertools.pairwise(region)
    )
    assert finding.evidence["starved_transitions"] == starved
    # The region holds nearly all the step's idle GPU time: the kernels before it ran from
    # the queue the replay's GPU was still working through when the step began.
    step_idle = _idle_ns(raw, in_step)
    assert 0.99 * step_idle <= idle <= step_idle
    assert round(idle / 1000) == 36_783 and round(step_idle / 1000) == 36_845


def test_tq201_over_the_cli_gives_the_same_finding(finding) -> None:
    result = CliRunner().invoke(
        main, ["analyze", str(EAGER), "--select", "TQ201", "--format", "json", "--no-config"]
    )
    assert result.exit_code == 0, result.stderr
    (found,) = json.loads(result.stdout)["findings"]
    assert found["fix"] == finding.fix and found["message"] == finding.message
    assert found["est_saving_us"] == pytest.approx(finding.est_saving_us)


def test_tq201_is_silent_on_the_graph_replay_of_the_same_step() -> None:
    replayed = traceq.load(REPLAY)  # with its capture_traces/: kernels attributed
    assert traceq.analyze(replayed, select="TQ201") == []
