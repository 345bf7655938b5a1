"""Rules over a multi-rank job: the context a `scope="job"` rule sees, and the run.

A job rule reads the reduced cross-rank frames (`traceq.job.JobFrames`: per-rank step
breakdown, matched collectives, host ranges), never a rank's full trace, so it runs on
the driver after the map whatever the job's size. Evidence names ranks, steps, process
groups, sequence numbers and per-rank event ids (`evidence["events"]`: rank -> ids).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from traceq.rules.base import Rule
from traceq.rules.config import Config, check_rule_refs, rule_options, selected
from traceq.rules.finding import Finding

if TYPE_CHECKING:
    from traceq.job import JobFrames
    from traceq.rules.engine import RuleSet


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


def run_job_rules(
    job: JobFrames, config: Config | None = None, *, ruleset: RuleSet | None = None
) -> tuple[list[Finding], dict[str, float]]:
    """The job-scope rules `config` selects, run on `job`; findings by saving, and timings."""
    from traceq.rules.engine import discover

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
