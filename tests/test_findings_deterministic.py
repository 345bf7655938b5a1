"""The same trace gives the same findings in every process.

Polars hashes with a seed of its own per process, and Python's `set` order follows
`PYTHONHASHSEED`: an expression such as `mode().first()` or a loop over a set picks among
ties differently from run to run. TQ304 once showed a `_nn_` kernel with layout `nt` one
run in four. Each trace here is analyzed in fresh processes with different seeds and the
JSON reports must be equal (timings left out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import FIXTURES, REPO_ROOT, SHARED_TRACES

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from findings_snapshot import without_timings  # the snapshot's own rule

TRACES = [
    FIXTURES / "gpu" / "hta-alexnet-a100.json.gz",
    FIXTURES / "corpus" / "llama.pt.trace.json.gz",
    FIXTURES / "serving" / "vllm_decode_full" / "graph_execution.json.gz",
    SHARED_TRACES / "hta/tests/data/trace_diff/control/control.json.gz",
]


def report(path: os.PathLike[str], seed: int) -> object:
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    cli = "from traceq.cli.main import main; main()"
    command = [sys.executable, "-c", cli, "analyze", str(path), "--format", "json", "--no-config"]
    done = subprocess.run(command, capture_output=True, env=env, timeout=300)
    assert done.returncode in (0, 1), done.stderr.decode()[-2000:]
    return without_timings(json.loads(done.stdout))


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_two_processes_give_equal_findings(path: os.PathLike[str]) -> None:
    if not os.path.exists(path):
        pytest.skip(f"{path} is absent")
    first, second = report(path, 1), report(path, 2)
    assert first == second
