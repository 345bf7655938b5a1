"""What a zoo entry is, and how entries are found.

An `Entry` is one implementation of one fusion pattern (the split eager reference, a Triton
kernel, `torch.compile` of the reference, a vendor library...). Entries are discovered only
through the entry-point group ``traceq.zoo``: each entry point resolves to an iterable of
`Entry`, and the built-in zoo registers itself there exactly like an outside package would
(``builtin = "traceq.zoo.builtin:ENTRIES"``). A broken plugin is reported as a `PluginProblem`,
never raised, so one bad package cannot hide the rest of the zoo.

This module imports neither torch nor triton: listing what exists must stay cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from traceq.zoo.errors import EntryError, UnknownEntry, UnknownPattern

ENTRY_POINT_GROUP = "traceq.zoo"

#: The built-in zoo's entry point, as pyproject declares it. Used when traceq runs from a
#: source checkout that was never installed (so no entry-point metadata exists).
BUILTIN_ENTRY_POINT = ("builtin", "traceq.zoo.builtin:ENTRIES")

#: Pattern name -> what it computes and which findings it fixes.
PATTERNS: dict[str, str] = {
    "gemm_bias_act": "act(x @ W.T + b) in one GEMM with an epilogue (fixes TQ101/TQ102)",
    "glu": "act(gate) * up in one pointwise pass (fixes TQ103)",
    "dual_gemm_glu": "act(x @ Wg.T) * (x @ Wu.T) in one GEMM kernel (fixes TQ103 + TQ105)",
    "mlp": "a whole Linear->act->Linear or GLU MLP (fixes the MLP's findings together)",
    "rms_norm": "x * rsqrt(mean(x²) + eps) * w in one pass over each row (fixes TQ107)",
    "add_rms_norm": "h = x + residual, then rms_norm(h) in one pass: returns (normed, h) (fixes "
    "TQ107's add+RMSNorm)",
    "rope": "the rotary embedding of q and k in one kernel: returns (q_embed, k_embed) (fixes "
    "TQ108)",
}

#: Patterns that apply no activation: their entries are called with act "none", whatever
#: activation a check or a recording was asked for.
NO_ACTIVATION: frozenset[str] = frozenset({"rms_norm", "add_rms_norm", "rope"})


def pattern_act(pattern: str, act: str) -> str:
    """The activation ``pattern`` is run with: ``act``, or "none" for a pattern that has none."""
    return "none" if pattern in NO_ACTIVATION else act


def pattern_activations(pattern: str) -> tuple[str, ...]:
    """Every activation an entry of ``pattern`` can be asked for."""
    return ("none",) if pattern in NO_ACTIVATION else tuple(ACTIVATIONS)


#: Activation name -> the PyTorch spelling it means.
ACTIVATIONS: dict[str, str] = {
    "gelu": "F.gelu(x) (erf)",
    "gelu_tanh": "F.gelu(x, approximate='tanh')",
    "relu": "F.relu(x)",
    "silu": "F.silu(x)",
    "none": "identity",
}

#: Dtype names an entry may declare. ``tf32`` is float32 storage with TF32 matmuls allowed.
DTYPES: tuple[str, ...] = ("float64", "float32", "tf32", "float16", "bfloat16")

DEVICES: tuple[str, ...] = ("cpu", "cuda")

#: Reasons ``requires`` hooks and `Entry.available` give, spelled once.
NEEDS_CUDA = "needs CUDA"


@dataclass(frozen=True)
class Entry:
    """One implementation of one pattern, with what it supports.

    ``fn(*inputs, act)`` returns a new tensor; the inputs per pattern are fixed by
    `traceq.zoo.patterns`. ``out_fn(*inputs, act, out=...)``, when given, writes into ``out``: the
    check harness poisons ``out`` with NaN first, so a tile the kernel forgets is caught.
    ``requires(device)`` returns why the entry cannot run there (a missing package) or
    ``None``. ``activations_on`` overrides ``activations`` per device, for entries whose
    meaning changes with the device (``torch._addmm_activation`` is tanh-GELU on CUDA,
    erf-GELU on the CPU). ``notes_on`` is what a user must know per device (e.g. "not fused
    on CPU"). ``timed_on`` lists devices where a time is a measurement of the real kernel;
    Triton on the CPU runs in its interpreter, whose time measures nothing.
    """

    name: str
    pattern: str
    impl: str
    fn: Callable[..., Any]
    activations: tuple[str, ...]
    dtypes: tuple[str, ...]
    devices: tuple[str, ...]
    description: str
    out_fn: Callable[..., Any] | None = None
    requires: Callable[[str], str | None] | None = None
    activations_on: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    notes_on: Mapping[str, str] = field(default_factory=dict)
    timed_on: tuple[str, ...] = DEVICES

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not self.name:
            problems.append("empty name")
        if self.pattern not in PATTERNS:
            problems.append(f"pattern {self.pattern!r} is not one of {sorted(PATTERNS)}")
        if not self.impl:
            problems.append("empty impl")
        if not callable(self.fn):
            problems.append("fn is not callable")
        if self.out_fn is not None and not callable(self.out_fn):
            problems.append("out_fn is not callable")
        activation_sets = [self.activations, *self.activations_on.values()]
        bad_acts = {a for acts in activation_sets for a in acts} - set(ACTIVATIONS)
        if bad_acts:
            problems.append(f"unknown activations {sorted(bad_acts)}")
        bad_dtypes = set(self.dtypes) - set(DTYPES)
        if bad_dtypes:
            problems.append(f"unknown dtypes {sorted(bad_dtypes)}")
        bad_devices = (set(self.devices) | set(self.timed_on)) - set(DEVICES)
        if bad_devices:
            problems.append(f"unknown devices {sorted(bad_devices)}")
        if problems:
            raise EntryError(f"entry {self.name or '?'}: " + "; ".join(problems))

    def activations_for(self, device: str) -> tuple[str, ...]:
        """The activations this entry computes correctly on ``device``."""
        return self.activations_on.get(device, self.activations)

    def available(self, device: str | None = None) -> tuple[bool, str]:
        """Whether the entry can run here, and why not (or a note on how it runs).

        With no device, asks whether any declared device is usable on this machine.
        """
        if device is None:
            results = [self.available(d) for d in self.devices]
            usable = [r for r in results if r[0]]
            if usable:
                return usable[0]
            return results[0] if results else (False, "declares no device")
        if device not in self.devices:
            return False, f"runs on {', '.join(self.devices)}, not {device}"
        if self.requires is not None:
            reason = self.requires(device)
            if reason:
                return False, reason
        if device == "cuda" and not cuda_available():
            return False, NEEDS_CUDA
        return True, self.notes_on.get(device, "")

    def supports(self, act: str, dtype: str, device: str) -> tuple[bool, str]:
        """Whether this entry applies to one check request, and why not."""
        ok, reason = self.available(device)
        if not ok:
            return False, reason
        acts = self.activations_for(device)
        if act not in acts:
            return False, f"activation {act} not supported on {device} (has {', '.join(acts)})"
        if dtype not in self.dtypes:
            return False, f"dtype {dtype} not supported (has {', '.join(self.dtypes)})"
        return True, reason

    def to_dict(self) -> dict[str, Any]:
        """The entry as JSON-ready data (what ``zoo list --format json`` prints)."""
        ok, reason = self.available()
        return {
            "name": self.name,
            "pattern": self.pattern,
            "impl": self.impl,
            "activations": list(self.activations),
            "activations_on": {d: list(a) for d, a in self.activations_on.items()},
            "dtypes": list(self.dtypes),
            "devices": list(self.devices),
            "supports_out": self.out_fn is not None,
            "timed_on": list(self.timed_on),
            "description": self.description,
            "notes_on": dict(self.notes_on),
            "available": ok,
            "availability": reason,
        }


def reference_entry(pattern: str, fn: Callable[..., Any], description: str) -> Entry:
    """The entry ``<pattern>.reference``: split eager PyTorch, every activation and dtype."""
    return Entry(
        name=f"{pattern}.reference",
        pattern=pattern,
        impl="reference",
        fn=fn,
        activations=pattern_activations(pattern),
        dtypes=DTYPES,
        devices=("cpu", "cuda"),
        description=description,
    )


def cuda_available() -> bool:
    """True when torch is importable and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@dataclass(frozen=True)
class PluginProblem:
    """An entry point that could not be loaded, or yielded something that is not an Entry."""

    source: str
    error: str

    def to_dict(self) -> dict[str, str]:
        return {"source": self.source, "error": self.error}


@dataclass(frozen=True)
class Zoo:
    """Everything discovery found: the entries, and what went wrong on the way."""

    entries: tuple[Entry, ...]
    problems: tuple[PluginProblem, ...] = ()

    def for_pattern(self, pattern: str) -> tuple[Entry, ...]:
        if pattern not in PATTERNS:
            raise UnknownPattern(
                f"unknown pattern {pattern!r}; known: {', '.join(sorted(PATTERNS))}"
            )
        return tuple(e for e in self.entries if e.pattern == pattern)

    def get(self, name: str) -> Entry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        known = ", ".join(e.name for e in self.entries)
        raise UnknownEntry(f"no zoo entry named {name!r}; known: {known}")

    def reference(self, pattern: str) -> Entry:
        """The split eager reference of a pattern: the baseline every check compares with."""
        candidates = [e for e in self.for_pattern(pattern) if e.impl == "reference"]
        preferred = [e for e in candidates if e.name == f"{pattern}.reference"]
        if not (preferred or candidates):
            raise UnknownEntry(f"no reference entry for pattern {pattern!r}")
        return (preferred or candidates)[0]


def one_line(error: BaseException) -> str:
    """An exception as the one line a list of problems can show."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _load(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


def _collect(
    source: str,
    loader: Callable[[], Any],
    entries: list[Entry],
    problems: list[PluginProblem],
) -> None:
    try:
        loaded = loader()
        items = list(loaded() if callable(loaded) else loaded)
    except Exception as error:  # a plugin can fail in any way; report it, go on
        problems.append(PluginProblem(source, one_line(error)))
        return
    seen = {e.name for e in entries}
    for item in items:
        if isinstance(item, Entry):
            if item.name in seen:
                problems.append(PluginProblem(source, f"duplicate entry name {item.name!r}"))
                continue
            seen.add(item.name)
            entries.append(item)
        elif isinstance(item, BaseException):
            problems.append(PluginProblem(source, one_line(item)))
        else:
            problems.append(PluginProblem(source, f"not an Entry: {type(item).__name__}"))


def discover(group: str = ENTRY_POINT_GROUP) -> Zoo:
    """Load every entry point of ``group`` into one `Zoo`.

    An entry point may resolve to an iterable of `Entry` or to a callable returning one;
    items that are exceptions are reported as problems (the built-in zoo uses that for
    kernel modules whose optional dependency is missing). When traceq is not installed,
    the built-in entry point is loaded from source so a checkout works the same.
    """
    entries: list[Entry] = []
    problems: list[PluginProblem] = []
    found = sorted(entry_points(group=group), key=lambda ep: (ep.name != "builtin", ep.name))
    builtin_name, builtin_value = BUILTIN_ENTRY_POINT
    if group == ENTRY_POINT_GROUP and not any(ep.value == builtin_value for ep in found):
        _collect(builtin_name, lambda: _load(builtin_value), entries, problems)
    for ep in found:
        _collect(ep.name, ep.load, entries, problems)
    return Zoo(tuple(entries), tuple(problems))
