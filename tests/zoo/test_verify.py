"""The closed loop: a finding's rule fires on the split reference and not on the fused entry.

Each verify records two small traces (one entry call per profiled step, 3 steps) and
analyzes them, about a second on the CPU; planning tests record nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from traceq.cli.zoo import zoo as zoo_cli
from traceq.zoo.errors import ZooUsageError
from traceq.zoo.gemm_bias_act.reference import gemm_bias_act_reference
from traceq.zoo.registry import Entry, Zoo
from traceq.zoo.verify import (
    CPU_SHAPE_LIMIT,
    Plan,
    plan_finding,
    run_plan,
    scaled_shape,
    verify,
)

import traceq
from traceq.analyze import analyze
from traceq.rules.finding import Finding

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
#: K != N: with K == N the analyzer's shape-based data flow cannot tell a GLU's input from
#: its GEMM outputs, and TQ103/TQ105 do not fire on the eager reference (not_reproduced).
SHAPE = (32, 64, 96)

#: An "entry" that claims to fuse GEMM + activation but runs them split, as a plugin might.
STILL_SPLIT = Entry(
    name="gemm_bias_act.still_split",
    pattern="gemm_bias_act",
    impl="fake-fused",
    fn=gemm_bias_act_reference,
    activations=("gelu", "gelu_tanh", "relu", "silu", "none"),
    dtypes=("float32",),
    devices=("cpu", "cuda"),
    description="F.linear then the activation, under a fused-sounding name",
)


def _fixture_findings(name: str) -> tuple[traceq.Trace, list[Finding]]:
    trace = traceq.load(FIXTURES / f"{name}.pt.trace.json.gz")
    return trace, analyze(trace)


def test_gelu_tanh_gemm_finding_is_gone_with_the_triton_epilogue(
    builtin_zoo: Zoo, device: str
) -> None:
    result = verify("gemm_bias_act", shape=SHAPE, act="gelu_tanh", device=device, zoo=builtin_zoo)
    assert result.status == "gone" and result.gone
    assert result.rules == ("TQ102",)
    assert [c.to_dict() for c in result.checks] == [
        {"rule": "TQ102", "split": 3, "fused": 0, "gone": True}
    ]
    assert result.split is not None and result.fused is not None
    assert result.split.top_level_ops == {"aten::gelu": 3, "aten::linear": 3}
    assert result.fused.top_level_ops == {"zoo::gemm_bias_act_triton": 3}
    assert result.fused.entry == "gemm_bias_act.triton"
    assert result.fused.timed == (device == "cuda")
    assert result.split.step_us > 0 and result.fused.step_us > 0
    payload = json.loads(json.dumps(result.to_dict()))
    assert payload["gone"] is True and payload["summary"].startswith("TQ102 gone")


def test_bias_add_without_activation_checks_tq101(builtin_zoo: Zoo, device: str) -> None:
    result = verify("gemm_bias_act", shape=SHAPE, act="none", device=device, zoo=builtin_zoo)
    assert result.rules == ("TQ101",) and result.gone
    assert result.split is not None
    assert result.split.entry == "gemm_bias_act.matmul_add"
    assert {"aten::matmul", "aten::add"} <= set(result.split.top_level_ops)


def test_glu_is_proven_inside_the_eager_glu_mlp(builtin_zoo: Zoo, device: str) -> None:
    result = verify("glu", shape=SHAPE, act="silu", device=device, zoo=builtin_zoo)
    assert result.rules == ("TQ103",)
    assert [(c.split, c.fused) for c in result.checks] == [(3, 0)]
    assert result.split is not None and result.fused is not None
    assert result.split.top_level_ops == {"aten::linear": 6, "aten::mul": 3, "aten::silu": 3}
    # the same GEMMs; only the GLU changed
    assert result.fused.top_level_ops == {"aten::linear": 6, "zoo::glu_triton": 3}


def test_a_bare_glu_on_inputs_does_not_reproduce_tq103(builtin_zoo: Zoo, device: str) -> None:
    """Why glu is recorded after GEMMs: TQ103 looks for act(gate GEMM) * up GEMM."""
    plan = Plan(
        pattern="glu",
        record_pattern="glu",
        rules=("TQ103",),
        split=builtin_zoo.get("glu.reference"),
        fused=builtin_zoo.get("glu.triton"),
        variant="contiguous",
        act="silu",
        dtype="float32",
        device=device,
        shape=SHAPE,
        requested_shape=SHAPE,
        scale=1,
    )
    result = run_plan(plan)
    assert result.status == "not_reproduced" and not result.gone
    assert result.checks[0].split == 0


def test_a_fused_entry_that_still_runs_split_keeps_the_finding(
    builtin_zoo: Zoo, device: str
) -> None:
    zoo = Zoo((*builtin_zoo.entries, STILL_SPLIT))
    result = verify(
        "gemm_bias_act",
        shape=SHAPE,
        act="relu",
        device=device,
        entry=STILL_SPLIT.name,
        zoo=zoo,
    )
    assert result.status == "still_fires" and not result.gone
    assert [(c.split, c.fused) for c in result.checks] == [(3, 3)]
    assert "still fires" in result.summary


def test_a_rule_without_a_zoo_pattern_is_a_result_not_an_error() -> None:
    finding = Finding(rule="TQ204", name="dispatch-overhead", severity="info", message="m")
    result = verify(finding)
    assert result.status == "no_zoo_pattern" and not result.gone
    assert result.split is None and result.fused is None
    assert result.summary == "no zoo pattern for TQ204 (dispatch-overhead)"
    assert result.to_dict()["rule"] == "TQ204"


def test_an_activation_the_zoo_cannot_fuse_is_unsupported(builtin_zoo: Zoo) -> None:
    finding = Finding(
        rule="TQ102",
        name="split-gemm-activation",
        severity="warning",
        message="m",
        shapes=[[32, 64], [128, 64], [128]],
        dtype="float",
        evidence={"op_names": ["aten::linear", "aten::tanh"], "activation": "tanh"},
    )
    result = verify(finding, zoo=builtin_zoo)
    assert result.status == "unsupported" and not result.gone
    assert "tanh" in result.summary
    finding.evidence["activation"] = "gelu"
    finding.dtype = "double"  # no fused entry runs float64 (addmm_activation does not fuse)
    result = verify(finding, device="cpu", zoo=builtin_zoo)
    assert result.status == "unsupported" and "float64" in result.reason


def test_findings_map_to_the_shapes_of_their_gemms(builtin_zoo: Zoo) -> None:
    _, mm_add = _fixture_findings("matmul_add-eager")
    plan = plan_finding(mm_add[0], device="cpu", zoo=builtin_zoo)
    assert plan is not None
    assert (plan.rules, plan.shape, plan.act) == (("TQ101",), (32, 64, 128), "none")
    assert plan.split.name == "gemm_bias_act.matmul_add" and plan.dtype == "float32"

    _, gelu = _fixture_findings("mlp_gelu-eager")
    plan = plan_finding(gelu[0], device="cpu", zoo=builtin_zoo)
    assert plan is not None
    assert (plan.rules, plan.shape, plan.act) == (("TQ102",), (32, 64, 128), "gelu")
    assert plan.split.name == "gemm_bias_act.reference"


def test_a_glu_finding_takes_k_from_the_trace_or_its_parallel_gemms(builtin_zoo: Zoo) -> None:
    trace, findings = _fixture_findings("geglu_mlp-eager")
    glu = next(f for f in findings if f.rule == "TQ103")
    gemms = next(f for f in findings if f.rule == "TQ105")
    # gate/up: x [4, 16, 64] -> hidden 128; the multiply's shapes alone have no K
    with_trace = plan_finding(glu, trace=trace, device="cpu", zoo=builtin_zoo)
    with_sibling = plan_finding(glu, siblings=findings, device="cpu", zoo=builtin_zoo)
    alone = plan_finding(glu, device="cpu", zoo=builtin_zoo)
    assert with_trace is not None and with_sibling is not None and alone is not None
    assert with_trace.shape == with_sibling.shape == (64, 64, 128)
    assert alone.shape == (64, 128, 128) and any("assumed K" in n for n in alone.notes)
    assert (with_trace.pattern, with_trace.act, with_trace.rules) == ("glu", "gelu", ("TQ103",))

    merged = plan_finding(gemms, siblings=findings, device="cpu", zoo=builtin_zoo)
    assert merged is not None
    assert (merged.pattern, merged.shape, merged.act) == ("dual_gemm_glu", (64, 64, 128), "gelu")
    assert merged.rules == ("TQ105",)  # the finding's rule, not every rule the pattern fixes


def test_interpreted_shapes_scale_down_by_one_factor() -> None:
    assert scaled_shape((8192, 768, 3072), interpreted=True) == ((128, 12, 48), 64)
    assert scaled_shape((8192, 768, 3072), interpreted=False) == ((8192, 768, 3072), 1)
    assert scaled_shape((100, 300, 50), interpreted=False, scale=4) == ((25, 75, 13), 4)
    assert scaled_shape(CPU_SHAPE_LIMIT, interpreted=True) == (CPU_SHAPE_LIMIT, 1)
    with pytest.raises(ZooUsageError, match="scale"):
        scaled_shape((8, 8, 8), interpreted=True, scale=0)


def test_a_finding_too_large_for_the_interpreter_is_recorded_scaled(
    builtin_zoo: Zoo, device: str
) -> None:
    finding = Finding(
        rule="TQ102",
        name="split-gemm-activation",
        severity="warning",
        message="m",
        shapes=[[8, 1024, 768], [3072, 768], [3072]],  # the post's Linear+GELU at 8192 rows
        dtype="c10::BFloat16",
        evidence={"op_names": ["aten::linear", "aten::gelu"], "activation": "gelu"},
    )
    plan = plan_finding(finding, device=device, zoo=builtin_zoo)
    assert plan is not None and plan.dtype == "bfloat16"
    assert plan.requested_shape == (8192, 768, 3072)
    if device == "cpu":  # Triton runs interpreted: scaled to fit, proportions kept
        assert (plan.shape, plan.scale) == ((128, 12, 48), 64)
        assert any("interpreted" in note for note in plan.notes)
    else:
        assert (plan.shape, plan.scale) == ((8192, 768, 3072), 1)


def test_the_result_shows_the_scale_it_recorded_at(builtin_zoo: Zoo) -> None:
    result = verify(
        "gemm_bias_act", shape=(64, 128, 128), act="relu", device="cpu", scale=2, zoo=builtin_zoo
    )
    assert result.gone
    assert (result.requested_shape, result.shape, result.scale) == ((64, 128, 128), (32, 64, 64), 2)
    assert "scaled 1/2" in result.summary


def test_bad_requests_raise_usage_errors(builtin_zoo: Zoo) -> None:
    with pytest.raises(ZooUsageError, match="unknown pattern"):
        verify("conv", shape=SHAPE, zoo=builtin_zoo)
    with pytest.raises(ZooUsageError, match="needs a shape"):
        verify("glu", zoo=builtin_zoo)
    with pytest.raises(ZooUsageError, match="no GLU"):
        verify("glu", shape=SHAPE, act="none", device="cpu", zoo=builtin_zoo)
    with pytest.raises(ZooUsageError, match="split reference"):
        verify("glu", shape=SHAPE, device="cpu", entry="glu.reference", zoo=builtin_zoo)


def _cli(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(zoo_cli, ["verify", *args])


def test_cli_names_the_rule_and_exits_0_when_gone(device: str) -> None:
    result = _cli("gemm_bias_act", "--shape", "32,64,64", "--act", "gelu_tanh", "--device", device)
    assert result.exit_code == 0, result.output
    assert "verify TQ102" in result.output and "TQ102 gone" in result.output


def test_cli_json_and_exit_1_when_the_finding_stays(device: str, install_plugin) -> None:  # type: ignore[no-untyped-def]
    install_plugin(
        "still_split_zoo",
        """
        from traceq.zoo.gemm_bias_act.reference import gemm_bias_act_reference
        from traceq.zoo.registry import Entry

        ENTRIES = [Entry(name="plugin.still_split", pattern="gemm_bias_act", impl="fake-fused",
                         fn=gemm_bias_act_reference, activations=("relu",),
                         dtypes=("float32",), devices=("cpu", "cuda"), description="split")]
        """,
    )
    result = _cli(
        "gemm_bias_act",
        "--shape",
        "32,64,64",
        "--act",
        "relu",
        "--device",
        device,
        "--entry",
        "plugin.still_split",
        "--format",
        "json",
    )
    assert result.exit_code == 1, result.output
    payload = json.loads(result.output)
    assert payload["status"] == "still_fires" and payload["checks"][0]["fused"] == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("gemm_bias_act", "--shape", "32,64"), "M,K,N"),
        (("gemm_bias_act", "--shape", "0,64,64"), "M,K,N"),
        (("conv2d", "--shape", "32,64,64"), "unknown pattern"),
        (("gemm_bias_act", "--shape", "32,64,64", "--act", "swish"), "unknown activation"),
        (("gemm_bias_act", "--shape", "32,64,64", "--entry", "nope"), "no zoo entry"),
    ],
)
def test_cli_bad_usage_exits_2_with_one_line(args: tuple[str, ...], message: str) -> None:
    result = _cli(*args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
