"""PyTorch's own FLOP count of one recorded op: the aten op re-run on meta tensors of the
recorded shapes and dtypes under `torch.utils.flop_counter.FlopCounterMode`.

An independent reference for `traceq.perf.cost`: it shares no code with it, only the
recorded signature (`Input Dims`, `Input type`, `Concrete Inputs`)."""

from __future__ import annotations

import json
from typing import Any

DTYPES = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
    "long int": "int64",
    "int": "int32",
    "bool": "bool",
}


def _scalar(text: str) -> Any:
    text = text.strip()
    if text in ("", "None"):
        return None
    if text in ("True", "False"):
        return text == "True"
    if text.startswith("["):
        return [_scalar(v) for v in text.strip("[]").split(",") if v.strip()]
    try:
        return int(text)
    except ValueError:
        return float(text)


def flop_counter_flops(name: str, dims: str, types: list[str], concrete: list[str]) -> int | None:
    """FlopCounterMode's total for the op, or None when the op cannot be re-run (an
    argument kind this does not rebuild, such as a tensor list)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    shapes = json.loads(dims)
    args: list[Any] = []
    for shape, kind, value in zip(shapes, types, concrete, strict=False):
        if kind in DTYPES:
            args.append(torch.empty(shape, dtype=getattr(torch, DTYPES[kind]), device="meta"))
        elif kind in ("Scalar", "ScalarList"):
            args.append(_scalar(value))
        elif kind in ("", "None"):
            args.append(None)
        else:
            return None
    packet = getattr(torch.ops.aten, name.split("::", 1)[1].split(".", 1)[0])
    for overload in packet.overloads():
        schema = getattr(packet, overload)._schema
        if len(schema.arguments) != len(args):
            continue
        positional = [v for v, a in zip(args, schema.arguments, strict=True) if not a.kwarg_only]
        keywords = {a.name: v for v, a in zip(args, schema.arguments, strict=True) if a.kwarg_only}
        counter = FlopCounterMode(display=False)
        try:
            with counter:
                getattr(packet, overload)(*positional, **keywords)
        except (RuntimeError, TypeError, ValueError, NotImplementedError):
            continue
        return counter.get_total_flops()
    return None
