"""traceq: read PyTorch profiler traces, find what to fuse and what it saves, prove the fix."""

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
from traceq.trace import Trace

__version__ = "0.1.0"
__all__ = [
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
    "report",
]


def __getattr__(name: str) -> object:
    """`traceq.diff`, `traceq.check`, `traceq.report`, `traceq.load_job`: their stacks (the
    regression stack, plotly, jobs) are imported when used."""
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
    raise AttributeError(f"module 'traceq' has no attribute {name!r}")
