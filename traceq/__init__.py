"""traceq: read PyTorch profiler traces, find what to fuse and what it saves, prove the fix."""

from traceq.errors import (
    TraceError,
    TraceFileError,
    TraceFormatError,
    TraceSchemaError,
    TraceTooLargeError,
)
from traceq.load import load
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
    "load",
]
