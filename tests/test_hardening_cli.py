"""Every command that writes a file answers an unwritable path with one line and exit 2, every
command's errors start with `traceq: error:`, and messages name types as JSON does.

Exit 1 means "a finding reached --fail-on" (or "a metric regressed"): an unwritable `-o` must
never end there, nor in a traceback.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

import traceq

FIXTURE = str(Path(__file__).parents[1] / "fixtures" / "linear-eager.pt.trace.json.gz")
ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


def _writers(out: str) -> dict[str, list[str]]:
    """Every command that writes a file, with `out` as the path it writes."""
    return {
        "analyze": ["analyze", FIXTURE, "-o", out],
        "analyze --format json": ["analyze", FIXTURE, "--format", "json", "--output", out],
        "annotate": ["annotate", FIXTURE, "-o", out],
        "baseline save": ["baseline", "save", FIXTURE, "-o", out],
    }


def _bad_paths(tmp: Path) -> dict[str, tuple[Path, str]]:
    """Unwritable paths, each with the reason the message must give."""
    a_file = tmp / "notes.txt"
    a_file.write_text("not a folder\n")
    return {
        "missing directory": (tmp / "missing" / "dir" / "out.json", "does not exist"),
        "a directory": (tmp, "it is a directory"),
        "inside a file": (a_file / "out.json", "is not a directory"),
        # The pre-check passes (the device is writable); the write itself fails.
        "a full disk": (Path("/dev/full"), "no space left on device"),
    }


def _one_error_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in output
    return lines[0]


@pytest.mark.parametrize("command", list(_writers("x")))
@pytest.mark.parametrize(
    "kind", ["missing directory", "a directory", "inside a file", "a full disk"]
)
def test_unwritable_output_is_one_line_and_exit_2(tmp_path: Path, command: str, kind: str) -> None:
    if kind == "a full disk" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    path, reason = _bad_paths(tmp_path)[kind]
    result = CliRunner().invoke(main, _writers(str(path))[command])
    assert result.exit_code == 2, result.output
    line = _one_error_line(result.stderr)
    assert line.startswith(f"traceq: error: cannot write {path}: "), line
    assert reason in line
    assert result.stdout == ""


@pytest.mark.skipif(ROOT, reason="root writes read-only files; run as a normal user")
@pytest.mark.parametrize("command", list(_writers("x")))
def test_read_only_file_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    path = tmp_path / "locked.json"
    path.write_text("{}")
    path.chmod(0o444)
    result = CliRunner().invoke(main, _writers(str(path))[command])
    assert result.exit_code == 2, result.output
    line = _one_error_line(result.stderr)
    assert line == f"traceq: error: cannot write {path}: permission denied"
    assert path.read_text() == "{}"


def test_read_only_file_as_a_normal_user_sees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the test above cannot run (root writes anything), `os.access` answers as it
    does for a normal user on a read-only file."""
    path = tmp_path / "locked.json"
    path.write_text("{}")
    real = os.access

    def access(where: str | Path, mode: int) -> bool:
        return not (Path(where) == path and mode & os.W_OK) and real(where, mode)

    monkeypatch.setattr(os, "access", access)
    for args in _writers(str(path)).values():
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        line = _one_error_line(result.stderr)
        assert line == f"traceq: error: cannot write {path}: permission denied"
    assert path.read_text() == "{}"


def test_a_missing_directory_is_reported_before_the_trace_is_loaded(tmp_path: Path) -> None:
    """The check runs when options are parsed: a trace that does not exist is not even read."""
    out = tmp_path / "missing" / "out.json"
    result = CliRunner().invoke(main, ["analyze", str(tmp_path / "nope.json"), "-o", str(out)])
    assert result.exit_code == 2
    assert _one_error_line(result.stderr).startswith(f"traceq: error: cannot write {out}")


def test_nothing_is_created_for_an_output_that_fails(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "out.json"
    CliRunner().invoke(main, ["baseline", "save", FIXTURE, "-o", str(out)])
    assert not (tmp_path / "missing").exists()


def test_writable_outputs_still_write(tmp_path: Path) -> None:
    for command, args in _writers(str(tmp_path / "out.json")).items():
        (tmp_path / "out.json").unlink(missing_ok=True)
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (command, result.output)
        assert (tmp_path / "out.json").stat().st_size > 0, command


def test_zoo_verify_keep_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    for keep in (a_file, a_file / "sub"):
        args = ["zoo", "verify", "glu", "--shape", "8,8,8", "--keep", str(keep)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        line = _one_error_line(result.stderr)
        assert line.startswith(f"traceq: error: cannot write {keep}: "), line


def test_zoo_verify_keep_makes_a_missing_folder(tmp_path: Path) -> None:
    keep = tmp_path / "traces" / "verify"
    # An unknown pattern stops the command right after its options are parsed.
    result = CliRunner().invoke(
        main, ["zoo", "verify", "conv", "--shape", "8,8,8", "--keep", str(keep)]
    )
    assert keep.is_dir()
    assert result.exit_code == 2
    assert _one_error_line(result.stderr).startswith("traceq: error: ")


def test_unwritable_output_in_a_real_process(tmp_path: Path) -> None:
    """The installed entry point, not CliRunner: exit status 2 and one line on stderr."""
    out = tmp_path / "missing" / "out.json"
    cli = "from traceq.cli.main import main; main()"
    for args in _writers(str(out)).values():
        done = subprocess.run(
            [sys.executable, "-c", cli, *args], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 2, (args, done.stderr)
        assert done.stdout == ""
        line = _one_error_line(done.stderr)
        assert line == f"traceq: error: cannot write {out}: directory {out.parent} does not exist"


# -- one error convention -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["zoo", "check", "conv", "--shape", "1,2,3"],
        ["zoo", "check", "glu", "--shape", "64,128"],
        ["zoo", "verify", "glu", "--shape", "8,8,8", "--dtype", "int8"],
        ["explain", "TQ999"],
        ["check", FIXTURE, "--baseline", FIXTURE, "--metric", "op:aten::nothing_like_this"],
        ["analyze", FIXTURE, "--option", "TQ201.min_gap_us=fast"],
    ],
)
def test_every_command_prefixes_its_errors_with_traceq_error(args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert _one_error_line(result.stderr).startswith("traceq: error: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["analyze"], "Missing argument 'TRACE'. (see 'traceq analyze --help')"),
        (["check", FIXTURE], "Missing option '--baseline'. (see 'traceq check --help')"),
        (["zoo", "check", "glu"], "Missing option '--shape'. (see 'traceq zoo check --help')"),
        (["nosuch"], "no command 'nosuch'; see 'traceq --help'"),
        (["--bogus", "info", FIXTURE], "No such option '--bogus'. (see 'traceq --help')"),
        (["diff", "--by", "x", FIXTURE, FIXTURE], "Invalid value for '--by': 'x' is not one of"),
    ],
)
def test_usage_errors_are_one_traceq_error_line(args: list[str], message: str) -> None:
    """click's usage block ("Usage: … Try … Error: …") becomes the same one line."""
    result = CliRunner().invoke(main, args, prog_name="traceq")
    assert result.exit_code == 2
    assert _one_error_line(result.stderr).startswith(f"traceq: error: {message}")


def test_bare_traceq_still_prints_its_help() -> None:
    result = CliRunner().invoke(main, [], prog_name="traceq")
    assert "Commands:" in result.output
    assert "traceq: error" not in result.output


# -- JSON's names for types ------------------------------------------------------------------

EVENT = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5}
PYTHON_NAMES = r"\b(?:NoneType|dict|list|str|int|float|bool)\b"


def _load_error(tmp_path: Path, document: object) -> str:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(document))
    with pytest.raises(traceq.TraceError) as raised:
        traceq.load(path)
    return str(raised.value).removeprefix(f"{path}: ")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (None, "not a trace: the JSON document is null, not an object with 'traceEvents'"),
        (True, "not a trace: the JSON document is a boolean, not an object with 'traceEvents'"),
        ({"traceEvents": None}, "not a trace: 'traceEvents' is null, not an array"),
        ({"traceEvents": {"a": 1}}, "not a trace: 'traceEvents' is an object, not an array"),
        ({"traceEvents": [EVENT, None]}, "event 1 is null, not a JSON object"),
        ({"traceEvents": [EVENT, [1]]}, "event 1 is an array, not a JSON object"),
        ({"traceEvents": [EVENT, "x"]}, "event 1 is a string, not a JSON object"),
        (
            {"traceEvents": [{**EVENT, "ts": "10"}]},
            "event 0: 'ts' is a string, not a number or null",
        ),
        (
            {"traceEvents": [{**EVENT, "ts": True}]},
            "event 0: 'ts' is a boolean, not a number or null",
        ),
        (
            {"traceEvents": [{**EVENT, "name": 3}]},
            "event 0: 'name' is a number, not a string or null",
        ),
        (
            {"traceEvents": [{**EVENT, "pid": 1.5}]},
            "event 0: 'pid' is a number, not an integer, a string or null",
        ),
        (
            {"traceEvents": [{**EVENT, "tid": {"a": 1}}]},
            "event 0: 'tid' is an object, not an integer, a string or null",
        ),
    ],
)
def test_load_messages_name_json_types(tmp_path: Path, document: object, message: str) -> None:
    text = _load_error(tmp_path, document)
    assert text == message
    assert not re.search(PYTHON_NAMES, text), text


def test_baseline_messages_name_json_types(tmp_path: Path) -> None:
    from traceq.regression.baseline import BaselineError, load_baseline, save_baseline

    path = tmp_path / "base.json"
    save_baseline(traceq.load(FIXTURE), path, findings=False)
    document = json.loads(path.read_text())
    document["steps"] = None
    path.write_text(json.dumps(document))
    with pytest.raises(BaselineError, match=r"steps must be an object, not null$"):
        load_baseline(path)


def test_option_messages_name_toml_types() -> None:
    result = CliRunner().invoke(main, ["analyze", FIXTURE, "--option", "TQ201.min_gap_us=fast"])
    line = _one_error_line(result.stderr)
    assert "TQ201.min_gap_us must be a number (default" in line
    assert "float" not in line


# -- a Trace's repr ------------------------------------------------------------------------


def _raw(path: str | Path) -> dict:
    with gzip.open(path) as f:
        return json.load(f)


def test_trace_repr_is_one_line_of_counts() -> None:
    trace = traceq.load(FIXTURE)
    raw = _raw(FIXTURE)
    events = len(raw["traceEvents"])
    steps = sum(e.get("name", "").startswith("ProfilerStep#") for e in raw["traceEvents"])
    assert repr(trace) == f"<Trace {FIXTURE}: {events} events, {steps} steps, CPU only>"
    assert str(trace) == repr(trace)
    assert trace.metadata  # the metadata is still there, one attribute away


def test_trace_repr_never_dumps_big_metadata(shared_trace: Callable[[str], Path]) -> None:
    """TraceLens's BERT trace (AMD-AGI/TraceLens, MIT) carries 20 kB of metadata: the
    recording machine's packages and environment."""
    path = shared_trace("tracelens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz")
    trace = traceq.load(path)
    raw = _raw(path)
    assert len(json.dumps(raw["metadata"])) > 20_000
    devices = sorted({e["args"]["device"] for e in raw["traceEvents"] if e.get("cat") == "kernel"})
    text = repr(trace)
    assert "\n" not in text and len(text) < 200 + len(str(path))
    assert f"{len(raw['traceEvents']):,} events" in text
    assert f"device{'s' if len(devices) > 1 else ''} {', '.join(map(str, devices))}" in text
    assert "metadata" not in text and "pip" not in text
    assert trace.metadata["metadata"] == raw["metadata"]


def test_a_ranked_trace_says_its_rank(shared_trace: Callable[[str], Path]) -> None:
    """HTA's test trace of rank 0 of 16 (facebookresearch/HolisticTraceAnalysis, MIT)."""
    path = shared_trace("hta/tests/data/negative_queue_length_values_check/rank0.json.gz")
    raw = _raw(path)
    info = raw["distributedInfo"]
    assert repr(traceq.load(path)).endswith(f", rank {info['rank']} of {info['world_size']}>")


def test_rich_and_ipython_show_the_summary_never_the_metadata() -> None:
    """rich prints the one line; a notebook's HTML view is a table of counts, without the
    metadata (which can carry the recording machine's environment)."""
    from rich.pretty import pretty_repr

    trace = traceq.load(FIXTURE)
    assert pretty_repr(trace) == repr(trace)
    page = trace._repr_html_()
    assert "<table" in page
    for key, value in trace.metadata.items():
        if isinstance(value, (dict, list)) and value:
            assert key not in page


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([None], "ET node 0 is null, not an object"),
        (
            [
                {
                    "id": 1,
                    "name": "x",
                    "inputs": None,
                    "input_types": [],
                    "outputs": [],
                    "output_types": [],
                }
            ],
            "ET node 0: 'inputs' is null, not an array or an object",
        ),
        (
            [
                {
                    "id": "one",
                    "name": "x",
                    "inputs": [],
                    "input_types": [],
                    "outputs": [],
                    "output_types": [],
                }
            ],
            "ET node 0: 'id' is a string, not an integer",
        ),
        ([{"id": 1, "name": "x"}], "ET node 0 has no 'inputs'"),
    ],
)
def test_execution_trace_messages_name_json_types(
    tmp_path: Path, nodes: list[Any], message: str
) -> None:
    from traceq.relations.dataflow.execution_trace import load_execution_trace

    path = tmp_path / "et.json"
    path.write_text(json.dumps({"schema": "1.0.1", "nodes": nodes}))
    with pytest.raises(traceq.TraceError) as raised:
        load_execution_trace(path)
    text = str(raised.value)
    assert message in text, text
    assert not re.search(PYTHON_NAMES, text), text
