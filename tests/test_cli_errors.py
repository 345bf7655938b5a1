"""Every command that reads a trace answers bad input with one line and exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

FIXTURE = str(Path(__file__).parents[1] / "fixtures" / "linear-eager.pt.trace.json.gz")


def _commands(bad: str, out: Path) -> list[list[str]]:
    return [
        ["info", bad],
        ["query", bad, "SELECT 1"],
        ["analyze", bad],
        ["critical-path", bad],
        ["annotate", bad, "-o", str(out / "a.json")],
        ["diff", bad, FIXTURE],
        ["diff", FIXTURE, bad],
        ["baseline", "save", bad, "-o", str(out / "b.json")],
        ["check", bad, "--baseline", FIXTURE],
        ["check", FIXTURE, "--baseline", bad],
    ]


@pytest.mark.parametrize("kind", ["directory", "missing", "not-json"])
def test_bad_trace_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    bad = {
        "directory": tmp_path,
        "missing": tmp_path / "nope.json",
        "not-json": tmp_path / "notes.json",
    }[kind]
    if kind == "not-json":
        bad.write_text("this is not JSON\n")
    for args in _commands(str(bad), tmp_path):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("traceq: error:"), (args, lines)
        assert "Traceback" not in result.output
