"""An outside package plugs into the zoo exactly like the built-in one does."""

from __future__ import annotations

import json

from click.testing import CliRunner
from traceq.cli.zoo import zoo as zoo_group
from traceq.zoo.check import check
from traceq.zoo.registry import discover

GOOD_PLUGIN = """
    import torch
    from traceq.zoo.registry import Entry

    def swiglu(gate, up, act, *, out=None):
        result = torch.nn.functional.silu(gate) * up
        if out is None:
            return result
        out.copy_(result)
        return out

    ENTRIES = [
        Entry(
            name="demo.swiglu",
            pattern="glu",
            impl="demo",
            fn=swiglu,
            out_fn=swiglu,
            activations=("silu",),
            dtypes=("float32", "bfloat16"),
            devices=("cpu",),
            description="a plugin's SwiGLU",
        )
    ]
"""

# Forgets the last column: a tiled kernel's classic bug, which only poisoning reveals.
LAZY_PLUGIN = """
    import torch
    from traceq.zoo.registry import Entry

    def lazy_swiglu(gate, up, act, *, out):
        out[..., :-1] = torch.nn.functional.silu(gate[..., :-1]) * up[..., :-1]
        return out

    ENTRIES = [
        Entry(
            name="lazy.swiglu",
            pattern="glu",
            impl="lazy",
            fn=lambda gate, up, act: torch.nn.functional.silu(gate) * up,
            out_fn=lazy_swiglu,
            activations=("silu",),
            dtypes=("float32",),
            devices=("cpu",),
            description="forgets the last column",
        )
    ]
"""

BROKEN_PLUGIN = """
    raise ImportError("this plugin needs a package that is not here")
"""


def test_an_installed_plugin_is_discovered_beside_the_builtin_zoo(install_plugin) -> None:  # type: ignore[no-untyped-def]
    install_plugin("traceq_zoo_demo", GOOD_PLUGIN)
    found = discover()
    names = {e.name for e in found.entries}
    assert "demo.swiglu" in names and "glu.triton" in names
    assert found.get("demo.swiglu").impl == "demo"
    assert not found.problems


def test_a_plugin_entry_goes_through_the_same_harness(install_plugin) -> None:  # type: ignore[no-untyped-def]
    install_plugin("traceq_zoo_demo", GOOD_PLUGIN)
    report = check("glu", (64, 128, 96), "float32", "cpu", "silu", select={"demo"}, timing=False)
    result = report.entry("demo.swiglu")
    assert result.status == "pass" and len(result.cases) == 4
    assert result.max_rel_error is not None and result.max_rel_error < 1e-6


def test_poisoning_catches_a_plugin_that_forgets_a_column(install_plugin) -> None:  # type: ignore[no-untyped-def]
    install_plugin("traceq_zoo_lazy", LAZY_PLUGIN)
    report = check("glu", (64, 128, 96), "float32", "cpu", "silu", select={"lazy"}, timing=False)
    result = report.entry("lazy.swiglu")
    assert result.status == "fail" and not report.passed
    assert all(c.error == "non-finite output" for c in result.cases)


def test_a_broken_plugin_is_reported_and_the_rest_still_loads(install_plugin) -> None:  # type: ignore[no-untyped-def]
    install_plugin("traceq_zoo_broken", BROKEN_PLUGIN)
    install_plugin("traceq_zoo_demo", GOOD_PLUGIN)
    found = discover()
    assert "demo.swiglu" in {e.name for e in found.entries}
    assert [(p.source, p.error) for p in found.problems] == [
        ("traceq_zoo_broken", "ImportError: this plugin needs a package that is not here")
    ]


def test_zoo_list_shows_the_plugin_entry_and_the_broken_one(install_plugin) -> None:  # type: ignore[no-untyped-def]
    install_plugin("traceq_zoo_demo", GOOD_PLUGIN)
    install_plugin("traceq_zoo_broken", BROKEN_PLUGIN)
    runner = CliRunner()
    as_json = runner.invoke(zoo_group, ["list", "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    payload = json.loads(as_json.output)
    demo = next(e for e in payload["entries"] if e["name"] == "demo.swiglu")
    assert demo["pattern"] == "glu" and demo["available"] is True
    assert payload["problems"][0]["source"] == "traceq_zoo_broken"
    as_text = runner.invoke(zoo_group, ["list"])
    assert as_text.exit_code == 0
    assert "demo.swiglu" in as_text.output and "traceq_zoo_broken" in as_text.output


def test_zoo_check_exits_1_when_a_plugin_entry_fails_numerics(install_plugin) -> None:  # type: ignore[no-untyped-def]
    install_plugin("traceq_zoo_lazy", LAZY_PLUGIN)
    result = CliRunner().invoke(
        zoo_group,
        ["check", "glu", "--shape", "64,128,96", "--act", "silu", "--entry", "lazy", "--no-timing"],
    )
    assert result.exit_code == 1, result.output
    assert "FAIL lazy.swiglu" in result.output
