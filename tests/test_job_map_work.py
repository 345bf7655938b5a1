"""The job map's per-rank work (`traceq.job_analysis.rank_work`) with only job rules
selected: the worker never imports the rule catalogue, and returns what the full rule
run returns (the device model, no rules run, no findings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from polars.testing import assert_frame_equal

from traceq.analyze import as_config
from traceq.job.engine import Task
from traceq.job_analysis import rank_work

REPO = Path(__file__).resolve().parent.parent
RANK = REPO / "fixtures" / "jobs" / "ddp_gloo_slow2" / "rank-2.pt.trace.json.gz"
SUMMARY = ("step_ns", "breakdown", "kernel_types", "collectives", "ranges", "unread")


def _config(select: list[str]):  # type: ignore[no-untyped-def]
    return as_config(None).merged(select=tuple(select), ignore=(), options={})


def test_job_rules_only_gives_what_the_rule_run_gives():
    task = Task(str(RANK), 2, "distributedInfo", cache=False)
    config = _config(["TQ401", "TQ402"])
    fast, fast_findings = rank_work(task, config, False)
    full, full_findings = rank_work(task, config)  # the driver said nothing: rules run
    assert fast.extra == full.extra
    assert fast.extra["rules"] == [] and fast.extra["device"]
    assert fast_findings == full_findings == []
    for name in SUMMARY:
        assert_frame_equal(getattr(fast, name), getattr(full, name))


def test_a_worker_with_only_job_rules_never_imports_the_rule_catalogue():
    code = f"""
import json, sys
from traceq.analyze import as_config
from traceq.job.engine import Task
from traceq.job_analysis import rank_work
config = as_config(None).merged(select=("TQ401",), ignore=(), options={{}})
summary, findings = rank_work(Task({str(RANK)!r}, 2, "distributedInfo", cache=False), config, False)
print(json.dumps([m for m in sys.modules if m.startswith("traceq.rules.tq")]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
