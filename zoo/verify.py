"""The closed loop: show that a zoo entry makes a finding go away, on the finding's shapes.

A finding says "this split costs time"; the zoo's `check` says a fused entry computes the
same numbers. `verify` closes the loop the way a user would: it records the split eager
reference and the fused entry under ``torch.profiler`` (`traceq.zoo.record.record_trace`), runs
traceq's analyzer on both traces with only the finding's rule selected, and reports how
often the rule fired on each, with their op and kernel counts and times. The fix is proven
when the rule fires on the split trace and not on the fused one.

Which recording reproduces which rule is decided here, because the rules look for specific
ops: TQ101 needs a ``matmul`` and a separate bias ``add`` (``F.linear`` runs ``addmm``, which
already fuses the bias), TQ103 needs the gate and up GEMMs feeding the activation and the
multiply (a bare ``act(gate) * up`` on inputs is no GLU to it), so the ``glu`` pattern is
recorded inside the eager GLU MLP: ``F.linear`` gate and up, then the GLU under test.

On the CPU the Triton entries run in Triton's interpreter. They are still the default fused
entry there: their trace has the same ``zoo::`` op a GPU run has, and they are the fix the
finding's ``zoo`` field names. ``torch.compile`` is not the default on the CPU: Inductor's
C++ backend keeps the GEMM in an extern ``addmm`` and the activation in its own kernel (no
epilogue fusion to prove; TQ102 leaves compiler-emitted activations out by default), and it
builds for seconds. Interpreted times are reported but marked as no measurement, and shapes
are scaled down (the factor is in the result) so the interpreter finishes in about a second.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import torch
import torch.nn.functional as F
from traceq.zoo.activations import activate
from traceq.zoo.activations import validate as validate_activation
from traceq.zoo.errors import ZooUsageError
from traceq.zoo.patterns import dtype_name, validate_pattern, validate_shape
from traceq.zoo.patterns import variants as pattern_variants
from traceq.zoo.record import record_trace
from traceq.zoo.registry import (
    ACTIVATIONS,
    DEVICES,
    DTYPES,
    Entry,
    Zoo,
    cuda_available,
    discover,
    pattern_act,
)

import traceq
from traceq.analyze import analyze
from traceq.rules.finding import Finding
from traceq.rules.op_classes import GEMM_OPERANDS, WEIGHT_NK

if TYPE_CHECKING:
    from traceq.trace import Trace

#: The pattern that proves the fix of each rule it can reproduce.
RULE_PATTERNS: dict[str, str] = {
    "TQ101": "gemm_bias_act",
    "TQ102": "gemm_bias_act",
    "TQ103": "glu",
    "TQ105": "dual_gemm_glu",
    "TQ107": "rms_norm",  # add_rms_norm when the finding has the residual add
    "TQ108": "rope",
}

#: The rule each pattern without an activation reproduces, recorded as the pattern's own
#: split reference: HF's written-out RMSNorm (after the residual add) and RoPE.
IDIOM_RULES: dict[str, str] = {"rms_norm": "TQ107", "add_rms_norm": "TQ107", "rope": "TQ108"}

#: Largest problem recorded on the CPU (M, K, N) when the shape is scaled automatically:
#: interpreted Triton costs ~2 ms per program per K-step, so this records in about a second.
CPU_SHAPE_LIMIT: tuple[int, int, int] = (128, 256, 512)

#: Dtype strings of the profiler's ``Input type`` -> the zoo's dtype names.
PROFILER_DTYPES: dict[str, str] = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
}

#: TQ103's name for a GLU -> the activation of its gate.
GLU_ACTIVATIONS: dict[str, str] = {"SwiGLU": "silu", "GeGLU": "gelu", "ReGLU": "relu"}

#: Fused implementations in the order verify prefers them: the zoo's own kernel first.
IMPL_PREFERENCE: tuple[str, ...] = (
    "triton",
    "liger",
    "cublaslt-epilogue",
    "functional",
    "compile",
)

#: Outcomes of a verification; only ``gone`` proves the fix.
STATUSES: tuple[str, ...] = (
    "gone",  # the rule fired on the split trace and not on the fused one
    "still_fires",  # the rule fired on the fused trace too
    "not_reproduced",  # the rule did not fire on the split trace: nothing was shown
    "unsupported",  # no zoo entry can run this finding's problem here
    "no_zoo_pattern",  # the rule has no zoo pattern (overhead rules, TQ104)
)


@dataclass(frozen=True)
class Plan:
    """What one verification records: two entries of one input pattern, and the rules.

    ``pattern`` is the pattern being proven (as a finding or the user names it);
    ``record_pattern`` the pattern whose inputs both entries take (``glu`` is recorded as
    ``dual_gemm_glu``: its GEMMs are what make TQ103 see a GLU).
    """

    pattern: str
    record_pattern: str
    rules: tuple[str, ...]
    split: Entry
    fused: Entry
    variant: str | None
    act: str
    dtype: str
    device: str
    shape: tuple[int, int, int]
    requested_shape: tuple[int, int, int]
    scale: int
    notes: tuple[str, ...] = ()

    @property
    def cache_key(self) -> tuple[Any, ...]:
        return (
            self.record_pattern,
            self.rules,
            self.split.name,
            self.fused.name,
            self.variant,
            self.act,
            self.dtype,
            self.device,
            self.shape,
        )


@dataclass(frozen=True)
class TraceStats:
    """One recorded trace as the result shows it: what ran, how much, and how long.

    Counts and times are totals over the profiled ``steps`` (one entry call per step);
    ``cpu_time_us`` is the wall time of the ``zoo:<entry>`` ranges, ``kernel_time_us`` the
    device kernels' time (None on a CPU-only trace); ``step_us`` is the median per step of
    the kernel time where there are kernels, else of the CPU time (a median, because the
    first profiled step still pays for the profiler's own start-up). ``timed`` is False when
    the time is no measurement of the real implementation (Triton's interpreter).
    """

    entry: str
    impl: str
    steps: int
    ops: int
    top_level_ops: dict[str, int]
    kernels: int
    cpu_time_us: float
    kernel_time_us: float | None
    step_us: float
    timed: bool
    findings: dict[str, int]
    path: str | None = None

    @property
    def clock(self) -> str:
        """What ``step_us`` measures: device kernels, or CPU wall time."""
        return "GPU" if self.kernel_time_us is not None else "CPU"

    def to_dict(self) -> dict[str, Any]:
        return {
            "entry": self.entry,
            "impl": self.impl,
            "steps": self.steps,
            "ops": self.ops,
            "top_level_ops": self.top_level_ops,
            "kernels": self.kernels,
            "cpu_time_us": round(self.cpu_time_us, 3),
            "kernel_time_us": _round(self.kernel_time_us),
            "step_us": round(self.step_us, 3),
            "timed": self.timed,
            "findings": self.findings,
            "path": self.path,
        }


@dataclass(frozen=True)
class RuleCheck:
    """How often one rule fired on each trace."""

    rule: str
    split: int
    fused: int

    @property
    def gone(self) -> bool:
        return self.split > 0 and self.fused == 0

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "split": self.split, "fused": self.fused, "gone": self.gone}


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of one closed-loop check. ``gone`` is the answer; the rest is evidence."""

    status: str
    rule: str | None
    rules: tuple[str, ...] = ()
    checks: tuple[RuleCheck, ...] = ()
    pattern: str | None = None
    act: str | None = None
    dtype: str | None = None
    device: str | None = None
    variant: str | None = None
    shape: tuple[int, int, int] | None = None
    requested_shape: tuple[int, int, int] | None = None
    scale: int = 1
    split: TraceStats | None = None
    fused: TraceStats | None = None
    notes: tuple[str, ...] = ()
    reason: str = ""
    # The fused entry's numbers against float64 at the recorded shape (`zoo.check`), taken
    # when its time is no measurement (Triton's interpreter): what such a check proves.
    numerics: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")

    @property
    def gone(self) -> bool:
        return self.status == "gone"

    @property
    def summary(self) -> str:
        """One line for reports: the verdict, the counts, and what was recorded."""
        rules = "+".join(self.rules) or self.rule or "?"
        if self.status == "no_zoo_pattern":
            return self.reason
        if self.split is None or self.fused is None:
            return f"{rules} not verified: {self.reason}"
        counts = ", ".join(f"{c.rule} {c.split}→{c.fused}" for c in self.checks)
        verdict = {
            "gone": "gone",
            "still_fires": "still fires",
            "not_reproduced": "not reproduced by the split reference",
        }[self.status]
        assert self.shape is not None
        shape = "×".join(map(str, self.shape))
        scale = f", scaled 1/{self.scale}" if self.scale > 1 else ""
        split, fused = self.split, self.fused
        ops = f"{_per(split.top_level_ops, split.steps)}→{_per(fused.top_level_ops, fused.steps)}"
        times = f"{_time(split)} → {_time(fused)}"
        if not fused.timed:  # the interpreter: what was proved, and no speed ratio
            return (
                f"{rules} {verdict} with {fused.entry}: re-profiled, {counts} findings over "
                f"{split.steps} steps; {_numerics(self.numerics)} at {shape} {self.dtype} "
                f"(the finding's shape{scale}) act={self.act} on {self.device}; speed not "
                "measured (Triton's interpreter, no GPU)"
            )
        return (
            f"{rules} {verdict} with {fused.entry} ({counts} findings over {split.steps} "
            f"steps; {self.pattern} {shape} {self.dtype} act={self.act} on "
            f"{self.device}{scale}; ops/step {ops}; time/step {times})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "gone": self.gone,
            "rule": self.rule,
            "rules": list(self.rules),
            "checks": [c.to_dict() for c in self.checks],
            "pattern": self.pattern,
            "act": self.act,
            "dtype": self.dtype,
            "device": self.device,
            "variant": self.variant,
            "shape": None if self.shape is None else list(self.shape),
            "requested_shape": None if self.requested_shape is None else list(self.requested_shape),
            "scale": self.scale,
            "split": None if self.split is None else self.split.to_dict(),
            "fused": None if self.fused is None else self.fused.to_dict(),
            "notes": list(self.notes),
            "reason": self.reason,
            "numerics": self.numerics,
            "summary": self.summary,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _per(ops: dict[str, int], steps: int) -> str:
    return str(round(sum(ops.values()) / max(steps, 1), 2)).removesuffix(".0")


def _numerics(numerics: dict[str, Any] | None) -> str:
    """'its numbers match float64 (worst 2.4e-07, bound 1e-05)', or that none were checked."""
    if not numerics:
        return "numbers not checked"
    worst = numerics.get("worst_rel_error")
    shown = f"worst {worst:.1e}, " if worst is not None else ""
    match = "match" if numerics["passed"] else "do NOT match"
    return f"its numbers {match} float64 ({shown}bound {numerics['bound']:.0e})"


def untimed_numerics(plan: Plan) -> dict[str, Any]:
    """The fused entry against float64 through the zoo's one harness, numerics only."""
    from traceq.zoo.check import check

    report = check(
        plan.record_pattern,
        plan.shape,
        plan.dtype,
        plan.device,
        plan.act,
        zoo=Zoo((plan.split, plan.fused)),
        select=[plan.fused.name],
        timing=False,
    )
    entry = report.entry(plan.fused.name)
    errors = [c.rel_error for c in entry.cases if c.rel_error is not None]
    return {
        "passed": entry.status == "pass",
        "cases": [c.case for c in entry.cases],
        "worst_rel_error": max(errors) if errors else None,
        "bound": report.bound,
    }


def _time(stats: TraceStats) -> str:
    text = f"{stats.step_us:,.1f} µs {stats.clock}"
    return text if stats.timed else f"{text} (interpreted, not a measurement)"


class NotVerifiable(ZooUsageError):
    """The zoo has nothing that runs this problem here: an activation no entry fuses, a
    dtype or device no fused entry supports, GEMMs the zoo cannot merge. For a finding this
    is a result (``unsupported``), not an error."""


# --- the entries verify records besides the zoo's own ------------------------------------


def matmul_add_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str
) -> torch.Tensor:
    """``x @ W.T`` and the bias ``add`` as two ops (what TQ101 finds), then the activation."""
    y = torch.matmul(x, weight.t())
    return activate(y + bias if bias is not None else y, act)


MATMUL_ADD_REFERENCE = Entry(
    name="gemm_bias_act.matmul_add",
    pattern="gemm_bias_act",
    impl="reference",
    fn=matmul_add_reference,
    activations=tuple(ACTIVATIONS),
    dtypes=DTYPES,
    devices=DEVICES,
    description="split eager: matmul, a separate bias add, then the activation",
)


class GluAfterGemms:
    """A ``glu`` entry fed by the gate and up ``F.linear`` of the eager GLU MLP.

    Called with ``dual_gemm_glu``'s inputs, so the split reference of TQ103 (the eager MLP
    half) and this differ only in the GLU: the fix TQ103 asks for, and nothing else.
    """

    def __init__(self, glu: Entry) -> None:
        self.glu = glu

    def __call__(
        self, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, act: str
    ) -> torch.Tensor:
        return self.glu.fn(F.linear(x, w_gate), F.linear(x, w_up), act)


def glu_after_gemms(glu: Entry) -> Entry:
    """The ``dual_gemm_glu``-input entry that runs the gate/up GEMMs, then ``glu``."""
    return replace(
        glu,
        name=f"linear+{glu.name}",
        pattern="dual_gemm_glu",
        fn=GluAfterGemms(glu),
        out_fn=None,
        description=f"F.linear gate and up, then {glu.name}: {glu.description}",
    )


# --- planning ------------------------------------------------------------------------------


def default_device() -> str:
    return "cuda" if cuda_available() else "cpu"


def interpret_triton_without_gpu(device: str) -> None:
    """Run Triton entries in the interpreter when there is no GPU to run them on.

    The flag is read when the kernel modules are imported (at discovery), so it is only set
    while no kernel module is loaded, and never over a value the user chose.
    """
    if "traceq.zoo.triton_support" in sys.modules or "TRITON_INTERPRET" in os.environ:
        return
    if device == "cpu" or not cuda_available():
        os.environ["TRITON_INTERPRET"] = "1"


def scaled_shape(
    shape: tuple[int, int, int], *, interpreted: bool, scale: int | None = None
) -> tuple[tuple[int, int, int], int]:
    """The shape divided by ``scale`` (rounded up), and the factor used.

    ``scale`` None: 1 when the fused entry runs compiled; when it is interpreted (Triton on
    the CPU), the smallest power of two that brings every dimension within
    `CPU_SHAPE_LIMIT`. One factor for all three keeps the problem's proportions, so the
    recorded ops are the finding's at a smaller size.
    """
    if scale is None:
        scale = 1
        if interpreted:
            limits = list(zip(shape, CPU_SHAPE_LIMIT, strict=True))
            while any(math.ceil(d / scale) > lim for d, lim in limits):
                scale *= 2
    if not isinstance(scale, int) or scale < 1:
        raise ZooUsageError(f"scale must be a positive integer, got {scale!r}")
    m, k, n = (max(1, math.ceil(d / scale)) for d in shape)
    return (m, k, n), scale


def fuses_on(entry: Entry, device: str) -> bool:
    """False for an entry whose note on ``device`` says it is not fused there
    (``torch._addmm_activation`` on the CPU runs addmm, then the activation)."""
    return "not fused" not in entry.notes_on.get(device, "")


def _fused_rank(entry: Entry, device: str) -> tuple[int, bool, str]:
    order = (
        IMPL_PREFERENCE.index(entry.impl) if entry.impl in IMPL_PREFERENCE else len(IMPL_PREFERENCE)
    )
    return (order, device not in entry.timed_on, entry.name)


def choose_fused(
    zoo: Zoo, pattern: str, act: str, dtype: str, device: str, entry: str | None = None
) -> Entry:
    """The fused entry to record: ``entry`` if named, else the best that can run here.

    Best: the zoo's Triton kernel before a vendor library before ``torch.compile``, and
    one that runs compiled before one that is interpreted. An entry that does not fuse on
    this device is never chosen by itself: its trace would prove nothing.
    """
    if entry is not None:
        chosen = zoo.get(entry)
        if chosen.pattern != pattern:
            raise ZooUsageError(f"entry {entry} implements {chosen.pattern}, not {pattern}")
        if chosen.impl == "reference":
            raise ZooUsageError(f"entry {entry} is the split reference, not a fused entry")
        ok, reason = chosen.supports(act, dtype, device)
        if not ok:
            raise ZooUsageError(f"{entry} cannot run {act} {dtype} on {device}: {reason}")
        return chosen
    candidates = [e for e in zoo.for_pattern(pattern) if e.impl != "reference"]
    runnable = [e for e in candidates if e.supports(act, dtype, device)[0] and fuses_on(e, device)]
    if not runnable:
        why = "; ".join(
            f"{e.name}: {e.supports(act, dtype, device)[1] or e.notes_on.get(device)}"
            for e in candidates
        )
        raise NotVerifiable(
            f"no fused {pattern} entry runs {act} {dtype} on {device} ({why or 'none found'})"
        )
    return min(runnable, key=lambda e: _fused_rank(e, device))


def plan_pattern(
    pattern: str,
    shape: Sequence[int],
    *,
    act: str = "gelu",
    dtype: str = "float32",
    device: str | None = None,
    entry: str | None = None,
    scale: int | None = None,
    variant: str | None = None,
    zoo: Zoo | None = None,
    notes: Iterable[str] = (),
    split_form: str | None = None,
    rule: str | None = None,
) -> Plan:
    """What to record to prove ``pattern`` at ``shape``, and which rules to check.

    gemm_bias_act: TQ102 (``F.linear`` then the activation); with ``act`` none, TQ101
    (matmul, then a bias add). glu: TQ103, inside the eager GLU MLP. dual_gemm_glu: TQ103
    and TQ105 (TQ105 alone for act none). mlp: TQ102 plain, TQ103 + TQ105 gated.
    rms_norm and add_rms_norm: TQ107 (HF's written-out norm, after the residual add for
    the second); rope: TQ108 (HF's ``apply_rotary_pos_emb``); they take no activation.
    ``split_form`` ``"matmul_add"`` records TQ101's split bias for gemm_bias_act; ``rule``
    checks that one rule only (a finding's).
    """
    validate_pattern(pattern)
    requested = validate_shape(tuple(shape))
    act = pattern_act(pattern, validate_activation(act))
    dtype = dtype_name(dtype)
    device = device or default_device()
    if device not in DEVICES:
        raise ZooUsageError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    if device == "cuda" and not cuda_available():
        raise ZooUsageError("device cuda requested, but torch sees no CUDA device")
    if zoo is None:
        interpret_triton_without_gpu(device)
        zoo = discover()
    record_pattern = "dual_gemm_glu" if pattern == "glu" else pattern
    known = pattern_variants(record_pattern)
    if variant is not None and variant not in known:
        raise ZooUsageError(f"{pattern} has variants {', '.join(known)}, not {variant}")
    variant = variant or known[0]

    rules: tuple[str, ...]
    if pattern == "gemm_bias_act":
        if act == "none" or split_form == "matmul_add":
            split = MATMUL_ADD_REFERENCE
            rules = ("TQ101",) if act == "none" else ("TQ102",)
        else:
            split, rules = zoo.reference(pattern), ("TQ102",)
        fused = choose_fused(zoo, pattern, act, dtype, device, entry)
    elif pattern in IDIOM_RULES:
        split, rules = zoo.reference(pattern), (IDIOM_RULES[pattern],)
        fused = choose_fused(zoo, pattern, act, dtype, device, entry)
    elif pattern == "glu":
        if act == "none":
            raise ZooUsageError("glu with act none multiplies two GEMMs: TQ103 has no GLU to find")
        split, rules = zoo.reference(record_pattern), ("TQ103",)
        fused = glu_after_gemms(choose_fused(zoo, "glu", act, dtype, device, entry))
    else:  # dual_gemm_glu, mlp
        if pattern == "mlp" and variant == "plain":
            if act == "none":
                raise ZooUsageError("a plain mlp with act none is two GEMMs: no rule to check")
            rules = ("TQ102",)
        else:
            rules = ("TQ105",) if act == "none" else ("TQ103", "TQ105")
        split = zoo.reference(pattern)
        fused = choose_fused(zoo, pattern, act, dtype, device, entry)
    if rule is not None:
        if rule not in rules:
            checked = "+".join(rules)
            raise ZooUsageError(f"{pattern} with act {act} reproduces {checked}, not {rule}")
        rules = (rule,)

    interpreted = device not in fused.timed_on
    shape_now, factor = scaled_shape(requested, interpreted=interpreted, scale=scale)
    notes = list(notes)
    if interpreted:
        notes.append(
            f"{fused.name} is interpreted on {device}: its trace shows the fused op, "
            "its time is no measurement"
        )
    return Plan(
        pattern=pattern,
        record_pattern=record_pattern,
        rules=rules,
        split=split,
        fused=fused,
        variant=variant,
        act=act,
        dtype=dtype,
        device=device,
        shape=shape_now,
        requested_shape=requested,
        scale=factor,
        notes=tuple(notes),
    )


def _rows(dims: Sequence[int]) -> int:
    return math.prod(dims[:-1]) if len(dims) > 1 else 1


def _gemm_mkn(op_name: str, shapes: Sequence[Sequence[int]]) -> tuple[int, int, int] | None:
    """M, K, N of a GEMM from its op name and input shapes (the analyzer's operand table)."""
    base = op_name.split("::")[-1]
    operands = GEMM_OPERANDS.get(base)
    if operands is None:
        return None
    x_index, w_index = operands[0], operands[1]
    if max(x_index, w_index) >= len(shapes):
        return None
    x, w = shapes[x_index], shapes[w_index]
    if len(x) < 1 or len(w) < 2:
        return None
    n = w[0] if base in WEIGHT_NK else w[-1]
    return _rows(x), x[-1], n


def _dtype_of(finding: Finding, notes: list[str]) -> str:
    if finding.dtype is None:
        notes.append("the finding has no dtype: recorded in float32")
        return "float32"
    name = PROFILER_DTYPES.get(finding.dtype, finding.dtype)
    try:
        return dtype_name(name)
    except ZooUsageError as error:
        raise NotVerifiable(f"the zoo has no {finding.dtype} entries: {error}") from None


def _act_name(activation: str | None) -> str:
    """The zoo's name for an activation a rule reported (gelu, relu, silu...)."""
    if activation in ACTIVATIONS and activation != "none":
        return activation
    raise NotVerifiable(f"no zoo entry fuses a {activation} activation")


def _glu_act(finding: Finding) -> str:
    kind = finding.evidence.get("glu")
    if kind in GLU_ACTIVATIONS:
        return GLU_ACTIVATIONS[kind]
    raise NotVerifiable(f"no zoo entry fuses a {kind or 'GLU'} with this activation")


def _gate_k(finding: Finding, siblings: Sequence[Finding], trace: Trace | None) -> int | None:
    """K of a GLU's gate GEMM: from the trace's gate op, else from a TQ105 finding on the
    same gate and up (TQ103's own shapes are the multiply's, which have no K)."""
    gate, up = finding.evidence.get("gate"), finding.evidence.get("up")
    if trace is not None and gate is not None:
        rows = trace.ops.filter(trace.ops["event"] == gate).select("name", "shapes").to_dicts()
        if rows:
            mkn = _gemm_mkn(rows[0]["name"], [s or [] for s in rows[0]["shapes"] or []])
            if mkn is not None:
                return mkn[1]
    for other in siblings:
        if other.rule == "TQ105" and {gate, up} <= set(other.ops):
            k = other.evidence.get("k")
            if isinstance(k, int):
                return k
    return None


def _sibling_glu_act(finding: Finding, siblings: Sequence[Finding]) -> str | None:
    ops = set(finding.ops)
    for other in siblings:
        if other.rule == "TQ103" and {other.evidence.get("gate"), other.evidence.get("up")} <= ops:
            return GLU_ACTIVATIONS.get(other.evidence.get("glu", ""))
    return None


def _problem_of(
    finding: Finding, siblings: Sequence[Finding], trace: Trace | None
) -> tuple[str, tuple[int, int, int], str, str | None, list[str]]:
    """pattern, M,K,N, act, split form and notes that reproduce ``finding``."""
    notes: list[str] = []
    rule = finding.rule
    op_names = list(finding.evidence.get("op_names") or [])
    if rule == "TQ101":
        mkn = _gemm_mkn(op_names[0], finding.shapes) if op_names else None
        if mkn is None:
            raise NotVerifiable("TQ101 finding without the GEMM's shapes")
        return "gemm_bias_act", mkn, "none", "matmul_add", notes
    if rule == "TQ102":
        mkn = _gemm_mkn(op_names[0], finding.shapes) if op_names else None
        if mkn is None:
            raise NotVerifiable("TQ102 finding without the GEMM's shapes")
        act = _act_name(finding.evidence.get("activation"))
        if act == "gelu":
            notes.append("GELU recorded as erf gelu (a trace does not say whether it was tanh)")
        if finding.evidence.get("written_out"):
            notes.append(f"the finding's {act} is written out as pointwise ops; recorded as one op")
        form = "matmul_add" if finding.evidence.get("bias_add") is not None else None
        return "gemm_bias_act", mkn, act, form, notes
    if rule == "TQ103":
        if not finding.shapes:
            raise NotVerifiable("TQ103 finding without the multiply's shapes")
        out = finding.shapes[0]
        k = _gate_k(finding, siblings, trace)
        if k is None:
            k = out[-1]
            notes.append(f"K is not in a TQ103 finding and no trace was given: assumed K = N = {k}")
        if finding.evidence.get("gate") == finding.evidence.get("up"):
            notes.append("the finding's gate and up come from one GEMM; recorded as two")
        act = _glu_act(finding)
        if act == "gelu":
            notes.append("GELU recorded as erf gelu (a trace does not say whether it was tanh)")
        return "glu", (_rows(out), k, out[-1]), act, None, notes
    if rule == "TQ105":
        n = finding.evidence.get("n") or []
        k = finding.evidence.get("k")
        x = finding.evidence.get("x_shape") or (finding.shapes[0] if finding.shapes else None)
        if len(n) != 2 or n[0] != n[1] or not isinstance(k, int) or not x:
            raise NotVerifiable(
                f"the zoo's dual_gemm_glu merges two GEMMs of equal N; this finding has N = {n}"
            )
        act = _sibling_glu_act(finding, siblings)
        if act is None:
            act = "none"
            notes.append("no GLU on these GEMMs among the findings: recorded with act none")
        return "dual_gemm_glu", (_rows(x), k, n[0]), act, None, notes
    if rule == "TQ107":
        return _norm_problem(finding, notes)
    if rule == "TQ108":
        return _rope_problem(finding, notes)
    raise NotVerifiable(f"verify cannot reproduce {rule}")


def _norm_problem(
    finding: Finding, notes: list[str]
) -> tuple[str, tuple[int, int, int], str, str | None, list[str]]:
    """TQ107: rms_norm at the norm's [rows, H], add_rms_norm when the residual add is in
    the finding. K is unused by the norms: 1 leaves the CPU scaling to M and H."""
    kind = finding.evidence.get("norm")
    if kind != "RMSNorm":
        raise NotVerifiable(f"the zoo has no fused {kind or 'norm'}: only RMSNorm")
    if not finding.shapes or not finding.shapes[0]:
        raise NotVerifiable("TQ107 finding without the norm's shape")
    out = finding.shapes[0]
    if not finding.evidence.get("weight", True):
        notes.append("the finding's norm has no weight; recorded with one")
    pattern = "add_rms_norm" if finding.evidence.get("residual_add") is not None else "rms_norm"
    return pattern, (_rows(out), 1, out[-1]), "none", None, notes


def _rope_problem(
    finding: Finding, notes: list[str]
) -> tuple[str, tuple[int, int, int], str, str | None, list[str]]:
    """TQ108: rope with M = B·S tokens, K = q's heads, N = the head dim."""
    q = finding.shapes[0] if finding.shapes else None
    if not q or len(q) != 4:
        raise NotVerifiable(f"TQ108 finding without a [B, heads, S, D] shape: {q}")
    batch, heads, seq, dim = q
    if len(finding.shapes) > 1:
        notes.append(f"k is {finding.shapes[1]}; recorded with q's {heads} heads for both")
    if batch > 1:
        notes.append(f"{batch} sequences of {seq} tokens recorded as one of {batch * seq}")
    return "rope", (batch * seq, heads, dim), "none", None, notes


def plan_finding(
    finding: Finding,
    *,
    siblings: Sequence[Finding] = (),
    trace: Trace | None = None,
    shape: Sequence[int] | None = None,
    act: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    entry: str | None = None,
    scale: int | None = None,
    zoo: Zoo | None = None,
) -> Plan | None:
    """The plan that reproduces ``finding`` and its fix, or None when its rule has no zoo
    pattern. ``siblings`` (the other findings of the same analysis) and ``trace`` fill in
    what a finding does not carry itself (a GLU's K, the activation of parallel GEMMs)."""
    if finding.rule not in RULE_PATTERNS:
        return None
    pattern, mkn, found_act, form, notes = _problem_of(finding, siblings, trace)
    return plan_pattern(
        pattern,
        tuple(shape) if shape is not None else mkn,
        act=act or found_act,
        dtype=dtype or _dtype_of(finding, notes),
        device=device,
        entry=entry,
        scale=scale,
        zoo=zoo,
        notes=notes,
        split_form=form,
        rule=finding.rule,
    )


# --- recording and analysis ----------------------------------------------------------------


def trace_stats(
    trace: Trace, entry: Entry, device: str, rules: Sequence[str], path: str | None
) -> TraceStats:
    """Counts and times of one recorded trace, and how often each rule fired on it."""
    ops = trace.ops
    top = Counter(ops.filter(ops["depth"] == 0)["name"].to_list())
    ranges = trace.annotations.filter(trace.annotations["name"] == f"zoo:{entry.name}")
    kernels = trace.kernels
    if kernels.height:
        per_step = kernels.group_by("step").agg(pl.col("dur_ns").sum())["dur_ns"]
    else:
        per_step = ranges["dur_ns"]
    fired = Counter(f.rule for f in analyze(trace, select=list(rules)))
    return TraceStats(
        entry=entry.name,
        impl=entry.impl,
        steps=trace.steps.height,
        ops=ops.height,
        top_level_ops=dict(sorted(top.items())),
        kernels=kernels.height,
        cpu_time_us=float(ranges["dur_ns"].sum() or 0) / 1000,
        kernel_time_us=float(kernels["dur_ns"].sum() or 0) / 1000 if kernels.height else None,
        step_us=float(per_step.median() or 0) / 1000,
        timed=device in entry.timed_on,
        findings={rule: fired.get(rule, 0) for rule in rules},
        path=path,
    )


def run_plan(plan: Plan, *, steps: int = 3, keep: str | Path | None = None) -> VerifyResult:
    """Record both traces of ``plan``, analyze them, and compare the rules' counts.

    Traces go to a temporary directory, or are kept in ``keep`` (their paths are then in
    the result).
    """
    zoo = Zoo((plan.split, plan.fused))
    with tempfile.TemporaryDirectory(prefix="traceq-verify-") as tmp:
        folder = Path(keep) if keep is not None else Path(tmp)
        stats: list[TraceStats] = []
        for side, entry in (("split", plan.split), ("fused", plan.fused)):
            path = folder / f"{plan.pattern}-{side}-{entry.name}.pt.trace.json.gz"
            record_trace(
                plan.record_pattern,
                entry.name,
                plan.shape,
                plan.dtype,
                plan.device,
                plan.act,
                path,
                steps=steps,
                variant=plan.variant,
                zoo=zoo,
            )
            # a recording in the temporary folder is never loaded again: not worth caching
            loaded = traceq.load(path, cache=None if keep is not None else False)
            kept = str(path) if keep is not None else None
            stats.append(trace_stats(loaded, entry, plan.device, plan.rules, kept))
    split, fused = stats
    numerics = None if fused.timed else untimed_numerics(plan)
    checks = tuple(RuleCheck(r, split.findings[r], fused.findings[r]) for r in plan.rules)
    notes = plan.notes
    if any(c.split == 0 for c in checks):
        status = "not_reproduced"
        if plan.shape[1] == plan.shape[2] and {"TQ103", "TQ105"} & set(plan.rules):
            notes += (
                "K == N: without tensor ids the analyzer links ops by shape, and cannot tell "
                "the GLU's input from its GEMM outputs",
            )
    elif all(c.gone for c in checks):
        status = "gone"
    else:
        status = "still_fires"
    return VerifyResult(
        status=status,
        rule=plan.rules[0],
        rules=plan.rules,
        checks=checks,
        pattern=plan.pattern,
        act=plan.act,
        dtype=plan.dtype,
        device=plan.device,
        variant=plan.variant,
        shape=plan.shape,
        requested_shape=plan.requested_shape,
        scale=plan.scale,
        split=split,
        fused=fused,
        notes=notes,
        numerics=numerics,
    )


def no_pattern(finding: Finding) -> VerifyResult:
    """The result for a rule the zoo has no kernel for: said plainly, not raised."""
    reason = f"no zoo pattern for {finding.rule} ({finding.name})"
    if finding.zoo:
        reason += f"; its zoo patterns {', '.join(finding.zoo)} cannot reproduce it"
    return VerifyResult(
        status="no_zoo_pattern", rule=finding.rule, rules=(finding.rule,), reason=reason
    )


def unsupported(finding: Finding, error: NotVerifiable) -> VerifyResult:
    """The result for a finding the zoo cannot run here (an activation, dtype or N it lacks)."""
    return VerifyResult(
        status="unsupported", rule=finding.rule, rules=(finding.rule,), reason=str(error)
    )


def verify(
    finding_or_pattern: Finding | str,
    *,
    shape: Sequence[int] | None = None,
    act: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    entry: str | None = None,
    scale: int | None = None,
    variant: str | None = None,
    steps: int = 3,
    siblings: Sequence[Finding] = (),
    trace: Trace | None = None,
    keep: str | Path | None = None,
    zoo: Zoo | None = None,
) -> VerifyResult:
    """Prove (or fail to prove) a fusion fix: the finding's rule fires on the split reference
    and not on the fused entry, recorded at the finding's shapes and dtype.

    From a `Finding`: its rule, shapes, dtype and activation pick the pattern and problem;
    ``shape`` / ``act`` / ``dtype`` override them. A rule with no zoo pattern gives a
    ``no_zoo_pattern`` result and a problem no entry can run an ``unsupported`` one; neither
    raises. From a pattern name: ``shape`` (M, K, N) is required, ``act`` defaults to gelu,
    and a request the zoo cannot run raises `ZooUsageError`. ``device`` defaults to CUDA
    when present; ``scale`` divides the shape (default: 1 on CUDA, on the CPU enough to
    stay within `CPU_SHAPE_LIMIT`); ``entry`` names the fused entry (default: the best
    that runs here, see `choose_fused`); ``keep`` a directory to keep the two traces in.
    """
    if isinstance(finding_or_pattern, Finding):
        finding = finding_or_pattern
        try:
            plan = plan_finding(
                finding,
                siblings=siblings,
                trace=trace,
                shape=shape,
                act=act,
                dtype=dtype,
                device=device,
                entry=entry,
                scale=scale,
                zoo=zoo,
            )
        except NotVerifiable as error:
            return unsupported(finding, error)
        if plan is None:
            return no_pattern(finding)
        return run_plan(plan, steps=steps, keep=keep)
    if shape is None:
        raise ZooUsageError("verify of a pattern needs a shape M,K,N")
    plan = plan_pattern(
        finding_or_pattern,
        shape,
        act=act or "gelu",
        dtype=dtype or "float32",
        device=device,
        entry=entry,
        scale=scale,
        variant=variant,
        zoo=zoo,
    )
    return run_plan(plan, steps=steps, keep=keep)


def check_fixes(
    findings: Sequence[Finding],
    *,
    trace: Trace | None = None,
    device: str | None = None,
    scale: int | None = None,
    steps: int = 3,
    zoo: Zoo | None = None,
) -> dict[str, dict[str, Any]]:
    """`verify` once per finding group (`Finding.key()`): group key -> result dict.

    Each group is verified through its occurrence with the largest saving (the one that
    speaks for it in reports); groups that need the same recording share one. ``trace`` is
    the analyzed trace, which gives what a finding does not carry (a GLU's K).
    """
    groups: dict[str, list[Finding]] = {}
    for finding in findings:
        groups.setdefault(finding.key(), []).append(finding)
    device = device or default_device()
    if zoo is None and any(f.rule in RULE_PATTERNS for f in findings):
        interpret_triton_without_gpu(device)
        zoo = discover()
    done: dict[tuple[Any, ...], VerifyResult] = {}
    results: dict[str, dict[str, Any]] = {}
    for key, members in groups.items():
        first = max(members, key=lambda f: (f.est_saving_us, f.time_us))
        try:
            plan = plan_finding(
                first, siblings=findings, trace=trace, device=device, scale=scale, zoo=zoo
            )
        except NotVerifiable as error:
            results[key] = unsupported(first, error).to_dict()
            continue
        if plan is None:
            results[key] = no_pattern(first).to_dict()
            continue
        if plan.cache_key not in done:
            done[plan.cache_key] = run_plan(plan, steps=steps)
        results[key] = done[plan.cache_key].to_dict()
    return results
