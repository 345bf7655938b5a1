"""`Finding`: one occurrence of a rule's pattern in a trace, with its evidence and savings.

A finding is plain data so every stage after the rules (reports, diffs, baselines, the
zoo's fix checks) can read, write and compare it without the trace it came from.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SEVERITIES = ("info", "warning", "error")

# `encoder.layer.3.mlp` -> `encoder.layer.*.mlp`; `Layer_3` -> `Layer_*` (with_modules names).
_INDEX_SEGMENT = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")
_INDEX_SUFFIX = re.compile(r"_\d+(?=\.|$)")


def normalize_module(module: str | None) -> str | None:
    """A module path with instance indices replaced by `*`, so repeated layers group together."""
    if module is None:
        return None
    return _INDEX_SUFFIX.sub("_*", _INDEX_SEGMENT.sub("*", module))


@dataclass
class Finding:
    """One occurrence of a pattern. Times are µs; `ops`/`kernels` are trace event ids.

    `evidence` holds what a reader needs to trust the finding: by convention `op_names`
    and `kernel_names` (filled in by the engine, aligned with `ops` / `kernels`, when a rule
    leaves them out; a rule over a large region may give the distinct names instead),
    decoded kernel names under `decoded`, and any measured numbers the savings model used.
    A finding whose saving is GPU idle time in a window rather than the time of its own
    kernels (TQ201, TQ204 on GPU traces) says so with `saves_from: "gpu_idle"` and
    `window_ns: [start, end]` (`saves_from: "gpu_idle+own"`: that idle time and its own
    kernels' time, TQ207), so a report's total counts each µs once
    (`traceq.reports.savings`).
    """

    rule: str
    name: str
    severity: str
    message: str
    step: int | None = None
    module: str | None = None
    ops: list[int] = field(default_factory=list)
    kernels: list[int] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    dtype: str | None = None
    time_us: float = 0.0
    est_saving_us: float = 0.0
    saving_model: str = ""
    fix: str = ""
    zoo: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    # Where the user's code issued its ops: {"file", "line", "function"} of the innermost
    # Python frame outside torch and installed libraries (traces recorded `with_stack=True`;
    # `relations.source`), None without stacks. Not part of `key()`: an edit that moves a
    # line is the same finding.
    source: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """Inverse of `to_dict`; unknown keys (from newer versions) are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def key(self) -> str:
        """Stable identity across steps, layers and runs: rule, normalized module, op names
        and shapes, and the `variant` of a rule that reports several kinds of finding on one
        op (TQ203: "pageable HtoD" and "small HtoD" copies of one `aten::to` are two
        problems with two fixes). Equal keys are "the same finding" for grouping, diffs and
        baselines. An idiom finding (`evidence["idiom"]`) is keyed by its idiom and shapes
        instead of module and op names: the same RMSNorm in every layer and the final norm
        is one problem with one fix."""
        shapes = ";".join("x".join(map(str, s)) for s in self.shapes)
        idiom = self.evidence.get("idiom")
        if idiom:
            # one idiom (`evidence["idiom"]`: "RMSNorm", "RoPE") at every call site is one
            # finding: decoder layers and the final norm alike, whatever ops each spelled
            key = f"{self.rule}|idiom:{idiom}|{shapes}"
            return f"{key}|{self.variant}" if self.variant else key
        op_names = ",".join(dict.fromkeys(self.evidence.get("op_names") or []))
        key = f"{self.rule}|{normalize_module(self.module) or ''}|{op_names}|{shapes}"
        return f"{key}|{self.variant}" if self.variant else key

    @property
    def variant(self) -> str | None:
        """Which of its kinds of finding a rule made (`evidence["variant"]`), if it has
        several; part of every identity of the finding."""
        return self.evidence.get("variant")

    @property
    def severity_rank(self) -> int:
        return SEVERITIES.index(self.severity)
