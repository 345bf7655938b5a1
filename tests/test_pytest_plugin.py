"""The pytest plugin: `traceq_regression.check(trace)` writes a baseline next to the test on
first run (or with --traceq-update), passes on the same trace, and fails with a readable
report on a slower one. Traces: the GeGLU MLP fixtures, eager and compiled (CPU-only)."""

from __future__ import annotations

import contextlib
import importlib
import json
from pathlib import Path

import pytest

# pytester runs the inner session in this process and afterwards drops the modules it
# imported; numpy's C extensions cannot be imported twice, so import what the plugin
# uses (scipy.stats, the regression package, the analyzer if present) up front.
for _module in ("scipy.stats", "traceq.regression.check", "traceq.regression.render"):
    importlib.import_module(_module)
with contextlib.suppress(ImportError):  # the analyzer is optional for baselines
    importlib.import_module("traceq.analyze")

pytest_plugins = ["pytester"]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
EAGER = FIXTURES / "geglu_mlp-eager.pt.trace.json.gz"
COMPILED = FIXTURES / "geglu_mlp-compiled.pt.trace.json.gz"

# The test under test reads which trace to check from a file, so one test file can be run
# against the eager trace (the baseline) and then the compiled one (4-10x slower per step).
TEST_FILE = """
from pathlib import Path

def test_mlp_step(traceq_regression):
    trace = Path(__file__).with_name("trace.txt").read_text().strip()
    traceq_regression.check(trace, max_regress="5%", metrics=["step", "cpu"])
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_mlp=TEST_FILE)
    return pytester


def use(pytester: pytest.Pytester, trace: Path) -> None:
    (pytester.path / "trace.txt").write_text(str(trace))


def baseline(pytester: pytest.Pytester) -> Path:
    return pytester.path / "__traceq_baselines__" / "test_mlp_step.json"


def test_first_run_writes_the_baseline_and_passes(project: pytest.Pytester) -> None:
    use(project, EAGER)
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*traceq: wrote 1 baseline(s)*", "*test_mlp_step.json"])
    data = json.loads(baseline(project).read_text())
    assert data["traceq_baseline"] == 3 and data["basis"] == "cpu"
    assert len(data["steps"]["ids"]) == 3


def test_the_same_trace_passes_against_its_baseline(project: pytest.Pytester) -> None:
    use(project, EAGER)
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    written = baseline(project).read_text()
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "wrote" not in result.stdout.str()
    assert baseline(project).read_text() == written


def test_a_slower_trace_fails_with_a_readable_report(project: pytest.Pytester) -> None:
    use(project, EAGER)
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    use(project, COMPILED)
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*traceq check — FAIL: 2 regressed beyond 5.0% (step time, CPU op time)*",
            "*step time*regressed*",
            "*--traceq-update*",
        ]
    )


def test_a_limit_over_100_percent_is_read_once(pytester: pytest.Pytester) -> None:
    """ "2000%" allows the compiled trace's 4-10x step time; read twice it became 20%."""
    pytester.makepyfile(test_mlp=TEST_FILE.replace('"5%"', '"2000%"'))
    use(pytester, EAGER)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    use(pytester, COMPILED)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_update_rewrites_the_baseline(project: pytest.Pytester) -> None:
    use(project, EAGER)
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    before = json.loads(baseline(project).read_text())
    use(project, COMPILED)
    result = project.runpytest("-p", "no:cacheprovider", "--traceq-update")
    result.assert_outcomes(passed=1)
    after = json.loads(baseline(project).read_text())
    assert after["steps"]["wall_ns"] != before["steps"]["wall_ns"]
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_named_and_repeated_checks_get_their_own_baselines(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_two=f"""
def test_both(traceq_regression):
    traceq_regression.check({str(EAGER)!r})
    traceq_regression.check({str(COMPILED)!r})
    traceq_regression.check({str(EAGER)!r}, name="eager step")
"""
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    names = sorted(p.name for p in (pytester.path / "__traceq_baselines__").iterdir())
    assert names == ["eager_step.json", "test_both-2.json", "test_both.json"]
