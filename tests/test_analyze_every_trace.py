"""Every rule runs on every trace we have, and says something well-formed or nothing.

The traces (fixtures recorded here, and `../shared/traces`: see each test module for
sources and licenses) cover the shapes a rule must not trip on: no ops at all (HTA's
`trace_file_list/inference_rank_1`: 54 events, 4 kernels), no steps, the 2021 schema,
ROCm, MTIA, CPU-only, compiled and eager. A crash here was a real bug once: a trace with no
ops made the compile-time mask a Null series, and every fusion rule raised.
"""

from __future__ import annotations

import math

from conftest import TraceCase

from traceq.analyze import analyze
from traceq.rules.catalogue import RULES

CODES = {rule.code for rule in RULES}


def test_every_rule_runs_on_every_trace(kineto_case: TraceCase) -> None:
    findings = analyze(kineto_case.trace)
    events = kineto_case.trace.events.height
    for finding in findings:
        assert finding.rule in CODES
        assert finding.message and "\n" not in finding.message
        assert math.isfinite(finding.est_saving_us) and finding.est_saving_us >= 0
        assert finding.est_saving_us <= finding.time_us * (1 + 1e-9) + 1e-6
        assert all(0 <= event < events for event in finding.ops)
