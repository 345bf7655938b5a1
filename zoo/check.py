"""The one harness every zoo entry goes through: same numbers as float64, then how fast.

``check(pattern, shape, dtype, device, act)`` runs each applicable entry of the pattern on
fresh random inputs (never zeros) for every case of `traceq.zoo.patterns.cases` — the shape
itself, a ragged shape no block size divides, a 3-D input (and the pattern's variants) —
and compares with the split reference run in float64 on the same inputs:
``‖out − ref‖ / ‖ref‖`` must be under the dtype's bound, and NaN or inf fails.

Outputs are poisoned first. An entry with ``out_fn`` writes into a buffer filled with NaN
("NaN out buffer"), so any element its kernel forgets stays NaN and fails the check. An
entry that only returns new tensors cannot be handed a buffer; there the harness allocates
and frees a NaN-filled block of the output's size just before the call ("NaN freed
block"), so an allocator that reuses it (CUDA's caching allocator does) gives the entry
poisoned memory. On the CPU malloc may hand out fresh pages instead, so there it is
best-effort; the report says which of the two each entry got.
Inputs are compared with copies afterwards: an entry may not write into them.

The main case is then timed beside the split reference in the same run (see `traceq.zoo.timing`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from traceq.zoo.activations import validate as validate_activation
from traceq.zoo.device import DevicePeak, device_peak
from traceq.zoo.errors import DeviceUnavailable, UnknownEntry, ZooUsageError
from traceq.zoo.patterns import (
    ERROR_BOUNDS,
    TORCH_DTYPES,
    Case,
    bytes_moved,
    cases,
    dtype_name,
    flops,
    make_inputs,
    output_shapes,
    validate_pattern,
    validate_shape,
)
from traceq.zoo.registry import (
    DEVICES,
    Entry,
    PluginProblem,
    Zoo,
    cuda_available,
    discover,
    one_line,
    pattern_act,
)
from traceq.zoo.timing import Timing, median_ms, throughput

POISON_OUT = "NaN out buffer"
POISON_ALLOCATOR = "NaN freed block"


@dataclass
class CaseResult:
    """One entry on one case: its error against float64, and its time when timed."""

    case: str
    shape: str
    rel_error: float | None
    bound: float
    passed: bool
    error: str | None = None
    timing: Timing | None = None
    speedup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "shape": self.shape,
            "rel_error": _finite_or_none(self.rel_error),
            "bound": self.bound,
            "passed": self.passed,
            "error": self.error,
            "timing": self.timing.to_dict() if self.timing else None,
            "speedup_vs_reference": self.speedup,
        }


@dataclass
class EntryResult:
    """Everything the check learned about one entry."""

    entry: str
    impl: str
    status: str  # "pass", "fail" or "skipped"
    note: str = ""
    poisoning: str = ""
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    @property
    def max_rel_error(self) -> float | None:
        errors = [c.rel_error for c in self.cases if c.rel_error is not None]
        if not errors:
            return None
        return math.nan if any(math.isnan(e) for e in errors) else max(errors)

    @property
    def timed_cases(self) -> list[CaseResult]:
        return [c for c in self.cases if c.timing is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "entry": self.entry,
            "impl": self.impl,
            "status": self.status,
            "note": self.note,
            "poisoning": self.poisoning,
            "max_rel_error": _finite_or_none(self.max_rel_error),
            "cases": [c.to_dict() for c in self.cases],
        }


@dataclass
class CheckReport:
    """The result of one ``check``: per entry, numerics on every case and the timings."""

    pattern: str
    shape: tuple[int, int, int]
    dtype: str
    device: str
    act: str
    bound: float
    seed: int
    reference: str
    cases: list[str]
    entries: list[EntryResult]
    peak: DevicePeak | None = None
    problems: list[PluginProblem] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not any(e.failed for e in self.entries)

    @property
    def failures(self) -> list[EntryResult]:
        return [e for e in self.entries if e.failed]

    def entry(self, name: str) -> EntryResult:
        for result in self.entries:
            if result.entry == name:
                return result
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "act": self.act,
            "bound": self.bound,
            "seed": self.seed,
            "reference": self.reference,
            "cases": self.cases,
            "passed": self.passed,
            "peak": self.peak.to_dict() if self.peak else None,
            "entries": [e.to_dict() for e in self.entries],
            "problems": [p.to_dict() for p in self.problems],
        }


def _finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN: a NaN error is reported as null beside passed=false."""
    return None if value is None or not math.isfinite(value) else value


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    """‖out − expected‖ / ‖expected‖ in float64; NaN when ``out`` holds NaN or inf."""
    out64 = out.detach().to(torch.float64)
    if not bool(torch.isfinite(out64).all()):
        return math.nan
    reference_norm = float(torch.linalg.vector_norm(expected))
    difference = float(torch.linalg.vector_norm(out64 - expected))
    if reference_norm == 0.0:
        return 0.0 if difference == 0.0 else math.inf
    return difference / reference_norm


@contextlib.contextmanager
def matmul_precision(dtype: str) -> Iterator[None]:
    """TF32 matmuls on for ``tf32``, off for everything else, restored afterwards.

    PyTorch's default is off, but a caller may have turned it on; float32's 1e-5 bound
    only means something with IEEE fp32 matmuls.
    """
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _poison_allocator(shapes: tuple[tuple[int, ...], ...], dtype: torch.dtype, device: str) -> None:
    blocks = [torch.full(shape, math.nan, dtype=dtype, device=device) for shape in shapes]
    del blocks


def outputs_of(result: object) -> tuple[torch.Tensor, ...]:
    """An entry's result as a tuple of tensors (most patterns return one tensor)."""
    if isinstance(result, torch.Tensor):
        return (result,)
    if isinstance(result, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in result):
        return tuple(result)
    raise TypeError(f"an entry returned {type(result).__name__}, not tensors")


def _run_case(
    entry: Entry,
    pattern: str,
    case: Case,
    inputs: tuple[torch.Tensor | None, ...],
    expected: tuple[torch.Tensor, ...],
    act: str,
    dtype: torch.dtype,
    device: str,
    bound: float,
) -> tuple[CaseResult, tuple[torch.Tensor, ...] | None]:
    """One entry on one case. A pattern with several outputs (add_rms_norm's normalized sum
    and sum, rope's q and k) gets one NaN buffer per output (``out=`` a tuple) and its
    error is the largest of its outputs'."""
    label = case.problem.label(pattern)
    saved = [t.clone() if t is not None else None for t in inputs]
    shapes = output_shapes(pattern, case)
    try:
        if entry.out_fn is not None:
            buffers = tuple(torch.full(s, math.nan, dtype=dtype, device=device) for s in shapes)
            out = buffers[0] if len(buffers) == 1 else buffers
            results = outputs_of(entry.out_fn(*inputs, act, out=out))
            if len(results) != len(buffers) or any(
                r.data_ptr() != b.data_ptr() for r, b in zip(results, buffers, strict=True)
            ):
                raise RuntimeError("out_fn returned a tensor other than out")
        else:
            _poison_allocator(shapes, dtype, device)
            results = outputs_of(entry.fn(*inputs, act))
        _synchronize(device)
    except Exception as error:  # any failure of the entry is a failed case, not a crash
        return CaseResult(case.name, label, None, bound, False, one_line(error)), None
    for before, after in zip(saved, inputs, strict=True):
        if before is not None and after is not None and not torch.equal(before, after):
            return CaseResult(case.name, label, None, bound, False, "modified its inputs"), None
    if len(results) != len(shapes):
        error = f"{len(results)} outputs, expected {len(shapes)}"
        return CaseResult(case.name, label, None, bound, False, error), None
    for result, shape in zip(results, shapes, strict=True):
        if tuple(result.shape) != shape:
            error = f"output shape {tuple(result.shape)}, expected {shape}"
            return CaseResult(case.name, label, None, bound, False, error), None
        if result.dtype != dtype:
            error = f"output dtype {result.dtype}, expected {dtype}"
            return CaseResult(case.name, label, None, bound, False, error), None
    errors = [relative_error(r, e) for r, e in zip(results, expected, strict=True)]
    rel = math.nan if any(math.isnan(e) for e in errors) else max(errors)
    passed = math.isfinite(rel) and rel <= bound
    error = None if passed else ("non-finite output" if math.isnan(rel) else "error above bound")
    return CaseResult(case.name, label, rel, bound, passed, error), results


def _select(zoo: Zoo, pattern: str, select: Collection[str] | None) -> list[Entry]:
    """The pattern's entries whose name or impl is in ``select`` (all when None).

    A name or impl that no entry of the whole zoo has is a typo, not an empty choice.
    """
    entries = zoo.for_pattern(pattern)
    if select is None:
        return list(entries)
    known = {e.name for e in zoo.entries} | {e.impl for e in zoo.entries}
    unknown = sorted(set(select) - known)
    if unknown:
        raise UnknownEntry(
            f"no zoo entry or impl named {', '.join(unknown)}; known impls: "
            + ", ".join(sorted({e.impl for e in zoo.entries}))
        )
    return [e for e in entries if e.name in select or e.impl in select]


def check(
    pattern: str,
    shape: tuple[int, int, int],
    dtype: str = "float32",
    device: str = "cpu",
    act: str = "gelu",
    *,
    zoo: Zoo | None = None,
    select: Collection[str] | None = None,
    seed: int = 0,
    timing: bool = True,
    min_run_time: float = 0.2,
) -> CheckReport:
    """Check every applicable entry of ``pattern`` against float64, then time the main case.

    ``select`` keeps entries whose name or impl is in it (the reference always runs: it is
    the baseline of the timings). ``timing=False`` checks numerics only. A pattern with no
    activation (`traceq.zoo.registry.NO_ACTIVATION`) runs with act "none", whatever ``act``.
    """
    pattern = validate_pattern(pattern)
    shape = validate_shape(tuple(shape))
    dtype = dtype_name(dtype)
    act = pattern_act(pattern, validate_activation(act))
    if device not in DEVICES:
        raise ZooUsageError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
    if device == "cuda" and not cuda_available():
        raise DeviceUnavailable("device cuda requested, but torch sees no CUDA device")
    zoo = zoo if zoo is not None else discover()
    reference = zoo.reference(pattern)
    entries = _select(zoo, pattern, select)
    if reference not in entries:
        entries.insert(0, reference)
    torch_dtype = TORCH_DTYPES[dtype]
    bound = ERROR_BOUNDS[dtype]
    plan = cases(pattern, shape)
    peak = device_peak(device) if timing else None

    results: dict[str, EntryResult] = {}
    runnable: list[Entry] = []
    for entry in entries:
        ok, note = entry.supports(act, dtype, device)
        if ok:
            poisoning = POISON_OUT if entry.out_fn is not None else POISON_ALLOCATOR
            results[entry.name] = EntryResult(entry.name, entry.impl, "pass", note, poisoning)
            runnable.append(entry)
        else:
            results[entry.name] = EntryResult(entry.name, entry.impl, "skipped", note)

    generator = torch.Generator().manual_seed(seed)
    with matmul_precision(dtype), torch.no_grad():
        for case in plan:
            inputs = make_inputs(pattern, case, torch_dtype, device, generator)
            inputs64 = tuple(t.to(torch.float64) if t is not None else None for t in inputs)
            expected = outputs_of(reference.fn(*inputs64, act))
            reference_ms: float | None = None
            for entry in runnable:
                result, _ = _run_case(
                    entry, pattern, case, inputs, expected, act, torch_dtype, device, bound
                )
                time_it = timing and case.timed and result.passed and device in entry.timed_on
                if time_it:

                    def call(e: Entry = entry, args: tuple[Any, ...] = inputs) -> object:
                        return e.fn(*args, act)

                    ms, method = median_ms(call, device, min_run_time)
                    work = flops(pattern, case)
                    traffic = bytes_moved(pattern, case, torch_dtype.itemsize)
                    result.timing = throughput(ms, method, work, traffic, dtype, peak)
                    if entry is reference:
                        reference_ms = ms
                    elif reference_ms is not None:
                        result.speedup = reference_ms / ms
                results[entry.name].cases.append(result)
                if not result.passed:
                    results[entry.name].status = "fail"
            del inputs, inputs64, expected

    return CheckReport(
        pattern=pattern,
        shape=shape,
        dtype=dtype,
        device=device,
        act=act,
        bound=bound,
        seed=seed,
        reference=reference.name,
        cases=[c.name for c in plan],
        entries=[results[e.name] for e in entries],
        peak=peak,
        problems=list(zoo.problems),
    )
