"""traceq: read PyTorch profiler traces, find what to fuse and what it saves, prove the fix."""

import os as _os
import sys as _sys
import typing as _typing

if "polars" not in _sys.modules:
    # Polars' allocator (jemalloc) keeps freed pages 0.5 s, then 1 s more as MADV_FREE pages
    # that still count in the RSS (Polars' defaults). A load frees big columns soon after
    # making them, so those pages stack into the peak: 1.1 GB instead of 0.96 GB on a
    # 2.16M-event trace, for 7% more CPU here. And it keeps 4 arenas per CPU, each with its
    # own freed pages, which a thread of another arena cannot reuse: one per CPU (one per
    # Polars thread) took the tail off the cold peak here (2 CPUs: 907-947 MiB over 22 runs
    # against 908-958 with 8 arenas in the same batches, up to 986 that day; no slower).
    # Polars appends `_RJEM_MALLOC_CONF` to its own settings for this (pola-rs/polars#21829);
    # Arrow returns pages early for the same reason (apache/arrow#5701). Only read when
    # Polars loads; a value the user set is kept.
    _affinity = getattr(_os, "sched_getaffinity", None)  # the CPUs this process may use
    _cpus = len(_affinity(0)) if _affinity else _os.cpu_count()
    _os.environ.setdefault(
        "_RJEM_MALLOC_CONF", f"narenas:{_cpus or 1},dirty_decay_ms:100,muzzy_decay_ms:0"
    )

# After the submodule imports: `traceq.analyze` names the function, not the module.
from traceq.analyze import analyze
from traceq.errors import (
    TraceError,
    TraceFileError,
    TraceFormatError,
    TraceSchemaError,
    TraceTooLargeError,
)
from traceq.pipeline import load
from traceq.rules.analysis import Analysis
from traceq.rules.finding import Finding
from traceq.trace import Trace
from traceq.version import __version__

if _typing.TYPE_CHECKING:  # imported when used (`__getattr__`); named here for type checkers
    from traceq.job import load_job
    from traceq.job_analysis import analyze_job
    from traceq.recording import profile
    from traceq.relations.critical_path import CriticalPath

__all__ = [
    "Analysis",
    "CriticalPath",
    "Finding",
    "Trace",
    "TraceError",
    "TraceFileError",
    "TraceFormatError",
    "TraceSchemaError",
    "TraceTooLargeError",
    "__version__",
    "analyze",
    "analyze_job",
    "check",
    "diff",
    "load",
    "load_job",
    "profile",
    "report",
]


def __getattr__(name: str) -> object:
    """`traceq.diff`, `traceq.check`, `traceq.report`, `traceq.load_job`, `traceq.profile`,
    `traceq.CriticalPath`: their stacks (the regression stack, plotly, jobs, torch, scipy)
    are imported when used."""
    if name in ("diff", "check", "save_baseline", "load_baseline"):
        import traceq.regression as regression

        return getattr(regression, name)
    if name == "report":  # plotly is imported only when a report is rendered
        from traceq.reports.html import report

        return report
    if name in ("load_job", "Job"):
        import traceq.job as job

        return getattr(job, name)
    if name == "analyze_job":
        from traceq.job_analysis import analyze_job

        return analyze_job
    if name == "CriticalPath":  # scipy is imported only when a path is asked for
        from traceq.relations.critical_path import CriticalPath

        return CriticalPath
    if name in ("profile", "profiler_options"):  # torch is imported only when recording
        import traceq.recording as recording

        return getattr(recording, name)
    if name == "roofline":  # the performance model: FLOPs, bytes, roofs per op
        from traceq.perf.roofline import roofline

        return roofline
    raise AttributeError(f"module 'traceq' has no attribute {name!r}")
