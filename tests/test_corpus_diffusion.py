"""The diffusion entries of the Execution Trace corpus: a UNet and a DiT, two denoising steps.

`fixtures/corpus/unet` and `dit` (diffusers 0.42.1, recorded by `fixtures/record_corpus.py`)
each run one model twice in one `ProfilerStep`, with a DDIM scheduler step after each call:
issue 10's class 1 (repeated calls with the same module path) as a diffusion pipeline has
it. The committed files are read with json and gzip (and traceq); only the re-recording
test needs diffusers, and it skips without it.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os
from collections import Counter
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import polars as pl
import pytest

import traceq
from traceq.relations.dataflow import dataflow, module_calls
from traceq.relations.dataflow.execution_trace import load_execution_trace
from traceq.rules.config import Config
from traceq.rules.engine import run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CORPUS = FIXTURES / "corpus"
MODEL = {"unet": "UNet2DConditionModel", "dit": "DiTTransformer2DModel"}
"""Each diffusion entry's model class, as its `nn.Module: <Class>_0` frame names it."""


def _paths(name: str) -> tuple[Path, Path]:
    kineto, et = CORPUS / f"{name}.pt.trace.json.gz", CORPUS / f"{name}.et.json.gz"
    if not (kineto.is_file() and et.is_file()):
        pytest.skip(f"corpus entry {name} is not recorded")
    return kineto, et


def _json(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


@cache
def _raw(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    kineto, et = _paths(name)
    return _json(kineto), _json(et)


def _model_calls(kineto: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The model's outermost module frames (`nn.Module: UNet2DConditionModel_0`), in order."""
    prefix = f"nn.Module: {MODEL[name]}_"
    calls = [
        e
        for e in kineto["traceEvents"]
        if e.get("cat") == "python_function" and e["name"].startswith(prefix)
    ]
    return sorted(calls, key=lambda e: e["ts"])


def _aten_in(kineto: dict[str, Any], span: dict[str, Any]) -> Counter[str]:
    return Counter(
        e["name"]
        for e in kineto["traceEvents"]
        if e.get("cat") == "cpu_op"
        and e["name"].startswith("aten::")
        and span["ts"] <= e["ts"] < span["ts"] + span["dur"]
    )


def _tensors(values: list[Any]) -> set[int]:
    """The tensor ids among an ET node's input or output values: a tensor is
    `[id, storage, offset, numel, itemsize, device]`, a tensor list a list of those."""
    found = set()
    for v in values:
        if isinstance(v, list) and len(v) == 6 and isinstance(v[0], int) and v[5] == "cpu":
            found.add(v[0])
        elif isinstance(v, list):
            found |= _tensors(v)
    return found


def test_the_index_lists_every_recorded_pair_with_its_sizes() -> None:
    index_path = CORPUS / "corpus.json"
    if not index_path.is_file():
        pytest.skip("fixtures/corpus is not recorded")
    index = json.loads(index_path.read_text())
    on_disk = {p.name.removesuffix(".pt.trace.json.gz") for p in CORPUS.glob("*.pt.trace.json.gz")}
    assert set(index) == on_disk
    assert {"unet", "dit"} <= on_disk
    for name, entry in index.items():
        assert entry["files"] == {
            f"{name}.pt.trace.json.gz": (CORPUS / f"{name}.pt.trace.json.gz").stat().st_size,
            f"{name}.et.json.gz": (CORPUS / f"{name}.et.json.gz").stat().st_size,
        }
    for name in MODEL:
        assert index[name]["diffusers_version"] == "0.42.1"


@pytest.mark.parametrize("name", sorted(MODEL))
def test_one_model_path_runs_twice_in_one_step_with_the_same_work(name: str) -> None:
    """Two denoising steps: the same `<Class>_0` frame twice in `ProfilerStep#1`, the same
    aten ops in each call, and the ET recorded every convolution and GEMM Kineto did."""
    kineto, et = _raw(name)
    steps = [e for e in kineto["traceEvents"] if e["name"].startswith("ProfilerStep#")]
    assert [e["name"] for e in steps] == ["ProfilerStep#1"]
    calls = _model_calls(kineto, name)
    assert [c["name"] for c in calls] == [f"nn.Module: {MODEL[name]}_0"] * 2
    first, second = (_aten_in(kineto, c) for c in calls)
    assert first == second
    assert first["aten::linear"] >= 10 and first["aten::conv2d"] >= 1
    in_et = Counter(n["name"] for n in et["nodes"])
    for op in ("aten::conv2d", "aten::linear", "aten::scaled_dot_product_attention"):
        assert in_et[op] == 2 * first[op] > 0


@pytest.mark.parametrize("name", sorted(MODEL))
def test_the_latents_reach_the_second_call_only_through_the_scheduler(name: str) -> None:
    """By the ET's tensor ids, no tensor call 1 wrote is read by call 2: the latents go
    from call 1 through the scheduler's ops (outside the model) to call 2, which reads
    what the scheduler's last `add` (`prev_sample`) wrote."""
    kineto, et = _raw(name)
    calls = _model_calls(kineto, name)
    ts_of = {
        e["args"]["Record function id"]: e["ts"]
        for e in kineto["traceEvents"]
        if e.get("cat") == "cpu_op" and "Record function id" in e.get("args", {})
    }

    def ts(node: dict[str, Any]) -> float | None:
        rf_id = next(a["value"] for a in node["attrs"] if a["name"] == "rf_id")
        return ts_of.get(rf_id)

    timed = [(t, n) for n in et["nodes"] if n["name"].startswith("aten::") and (t := ts(n))]
    timed.sort(key=lambda pair: pair[0])
    first_end = calls[0]["ts"] + calls[0]["dur"]
    in_first = [n for t, n in timed if calls[0]["ts"] <= t < first_end]
    between = [n for t, n in timed if first_end <= t < calls[1]["ts"]]
    in_second = [n for t, n in timed if calls[1]["ts"] <= t < calls[1]["ts"] + calls[1]["dur"]]
    assert in_first and between and in_second
    written_by_first = set().union(*(_tensors(n["outputs"]["values"]) for n in in_first))
    read_by_second = set().union(*(_tensors(n["inputs"]["values"]) for n in in_second))
    assert not (written_by_first & read_by_second)  # parameters are read, never written
    # prev_sample = alpha * x0 + direction, then what reads it before the call (the UNet's
    # `torch.cat([latents] * 2)` for classifier-free guidance)
    last_add = max(i for i, n in enumerate(between) if n["name"] == "aten::add")
    latents = _tensors(between[last_add]["outputs"]["values"])
    for node in between[last_add + 1 :]:
        if _tensors(node["inputs"]["values"]) & latents:
            latents |= _tensors(node["outputs"]["values"])
    assert latents & read_by_second


def _tops(trace: traceq.Trace) -> pl.DataFrame:
    """event -> its outermost module call instance (`_top`), for ops inside the model."""
    calls = module_calls(trace, trace.dataflow_ops).select("event", "_top")
    return calls.filter(pl.col("_top").is_not_null())


@pytest.mark.parametrize("name", sorted(MODEL))
def test_no_inferred_edge_joins_the_two_denoising_calls(name: str) -> None:
    """Call 2's ops have the shapes and module paths of call 1's: no inferred edge may
    link them (the ET has none: the test above)."""
    trace = traceq.load(_paths(name)[0], execution_trace=False)
    tops = _tops(trace)
    assert tops["_top"].n_unique() == 2
    crossing = (
        trace.dataflow.join(tops.rename({"event": "producer", "_top": "_p"}), on="producer")
        .join(tops.rename({"event": "consumer", "_top": "_c"}), on="consumer")
        .filter(pl.col("_p") != pl.col("_c"))
    )
    assert crossing.height == 0
    within = trace.dataflow.join(tops.rename({"event": "consumer"}), on="consumer")
    assert within.height > 300  # and the calls do hold data flow


@cache
def _findings(name: str, exact: bool) -> frozenset[tuple[str, frozenset[int]]]:
    kineto, et = _paths(name)
    trace = traceq.load(kineto, execution_trace=False)
    if exact:
        et_frame = load_execution_trace(et)
        trace.__dict__["dataflow"] = dataflow(trace, trace.dataflow_ops, execution_trace=et_frame)
    found = run(trace, Config(select=["TQ102", "TQ103", "TQ105"])).findings
    return frozenset((f.rule, frozenset(f.ops)) for f in found)


@pytest.mark.parametrize(
    ("name", "counts"),
    [
        # per denoising step: TimestepEmbedding's linear_1 -> silu, and linear_2's output
        # read by silu(temb) in each of the 8 ResnetBlock2Ds; the mid block's GEGLU; its
        # self-attention q/k/v and cross-attention k/v
        ("unet", {"TQ102": 18, "TQ103": 2, "TQ105": 4}),
        # per step: the tanh-GELU MLP of 2 blocks, the timestep embedding's linear -> silu
        # (once outside the blocks, once in each adaLN-Zero), q/k/v of 2 blocks
        ("dit", {"TQ102": 10, "TQ105": 4}),
    ],
)
def test_gemm_findings_agree_with_the_et(name: str, counts: dict[str, int]) -> None:
    """TQ102/103/105 on inferred data flow make exactly the findings exact data flow makes,
    in both denoising steps, and each finding holds ops of one model call only."""
    got, truth = _findings(name, exact=False), _findings(name, exact=True)
    assert got == truth
    assert Counter(rule for rule, _ in got) == counts
    tops = dict(_tops(traceq.load(_paths(name)[0])).iter_rows())
    assert len(set(tops.values())) == 2  # the two model calls
    for _, ops in got:
        assert len({tops.get(op) for op in ops}) == 1


def test_each_unet_geglu_is_one_tq103_finding() -> None:
    """The mid block's GEGLU (`proj` -> chunk -> `gelu(gate) * hidden`), once per
    denoising step: as many TQ103 findings as the ET has `aten::gelu` nodes."""
    _, et = _raw("unet")
    gelus = sum(n["name"] == "aten::gelu" for n in et["nodes"])
    assert gelus == 2
    assert sum(rule == "TQ103" for rule, _ in _findings("unet", exact=False)) == gelus


def test_unet_upsampler_conv_reads_the_upsampled_value() -> None:
    """`Upsample2D`: `conv(interpolate(x, scale_factor=2.0))`; the conv reads the
    `upsample_nearest2d` (its output shape from the scale factors), as in the ET."""
    from traceq.relations.dataflow.execution_trace import tensor_edges

    trace = traceq.load(_paths("unet")[0], execution_trace=False)
    et = load_execution_trace(_paths("unet")[1])
    convs = trace.dataflow_ops.filter(
        (pl.col("name") == "aten::conv2d") & pl.col("module").str.contains(r"Upsample2D_\d+\.")
    )["event"]
    assert convs.len() == 2  # one upsampler, two denoising steps

    def into(edges: pl.DataFrame) -> set[tuple[str, int]]:
        edges = edges.filter(pl.col("consumer").is_in(convs.implode()))
        return set(edges.select("producer_name", "consumer").iter_rows())

    exact = into(tensor_edges(trace, et))
    assert {name for name, _ in exact} == {"aten::upsample_nearest2d"}
    assert into(trace.dataflow) == exact


@pytest.fixture(scope="module")
def record_corpus() -> ModuleType:
    pytest.importorskip("torch")
    pytest.importorskip("diffusers", reason="re-recording the diffusion entries needs diffusers")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(FIXTURES))  # record_corpus.py imports its sibling record.py
        return importlib.import_module("record_corpus")


@pytest.mark.slow
def test_rerecording_dit_matches_the_committed_pair(
    record_corpus: ModuleType, tmp_path: Path
) -> None:
    """The recorder still builds the committed DiT: the same cpu ops and ET nodes."""
    _paths("dit")
    entry = record_corpus.record("dit", tmp_path)
    assert entry["diffusers_version"] is not None
    for suffix, key, select in (
        (".pt.trace.json.gz", "traceEvents", lambda e: e.get("cat") == "cpu_op"),
        (".et.json.gz", "nodes", lambda n: n["name"].startswith("aten::")),
    ):
        new, old = _json(tmp_path / f"dit{suffix}"), _json(CORPUS / f"dit{suffix}")
        assert Counter(e["name"] for e in new[key] if select(e)) == Counter(
            e["name"] for e in old[key] if select(e)
        )
