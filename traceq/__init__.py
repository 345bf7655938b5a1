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
from traceq.loader.load import load
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
    "check",
    "diff",
    "load",
    "report",
]


def __getattr__(name: str) -> object:
    """`traceq.diff` / `traceq.check` / `traceq.report` without importing the regression stack
    (or plotly) at import."""
    if name in ("diff", "check", "save_baseline", "load_baseline"):
        import traceq.regression as regression

        return getattr(regression, name)
    if name == "report":  # plotly is imported only when a report is rendered
        from traceq.reports.html import report

        return report
    raise AttributeError(f"module 'traceq' has no attribute {name!r}")
