"""Regression checks for multi-rank jobs: a baseline per rank plus the job's step time.

A job baseline is one JSON document holding each rank's ordinary baseline
(`baseline.to_json`) and the job's step time per step (the slowest rank's step: the job
waits for it). `diff_jobs` compares two jobs rank by rank and names the rank that got
worst; `check_job` runs the single-trace gate on every rank and the same statistics on the
job's step time. Per-rank summaries come from the job's map, so the driver never loads a
rank's trace.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from traceq.job.engine import Task
from traceq.job.job import Job
from traceq.regression.baseline import dumps, from_json, read_head, to_json
from traceq.regression.check import CheckResult, check, verdict
from traceq.regression.errors import BaselineError
from traceq.regression.stats import compare
from traceq.regression.summary import Summary
from traceq.version import __version__

JOB_KEY = "traceq_job_baseline"
JOB_VERSION = 1


@dataclass
class JobSummaries:
    """Per-rank `Summary`s of a job (or of a job baseline) and what could not be read."""

    source: str
    ranks: dict[int, Summary]
    world_size: int
    notes: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        common = None
        for s in self.ranks.values():
            common = set(s.steps) if common is None else common & set(s.steps)
        return sorted(common or [])

    def job_step_ns(self) -> list[int]:
        """Per common step, the slowest rank's step wall time."""
        out = []
        for step in self.steps:
            out.append(max(s.step_wall_ns[s.steps.index(step)] for s in self.ranks.values()))
        return out


def _summary_task(task: Task, findings: bool | None) -> Summary:
    from traceq.pipeline import load
    from traceq.regression.summary import summarize

    return summarize(load(task.path, cache=task.cache), findings=findings)


def job_summaries(job: Job, findings: bool | None = None) -> JobSummaries:
    """Each rank's regression `Summary`, computed by the job's map."""
    outcomes = job.map(_summary_task, findings)
    ranks = {o.rank: o.value for o in outcomes if o.error is None}
    return JobSummaries(job.source, ranks, job.world_size, job.notes())


def to_job_json(summaries: JobSummaries) -> dict[str, Any]:
    return {
        JOB_KEY: JOB_VERSION,
        "traceq_version": __version__,
        "world_size": summaries.world_size,
        "job_steps": {"ids": summaries.steps, "step_ns": summaries.job_step_ns()},
        "ranks": {str(r): to_json(s) for r, s in sorted(summaries.ranks.items())},
        "notes": summaries.notes,
    }


def save_job_baseline(
    job: Job, path: str | os.PathLike[str], findings: bool | None = None
) -> JobSummaries:
    """Write the job's baseline (every rank's, and the job step time) to `path`."""
    summaries = job_summaries(job, findings)
    text = dumps(to_job_json(summaries))
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BaselineError(f"cannot write: {exc.strerror or exc}", source=str(path)) from None
    return summaries


def is_job_baseline(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a job baseline (its first bytes name the job key). `diff` and
    `check` ask this of every file they are given, traces included: only the head is read
    (the whole file was inflated: 1.5 s and 1.2 GB for a 588 MB trace)."""
    head = read_head(path)
    return head is not None and JOB_KEY.encode() in head


def load_job_baseline(path: str | os.PathLike[str]) -> JobSummaries:
    name = str(path)
    try:
        raw = Path(path).read_bytes()
        document = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        raise BaselineError(f"cannot read the job baseline: {exc}", source=name) from None
    if not isinstance(document, dict) or document.get(JOB_KEY) != JOB_VERSION:
        raise BaselineError(f"not a traceq job baseline version {JOB_VERSION}", source=name)
    ranks = document.get("ranks")
    if not isinstance(ranks, dict):
        raise BaselineError("ranks must be an object", source=name)
    try:
        summaries = {int(r): from_json(d, source=f"{name}#rank{r}") for r, d in ranks.items()}
    except ValueError:
        raise BaselineError("rank keys must be integers", source=name) from None
    return JobSummaries(name, summaries, int(document.get("world_size") or len(summaries)))


def as_job_summaries(
    source: Job | JobSummaries | str, findings: bool | None = None, cache: bool | None = None
):
    if isinstance(source, JobSummaries):
        return source
    if isinstance(source, Job):
        return job_summaries(source, findings)
    if is_job_baseline(source):
        return load_job_baseline(source)
    from traceq.job import load_job

    return job_summaries(load_job(source, cache=cache), findings)


@dataclass
class JobDiff:
    """Rank by rank: median step wall time before and after; the worst rank; the job."""

    base_source: str
    new_source: str
    rows: list[dict[str, Any]]
    job: dict[str, Any]
    notes: list[str]

    @property
    def worst_rank(self) -> int | None:
        changed = [r for r in self.rows if r["change"] is not None]
        return max(changed, key=lambda r: r["change"])["rank"] if changed else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base_source,
            "new": self.new_source,
            "ranks": self.rows,
            "worst_rank": self.worst_rank,
            "job": self.job,
            "notes": self.notes,
        }


def _median(values: list[int]) -> float | None:
    return float(np.median(values)) if values else None


def _change(base: float | None, new: float | None) -> float | None:
    return (new / base - 1.0) if base and new is not None else None


def diff_jobs(base: Any, new: Any) -> JobDiff:
    """Compare two jobs (or job baselines) rank by rank and by the job's step time."""
    b, n = as_job_summaries(base, False), as_job_summaries(new, False)
    notes = list(b.notes) + [x for x in n.notes if x not in b.notes]
    rows = []
    for rank in sorted(set(b.ranks) | set(n.ranks)):
        before = _median(b.ranks[rank].step_wall_ns) if rank in b.ranks else None
        after = _median(n.ranks[rank].step_wall_ns) if rank in n.ranks else None
        if rank not in b.ranks or rank not in n.ranks:
            notes.append(f"rank {rank} is only in the {'new' if rank in n.ranks else 'base'} job")
        rows.append(
            {
                "rank": rank,
                "base_step_ns": before,
                "new_step_ns": after,
                "change": _change(before, after),
            }
        )
    job_b, job_n = _median(b.job_step_ns()), _median(n.job_step_ns())
    job = {"base_step_ns": job_b, "new_step_ns": job_n, "change": _change(job_b, job_n)}
    return JobDiff(b.source, n.source, rows, job, notes)


@dataclass
class JobCheck:
    """Every rank's `CheckResult` and the verdict on the job's step time."""

    ranks: dict[int, CheckResult]
    job_step: dict[str, Any]
    notes: list[str]

    @property
    def failed(self) -> bool:
        return self.job_step["verdict"] == "regressed" or any(c.failed for c in self.ranks.values())

    @property
    def too_few(self) -> str | None:
        """'too few steps to judge (n=3; need ≥ 4)' when the job's step time or a rank had
        too few steps for the noise to be judged (`check.verdict` says what then fails)."""
        if self.job_step.get("too_few_steps"):
            return str(self.job_step["judgement"])
        return next((c.too_few for c in self.ranks.values() if c.too_few), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "failed": self.failed,
            "job_step": self.job_step,
            "ranks": {str(r): c.to_dict() for r, c in sorted(self.ranks.items())},
            "regressed_ranks": [r for r, c in sorted(self.ranks.items()) if c.failed],
            "notes": self.notes,
        }


def check_job(
    new: Any,
    baseline: Any,
    max_regress: float = 0.05,
    metrics: list[str] | None = None,
    cache: bool | None = None,
) -> JobCheck:
    """The CI gate for a job: each rank against its baseline, and the job's step time
    (`cache` as `traceq.load`'s, for the jobs it loads)."""
    b, n = as_job_summaries(baseline, None, cache), as_job_summaries(new, None, cache)
    notes = list(n.notes)
    results = {}
    for rank in sorted(set(b.ranks) & set(n.ranks)):
        results[rank] = check(n.ranks[rank], b.ranks[rank], max_regress, metrics)
    for rank in sorted(set(b.ranks) ^ set(n.ranks)):
        notes.append(f"rank {rank} is only in the {'new' if rank in n.ranks else 'base'} job")
    base_steps, new_steps = b.job_step_ns(), n.job_step_ns()
    if base_steps and new_steps:
        (change,) = compare(np.array([base_steps]), np.array([new_steps]))
        job_step = {
            "verdict": verdict(change, max_regress),
            "judgement": change.judgement,
            **change.to_dict(),
        }
    else:
        job_step = {"verdict": "no steps"}
    return JobCheck(results, job_step, notes)
