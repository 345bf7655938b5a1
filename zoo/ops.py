"""How a zoo entry becomes a torch custom op: ``zoo::<name>``, seen by name in a trace.

A fused kernel called from Python shows in the profiler only as its launches, and
torch.compile cannot trace into it. Registered as a custom op it is one named op in both,
and its fake kernel tells torch.compile the output's shape and dtype without running it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def zoo_op(
    fake: Callable[..., Any],
) -> Callable[[Callable[..., Any]], torch.library.CustomOpDef]:
    """Register the decorated function as the custom op ``zoo::<its name>``, which writes
    none of its inputs, with ``fake`` (same arguments, empty outputs) as its fake kernel.

    The schema comes from the function's annotations, so it must annotate every argument.
    """

    def register(fn: Callable[..., Any]) -> torch.library.CustomOpDef:
        op = torch.library.custom_op(f"zoo::{fn.__name__}", fn, mutates_args=())
        op.register_fake(fake)
        return op

    return register
