"""`traceq info`, `traceq query` and the load progress display, as a user runs them.

Query results are checked three ways: against `Trace.sql`, against a Polars group-by on
the frames, and against totals computed from the file with the stdlib. Sources and
licenses (../shared/traces/INDEX.md): HolisticTraceAnalysis test data
(facebookresearch/HolisticTraceAnalysis, MIT); TraceLens test traces (AMD-AGI/TraceLens,
MIT).
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import select
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner
from traceq.cli.common import progress
from traceq.cli.main import main

SAMPLED = "hta/tests/data/timeline_analysis/sampled_rank-0.json.gz"
ROCM = "hta/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
QWEN = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
BY_NAME = (
    "SELECT name, count(*) AS n, sum(dur_ns) AS total_ns FROM kernels "
    "GROUP BY name ORDER BY total_ns DESC, name LIMIT 8"
)

Finder = Callable[[str], Path]


def invoke(*args: str, columns: int = 200) -> Any:
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(main, list(args))


@pytest.fixture(scope="module")
def sampled(shared_trace: Finder) -> Path:
    return shared_trace(SAMPLED)


@pytest.fixture(scope="module")
def expected_by_name(sampled: Path, read_json: Callable[..., Any]) -> list[dict[str, Any]]:
    """The query's answer from the raw file: GPU activities by name, ties broken by name."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in read_json(sampled, parse_float=Decimal)["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            totals[e["name"]][0] += 1
            totals[e["name"]][1] += int(Decimal(e["dur"]) * 1000)
    rows = sorted(totals.items(), key=lambda kv: (-kv[1][1], kv[0]))[:8]
    return [{"name": name, "n": n, "total_ns": total} for name, (n, total) in rows]


def test_query_json_matches_sql_polars_and_the_raw_file(
    sampled: Path, load_shared: Callable[[str], Any], expected_by_name: list[dict[str, Any]]
) -> None:
    result = invoke("query", str(sampled), BY_NAME, "--format", "json")
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert rows == expected_by_name
    trace = load_shared(SAMPLED)
    assert rows == trace.sql(BY_NAME).to_dicts()
    by_polars = (
        trace.kernels.group_by("name")
        .agg(pl.len().alias("n"), pl.col("dur_ns").sum().alias("total_ns"))
        .sort(["total_ns", "name"], descending=[True, False])
        .head(8)
    )
    assert rows == by_polars.to_dicts()


def test_query_csv_has_a_header_and_the_same_rows(
    sampled: Path, expected_by_name: list[dict[str, Any]]
) -> None:
    result = invoke("query", str(sampled), BY_NAME, "--format", "csv")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [{**r, "n": int(r["n"]), "total_ns": int(r["total_ns"])} for r in rows] == (
        expected_by_name
    )


def test_query_csv_writes_list_columns_as_text(sampled: Path) -> None:
    sql = "SELECT event, grid FROM kernels WHERE grid IS NOT NULL ORDER BY event LIMIT 3"
    result = invoke("query", str(sampled), sql, "--format", "csv")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 3
    assert all(json.loads(r["grid"]) and len(json.loads(r["grid"])) == 3 for r in rows)


def test_query_text_shows_the_values(sampled: Path, expected_by_name: list[dict[str, Any]]) -> None:
    top = expected_by_name[0]
    result = invoke("query", str(sampled), BY_NAME.replace("LIMIT 8", "LIMIT 1"))
    assert result.exit_code == 0, result.stderr
    assert "shape: (1, 3)" in result.stdout
    assert str(top["total_ns"]) in result.stdout and top["name"][:30] in result.stdout


@pytest.mark.parametrize(
    "sql",
    ["SELEC name FROM kernels", "SELECT nope FROM kernels", "SELECT * FROM no_such_table"],
)
def test_bad_sql_is_one_error_line_and_exit_2(sampled: Path, sql: str) -> None:
    result = invoke("query", str(sampled), sql)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceq: error: SQL failed: ")
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("relpath", "device_name"),
    [(QWEN, "NVIDIA H100 80GB HBM3"), (ROCM, "AMD Radeon Graphics")],
)
def test_info_text_names_the_device(relpath: str, device_name: str, shared_trace: Finder) -> None:
    result = invoke("info", str(shared_trace(relpath)))
    assert result.exit_code == 0, result.stderr
    assert device_name in result.stdout
    assert "events" in result.stdout and "kernels" in result.stdout


def test_info_text_on_a_cpu_trace(fixture_traces: list[Path]) -> None:
    result = invoke("info", str(fixture_traces[0]))
    assert result.exit_code == 0, result.stderr
    assert "device" not in result.stdout
    assert "ProfilerStep" not in result.stdout and "steps" in result.stdout


# -- progress -----------------------------------------------------------------------------


def test_progress_prints_nothing_when_stderr_is_not_a_tty(capfd: pytest.CaptureFixture) -> None:
    assert not sys.stderr.isatty()
    with progress("Loading big.json ...", delay=0.0):
        time.sleep(0.2)
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def tty_stderr(monkeypatch: pytest.MonkeyPatch) -> int:
    """Point sys.stderr at a pseudo-terminal; return the fd to read what was shown."""
    reader, writer = pty.openpty()
    monkeypatch.setattr(sys, "stderr", os.fdopen(writer, "w"))
    return reader


def shown(reader: int) -> str:
    sys.stderr.flush()
    out = b""
    while select.select([reader], [], [], 0.1)[0]:
        out += os.read(reader, 65536)
    return out.decode(errors="replace")


def test_progress_shows_on_a_tty_once_loading_takes_longer_than_the_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader = tty_stderr(monkeypatch)
    with progress("Loading big.json ...", delay=0.05):
        time.sleep(0.4)
    assert "Loading big.json" in shown(reader)


def test_progress_stays_silent_on_a_tty_for_quick_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = tty_stderr(monkeypatch)
    with progress("Loading small.json ...", delay=1.0):
        time.sleep(0.01)
    assert "Loading" not in shown(reader)
