"""What every Triton entry shares: tile offsets, loads and stores, the activation epilogue,
and how a launch is shaped.

Triton runs here either on a GPU or in its interpreter (``TRITON_INTERPRET=1``, read when
``@triton.jit`` runs, so it must be set before a kernel module is imported). The
interpreter has no ``tl.tanh`` and its libdevice calls return None, so tanh is written as
``2*sigmoid(2x) - 1``; ``tl.math.erf`` works in both. Its bf16 arithmetic is wrong, so
operands are upcast right after ``tl.load`` there; on a GPU the GEMM operands stay in their
storage dtype (tensor cores, fp32 accumulation, the same products exactly) and only the
epilogue math runs in fp32. Multi-config autotuning needs a driver, so the interpreter gets
one config derived from the problem.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from traceq.zoo.registry import Entry, pattern_activations

#: Whether the kernels defined by modules imported after this point run interpreted.
INTERPRETED: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: Largest tile edge used in the interpreter: its cost grows with programs × K-steps, and
#: 64 still leaves the test shapes with several tiles and a ragged last one.
INTERPRETER_BLOCK_CAP = 64

#: Storage dtypes the Triton entries accept (tf32 is float32 storage).
TRITON_DTYPES: tuple[str, ...] = ("float32", "tf32", "float16", "bfloat16")

INTERPRETER_NOTE = "Triton interpreter: correctness only"


def requires_triton_device(device: str) -> str | None:
    """Why a Triton entry cannot run on ``device`` here, or None."""
    if device == "cpu" and not INTERPRETED:
        return "Triton on CPU needs TRITON_INTERPRET=1 set before zoo kernels are imported"
    return None


def device_notes() -> dict[str, str]:
    """Per-device notes of a Triton entry: on the CPU it can only be interpreted."""
    notes = {"cpu": INTERPRETER_NOTE}
    if INTERPRETED:
        notes["cuda"] = INTERPRETER_NOTE
    return notes


def timed_devices() -> tuple[str, ...]:
    """Devices where a Triton entry's time is a measurement: a GPU, not interpreted."""
    return () if INTERPRETED else ("cuda",)


def tile(dim: int, cap: int = INTERPRETER_BLOCK_CAP, floor: int = 16) -> int:
    """A power-of-two tile edge covering ``dim``, within [floor, cap] (tl.dot needs >= 16)."""
    return max(floor, min(cap, triton.next_power_of_2(max(dim, 1))))


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: IEEE fp32 unless PyTorch allows TF32 matmuls too.

    Only float32 operands are affected; half-precision operands ignore it ("tf32" is
    Triton's default there).
    """
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def check_device(*tensors: torch.Tensor) -> None:
    """Refuse CPU tensors outside the interpreter with a message, not a driver crash."""
    if not INTERPRETED and any(t.device.type != "cuda" for t in tensors):
        raise RuntimeError(
            "Triton zoo kernels need CUDA tensors, or TRITON_INTERPRET=1 set before "
            "the zoo kernel modules are imported"
        )


def rows_2d(x: torch.Tensor) -> torch.Tensor:
    """Flatten leading dims: [..., K] -> [rows, K] (a view when the strides allow it)."""
    return x.reshape(-1, x.shape[-1])


@functools.cache
def autotuned(kernel: triton.JITFunction, configs_key: str) -> triton.runtime.Autotuner:
    """The GPU autotuned variant of ``kernel``, built on first use, never interpreted."""
    configs, key = _AUTOTUNE_TABLES[configs_key]
    return triton.autotune(configs=configs, key=key)(kernel)


def _configs(shapes: list[tuple[int, int, int, int, int]]) -> list[triton.Config]:
    """Autotuning configs from (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) rows."""
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
            num_warps=w,
            num_stages=s,
        )
        for bm, bn, bk, w, s in shapes
    ]


_GEMM_SHAPES = [
    (128, 256, 64, 8, 3),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 3),
    (64, 256, 32, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (256, 128, 64, 8, 3),
    (64, 64, 64, 4, 5),
]

# Two fp32 accumulators per program: tiles half the size of the single GEMM's.
_DUAL_GEMM_SHAPES = [
    (128, 128, 64, 8, 3),
    (128, 64, 64, 4, 4),
    (128, 64, 64, 8, 3),
    (64, 128, 64, 4, 4),
    (128, 128, 32, 8, 4),
    (64, 64, 64, 4, 5),
]

_AUTOTUNE_TABLES: dict[str, tuple[list[triton.Config], list[str]]] = {
    "gemm": (_configs(_GEMM_SHAPES), ["M", "N", "K", "HAS_BIAS", "ACT"]),
    "dual_gemm": (_configs(_DUAL_GEMM_SHAPES), ["M", "N", "K", "ACT"]),
}


def launch_gemm(
    kernel: triton.JITFunction,
    configs_key: str,
    args: tuple[Any, ...],
    flags: dict[str, Any],
    m: int,
    n: int,
    k: int,
) -> None:
    """Launch a grouped-tile GEMM kernel over an [m, n] output with inner dimension k.

    Interpreted: one config whose tiles are derived from the problem. On a GPU: the
    autotuned variant from the ``configs_key`` table, its grid sized by the chosen tiles.
    """
    if INTERPRETED:
        block_m, block_n, block_k = tile(m), tile(n), tile(k)
        grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
        kernel[grid](*args, **flags, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8)
    else:

        def grid(meta: dict[str, int]) -> tuple[int]:
            return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

        autotuned(kernel, configs_key)[grid](*args, **flags)


def triton_entry(
    pattern: str,
    fn: Callable[..., Any],
    out_fn: Callable[..., Any],
    description: str,
) -> Entry:
    """The zoo entry ``<pattern>.triton``: what every Triton entry supports and where."""
    return Entry(
        name=f"{pattern}.triton",
        pattern=pattern,
        impl="triton",
        fn=fn,
        out_fn=out_fn,
        activations=pattern_activations(pattern),
        dtypes=TRITON_DTYPES,
        devices=("cpu", "cuda"),
        requires=requires_triton_device,
        notes_on=device_notes(),
        timed_on=timed_devices(),
        description=description,
    )


@triton.jit
def grouped_tile_offsets(
    M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr
):
    """Row, column and K offsets of this program's output tile, program ids grouped along M.

    The grouping is the Triton matmul tutorial's L2 swizzle: neighbouring programs share
    weight tiles. Plain integer arithmetic instead of tl.cdiv, because each nested @jit call
    costs the interpreter milliseconds per program (the compiled kernel nothing either way).
    The offsets are int64: no int32 overflow on large tensors, and the interpreter skips its
    per-operation overflow checks (which dominate its run time) for 64-bit integers.
    """
    pid = tl.program_id(0)
    num_pid_m = (M + BLOCK_M - 1) // BLOCK_M
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    return offs_m, offs_n, offs_k


@triton.jit
def row_tile_offsets(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row and column offsets of this program's tile of an [M, N] row-wise problem, and the
    mask of its in-bounds elements.

    Program id 0 steps through row tiles and id 1 through column tiles (a 1-D grid has one,
    so its tiles are whole rows). The offsets are int64, as in ``grouped_tile_offsets``.
    """
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    return offs_m, offs_n, (offs_m[:, None] < M) & (offs_n[None, :] < N)


@triton.jit
def load_tile(x_ptr, offs_m, offs_n, mask, stride_xm, stride_xn):
    """The (offs_m, offs_n) tile of a strided 2-D tensor in fp32, zero where ``mask`` is off."""
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn
    return tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_tile(y_ptr, y, offs_m, offs_n, M, N, stride_ym, stride_yn):
    """Store the fp32 tile ``y`` at (offs_m, offs_n) in y's dtype, masked to [M, N]."""
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(
        y_ptrs, y.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N)
    )


@triton.jit
def activate(x, ACT: tl.constexpr):
    """The activation named by ``ACT`` on an fp32 tile (resolved at compile time).

    tanh is ``2*sigmoid(2z) - 1`` (the interpreter has no tl.tanh), so gelu_tanh is
    ``0.5*x*(1 + tanh(z)) = x*sigmoid(2z)``. sigmoid is written inline, because every
    nested @jit call (tl.sigmoid is one) costs the interpreter milliseconds per program,
    and in the form that cannot overflow: with ``e = exp(-|s|)`` it is ``1/(1+e)`` for
    ``s >= 0`` and ``e/(1+e)`` below.
    """
    if ACT == "gelu":
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACT == "gelu_tanh":
        s = 1.5957691216057308 * (x + 0.044715 * x * x * x)  # 2 * sqrt(2/pi) * (...)
        e = tl.exp(-tl.abs(s))
        return x * tl.where(s >= 0, 1.0, e) / (1.0 + e)
    elif ACT == "silu":
        e = tl.exp(-tl.abs(x))
        return x * tl.where(x >= 0, 1.0, e) / (1.0 + e)
    elif ACT == "relu":
        return tl.maximum(x, 0.0)
    else:
        return x
