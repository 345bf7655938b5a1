"""The fusion rules on patterns the bundled fixtures do not hold, recorded here with
`torch.profiler` (CPU, record_shapes, with_modules) from small models written the way
models write them: GPT-2's `gelu_new` spelled out after a Linear, `x * sigmoid(x)`,
`clamp(min=0)` as ReLU, a gate/up projection merged into one GEMM and split with `chunk`,
a GLU gated by a written-out GELU, and `relu(x @ W + b)`.

Each model runs once unprofiled (warm-up), then once under the profiler; the expected
findings follow from the model code alone. Skipped where torch is not installed (traceq
itself never imports it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import traceq
import traceq.relations.dataflow
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.finding import Finding

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

DIM, HIDDEN, ROWS = 64, 128, 32


def gelu_new(x: Any) -> Any:
    """GPT-2's GELU, as `transformers.activations.NewGELUActivation` writes it."""
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


class GeluNewMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, HIDDEN)
        self.proj = nn.Linear(HIDDEN, DIM)

    def forward(self, x: Any) -> Any:
        return self.proj(gelu_new(self.fc(x)))


class SiluWrittenMlp(GeluNewMlp):
    def forward(self, x: Any) -> Any:
        h = self.fc(x)
        return self.proj(h * torch.sigmoid(h))


class ClampReluMlp(GeluNewMlp):
    def forward(self, x: Any) -> Any:
        return self.proj(self.fc(x).clamp(min=0))


class ChunkSwiglu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_up = nn.Linear(DIM, 2 * HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: Any) -> Any:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class GeluNewGlu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(DIM, HIDDEN, bias=False)
        self.up = nn.Linear(DIM, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: Any) -> Any:
        return self.down(gelu_new(self.gate(x)) * self.up(x))


class MatmulBiasRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(DIM, HIDDEN) / DIM**0.5)
        self.bias = nn.Parameter(torch.zeros(HIDDEN))

    def forward(self, x: Any) -> Any:
        return torch.relu(x @ self.weight + self.bias)


class SquareGlu(nn.Module):
    """A SwiGLU whose hidden size equals its input size (K == N): every value is [ROWS, DIM]."""

    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM) if norm else nn.Identity()
        self.gate = nn.Linear(DIM, DIM, bias=False)
        self.up = nn.Linear(DIM, DIM, bias=False)
        self.down = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: Any) -> Any:
        x = self.norm(x)
        return self.down(F.silu(self.gate(x)) * self.up(x))


class SquareChain(SquareGlu):
    """Linear -> SiLU -> Linear with K == N: the chain a square GLU must not be read as."""

    def forward(self, x: Any) -> Any:
        return self.up(F.silu(self.gate(x)))


class AddmmGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(HIDDEN, DIM) / DIM**0.5)
        self.bias = nn.Parameter(torch.zeros(HIDDEN))

    def forward(self, x: Any) -> Any:
        return torch._addmm_activation(self.bias, x, self.weight.t(), use_gelu=True)


MODELS = {
    "gelu_new": GeluNewMlp,
    "silu_written": SiluWrittenMlp,
    "clamp_relu": ClampReluMlp,
    "chunk_swiglu": ChunkSwiglu,
    "gelu_new_glu": GeluNewGlu,
    "matmul_bias_relu": MatmulBiasRelu,
    "square_glu": SquareGlu,
    "norm_square_glu": lambda: SquareGlu(norm=True),
    "square_chain": SquareChain,
    "addmm_gelu": AddmmGelu,
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], traceq.Trace]:
    folder: Path = tmp_path_factory.mktemp("recorded")
    cache: dict[str, traceq.Trace] = {}

    def record(name: str) -> traceq.Trace:
        if name not in cache:
            torch.manual_seed(0)
            model = MODELS[name]().eval()
            x = torch.randn(ROWS, DIM)
            activities = [torch.profiler.ProfilerActivity.CPU]
            with torch.no_grad():
                model(x)
                with torch.profiler.profile(
                    activities=activities, record_shapes=True, with_modules=True
                ) as prof:
                    model(x)
            path = folder / f"{name}.json"
            prof.export_chrome_trace(str(path))
            cache[name] = traceq.load(path)
        return cache[name]

    return record


def analyze(trace: traceq.Trace, code: str) -> list[Finding]:
    return run(trace, Config(select=(code,))).findings


def physical_cap(trace: traceq.Trace, found: Finding) -> float:
    """TQ102's cap: the activation's traffic at the CPU model's bandwidth plus one dispatch
    per removed op (`traceq.perf.savings.removable_us`)."""
    from traceq.perf.device import device_model

    dispatch = device_model(trace).launch_overhead_us
    return found.evidence["round_trip_floor_us"] + (len(found.ops) - 1) * dispatch


def test_gelu_new_is_one_activation_in_the_gemm_epilogue(recorded: Callable) -> None:
    trace = recorded("gelu_new")
    (found,) = analyze(trace, "TQ102")
    assert found.evidence["written_out"] is True
    assert found.evidence["activation"] == "gelu"
    names = [n.removeprefix("aten::") for n in found.evidence["op_names"]]
    # linear, then 0.5*x, x**3, 0.044715*x**3, x + ..., c * (...), tanh, 1 + tanh, product
    assert names == ["linear", "mul", "pow", "mul", "add", "mul", "tanh", "add", "mul"]
    assert found.zoo == ["gemm_bias_act", "mlp"]
    assert "F.gelu" in found.fix
    # every op of the written-out GELU is removed by the epilogue: its whole time saved, up
    # to what fusion can physically remove (their traffic and one dispatch per op)
    durations = dict(zip(trace.ops["event"].to_list(), trace.ops["dur_ns"].to_list(), strict=True))
    measured = sum(durations[e] for e in found.ops[1:]) / 1000
    assert found.est_saving_us == pytest.approx(min(measured, physical_cap(trace, found)), rel=1e-3)
    assert analyze(trace, "TQ104") == []  # the chain is TQ102's


def test_x_times_sigmoid_x_is_a_written_out_silu(recorded: Callable) -> None:
    (found,) = analyze(recorded("silu_written"), "TQ102")
    assert found.evidence["activation"] == "silu"
    assert found.evidence["op_names"] == ["aten::linear", "aten::sigmoid", "aten::mul"]


def test_clamp_min_zero_is_a_relu(recorded: Callable) -> None:
    (found,) = analyze(recorded("clamp_relu"), "TQ102")
    assert found.evidence["activation"] == "relu"
    assert found.evidence["op_names"] == ["aten::linear", "aten::clamp"]


def test_a_glu_split_from_one_gemm_needs_only_the_fused_activation(recorded: Callable) -> None:
    trace = recorded("chunk_swiglu")
    (found,) = analyze(trace, "TQ103")
    assert found.evidence["gate"] == found.evidence["up"]
    assert found.zoo == ["glu", "mlp"]  # gate and up are merged already
    assert "concatenated" not in found.fix
    assert analyze(trace, "TQ105") == []
    assert analyze(trace, "TQ102") == []


def test_a_glu_gated_by_a_written_out_gelu_is_tq103s(recorded: Callable) -> None:
    trace = recorded("gelu_new_glu")
    (found,) = analyze(trace, "TQ103")
    assert found.evidence["glu"] == "GeGLU"
    assert len(found.evidence["activation_ops"]) == 8
    assert analyze(trace, "TQ102") == []
    assert analyze(trace, "TQ104") == []
    (parallel,) = analyze(trace, "TQ105")
    assert sorted(parallel.ops) == sorted([found.evidence["gate"], found.evidence["up"]])


def test_an_activation_after_a_split_bias_is_still_the_gemms(recorded: Callable) -> None:
    trace = recorded("matmul_bias_relu")
    (bias,) = analyze(trace, "TQ101")
    (act,) = analyze(trace, "TQ102")
    assert bias.evidence["op_names"] == ["aten::matmul", "aten::add"]
    assert act.evidence["op_names"] == ["aten::matmul", "aten::relu"]
    assert act.evidence["bias_add"] == bias.ops[1]
    assert analyze(trace, "TQ104") == []  # add and relu are reported by TQ101 and TQ102


def edges_between(trace: traceq.Trace) -> set[tuple[str, str]]:
    """Data-flow edges as (producer, consumer) op names, numbered in program order."""
    ops = traceq.relations.dataflow.dataflow_ops(trace).sort("ts_ns")
    label = {
        e: f"{n.removeprefix('aten::')}{i}"
        for i, (e, n) in enumerate(ops.select("event", "name").iter_rows())
    }
    edges = traceq.relations.dataflow.dataflow(trace, ops)
    return {(label[p], label[c]) for p, c in edges.select("producer", "consumer").iter_rows()}


def test_a_square_glus_up_projection_reads_the_gates_input(recorded: Callable) -> None:
    # gate(x) and silu(gate(x)) have x's shape: shape matching alone would feed silu to up
    assert edges_between(recorded("square_glu")) == {
        ("linear0", "silu1"),
        ("silu1", "mul3"),
        ("linear2", "mul3"),
        ("mul3", "linear4"),
    }
    edges = edges_between(recorded("norm_square_glu"))
    assert {("layer_norm0", "linear1"), ("layer_norm0", "linear3")} <= edges
    assert ("silu2", "linear3") not in edges


def test_a_square_glu_is_tq103s_and_its_gemms_tq105s(recorded: Callable) -> None:
    for name in ("square_glu", "norm_square_glu"):
        trace = recorded(name)
        (found,) = analyze(trace, "TQ103")
        assert found.evidence["glu"] == "SwiGLU"
        assert analyze(trace, "TQ102") == []
        (parallel,) = analyze(trace, "TQ105")
        assert sorted(parallel.ops) == sorted([found.evidence["gate"], found.evidence["up"]])


def test_a_square_chain_stays_a_chain(recorded: Callable) -> None:
    trace = recorded("square_chain")
    assert ("silu1", "linear2") in edges_between(trace)
    (found,) = analyze(trace, "TQ102")
    assert found.evidence["next_gemm"] is not None
    assert analyze(trace, "TQ103") == []


def test_addmm_activation_on_the_cpu_is_a_split_gemm_and_activation(
    recorded: Callable,
) -> None:
    # on the CPU `_addmm_activation` runs addmm, then `gelu_` on its output: no epilogue
    trace = recorded("addmm_gelu")
    (found,) = analyze(trace, "TQ102")
    assert found.evidence["op_names"] == ["aten::_addmm_activation", "aten::gelu_"]
    assert found.evidence["activation"] == "gelu"
    gelu = trace.ops.filter(pl.col("name") == "aten::gelu_")
    assert found.ops[1] == gelu["event"].item()
    measured = gelu["dur_ns"].item() / 1000
    assert found.est_saving_us == pytest.approx(min(measured, physical_cap(trace, found)), rel=1e-3)
    assert "fuses only on CUDA" in found.fix  # not "use _addmm_activation" for that op
