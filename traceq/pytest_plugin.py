"""pytest plugin (entry point `pytest11`): guard a test's trace against a committed baseline.

    def test_step_is_fast(traceq_regression, tmp_path):
        trace = record_my_step(tmp_path)              # writes a torch.profiler trace
        traceq_regression.check(trace, max_regress="5%")

The first run (or any run with `--traceq-update`) writes the baseline next to the test
file, in `__traceq_baselines__/<test name>.json`, and passes; later runs compare the new
trace with it and fail with a readable table naming every group that regressed. pytest
loads this module in every session of every project that installs traceq, so it imports
nothing heavy until a test asks for the fixture.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from traceq.regression.check import CheckResult

BASELINE_DIR = "__traceq_baselines__"
_UNSAFE = re.compile(r"[^\w.-]+")
_WRITTEN = pytest.StashKey[list[Path]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("traceq", "traceq performance regression checks")
    group.addoption(
        "--traceq-update",
        action="store_true",
        default=False,
        help="rewrite the traceq baselines of the tests that run instead of checking them",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_WRITTEN] = []


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    written = config.stash.get(_WRITTEN, [])
    if written:
        terminalreporter.write_sep("-", f"traceq: wrote {len(written)} baseline(s)")
        for path in written:
            terminalreporter.write_line(f"  {path}")


class TraceRegression:
    """The `traceq_regression` fixture: one per test, naming baselines after the test."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._calls = 0

    @property
    def update(self) -> bool:
        return bool(self._request.config.getoption("--traceq-update"))

    def baseline_path(self, name: str | None = None) -> Path:
        """Where the baseline for this test (or for `name`) lives, next to the test file."""
        if name is None:
            name = self._request.node.name
            if self._calls > 1:  # a second unnamed check in one test gets its own file
                name = f"{name}-{self._calls}"
        safe = _UNSAFE.sub("_", name).strip("_") or "baseline"
        return Path(self._request.path).parent / BASELINE_DIR / f"{safe}.json"

    def check(
        self,
        trace_path: str | os.PathLike[str],
        max_regress: str | float = "5%",
        name: str | None = None,
        metrics: list[str] | None = None,
        fail_on_new_findings: bool = False,
    ) -> CheckResult | None:
        """Compare `trace_path` with this test's baseline; write the baseline when there is
        none yet or `--traceq-update` is given. Fails the test on a regression."""
        from traceq.pipeline import load
        from traceq.regression.baseline import load_baseline, save_baseline
        from traceq.regression.check import check
        from traceq.regression.render import render_check

        self._calls += 1
        path = self.baseline_path(name)
        trace = load(trace_path)
        if self.update or not path.exists():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                save_baseline(trace, path, findings=True if fail_on_new_findings else None)
            except OSError as exc:  # one line, as the CLI says it, not a traceback
                pytest.fail(f"traceq: cannot write {path}: {exc.strerror or exc}", pytrace=False)
            self._request.config.stash[_WRITTEN].append(path)
            return None
        result = check(
            trace,
            load_baseline(path),
            max_regress=max_regress,  # parsed once, by check
            metrics=metrics,
            fail_on_new_findings=fail_on_new_findings,
        )
        if result.failed:
            report = render_check(result, "text", width=110)
            hint = f"\nbaseline: {path}  (rerun with --traceq-update to accept the new trace)"
            pytest.fail(report + hint, pytrace=False)
        return result


@pytest.fixture
def traceq_regression(request: pytest.FixtureRequest) -> TraceRegression:
    """Check traces against baselines kept next to the test (`__traceq_baselines__/`)."""
    return TraceRegression(request)
