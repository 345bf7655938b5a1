"""Errors a user can act on: every bad input becomes one of these, with a one-line message."""

from __future__ import annotations


class TraceError(Exception):
    """Base of every error traceq raises for bad input; the CLI prints it in one line, exit 2."""

    def __init__(self, message: str, *, source: str | None = None) -> None:
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)


class TraceFileError(TraceError):
    """The file cannot be read: missing, empty, truncated or corrupt compression."""


class TraceFormatError(TraceError):
    """The bytes are not a JSON trace: invalid or truncated JSON, or JSON that is not a trace."""


class TraceSchemaError(TraceError):
    """The JSON is a trace, but an event breaks the Trace Event Format (wrong type, bad value)."""


class TraceTooLargeError(TraceFileError):
    """Decompression would exceed the configured limit (a gzip bomb or a mislabelled file)."""


class ConfigError(TraceError):
    """Configuration names a rule, option or value traceq does not know (a `traceq.toml`,
    `[tool.traceq]`, or the same given as arguments)."""
