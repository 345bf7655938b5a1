"""Errors of the regression stage: bad baselines and bad requests, exit status 2 in the CLI."""

from __future__ import annotations

from traceq.errors import TraceError


class RegressionError(TraceError):
    """A diff or check cannot run as asked (an unknown metric, findings without analyzer)."""


class BaselineError(RegressionError):
    """A baseline file is not one traceq wrote, is damaged, or has an unknown version."""
