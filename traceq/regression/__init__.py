"""Regression checks on saved traces: summaries, diffs, baselines and the CI gate.

    trace / baseline JSON → `Summary` (summary.py) → `diff` / `check` → `render`

`groups` computes per-step time samples per kernel, op and module; `dispatch` the op →
kernel table; `stats` decides whether a change is outside the noise; `baseline` reads and
writes the versioned JSON; `render` turns a `Diff` or `CheckResult` into text, JSON or
Markdown.
"""

from traceq.regression.baseline import load_baseline, load_summary, save_baseline
from traceq.regression.check import CheckResult, Metric, check
from traceq.regression.diff import Diff, diff
from traceq.regression.errors import BaselineError, RegressionError
from traceq.regression.render import render_check, render_diff
from traceq.regression.summary import Summary, summarize

__all__ = [
    "BaselineError",
    "CheckResult",
    "Diff",
    "Metric",
    "RegressionError",
    "Summary",
    "check",
    "diff",
    "load_baseline",
    "load_summary",
    "render_check",
    "render_diff",
    "save_baseline",
    "summarize",
]
