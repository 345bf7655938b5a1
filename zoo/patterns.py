"""The contract of each pattern: its inputs, the cases every check runs, and its work.

A shape is ``M,K,N``: M rows (all leading dims of x flattened), K input features, N
output (hidden) features. Per pattern, an entry is called as

- ``gemm_bias_act(x[..., K], weight[N, K], bias[N], act) -> [..., N]``
- ``glu(gate[..., N], up[..., N], act) -> [..., N]`` (K is unused)
- ``dual_gemm_glu(x[..., K], w_gate[N, K], w_up[N, K], act) -> [..., N]``
- ``mlp(x[..., K], w_gate[N, K] | None, w_up[N, K], b_up[N] | None, w_down[K, N],
  b_down[K] | None, act) -> [..., K]``: ``w_gate`` None is the Linear->act->Linear MLP
  (with biases), given it is the bias-free GLU MLP ``down(act(gate) * up)``.
- ``rms_norm(x[..., N], weight[N], act) -> [..., N]`` (K is unused; act is always "none")
- ``add_rms_norm(x[..., N], residual[..., N], weight[N], act) -> ([..., N], [..., N])``: the
  normalized sum and the sum itself (the residual stream goes on), as vLLM's
  ``fused_add_rms_norm`` computes them
- ``rope(q[B, K, S, N], k[B, K, S, N], cos[B, S, N], sin[B, S, N], act) -> (q_embed,
  k_embed)``: HF's ``apply_rotary_pos_emb`` layout, M = B·S tokens (the leading row dims
  are B and S; one row dim is B = 1), K heads of head dim N; q and k are HF's
  ``view(B, S, K, N).transpose(1, 2)`` of a projection (strided), cos and sin
  ``cat(freqs, freqs)`` halves as HF's rotary embedding builds them

Weights use ``nn.Linear``'s [out, in] layout, so a finding's module maps onto them as is.
Every check also runs a shape that is not a multiple of any block size and a 3-D input,
because the bugs of a tiled kernel live in its last, partial tile and in its strides.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from traceq.zoo.errors import BadShape, UnknownDtype, UnknownPattern
from traceq.zoo.registry import DTYPES, PATTERNS

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "tf32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

DTYPE_ALIASES: dict[str, str] = {
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "tfloat32": "tf32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
}

#: Relative error bound ‖out − ref‖ / ‖ref‖ against the float64 reference, per dtype.
ERROR_BOUNDS: dict[str, float] = {
    "float64": 1e-10,
    "float32": 1e-5,
    "tf32": 1e-3,
    "float16": 2e-3,
    "bfloat16": 1.5e-2,
}


def dtype_name(name: str) -> str:
    """The canonical dtype name for ``name`` (``bf16`` -> ``bfloat16``), or `UnknownDtype`."""
    canonical = DTYPE_ALIASES.get(name.lower(), name.lower())
    if canonical not in DTYPES:
        known = ", ".join(DTYPES)
        raise UnknownDtype(f"unknown dtype {name!r}; known: {known}")
    return canonical


def validate_pattern(pattern: str) -> str:
    if pattern not in PATTERNS:
        raise UnknownPattern(f"unknown pattern {pattern!r}; known: {', '.join(sorted(PATTERNS))}")
    return pattern


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"64,128,96"`` -> (64, 128, 96); anything else raises `BadShape` saying what to pass."""
    parts = [p for p in re.split(r"[,x×\s]+", text.strip()) if p]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise BadShape(f"shape must be M,K,N (three positive integers), got {text!r}")
    m, k, n = (int(p) for p in parts)
    return validate_shape((m, k, n))


def validate_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) != 3 or not all(isinstance(d, int) and d > 0 for d in shape):
        raise BadShape(f"shape must be M,K,N (three positive integers), got {shape!r}")
    m, k, n = shape
    return m, k, n


@dataclass(frozen=True)
class Problem:
    """One concrete problem: leading row dims (their product is M), K and N."""

    rows: tuple[int, ...]
    k: int
    n: int

    @property
    def m(self) -> int:
        return math.prod(self.rows)

    def label(self, pattern: str) -> str:
        rows = "×".join(str(r) for r in self.rows)
        if pattern in ("glu", "rms_norm", "add_rms_norm"):
            return f"{rows}×{self.n}"
        if pattern == "rope":
            return f"{rows} tokens×{self.k} heads×{self.n}"
        return f"{rows}×{self.k}→{self.n}"


@dataclass(frozen=True)
class Case:
    """One run of every entry: a problem, an input variant, and whether it is timed."""

    name: str
    problem: Problem
    variant: str
    timed: bool


def ragged(dim: int) -> int:
    """A size near ``dim`` that is odd, so no power-of-two block divides it."""
    if dim <= 4:
        return dim
    smaller = dim - dim // 4
    return smaller if smaller % 2 else smaller - 1


def variants(pattern: str) -> tuple[str, ...]:
    """Input variants every check of ``pattern`` runs."""
    if pattern == "mlp":
        return ("plain", "gated")
    if pattern == "glu":
        return ("contiguous", "chunked")
    return ("plain",)


def cases(pattern: str, shape: tuple[int, int, int]) -> list[Case]:
    """The cases of one check: the shape itself (timed), a ragged shape and a 3-D input.

    GLU also runs on ``chunk``ed halves of one [M, 2N] projection (strided rows, as a fused
    gate/up Linear produces them); the MLP runs both its plain and its gated form.
    """
    validate_pattern(pattern)
    m, k, n = validate_shape(shape)
    problems = [
        ("main", Problem((m,), k, n), True),
        ("ragged", Problem((ragged(m),), ragged(k), ragged(n)), False),
        ("3-D", Problem((2, m // 2 + 1), k, n), False),
    ]
    out: list[Case] = []
    for variant in variants(pattern):
        for name, problem, timed in problems:
            label = name if variant in ("plain", "contiguous") else f"{variant} {name}"
            if variant == "chunked" and name != "main":
                continue  # one strided case is enough; its rows are the main shape
            out.append(Case(label, problem, variant, timed and variant != "chunked"))
    return out


def _randn(shape: tuple[int, ...], generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float32) * scale


def make_inputs(
    pattern: str,
    case: Case,
    dtype: torch.dtype,
    device: str,
    generator: torch.Generator,
) -> tuple[torch.Tensor | None, ...]:
    """Fresh random inputs for one case (never zeros), in ``dtype`` on ``device``.

    Weights are scaled by 1/sqrt(fan-in) so pre-activations are O(1): both sides of every
    activation are exercised and fp16 does not overflow. Drawn on the CPU from ``generator``
    so a seed gives the same numbers on every device.
    """
    p = case.problem
    rows, k, n = p.rows, p.k, p.n

    def put(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype)

    if pattern == "gemm_bias_act":
        return (
            put(_randn((*rows, k), generator)),
            put(_randn((n, k), generator, k**-0.5)),
            put(_randn((n,), generator, 0.5)),
        )
    if pattern == "glu":
        if case.variant == "chunked":
            projection = put(_randn((*rows, 2 * n), generator))
            gate, up = projection.chunk(2, dim=-1)
            return gate, up
        return put(_randn((*rows, n), generator)), put(_randn((*rows, n), generator))
    if pattern == "dual_gemm_glu":
        return (
            put(_randn((*rows, k), generator)),
            put(_randn((n, k), generator, k**-0.5)),
            put(_randn((n, k), generator, k**-0.5)),
        )
    if pattern == "rms_norm":
        return put(_randn((*rows, n), generator)), put(1.0 + _randn((n,), generator, 0.1))
    if pattern == "add_rms_norm":
        return (
            put(_randn((*rows, n), generator)),
            put(_randn((*rows, n), generator)),
            put(1.0 + _randn((n,), generator, 0.1)),
        )
    if pattern == "rope":
        batch, seq = rope_batch_seq(rows)
        q = put(_randn((batch, seq, k, n), generator)).transpose(1, 2)
        key = put(_randn((batch, seq, k, n), generator)).transpose(1, 2)
        # HF's cos/sin: emb = cat(freqs, freqs), so position i and i + N/2 share an angle
        freqs = _randn((batch, seq, (n + 1) // 2), generator, 3.0)
        emb = torch.cat((freqs, freqs), dim=-1)[..., :n]
        return q, key, put(emb.cos()), put(emb.sin())
    if pattern == "mlp":
        x = put(_randn((*rows, k), generator))
        w_up = put(_randn((n, k), generator, k**-0.5))
        w_down = put(_randn((k, n), generator, n**-0.5))
        if case.variant == "gated":
            w_gate = put(_randn((n, k), generator, k**-0.5))
            return x, w_gate, w_up, None, w_down, None
        b_up = put(_randn((n,), generator, 0.5))
        b_down = put(_randn((k,), generator, 0.5))
        return x, None, w_up, b_up, w_down, b_down
    raise UnknownPattern(f"unknown pattern {pattern!r}")


def rope_batch_seq(rows: tuple[int, ...]) -> tuple[int, int]:
    """B and S of a rope problem's row dims: (S,) is one sequence, (B, S) a batch."""
    if len(rows) == 1:
        return 1, rows[0]
    return math.prod(rows[:-1]), rows[-1]


def output_shapes(pattern: str, case: Case) -> tuple[tuple[int, ...], ...]:
    """Every output's shape, in the order an entry returns them (most return one)."""
    p = case.problem
    if pattern == "mlp":
        return ((*p.rows, p.k),)
    if pattern == "add_rms_norm":
        return ((*p.rows, p.n), (*p.rows, p.n))
    if pattern == "rope":
        batch, seq = rope_batch_seq(p.rows)
        return ((batch, p.k, seq, p.n), (batch, p.k, seq, p.n))
    return ((*p.rows, p.n),)


def output_shape(pattern: str, case: Case) -> tuple[int, ...]:
    """The (first) output's shape."""
    return output_shapes(pattern, case)[0]


def flops(pattern: str, case: Case) -> int | None:
    """Multiply-add work of the GEMMs (2 per MAC); None for the memory-bound patterns (GLU,
    the norms, RoPE)."""
    m, k, n = case.problem.m, case.problem.k, case.problem.n
    if pattern == "gemm_bias_act":
        return 2 * m * k * n
    if pattern == "dual_gemm_glu":
        return 4 * m * k * n
    if pattern == "mlp":
        return (6 if case.variant == "gated" else 4) * m * k * n
    return None


def bytes_moved(pattern: str, case: Case, itemsize: int) -> int:
    """The least memory traffic of the pattern: every input read once, the output written once.

    Intermediates a split implementation writes and reads back are not counted: that is
    the traffic fusion removes, so GB/s against this number is the fused kernel's yardstick.
    """
    m, k, n = case.problem.m, case.problem.k, case.problem.n
    if pattern == "gemm_bias_act":
        elements = m * k + n * k + n + m * n
    elif pattern == "glu":
        elements = 3 * m * n
    elif pattern == "dual_gemm_glu":
        elements = m * k + 2 * n * k + m * n
    elif pattern == "rms_norm":
        elements = 2 * m * n + n
    elif pattern == "add_rms_norm":
        elements = 4 * m * n + n
    elif pattern == "rope":
        elements = 4 * m * k * n + 2 * m * n
    elif pattern == "mlp":
        if case.variant == "gated":
            elements = m * k + 3 * n * k + m * k
        else:
            elements = m * k + n * k + n + k * n + k + m * k
    else:
        raise UnknownPattern(f"unknown pattern {pattern!r}")
    return elements * itemsize
