"""Find rules (built-in and from installed packages) and run the selected ones on a trace.

Third-party packages add rules without touching traceq: an entry point in the group
`traceq.rules` resolving to a `Rule` or an iterable of `Rule`s. A plugin that fails to
import, resolves to something else, or reuses a taken code is reported in `problems`
and left out; it never stops the analysis. Built-in rules are trusted: their errors are
bugs and propagate. A plugin rule that raises while checking is reported the same way.
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from traceq.perf.device import DeviceModel, device_model
from traceq.rules.analysis import Analysis
from traceq.rules.base import Context, JobContext, Rule
from traceq.rules.config import Config, check_rule_refs, rule_options, selected
from traceq.rules.explained import CACHE_KEY as EXPLAINED_KEY
from traceq.rules.explained import drop_explained, explained_ops
from traceq.rules.finding import Finding

if TYPE_CHECKING:
    from traceq.job import JobFrames
    from traceq.trace import Trace

ENTRY_POINT_GROUP = "traceq.rules"


@dataclass
class Problem:
    """A plugin or rule that could not be used, and why (shown, never fatal)."""

    source: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.message}"


@dataclass
class RuleSet:
    """All known rules in order (built-ins first), and what went wrong finding them."""

    rules: list[Rule]
    problems: list[Problem] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)  # code -> "builtin" / dist name

    def get(self, ref: str) -> Rule | None:
        ref_upper = ref.upper()
        return next((r for r in self.rules if r.code == ref_upper or r.name == ref), None)


def builtin_rules() -> list[Rule]:
    """The catalogue, imported when rules are first discovered: every rule module with it,
    which `import traceq` and a cached `traceq info` need not pay for."""
    from traceq.rules.catalogue import RULES

    return list(RULES)


def discover(entry_points: Iterable[importlib.metadata.EntryPoint] | None = None) -> RuleSet:
    """Built-in rules plus those of every `traceq.rules` entry point, de-duplicated."""
    rules = builtin_rules()
    ruleset = RuleSet(rules=rules, origin={r.code: "builtin" for r in rules})
    builtin_ids = {id(r) for r in rules}
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    for ep in entry_points:
        source = f"plugin {ep.name!r} ({ep.value})"
        try:
            loaded = ep.load()
        except Exception as exc:  # a broken plugin must not stop the analysis
            ruleset.problems.append(Problem(source, f"failed to load: {type(exc).__name__}: {exc}"))
            continue
        candidates = [loaded] if isinstance(loaded, Rule) else _iterable(loaded)
        if candidates is None:
            kind = type(loaded).__name__
            ruleset.problems.append(Problem(source, f"is a {kind}, not a Rule or list of Rules"))
            continue
        dist = getattr(getattr(ep, "dist", None), "name", None) or ep.name
        for candidate in candidates:
            if id(candidate) in builtin_ids:
                continue  # traceq's own entry point lists the catalogue again
            if not isinstance(candidate, Rule):
                ruleset.problems.append(Problem(source, f"holds a {type(candidate).__name__}"))
                continue
            taken = ruleset.get(candidate.code) or ruleset.get(candidate.name)
            if taken is not None:
                ruleset.problems.append(
                    Problem(
                        source,
                        f"{candidate.code} ({candidate.name}) clashes with {taken.code} "
                        f"({taken.name}) from {ruleset.origin[taken.code]}; left out",
                    )
                )
                continue
            ruleset.rules.append(candidate)
            ruleset.origin[candidate.code] = dist
    return ruleset


def run(
    trace: Trace,
    config: Config | None = None,
    *,
    ruleset: RuleSet | None = None,
    device: DeviceModel | None = None,
) -> Analysis:
    """Run the rules `config` selects on `trace`; findings sorted by estimated saving."""
    config = config or Config()
    ruleset = ruleset or discover()
    check_rule_refs(ruleset.rules, config)
    chosen = [r for r in selected(ruleset.rules, config) if r.scope == "trace"]
    options = {r.code: rule_options(r, config) for r in chosen}
    model = (device or device_model(trace)).with_overrides(dict(config.device))
    cache: dict[str, Any] = {}
    problems = list(ruleset.problems)
    findings: list[Finding] = []
    timings: dict[str, float] = {}
    # idiom rules first: what they explain, the generic rules leave (`rules.explained`)
    for rule in sorted(chosen, key=lambda r: not r.explains):
        ctx = Context(trace, rule, options[rule.code], model, cache)
        start = time.perf_counter()
        if ruleset.origin.get(rule.code, "builtin") == "builtin":
            found = list(rule(ctx))
        else:
            try:
                found = list(rule(ctx))
            except Exception as exc:  # a plugin's bug is reported, the rest still runs
                problems.append(Problem(f"rule {rule.code}", f"{type(exc).__name__}: {exc}"))
                found = []
        timings[rule.code] = time.perf_counter() - start
        findings.extend(found)
        if rule.explains:
            cache[EXPLAINED_KEY] = cache.get(EXPLAINED_KEY, frozenset()) | explained_ops(found)
    start = time.perf_counter()
    deferring = [r.code for r in chosen if r.defers]
    findings = drop_explained(findings, cache.get(EXPLAINED_KEY, frozenset()), deferring)
    _fill_names(trace, findings)
    timings["names"] = time.perf_counter() - start
    start = time.perf_counter()
    _fill_sources(trace, findings)
    from traceq.rules.recorded import notices  # op tables: not for `import traceq`

    # what the trace lacks costs trace rules only (a job rule reads the job's frames)
    reads_trace = any(r.scope == "trace" for r in chosen)
    lacks = [str(n) for n in notices(trace) if n.findings] if reads_trace else []
    timings["sources"] = time.perf_counter() - start
    findings.sort(key=lambda f: (-f.est_saving_us, -f.time_us, f.rule, f.step or 0))
    return Analysis(findings, chosen, model, problems, timings, options, lacks, trace)


def _fill_sources(trace: Trace, findings: Sequence[Finding]) -> None:
    """Give each finding the user-code frame that issued its ops (`Finding.source`), from
    the trace's Python stacks (`relations.source`); one pass for all findings."""
    missing = [f for f in findings if f.source is None and f.ops]
    if not missing or trace.python.height == 0:
        return
    from traceq.relations.source import source_of  # numpy: not for `import traceq`

    frames = source_of(trace, {op for f in missing for op in f.ops})
    for f in missing:
        f.source = next((frames[op] for op in f.ops if op in frames), None)


def _fill_names(trace: Trace, findings: Sequence[Finding]) -> None:
    """Give each finding `op_names` / `kernel_names` evidence where its rule left them out
    (one join for all findings, not one lookup each)."""
    missing = [
        f
        for f in findings
        if ("op_names" not in f.evidence and f.ops)
        or ("kernel_names" not in f.evidence and f.kernels)
    ]
    if not missing:
        return
    ids = {e for f in missing for e in (*f.ops, *f.kernels)}
    names = _names_of(trace, ids)
    for f in missing:
        if "op_names" not in f.evidence and f.ops:
            f.evidence["op_names"] = [names.get(e, "?") for e in f.ops]
        if "kernel_names" not in f.evidence and f.kernels:
            f.evidence["kernel_names"] = [names.get(e, "?") for e in f.kernels]


def _names_of(trace: Trace, ids: set[int]) -> Mapping[int, str]:
    wanted = pl.DataFrame({"event": sorted(ids)}, schema={"event": trace.events["event"].dtype})
    rows = trace.events.select("event", "name").join(wanted, on="event", how="semi")
    names = dict(zip(rows["event"].to_list(), rows["name"].to_list(), strict=True))
    if "replayed" in trace.ops.columns:  # a replayed graph's ops are no recorded event
        copies = trace.ops.filter(pl.col("replayed")).select("event", "name")
        copies = copies.join(wanted.cast({"event": copies.schema["event"]}), on="event", how="semi")
        names.update(zip(copies["event"].to_list(), copies["name"].to_list(), strict=True))
    return names


def _iterable(value: object) -> list[Any] | None:
    if isinstance(value, (str, bytes, Mapping)):
        return None
    try:
        return list(value)  # type: ignore[call-overload]
    except TypeError:
        return None


def run_job_rules(
    job: JobFrames, config: Config | None = None, *, ruleset: RuleSet | None = None
) -> tuple[list[Finding], dict[str, float]]:
    """The job-scope rules `config` selects, run on `job`; findings by saving, and timings."""
    config = config or Config()
    ruleset = ruleset or discover()
    check_rule_refs(ruleset.rules, config)
    findings: list[Finding] = []
    timings: dict[str, float] = {}
    for rule in selected(ruleset.rules, config):
        if rule.scope != "job":
            continue
        start = time.perf_counter()
        findings.extend(rule(JobContext(job, rule, rule_options(rule, config))))
        timings[rule.code] = time.perf_counter() - start
    findings.sort(key=lambda f: (-f.est_saving_us, -f.time_us, f.rule, f.step or 0))
    return findings, timings
