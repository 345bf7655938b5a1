"""`diff(base, new)`: what changed between two traces (or a baseline and a trace), and where.

Per group of one dimension (kernel name, op, module, or step): counts and time per step,
their deltas sorted by impact, whether the change is outside the noise (unknown, `None`,
with too few steps to judge it: `stats`), and the groups that appear or disappear.
Alongside: ops that now dispatch to different kernels, separate ops that became one fused
kernel, and the analyzer's findings that appear or disappear.

Traces of different lengths compare per step when both have steps; traces from different
devices or vendors should be compared by op or module (the default), because the same
model runs differently named kernels on an A100, a V100 and an MI300.

`--by op` lists the ops called (the outermost op of each call, in either trace) and measures
each as `key_averages()` would: its instances at any depth, their total time. So eager
`aten::linear` → compiled `aten::mm` shows `aten::mm` in both traces (nested in the first),
not as a new op; an op's row holds the time of the ops nested in it.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from traceq.kernel_names import split_fused_ops
from traceq.regression.dispatch import dispatch_changes
from traceq.regression.errors import RegressionError
from traceq.regression.groups import OP_TOTAL, strip_compile_wrapper
from traceq.regression.stats import Change, compare
from traceq.regression.summary import Summary, summarize
from traceq.trace import Trace

if TYPE_CHECKING:
    from traceq.rules.finding import Finding

BY = ("op", "kernel", "module", "step")
# Inductor names a fused kernel after the ops it absorbed:
# `triton_poi_fused_gelu_mul_0`, `cpp_fused_add_mul_1`, `graph_0_cpp_fused__unsafe_view_gelu_mul_0`.
FUSED = re.compile(r"fused_(?P<parts>.+?)(?:_\d+)?$")


@dataclass
class Total:
    """A whole-trace metric: step time, or GPU / CPU op time."""

    metric: str
    label: str
    change: Change


@dataclass
class Fusion:
    """Ops that ran separately in the base and as one fused kernel/op in the new trace."""

    fused: str
    dim: str  # where the fused one shows: "op" or "kernel"
    parts: list[str]
    base_ns: float  # per step (or total): time the parts lost
    new_ns: float  # per step (or total): time of the fused one
    base_calls: float
    new_calls: float


@dataclass
class Diff:
    """Everything `traceq diff` reports; `groups` is sorted by impact (|delta|)."""

    by: str
    basis: str
    per_step: bool
    base_source: str
    new_source: str
    totals: list[Total]
    groups: pl.DataFrame
    fusions: list[Fusion]
    dispatch: pl.DataFrame
    findings: dict[str, list[dict[str, Any]]] | None
    metadata: dict[str, dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def appeared(self) -> list[str]:
        return self.groups.filter(pl.col("status") == "appeared")["group"].to_list()

    def disappeared(self) -> list[str]:
        return self.groups.filter(pl.col("status") == "disappeared")["group"].to_list()

    def row(self, group: str) -> dict[str, Any]:
        rows = self.groups.filter(pl.col("group") == group)
        if rows.height == 0:
            raise KeyError(group)
        return rows.row(0, named=True)

    def _repr_html_(self) -> str:
        """A notebook's view: the totals, then the groups that changed most (names from
        the traces escaped; never the metadata)."""
        esc = html.escape
        totals = "".join(
            f"<tr><td style='text-align:left'>{esc(t.label)}</td><td>{t.change.base:,.1f}</td>"
            f"<td>{t.change.new:,.1f}</td><td>"
            + (f"{t.change.rel:+.1%}" if t.change.rel is not None else "—")
            + "</td></tr>"
            for t in self.totals
        )
        shown = [
            c for c in ("group", "status", "base_ns", "new_ns", "delta_ns") if c in self.groups
        ]
        rows = "".join(
            "<tr>"
            + "".join(
                f"<td style='text-align:left'>{esc(str(v))}</td>"
                if isinstance(v, str) or v is None
                else f"<td>{v:,.1f}</td>"
                for v in row
            )
            + "</tr>"
            for row in self.groups.select(shown).head(10).iter_rows()
        )
        head = "".join(f"<th>{esc(c)}</th>" for c in shown)
        return (
            f"<div><p><b>Diff</b> by {esc(self.by)} ({esc(basis_label(self.basis))}"
            f"{', per step' if self.per_step else ''}): {esc(self.base_source)} → "
            f"{esc(self.new_source)}</p><table><tr><th>metric</th><th>base ns</th><th>new ns</th>"
            f"<th>change</th></tr>{totals}</table>"
            + (f"<table><tr>{head}</tr>{rows}</table>" if shown else "")
            + "</div>"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "basis": self.basis,
            "per_step": self.per_step,
            "base": self.base_source,
            "new": self.new_source,
            "notes": self.notes,
            "metadata": self.metadata,
            "totals": [
                {"metric": t.metric, "label": t.label, "verdict": t.change.judgement}
                | t.change.to_dict()
                for t in self.totals
            ],
            "groups": self.groups.to_dicts(),
            "fusions": [vars(f) for f in self.fusions],
            "dispatch": self.dispatch.to_dicts(),
            "findings": self.findings,
        }


def op_dimension(base: Summary, new: Summary) -> str:
    """Where op times are measured: `op_total` (every op at any depth), or the outermost-op
    groups when a summary lacks it (a version 1 baseline)."""
    both = all(summary.group_names(OP_TOTAL) for summary in (base, new))
    return OP_TOTAL if both else "op"


def as_summary(value: Trace | Summary, findings: bool | None = None) -> Summary:
    return value if isinstance(value, Summary) else summarize(value, findings=findings)


def basis_label(basis: str) -> str:
    return "GPU time" if basis == "gpu" else "CPU op time"


def diff(
    base: Trace | Summary,
    new: Trace | Summary,
    by: str | None = None,
    findings: bool | None = None,
) -> Diff:
    """Compare two traces or summaries, grouped `by` 'op' (default), 'kernel', 'module' or
    'step'. `findings` as in `summarize` (False: leave findings out)."""
    b, n = as_summary(base, findings), as_summary(new, findings)
    by = by or "op"
    if by not in BY:
        raise RegressionError(f"cannot group by {by!r}: choose one of {', '.join(BY)}")
    notes = comparability_notes(b, n, by)
    if by == "kernel" and "cpu" in (b.basis, n.basis):
        raise RegressionError("a CPU-only trace has no kernels: diff it --by op or module")
    per_step = b.has_steps and n.has_steps
    if by == "step":
        groups = step_rows(b, n, per_step)
    else:
        measure = op_dimension(b, n) if by == "op" else by
        groups = group_rows(b, n, by, per_step, measure=measure)
    unit = "kernels" if b.basis == n.basis == "gpu" else "ops"
    # Kernels and child ops are not the same kind of implementation: compare like with like.
    same = b.basis == n.basis
    dispatch = dispatch_changes(b.dispatch if same else b.dispatch.clear(), n.dispatch, unit)
    whole = totals(b, n, per_step)
    if whole[0].change.too_few:
        notes.append(
            f"{whole[0].change.too_few_text}: no change is called outside or inside the "
            "noise; slower and faster give the direction only"
        )
    return Diff(
        by=by,
        basis=b.basis if b.basis == n.basis else f"{b.basis}/{n.basis}",
        per_step=per_step,
        base_source=b.source,
        new_source=n.source,
        totals=whole,
        groups=groups,
        fusions=fusions(b, n, per_step),
        dispatch=dispatch,
        findings=findings_diff(b.findings, n.findings),
        metadata={"base": b.metadata, "new": n.metadata},
        notes=notes,
    )


def comparability_notes(b: Summary, n: Summary, by: str) -> list[str]:
    """What makes the two hard to compare, in a sentence each, for the top of the report."""
    notes = []
    if b.basis != n.basis:
        notes.append(
            f"base has {basis_label(b.basis)}, new has {basis_label(n.basis)}: "
            "times are not comparable, only which ops ran"
        )
    if b.devices != n.devices and b.basis == n.basis == "gpu":
        devices = f"{', '.join(b.devices) or '?'} vs {', '.join(n.devices) or '?'}"
        advice = {
            "kernel": "compare by op or module",
            "check": "kernel groups appear and disappear, judge by op and module",
        }.get(by, f"grouped by {by}")
        notes.append(f"different devices ({devices}): kernel names differ; {advice}")
    if not (b.has_steps and n.has_steps):
        which = "neither trace has" if not (b.has_steps or n.has_steps) else "one trace lacks"
        notes.append(f"{which} ProfilerStep markers: whole traces are compared, not steps")
    elif len(b.steps) != len(n.steps):
        notes.append(f"{len(b.steps)} vs {len(n.steps)} steps: compared per step")
    bv, nv = b.metadata.get("versions", {}), n.metadata.get("versions", {})
    for key in sorted(set(bv) & set(nv)):
        if key != "schemaVersion" and bv[key] != nv[key]:
            notes.append(f"{key} differs: {bv[key]} vs {nv[key]}")
    return notes


def totals(b: Summary, n: Summary, per_step: bool) -> list[Total]:
    """Step wall time and basis time (GPU, or CPU op time), decided against the noise."""
    rows = [("step", "step time"), ("time", basis_label(b.basis))]
    changes = [
        compare(b.step_samples(m, per_step)[None, :], n.step_samples(m, per_step)[None, :])[0]
        for m, _ in rows
    ]
    metric = {"step": "step", "time": "gpu" if b.basis == "gpu" else "cpu"}
    return [Total(metric[m], label, c) for (m, label), c in zip(rows, changes, strict=True)]


def group_rows(
    b: Summary,
    n: Summary,
    dim: str,
    per_step: bool,
    with_stats: bool = True,
    measure: str | None = None,
) -> pl.DataFrame:
    """One row per group of `dim` present in either: per-step (or total) count and time,
    delta, shares of the basis time, status, and (`with_stats`) the change's interval and
    p-value. `measure`: the dimension the values come from (`op_total` for ops), when not
    `dim` itself."""
    names = sorted(set(b.group_names(dim)) | set(n.group_names(dim)))
    if not names:
        return empty_rows()
    dim = measure or dim
    bt, nt = b.samples(dim, names, per_step=per_step), n.samples(dim, names, per_step=per_step)
    bc = b.samples(dim, names, "count", per_step=per_step)
    nc = n.samples(dim, names, "count", per_step=per_step)
    changes = compare(bt, nt) if with_stats else [None] * len(names)
    base_total = max(float(b.step_samples("time", per_step).mean()), 1.0)
    new_total = max(float(n.step_samples("time", per_step).mean()), 1.0)
    frame = pl.DataFrame(
        {
            "group": names,
            "base_count": bc.mean(axis=1),
            "new_count": nc.mean(axis=1),
            "base_ns": bt.mean(axis=1),
            "new_ns": nt.mean(axis=1),
            "ci_low": [c.ci_low if c else None for c in changes],
            "ci_high": [c.ci_high if c else None for c in changes],
            "p_value": [c.p_value if c else None for c in changes],
            "significant": [c.significant if c else None for c in changes],
        },
        schema={k: v for k, v in ROW_SCHEMA.items() if k != "rel"},
    ).with_columns(
        pl.when(pl.col("base_ns") > 0).then(pl.col("new_ns") / pl.col("base_ns") - 1).alias("rel")
    )
    return finish_rows(frame, base_total, new_total)


def step_rows(b: Summary, n: Summary, per_step: bool) -> pl.DataFrame:
    """`--by step`: the i-th step of each trace side by side (wall time; counts unknown)."""
    length = max(len(b.steps), len(n.steps))
    bw = b.step_wall_ns + [0] * (length - len(b.steps))
    nw = n.step_wall_ns + [0] * (length - len(n.steps))
    label = [f"#{i + 1} ({_at(b.steps, i)} → {_at(n.steps, i)})" for i in range(length)]
    frame = pl.DataFrame(
        {
            "group": label,
            "base_count": [1.0 if i < len(b.steps) else 0.0 for i in range(length)],
            "new_count": [1.0 if i < len(n.steps) else 0.0 for i in range(length)],
            "base_ns": np.asarray(bw, dtype=float),
            "new_ns": np.asarray(nw, dtype=float),
        },
        schema={
            k: ROW_SCHEMA[k] for k in ("group", "base_count", "new_count", "base_ns", "new_ns")
        },
    ).with_columns(
        pl.when(pl.col("base_ns") > 0).then(pl.col("new_ns") / pl.col("base_ns") - 1).alias("rel"),
        pl.lit(None, dtype=pl.Float64).alias("ci_low"),
        pl.lit(None, dtype=pl.Float64).alias("ci_high"),
        pl.lit(None, dtype=pl.Float64).alias("p_value"),
        pl.lit(None, dtype=pl.Boolean).alias("significant"),
    )
    base_total = max(float(sum(bw)), 1.0)
    new_total = max(float(sum(nw)), 1.0)
    return finish_rows(frame, base_total, new_total, sort=False)


ROW_SCHEMA = {
    "group": pl.String,
    "base_count": pl.Float64,
    "new_count": pl.Float64,
    "base_ns": pl.Float64,
    "new_ns": pl.Float64,
    "rel": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "p_value": pl.Float64,
    "significant": pl.Boolean,
}


def empty_rows() -> pl.DataFrame:
    return finish_rows(pl.DataFrame(schema=ROW_SCHEMA), 1.0, 1.0)


def finish_rows(
    frame: pl.DataFrame, base_total: float, new_total: float, sort: bool = True
) -> pl.DataFrame:
    base_absent = (pl.col("base_count") == 0) & (pl.col("base_ns") == 0)
    new_absent = (pl.col("new_count") == 0) & (pl.col("new_ns") == 0)
    out = frame.with_columns(
        (pl.col("new_ns") - pl.col("base_ns")).alias("delta_ns"),
        (pl.col("new_count") - pl.col("base_count")).alias("delta_count"),
        (pl.col("base_ns") / base_total).alias("base_share"),
        (pl.col("new_ns") / new_total).alias("new_share"),
        pl.when(base_absent)
        .then(pl.lit("appeared"))
        .when(new_absent)
        .then(pl.lit("disappeared"))
        .when(pl.col("new_ns") == pl.col("base_ns"))
        .then(pl.lit("same"))
        .otherwise(pl.lit("changed"))
        .alias("status"),
    )
    if sort:
        out = out.sort(pl.col("delta_ns").abs(), "group", descending=[True, False])
    return out.select(
        "group",
        "status",
        "base_count",
        "new_count",
        "delta_count",
        "base_ns",
        "new_ns",
        "delta_ns",
        "rel",
        "ci_low",
        "ci_high",
        "p_value",
        "significant",
        "base_share",
        "new_share",
    )


def fusions(b: Summary, n: Summary, per_step: bool) -> list[Fusion]:
    """Fused kernels/ops that appeared, each with the base ops it replaced: ops whose calls
    dropped and whose names are parts of the fused name (`aten::gelu` + `aten::mul` →
    `..._fused_gelu_mul_0`). Two or more parts make a fusion."""
    ops = group_rows(b, n, "op", per_step, with_stats=False)
    dropped = ops.filter(pl.col("delta_count") < 0).with_columns(
        pl.when(pl.col("group").str.starts_with("aten::"))
        .then(pl.col("group").str.strip_prefix("aten::"))
        .alias("_part")
    )
    found: list[Fusion] = []
    seen: set[str] = set()
    for dim in ("op", "kernel"):
        if dim == "kernel" and "cpu" in (b.basis, n.basis):
            continue
        rows = ops if dim == "op" else group_rows(b, n, "kernel", per_step, with_stats=False)
        # Appeared fused groups are few (one per Inductor kernel); the parts are matched
        # with one expression per fused name.
        for row in rows.filter(pl.col("status") == "appeared").iter_rows(named=True):
            match = FUSED.search(row["group"])
            if match is None or row["group"] in seen:
                continue
            names = split_fused_ops(match.group("parts"))
            parts = dropped.filter(pl.col("_part").is_in(names))
            if parts.height < 2:
                continue
            seen.add(row["group"])
            found.append(
                Fusion(
                    fused=row["group"],
                    dim=dim,
                    parts=parts["group"].to_list(),
                    base_ns=float(-parts["delta_ns"].sum()),
                    new_ns=float(row["new_ns"]),
                    base_calls=float(-parts["delta_count"].sum()),
                    new_calls=float(row["new_count"]),
                )
            )
    return found


def finding_identity(finding: Finding) -> str:
    """What a finding is about, the same in an eager and a compiled run of one model: its
    rule, its module (torch.compile's `OptimizedModule` wrapper dropped, layer indices as
    `*`) and its GEMM as M×K×N. Never the op name: compile turns `aten::linear` on a
    [4, 16, 64] input into `aten::mm` on [64, 64], one GEMM of M=64, K=64. Leading dims fold
    into M, as `aten::mm` sees them. Findings without shapes are about their ops (TQ204's
    dispatch-heavy op names), so those keep the op names."""
    from traceq.rules.finding import normalize_module

    module = normalize_module(strip_compile_wrapper(finding.module)) or ""
    evidence = finding.evidence
    if evidence.get("k") is not None and evidence.get("x_shape"):
        n = evidence.get("n")
        ns = "+".join(map(str, n)) if isinstance(n, list) else str(n)
        subject = f"{math.prod(evidence['x_shape'][:-1])}x{evidence['k']}x{ns}"
    elif finding.shapes:
        subject = ";".join("x".join(map(str, _folded(s))) for s in finding.shapes)
    else:
        subject = ",".join(dict.fromkeys(evidence.get("op_names") or []))
    identity = f"{finding.rule}|{module}|{subject}"
    return f"{identity}|{finding.variant}" if finding.variant else identity


def _folded(shape: list[int]) -> list[int]:
    """[4, 16, 64] -> [64, 64]: every leading dim folded into the first, as GEMMs see it."""
    return [math.prod(shape[:-1]), shape[-1]] if len(shape) > 2 else list(shape)


def findings_diff(
    base: list[dict[str, Any]] | None, new: list[dict[str, Any]] | None
) -> dict[str, list[dict[str, Any]]] | None:
    """Findings present in only one of the two (matched by `finding_identity`, so a finding
    whose op was renamed by torch.compile is one finding), with their counts."""
    if base is None or new is None:
        return None
    from traceq.rules.finding import Finding

    def by_key(items: list[dict[str, Any]]) -> dict[str, tuple[int, dict[str, Any]]]:
        out: dict[str, tuple[int, dict[str, Any]]] = {}
        for item in items:
            # a baseline's compact finding carries its identity (`baseline.compact_finding`)
            key = item.get("identity") or finding_identity(Finding.from_dict(item))
            count, first = out.get(key, (0, item))
            out[key] = (count + 1, first)
        return out

    b, n = by_key(base), by_key(new)

    def entry(key: str, count: int, item: dict[str, Any]) -> dict[str, Any]:
        fields = ("rule", "name", "severity", "message", "module", "est_saving_us")
        return {"key": key, "count": count, **{f: item.get(f) for f in fields}}

    return {
        "appeared": [entry(k, *n[k]) for k in sorted(set(n) - set(b))],
        "disappeared": [entry(k, *b[k]) for k in sorted(set(b) - set(n))],
    }


def _at(steps: list[int], i: int) -> str:
    return f"step {steps[i]}" if i < len(steps) else "—"
