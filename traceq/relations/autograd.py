"""How the profiler names autograd's work: the one place the relations and rules read it.

Three spellings are needed, on purpose, and each caller picks the one its reasoning holds
for: the engine's frame around each node it runs; any node (a custom `autograd.Function`'s
`MyFnBackward` included), for "this op is backward work"; and only the nodes of PyTorch's
derivative formulas (`AddmmBackward0`), for "this node reads what its formula reads".
"""

from __future__ import annotations

ENGINE_FRAME = "autograd::engine::evaluate_function:"
"""The engine's range around each node it runs: `evaluate_function: AddmmBackward0`."""
NODE = r"Backward\d*$"
"""Any autograd node, by name: `AddmmBackward0`, a custom Function's `MyFnBackward`,
TorchScript's `DifferentiableGraphBackward`."""
FORMULA_NODE = r"Backward\d+$"
"""A node of PyTorch's derivative formulas (`AddmmBackward0`), numbered by overload. Not a
custom `autograd.Function`'s or TorchScript's: their backward is any code, whose ops read
each other."""
ANONYMISED_NODE = "<backward op>"
"""What a trace with names stripped (HTA's anonymised test traces) calls a node."""
