"""Record a zoo entry under ``torch.profiler`` into a Kineto trace that traceq can read.

The closed loop (``zoo verify``) records the split reference and the fused entry at a
finding's shapes, analyzes both traces and shows that the finding's rule fires on the
first and not on the second. This module does the recording: a few ``ProfilerStep#`` steps
(after a wait and a warm-up step, so one-time costs stay out), shapes recorded, the call
made from an ``nn.Module`` so module attribution is in the trace as a model's would be
(``nn.Module: ZooBlock_0``, except for entries that run as Python, see below), and each
call wrapped in a ``zoo:<entry>`` range so it can be found by name.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from traceq.zoo.check import matmul_precision
from traceq.zoo.errors import ZooUsageError
from traceq.zoo.patterns import TORCH_DTYPES, Case, Problem, dtype_name, make_inputs, validate_shape
from traceq.zoo.patterns import variants as pattern_variants
from traceq.zoo.registry import Entry, Zoo, cuda_available, discover, pattern_act

#: Profiler steps skipped before recording: one to wait, one to warm up (compile, autotune).
# Kineto logs each profiler start and stop to stderr as `USDT:` lines; libkineto reads
# its level once, when the process first profiles. 6 is above its highest level (USDT, 5).
# A level the user set is kept.
QUIET_KINETO = {"KINETO_LOG_LEVEL": "6"}

WAIT_STEPS = 1
WARMUP_STEPS = 1


@dataclass(frozen=True)
class RecordedTrace:
    """Where a recording went, what it ran, and the op counts the profiler saw in it."""

    path: Path
    pattern: str
    entry: str
    impl: str
    shape: tuple[int, int, int]
    dtype: str
    device: str
    act: str
    variant: str
    steps: int
    with_stack: bool
    op_counts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "pattern": self.pattern,
            "entry": self.entry,
            "impl": self.impl,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "act": self.act,
            "variant": self.variant,
            "steps": self.steps,
            "with_stack": self.with_stack,
            "op_counts": self.op_counts,
        }


class ZooBlock(torch.nn.Module):
    """The module a recorded step calls: one entry on fixed inputs."""

    def __init__(self, entry: Entry, inputs: tuple[torch.Tensor | None, ...], act: str) -> None:
        super().__init__()
        self.entry = entry
        self.inputs = inputs
        self.act = act

    def forward(self) -> torch.Tensor:
        with record_function(f"zoo:{self.entry.name}"):
            return self.entry.fn(*self.inputs, self.act)


def record_trace(
    pattern: str,
    entry_name: str,
    shape: tuple[int, int, int],
    dtype: str,
    device: str,
    act: str,
    path: str | Path,
    steps: int = 3,
    *,
    variant: str | None = None,
    zoo: Zoo | None = None,
    seed: int = 0,
) -> RecordedTrace:
    """Run ``entry_name`` for ``steps`` profiled steps and export the Kineto trace to ``path``.

    ``variant`` picks the pattern's input form (``plain``/``gated`` for the MLP,
    ``contiguous``/``chunked`` for the GLU); by default the first. A path ending in ``.gz``
    is written gzipped.
    """
    if steps < 1:
        raise ZooUsageError(f"steps must be at least 1, got {steps}")
    shape = validate_shape(tuple(shape))
    dtype = dtype_name(dtype)
    act = pattern_act(pattern, act)
    zoo = zoo if zoo is not None else discover()
    entry = zoo.get(entry_name)
    if entry.pattern != pattern:
        raise ZooUsageError(f"entry {entry_name} implements {entry.pattern}, not {pattern}")
    known_variants = pattern_variants(pattern)
    variant = variant or known_variants[0]
    if variant not in known_variants:
        raise ZooUsageError(f"{pattern} has variants {', '.join(known_variants)}, not {variant}")
    if device == "cuda" and not cuda_available():
        raise ZooUsageError("device cuda requested, but torch sees no CUDA device")
    ok, reason = entry.supports(act, dtype, device)
    if not ok:
        raise ZooUsageError(f"{entry_name} cannot run {act} {dtype} on {device}: {reason}")

    m, k, n = shape
    case = Case("main", Problem((m,), k, n), variant, timed=False)
    generator = torch.Generator().manual_seed(seed)
    inputs = make_inputs(pattern, case, TORCH_DTYPES[dtype], device, generator)
    block = ZooBlock(entry, inputs, act)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    for name, value in QUIET_KINETO.items():  # before this process's first profile
        os.environ.setdefault(name, value)
    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)

    def export(prof: profile) -> None:
        prof.export_chrome_trace(str(path))

    # Eager modules show in a trace only through the Python tracer (with_modules alone
    # covers TorchScript). An entry whose device time is no measurement runs as Python
    # (Triton's interpreter): tracing every call it makes costs minutes and 100s of MB.
    with_stack = device in entry.timed_on
    with matmul_precision(dtype):
        with (
            torch.no_grad(),
            profile(
                activities=activities,
                schedule=schedule(wait=WAIT_STEPS, warmup=WARMUP_STEPS, active=steps, repeat=1),
                record_shapes=True,
                with_modules=True,
                with_stack=with_stack,
                on_trace_ready=export,
            ) as prof,
        ):
            for _ in range(WAIT_STEPS + WARMUP_STEPS + steps):
                block()
                if device == "cuda":
                    torch.cuda.synchronize()
                prof.step()
        counts = Counter({e.key: e.count for e in prof.key_averages()})

    return RecordedTrace(
        path=path,
        pattern=pattern,
        entry=entry.name,
        impl=entry.impl,
        shape=shape,
        dtype=dtype,
        device=device,
        act=act,
        variant=variant,
        steps=steps,
        with_stack=with_stack,
        op_counts=dict(sorted(counts.items())),
    )
