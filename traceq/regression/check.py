"""`check(trace, baseline)`: the CI gate. Did a metric get slower than allowed, beyond noise?

Without named metrics, it checks the step time, the total GPU time (CPU op time on
CPU-only traces) and every kernel, op and module group that holds at least 1 % of the
time in either trace, and names every one that regressed. Ops are chosen by the outermost
op called (those groups add up), and every op metric, chosen or named (`op:aten::mm`),
measures the op as `torch.profiler`'s `key_averages()` names it: its instances at any
depth, their total time (`groups.op_totals`). A metric regresses when its
relative change exceeds `max_regress` and lies outside the noise (see `stats`). Groups
that appear or disappear are reported, not failed: their time shows in the totals, and a
pattern that came back shows as a new finding (`fail_on_new_findings`).

With too few steps to judge the noise (fewer than `stats.min_steps()` a side, but more
than one: 3 + 3 steps give the U test at best p = 0.1), the gate cannot tell a slowdown
from jitter, so it fails only on what three steps do prove: a metric slower by more than
`max_regress` on every step pair (its fastest new step against its slowest base step).
Anything less passes, as "too few steps to judge (n=3; need ≥ 4)", said in the report and
by `traceq check` on stderr. With one sample a side (no steps), the point estimate decides.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from traceq.regression.baseline import load_summary
from traceq.regression.diff import (
    as_summary,
    basis_label,
    comparability_notes,
    findings_diff,
    op_dimension,
)
from traceq.regression.errors import RegressionError
from traceq.regression.groups import DIMENSIONS, strip_compile_wrapper
from traceq.regression.stats import Change, compare, min_steps
from traceq.regression.summary import Summary
from traceq.trace import Trace

MIN_SHARE = 0.01
METRIC = re.compile(r"^(?P<kind>step|gpu|cpu|time|kernel|op|module)(?::(?P<name>.+))?$")

Source = Trace | Summary | str | os.PathLike[str]


@dataclass
class Metric:
    """One checked metric: what it is, how it changed, and the verdict."""

    spec: str  # e.g. "step", "gpu", "kernel:ampere_sgemm_128x64_tn", "module:encoder"
    label: str
    change: Change
    # regressed | improved | within limit | no change | appeared | disappeared | too few steps
    verdict: str
    groups: list[str] = field(default_factory=list)  # the groups the metric sums

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.spec,
            "label": self.label,
            "verdict": self.verdict,
            "groups": self.groups,
            "decided_by": self.change.basis,
            **self.change.to_dict(),
        }


@dataclass
class CheckResult:
    """The gate's answer. `failed` drives the exit status (1) and the pytest failure."""

    metrics: list[Metric]
    max_regress: float
    per_step: bool
    base_source: str
    new_source: str
    notes: list[str]
    new_findings: list[dict[str, Any]]
    resolved_findings: list[dict[str, Any]]
    fail_on_new_findings: bool

    @property
    def regressions(self) -> list[Metric]:
        return [m for m in self.metrics if m.verdict == "regressed"]

    @property
    def failed(self) -> bool:
        return bool(self.regressions) or (self.fail_on_new_findings and bool(self.new_findings))

    @property
    def too_few(self) -> str | None:
        """'too few steps to judge (n=3; need ≥ 4)' when the noise could not be judged, so
        that only a regression on every step pair failed; None when it could."""
        judged = next((m.change for m in self.metrics if m.change.too_few), None)
        return judged.too_few_text if judged else None

    def too_few_line(self) -> str | None:
        """What the gate decided without a noise estimate, and how to get one (`traceq
        check` prints it on stderr); None when the noise could be judged."""
        if self.too_few is None:
            return None
        limit = f"{self.max_regress:.1%}"
        if self.regressions:
            return (
                f"{self.too_few}: failed on {len(self.regressions)} metric(s) slower by more "
                f"than {limit} on every step pair"
            )
        return (
            f"{self.too_few}: passed, as no metric is slower by more than {limit} on every "
            f"step pair; record ≥ {min_steps()} steps a side to judge the noise"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "failed": self.failed,
            "max_regress": self.max_regress,
            "per_step": self.per_step,
            "base": self.base_source,
            "new": self.new_source,
            "notes": self.notes,
            "regressed": [m.spec for m in self.regressions],
            "too_few_steps": self.too_few,
            "metrics": [m.to_dict() for m in self.metrics],
            "new_findings": self.new_findings,
            "resolved_findings": self.resolved_findings,
            "fail_on_new_findings": self.fail_on_new_findings,
        }


def parse_ratio(value: str | float) -> float:
    """'5%' -> 0.05, '0.05' -> 0.05, 5 -> 0.05 (a bare number over 1 is read as percent)."""
    text = str(value).strip()
    try:
        if text.endswith("%"):
            number = float(text[:-1]) / 100
        else:
            number = float(text)
            number = number / 100 if number > 1 else number
    except ValueError:
        raise RegressionError(f"not a ratio: {value!r} (write e.g. 5% or 0.05)") from None
    if not 0 <= number < 100:
        raise RegressionError(f"max regression {value!r} is out of range (0% to 10000%)")
    return number


def check(
    trace: Source,
    baseline: Source,
    max_regress: float | str = 0.05,
    metrics: list[str] | None = None,
    fail_on_new_findings: bool = False,
    min_share: float = MIN_SHARE,
    cache: bool | None = None,
) -> CheckResult:
    """Compare `trace` with `baseline` (a baseline file, a trace file, a `Trace` or a
    `Summary`); see the module docstring for what is checked and when it fails. `cache`
    as `traceq.load`'s, for the trace files it loads."""
    limit = parse_ratio(max_regress)
    base = _summary(baseline, findings=fail_on_new_findings, cache=cache)
    # Findings cost an analysis: run it when asked to fail on them, or when the baseline
    # has findings to report against.
    wanted = True if fail_on_new_findings else (None if base.findings is not None else False)
    new = _summary(trace, findings=wanted, cache=cache)
    if fail_on_new_findings and base.findings is None:
        raise RegressionError(
            "the baseline holds no findings (saved without the analyzer): save it again "
            "to use --fail-on-new-findings"
        )
    if base.basis != new.basis:
        raise RegressionError(
            f"cannot check a trace with {basis_label(new.basis)} against a baseline with "
            f"{basis_label(base.basis)}: record both with the same activities"
        )
    per_step = base.has_steps and new.has_steps
    selected = [_resolve(spec, base, new) for spec in metrics] if metrics else None
    if selected is None:
        selected = default_metrics(base, new, per_step, min_share)
    selected = [_measured(m, op_dimension(base, new)) for m in selected]
    base_rows = np.vstack([_samples(base, m, per_step) for m in selected])
    new_rows = np.vstack([_samples(new, m, per_step) for m in selected])
    changes = compare(base_rows, new_rows)
    checked = [
        Metric(spec, label, change, verdict(change, limit), names)
        for (spec, label, _dim, names), change in zip(selected, changes, strict=True)
    ]
    found = findings_diff(base.findings, new.findings) or {"appeared": [], "disappeared": []}
    notes = comparability_notes(base, new, "check")
    if checked and checked[0].change.too_few:  # one sample size for every metric
        notes.append(too_few_note(checked[0].change, limit))
    return CheckResult(
        metrics=checked,
        max_regress=limit,
        per_step=per_step,
        base_source=base.source,
        new_source=new.source,
        notes=notes,
        new_findings=found["appeared"],
        resolved_findings=found["disappeared"],
        fail_on_new_findings=fail_on_new_findings,
    )


TOO_FEW = "too few steps"


def too_few_note(change: Change, limit: float) -> str:
    """The line that says the gate could not judge the noise, and what it failed on."""
    return (
        f"{change.too_few_text}: the noise cannot be judged, so only a metric slower by "
        f"more than {limit:.1%} on every step pair fails"
    )


def verdict(change: Change, limit: float) -> str:
    """Regressed only when the change is both larger than `limit` and outside the noise.

    With too few steps to judge the noise, "outside" cannot be said: regressed only when
    every step pair is slower by more than `limit` (improved: faster by more), else
    `TOO_FEW`, which passes: three steps are no ground to fail a build on a mean."""
    if change.base == 0:
        return "appeared" if change.new > 0 else "no change"
    if change.new == 0:
        return "disappeared"
    if change.too_few:
        if change.rel == 0:
            return "no change"
        if change.pairs_low is not None and change.pairs_low > limit:
            return "regressed"
        if change.pairs_high is not None and change.pairs_high < -limit:
            return "improved"
        return TOO_FEW
    if not change.significant:
        return "no change"
    assert change.rel is not None
    if change.rel > limit:
        return "regressed"
    if change.rel < -limit:
        return "improved"
    return "within limit"


# A selected metric: (spec, label, dimension or step/time, group names it sums).
Selected = tuple[str, str, str, list[str]]


def default_metrics(
    base: Summary, new: Summary, per_step: bool, min_share: float
) -> list[Selected]:
    """Step time, basis time, and every group holding at least `min_share` in either."""
    label = basis_label(base.basis)
    chosen: list[Selected] = [
        ("step", "step time", "step", []),
        (_basis_spec(base), label, "time", []),
    ]
    for dim in DIMENSIONS:
        shares: dict[str, float] = {}
        for summary in (base, new):
            totals = summary.totals(dim)
            total = max(summary.total_time_ns, 1)
            for name, time_ns in zip(totals["group"], totals["time_ns"], strict=True):
                shares[name] = max(shares.get(name, 0.0), time_ns / total)
        for name in sorted(shares, key=lambda n: (-shares[n], n)):
            if shares[name] >= min_share:
                chosen.append((f"{dim}:{name}", f"{dim} {name}", dim, [name]))
    return chosen


def _measured(selected: Selected, op_dim: str) -> Selected:
    spec, label, dim, names = selected
    return (spec, label, op_dim, names) if dim == "op" else selected


def _basis_spec(summary: Summary) -> str:
    return "gpu" if summary.basis == "gpu" else "cpu"


def _resolve(spec: str, base: Summary, new: Summary) -> Selected:
    """A `--metric` spec as the groups it covers; an error names what was not found."""
    match = METRIC.match(spec.strip())
    if match is None:
        raise RegressionError(
            f"unknown metric {spec!r}: use step, gpu, kernel:NAME, op:NAME or module:PATH"
        )
    kind, name = match.group("kind"), match.group("name")
    if kind == "step":
        return ("step", "step time", "step", [])
    if kind in ("gpu", "cpu", "time"):
        return (_basis_spec(base), basis_label(base.basis), "time", [])
    if not name:
        raise RegressionError(f"metric {spec!r} needs a name: {kind}:NAME")
    if kind == "kernel" and base.basis == "cpu":
        raise RegressionError(f"{spec!r}: a CPU-only trace has no kernels; check an op instead")
    dim = op_dimension(base, new) if kind == "op" else kind
    names = sorted(set(base.group_names(dim)) | set(new.group_names(dim)))
    chosen = [g for g in names if _matches(kind, name, g)]
    if not chosen:
        raise RegressionError(f"metric {spec!r} matches no {kind} in either trace")
    label = f"{kind} {name}" + (f" ({len(chosen)} groups)" if len(chosen) > 1 else "")
    return (f"{kind}:{name}", label, kind, chosen)


def _matches(kind: str, pattern: str, group: str) -> bool:
    if kind == "module":
        path = strip_compile_wrapper(pattern)
        return group == path or group.startswith(f"{path}.")
    if group == pattern:
        return True
    return any(c in pattern for c in "*?") and fnmatch.fnmatchcase(group, pattern)


def _samples(summary: Summary, selected: Selected, per_step: bool) -> np.ndarray:
    _spec, _label, dim, names = selected
    if dim == "step":
        return summary.step_samples("step", per_step)
    if dim == "time":
        return summary.step_samples("time", per_step)
    return summary.samples(dim, names, per_step=per_step).sum(axis=0)


def _summary(source: Source, findings: bool | None, cache: bool | None) -> Summary:
    if isinstance(source, Summary | Trace):
        return as_summary(source, findings=findings)
    return load_summary(source, findings=findings, cache=cache)
