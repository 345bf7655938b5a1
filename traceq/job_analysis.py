"""`analyze_job(job)`: the rule catalogue over a multi-rank job.

Per rank (the map, on the job's engine): load the trace, reduce it to its `RankSummary`
and run the single-trace rules on it, returning only the summary and the findings. Across
ranks (the reduce, on the driver): the job-scope rules (TQ4xx) over the combined frames.
A rank's findings carry `evidence["rank"]` and say their rank in the message. What the
ranks' traces lack (`rules.recorded`) is said once for the job, with how many ranks lack
it, not once per rank.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from traceq.analyze import ConfigLike, as_config
from traceq.job.job import Job, JobFrames, reduce_summaries
from traceq.job.summary import summarize
from traceq.rules.engine import run_job_rules
from traceq.rules.finding import Finding

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from traceq.job.engine import Task
    from traceq.rules.config import Config
    from traceq.rules.engine import RuleSet


NOTICE_ORDER = ("shapes", "stacks", "modules", "execution_trace")  # `rules.recorded.notices`


@dataclass
class JobAnalysis:
    """Findings across the job (TQ4xx) and per rank, with the frames they rest on."""

    findings: list[Finding]
    frames: JobFrames
    notes: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    devices: dict[int, dict[str, Any]] = field(default_factory=dict)
    rules_run: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    """What the ranks' traces lack and what that costs the findings, once for the job:
    "4 of 4 ranks: no input shapes: ..." (`job_notices`)."""

    @property
    def job_findings(self) -> list[Finding]:
        return [f for f in self.findings if "rank" not in f.evidence or f.rule.startswith("TQ4")]


def rank_work(
    task: Task, config: Config, trace_rules: bool | None = None
) -> tuple[Any, list[dict[str, Any]]]:
    """The map step: one rank's summary and its single-trace findings (as plain dicts).

    `trace_rules`: whether `config` selects any single-trace rule, as the driver found
    (None: find out here). Without one, the worker never imports the rule catalogue (its
    modules cost a worker ~0.15 CPU s, more than a rank's whole map): the rank's device
    model is all it needs of the rules."""
    from traceq.job.rankload import load_for_map

    if trace_rules is None:
        trace_rules = _selects_trace_rules(_ruleset(), config)
    trace = load_for_map(task.path, rules=trace_rules, cache=task.cache)
    summary = summarize(trace, task.rank, task.rank_source)
    if not trace_rules:
        from traceq.perf.device import device_model

        model = device_model(trace).with_overrides(dict(config.device))
        summary.extra["device"] = model.to_dict()
        summary.extra["rules"] = []
        summary.extra["notices"] = []  # what a trace lacks costs trace rules only
        return summary, []
    from traceq.rules.engine import run
    from traceq.rules.recorded import notices

    analysis = run(trace, config, ruleset=_ruleset())
    summary.extra["device"] = analysis.device.to_dict()
    summary.extra["rules"] = [r.code for r in analysis.rules]
    # as `analysis.notices`, with their kinds, so the driver can count ranks per kind
    summary.extra["notices"] = [(n.kind, n.message) for n in notices(trace) if n.findings]
    findings = []
    for finding in analysis.findings:
        finding.evidence["rank"] = task.rank
        finding.message = f"rank {task.rank}: {finding.message}"
        findings.append(finding.to_dict())
    return summary, findings


def _selects_trace_rules(ruleset: RuleSet, config: Config) -> bool:
    from traceq.rules.config import selected

    return any(r.scope == "trace" for r in selected(ruleset.rules, config))


@functools.cache
def _ruleset() -> RuleSet:
    """The rule catalogue, discovered once per worker process, not once per rank (the
    entry-point scan costs ~3 ms: 2% of a rank's map)."""
    from traceq.rules.engine import discover

    return discover()


def analyze_job(
    job: Job,
    select: Sequence[str] | str | None = None,
    ignore: Sequence[str] | str | None = None,
    config: ConfigLike = None,
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> JobAnalysis:
    """Run the selected rules over `job`: single-trace rules per rank (mapped), job rules
    across ranks (reduced). Selection and thresholds as in `traceq.analyze`."""
    from traceq.analyze import _codes
    from traceq.rules.config import check_rule_refs
    from traceq.rules.engine import discover

    merged = as_config(config).merged(
        select=_codes(select),
        ignore=_codes(ignore) or (),
        options={str(k): dict(v) for k, v in (options or {}).items()},
    )
    ruleset = discover()  # the driver's, fresh per call as `run_job_rules` found it
    check_rule_refs(ruleset.rules, merged)  # a bad reference fails here, not in each rank
    outcomes = job.map(rank_work, merged, _selects_trace_rules(ruleset, merged))
    summaries = [o.value[0] for o in outcomes if o.error is None]
    per_rank = [Finding.from_dict(d) for o in outcomes if o.error is None for d in o.value[1]]
    frames = reduce_summaries(summaries, job.align)
    job.__dict__["frames"] = frames
    findings, timings = run_job_rules(frames, merged, ruleset=ruleset)
    everything = findings + per_rank
    everything.sort(key=lambda f: (-f.est_saving_us, -f.time_us, f.rule, f.step or 0))
    devices = {s.rank: s.extra["device"] for s in summaries}
    ran = {code for s in summaries for code in s.extra["rules"]} | set(timings)
    lacks = job_notices({s.rank: s.extra.get("notices", []) for s in summaries})
    return JobAnalysis(everything, frames, job.notes(), timings, devices, sorted(ran), lacks)


def job_notices(per_rank: Mapping[int, Sequence[tuple[str, str]]]) -> list[str]:
    """Each rank's notices (kind, message) as one line per kind for the job: a job's ranks
    are usually recorded alike, and 128 copies of "no input shapes" hide the one rank
    recorded differently. "4 of 4 ranks: no input shapes: ...", "1 of 4 ranks (rank 2):
    ..."; the message is the lowest such rank's, said so when another rank's differs
    (its counts of GEMMs)."""
    total = len(per_rank)
    ranks: dict[str, list[int]] = {}
    messages: dict[str, list[str]] = {}
    for rank in sorted(per_rank):
        for kind, message in per_rank[rank]:
            ranks.setdefault(kind, []).append(rank)
            messages.setdefault(kind, []).append(message)
    lines = []
    # in the order `notices` gives them, what costs findings most first
    order = {kind: i for i, kind in enumerate(NOTICE_ORDER)}
    for kind, lacking in sorted(ranks.items(), key=lambda kv: order.get(kv[0], len(order))):
        which = "" if len(lacking) == total else f" ({_ranks(lacking)})"
        first = messages[kind][0]
        differ = any(m != first for m in messages[kind])
        lines.append(
            f"{len(lacking)} of {total} ranks{which}: {first}"
            + (f" (rank {lacking[0]}'s; other ranks' numbers differ)" if differ else "")
        )
    return lines


def _ranks(ranks: list[int]) -> str:
    """'rank 2', 'ranks 1, 3', 'ranks 0..63' (contiguous), cut after 8 ranks."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}..{ranks[-1]}"
    shown = ", ".join(map(str, ranks[:8]))
    return f"ranks {shown}" + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
