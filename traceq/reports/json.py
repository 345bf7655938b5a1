"""JSON: every occurrence (`findings`), the groups, and `summary`; for tools and diffs."""

from __future__ import annotations

import json
import math
from typing import Any

from traceq.reports.model import Report


def render(report: Report, *, indent: int | None = 2) -> str:
    return json.dumps(clean(report.to_dict()), indent=indent, allow_nan=False)


def clean(value: Any) -> Any:
    """Plain JSON values: tuples become lists, numpy scalars Python numbers, NaN/inf null
    (strict JSON has no NaN), anything else unknown its string."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [clean(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item"):
        return clean(value.item())
    return str(value)
