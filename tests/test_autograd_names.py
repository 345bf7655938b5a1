"""The profiler's names for autograd's work, matched as each caller's reasoning needs.

`relations/autograd.py` holds the three spellings; these cases pin what each one takes, on
names as PyTorch's profiler writes them, so that merging two of them (they differ on
purpose) fails here rather than silently moving data-flow edges.
"""

from __future__ import annotations

import polars as pl
import pytest

from traceq.relations import autograd
from traceq.relations.backward_reads import BACKWARD_NODE
from traceq.relations.breakdown import BACKWARD_OP
from traceq.relations.gradients import EVALUATE
from traceq.rules.opclass import AUTOGRAD_NODE

NAMES = {
    "AddmmBackward0": {"node", "formula", "work"},
    "autograd::engine::evaluate_function: AddmmBackward0": {"node", "formula", "work"},
    "MyFnBackward": {"node", "work"},  # a custom autograd.Function
    "DifferentiableGraphBackward": {"node", "work"},  # TorchScript
    "<backward op>": {"work"},  # names stripped (HTA's anonymised traces)
    "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad": {"work"},
    "aten::addmm": set(),
    "Backwards": set(),
    "aten::backward_hook": set(),
}


@pytest.mark.parametrize(("name", "kinds"), NAMES.items())
def test_each_spelling_takes_the_names_it_documents(name: str, kinds: set[str]) -> None:
    names = pl.Series([name])
    got = {
        kind
        for kind, pattern in (
            ("node", autograd.NODE),
            ("formula", autograd.FORMULA_NODE),
            ("work", AUTOGRAD_NODE),
        )
        if names.str.contains(pattern).item()
    }
    assert got == kinds


def test_callers_read_the_one_module() -> None:
    assert BACKWARD_OP == EVALUATE.rstrip() == autograd.ENGINE_FRAME
    assert BACKWARD_NODE == autograd.FORMULA_NODE
