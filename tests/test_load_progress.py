"""Load progress: a bar on a terminal (phase, bytes of the file, events), nothing elsewhere."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console
from traceq.cli import common
from traceq.cli.main import main

import traceq
from traceq.loader.load import Progress


def test_load_reports_bytes_events_and_phases(fixture_traces: list[Path]) -> None:
    path = fixture_traces[0]
    seen: list[Progress] = []
    trace = traceq.load(path, cache=False, progress=lambda p: seen.append(Progress(**vars(p))))
    phases = [p.phase for p in seen]
    assert phases[0] == "parsing" and phases[-1] == "linking"
    parsed = [p for p in seen if p.phase == "parsing"]
    assert parsed[-1].read == parsed[-1].total == path.stat().st_size
    assert parsed[-1].events == trace.events.height
    assert [p.events for p in parsed] == sorted(p.events for p in parsed)


def test_a_terminal_gets_a_bar(fixture_traces: list[Path]) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    path = fixture_traces[0]
    with common.LoadBar(str(path), console, delay=0) as bar:
        time.sleep(0.2)  # the bar starts on a timer
        bar.update(Progress("parsing", read=10, total=100, events=42))
        time.sleep(0.3)
    text = out.getvalue()
    assert "Parsing" in text and str(path) in text and "42 events" in text


def test_no_bar_when_stderr_is_not_a_terminal(
    fixture_traces: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(common.LoadBar, "__init__", _refuse)
    result = CliRunner().invoke(main, ["info", str(fixture_traces[0])])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


def test_no_bar_in_ci_even_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    monkeypatch.setenv("CI", "true")
    assert common._terminal() is None


def _refuse(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("a progress bar was made for a non-terminal")
