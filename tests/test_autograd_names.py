"""The profiler's names for autograd's work, read in one place (`relations/autograd.py`).

An autograd node has one spelling (`is_node`); whether a range is the engine's frame
around one (`is_frame`, `framed_node`) and whether its node runs a derivative formula
(`is_formula`) are properties of a node. These cases pin what each takes, on names as
PyTorch's profiler writes them, so that a change to one fails here rather than silently
moving data-flow edges or findings.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

import traceq
from traceq.relations import autograd
from traceq.relations.breakdown import BACKWARD_OP

NAMES = {
    "AddmmBackward0": {"node", "formula"},
    "autograd::engine::evaluate_function: AddmmBackward0": {"node", "formula", "frame"},
    "MyFnBackward": {"node"},  # a custom autograd.Function
    "DifferentiableGraphBackward": {"node"},  # TorchScript
    "<backward op>": {"node"},  # names stripped (HTA's anonymised traces)
    "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad": {"node", "frame"},
    "aten::addmm": set(),
    "Backwards": set(),
    "aten::backward_hook": set(),
}


@pytest.mark.parametrize(("name", "kinds"), NAMES.items())
def test_each_property_takes_the_names_it_documents(name: str, kinds: set[str]) -> None:
    names = pl.DataFrame({"name": [name]})
    got = {
        kind
        for kind, test in (
            ("node", autograd.is_node()),
            ("formula", autograd.is_formula()),
            ("frame", autograd.is_frame()),
        )
        if names.select(test).item()
    }
    assert got == kinds


def test_a_frame_names_the_node_it_runs() -> None:
    names = pl.DataFrame(
        {"name": ["autograd::engine::evaluate_function: MulBackward0", "MulBackward0"]}
    )
    assert names.select(autograd.framed_node())["name"].to_list() == ["MulBackward0", None]


def test_no_module_spells_a_node_of_its_own() -> None:
    assert BACKWARD_OP == autograd.ENGINE_FRAME
    spelling = re.compile(r"Backward\\d|evaluate_function:\"|<backward op>")
    package = Path(traceq.__file__).parent
    spelled = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "autograd.py" and spelling.search(path.read_text())
    ]
    assert spelled == []
