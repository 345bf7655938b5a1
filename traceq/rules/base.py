"""What a rule is: a code, a name, a severity, a documented check over a `Context`.

A rule is written as one function whose docstring is its documentation, in ruff's shape
(What it does / Why is this bad? / Example / Use instead / References), wrapped by
`@rule(...)`. The function receives a `Context` and yields `Finding`s; it never reads
configuration or the device itself, so the same check runs from the CLI, the Python API
and tests with whatever thresholds and device model the caller chose.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from traceq.rules.explained import CACHE_KEY as EXPLAINED_KEY
from traceq.rules.finding import SEVERITIES, Finding

if TYPE_CHECKING:
    import polars as pl

    from traceq.job import JobFrames
    from traceq.perf.device import DeviceModel
    from traceq.trace import Trace

CODE = re.compile(r"^[A-Z]+[0-9]+$")
NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")

Check = Callable[[Any], Iterable[Finding]]
SCOPES = ("trace", "job")


@dataclass(frozen=True)
class Rule:
    """One addressable check. `defaults` are its thresholds, overridable by configuration."""

    code: str
    name: str
    severity: str
    check: Check = field(repr=False)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    zoo: tuple[str, ...] = ()
    scope: str = "trace"  # "job": reads a job's frames (`JobContext`, `engine.run_job_rules`)
    # an idiom rule: its findings explain their ops (`traceq.rules.explained`), run first
    explains: bool = False
    # a generic rule: its findings give way to the ops idiom findings explain
    defers: bool = False

    def __post_init__(self) -> None:
        if not CODE.match(self.code):
            raise ValueError(f"rule code {self.code!r} must look like 'TQ102'")
        if not NAME.match(self.name):
            raise ValueError(f"rule name {self.name!r} must be kebab-case")
        if self.severity not in SEVERITIES:
            raise ValueError(f"rule severity must be one of {SEVERITIES}, not {self.severity!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"rule scope must be one of {SCOPES}, not {self.scope!r}")
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))

    @property
    def doc(self) -> str:
        """The check's docstring, dedented: the rule's documentation."""
        return inspect.cleandoc(self.check.__doc__ or "")

    @property
    def summary(self) -> str:
        """First sentence of "What it does" (or of the doc), for catalogue listings."""
        text = self.doc
        match = re.search(r"What it does\s*\n+(.+?)(?:\n\n|$)", text, re.S)
        body = (match.group(1) if match else text).strip()
        first = re.split(r"(?<=\.)\s", " ".join(body.split()), maxsplit=1)[0]
        return first

    @property
    def module(self) -> str:
        return getattr(self.check, "__module__", "")

    def __call__(self, ctx: Any) -> Iterable[Finding]:
        return self.check(ctx)


def rule(
    code: str,
    name: str,
    severity: str,
    *,
    defaults: Mapping[str, Any] | None = None,
    zoo: Iterable[str] = (),
    scope: str = "trace",
    explains: bool = False,
    defers: bool = False,
) -> Callable[[Check], Rule]:
    """Make a `Rule` of a check function: `@rule("TQ201", "launch-bound", "warning", ...)`."""

    def wrap(check: Check) -> Rule:
        return Rule(
            code,
            name,
            severity,
            check,
            dict(defaults or {}),
            tuple(zoo),
            scope,
            explains=explains,
            defers=defers,
        )

    return wrap


class Context:
    """What a check sees: the trace, its own thresholds, the device model, and shared,
    lazily computed relations (data-flow ops and edges) that every rule may reuse."""

    def __init__(
        self,
        trace: Trace,
        rule: Rule,
        options: Mapping[str, Any],
        device: DeviceModel,
        cache: dict[str, Any] | None = None,
    ) -> None:
        self.trace = trace
        self.rule = rule
        self.options: Mapping[str, Any] = MappingProxyType(dict(options))
        self.device = device
        self._cache = cache if cache is not None else {}

    def cached(self, key: str, compute: Callable[[], Any]) -> Any:
        """A value computed once per analysis and shared by every rule (e.g. decoded kernels)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @property
    def ops(self) -> pl.DataFrame:
        """Semantic ops (`relations.dataflow.dataflow_ops`): top-level aten ops + fused kernels.

        Taken from the trace's own cache, so `trace.dataflow_ops` and repeated analyses
        share one computation."""
        return self.cached("dataflow_ops", lambda: self.trace.dataflow_ops)

    @property
    def edges(self) -> pl.DataFrame:
        """Producer → consumer tensor edges between semantic ops (`relations.dataflow.dataflow`),
        from the trace's own cache like `ops`."""
        return self.cached("dataflow_edges", lambda: self.trace.dataflow)

    @property
    def explained(self) -> frozenset[int]:
        """Op events the idiom findings made so far explain (`traceq.rules.explained`):
        empty for the explaining rules themselves, which the engine runs first."""
        return self._cache.get(EXPLAINED_KEY, frozenset())

    @property
    def kernel_names(self) -> pl.DataFrame:
        """`trace.kernels` with each name decoded (`traceq.kernel_names.decode_frame`:
        library, category, arch, dtype, tensor_core, tile, layout, epilogue, fused_ops, op)."""
        from traceq.kernel_names import decode_frame

        return self.cached("kernel_names", lambda: decode_frame(self.trace.kernels))

    def finding(self, **fields: Any) -> Finding:
        """A `Finding` of this rule: code, name, severity and zoo patterns filled in."""
        fields.setdefault("severity", self.rule.severity)
        fields.setdefault("zoo", list(self.rule.zoo))
        return Finding(rule=self.rule.code, name=self.rule.name, **fields)


class JobContext:
    """What a job rule sees: the job's frames and its own thresholds."""

    def __init__(self, job: JobFrames, rule: Rule, options: Mapping[str, Any]) -> None:
        self.job = job
        self.rule = rule
        self.options: Mapping[str, Any] = MappingProxyType(dict(options))

    def finding(self, **fields: Any) -> Finding:
        """A `Finding` of this rule: code, name and severity filled in."""
        fields.setdefault("severity", self.rule.severity)
        return Finding(rule=self.rule.code, name=self.rule.name, **fields)
