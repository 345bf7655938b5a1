"""The Python API a notebook uses: `traceq.analyze` returns an `Analysis` (still a sequence
of findings), which flattens to a DataFrame; `Trace`, `Analysis`, `CriticalPath`, `Diff` and
`Job` show as compact, escaped HTML tables; what a trace lacks is said once."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from traceq.cli.main import main

import traceq
from traceq import Analysis, CriticalPath, Finding

FIXTURES = Path(__file__).parent.parent / "fixtures"
EAGER = FIXTURES / "mlp_gelu-eager.pt.trace.json.gz"
COMPILED = FIXTURES / "mlp_gelu-compiled.pt.trace.json.gz"
JOB = FIXTURES / "jobs" / "ddp_gloo_balanced"


@pytest.fixture(scope="module")
def trace() -> traceq.Trace:
    return traceq.load(EAGER)


@pytest.fixture(scope="module")
def unshaped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The eager MLP as recorded without `record_shapes`."""
    data = json.loads(gzip.decompress(EAGER.read_bytes()))
    for event in data["traceEvents"]:
        for key in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
            (event.get("args") or {}).pop(key, None)
    path = tmp_path_factory.mktemp("unshaped") / "mlp.pt.trace.json"
    path.write_text(json.dumps(data))
    return path


def test_analyze_returns_an_analysis_that_reads_as_the_list_it_was(trace) -> None:
    found = traceq.analyze(trace)
    assert isinstance(found, Analysis)
    listed = list(found)
    assert all(isinstance(f, Finding) for f in listed) and len(found) == len(listed) == 3
    assert found == listed and found[0] is listed[0] and found[:2] == listed[:2]
    assert traceq.analyze(trace, select="TQ203") == []
    assert found.findings == listed


def test_an_analysis_totals_its_saving_and_says_what_it_is_a_share_of(trace) -> None:
    found = traceq.analyze(trace)
    assert len(found.groups) == 1 and found.groups[0].count == 3
    assert 0 < found.total_saving_us <= sum(f.est_saving_us for f in found)
    steps_us = trace.steps["dur_ns"].sum() / 1000
    assert found.share_of == "3 steps' time" and found.base_us == pytest.approx(steps_us)
    assert found.share == pytest.approx(found.total_saving_us / steps_us)
    summary = found.summary
    assert summary["findings"] == 3 and summary["by_rule"]["TQ102"]["count"] == 3
    assert "3 findings in 1 groups" in repr(found) and "of 3 steps' time" in repr(found)


def test_findings_become_one_flat_dataframe(trace) -> None:
    found = traceq.analyze(trace)
    frame = found.to_polars()
    assert frame.height == 3 and frame["rule"].to_list() == ["TQ102"] * 3
    assert frame.schema["est_saving_us"] == pl.Float64 and frame.schema["evidence"] == pl.String
    assert frame["source_file"].to_list() == ["models.py"] * 3  # the fixture's model code
    assert json.loads(frame["evidence"][0])["op_names"] == ["aten::linear", "aten::gelu"]
    mixed = traceq.analyze(traceq.load(FIXTURES / "mlp_gelu-train_adam.pt.trace.json.gz"))
    assert mixed.to_polars().height == len(mixed)  # evidence of every shape in one frame


def test_critical_path_is_typed_and_says_its_length_in_its_repr(trace) -> None:
    path = trace.critical_path(3)
    assert isinstance(path, CriticalPath)
    text = repr(path)
    assert text.startswith("<CriticalPath step 3: ") and f"{path.length_us:,.1f} µs" in text
    assert f"{len(path.critical_events)} events" in text
    assert "<table>" in path._repr_html_()


def test_notebook_views_are_compact_and_escaped(tmp_path: Path, trace) -> None:
    odd = tmp_path / "<i>odd&.pt.trace.json.gz"
    shutil.copy(EAGER, odd)
    loaded = traceq.load(odd, cache=False)
    page = loaded._repr_html_()
    assert "&lt;i&gt;odd&amp;" in page and "<i>odd" not in page
    assert "deviceProperties" not in page and "baseTimeNanoseconds" not in page  # no metadata
    finding = Finding("TQ999", "x", "warning", "<script>alert(1)</script>", ops=[1])
    analysis = Analysis([finding], [], traceq.analyze(trace).device)
    assert "<script>" not in analysis._repr_html_()
    assert "&lt;script&gt;" in analysis._repr_html_()
    diff = traceq.diff(trace, traceq.load(COMPILED))
    assert "<table>" in diff._repr_html_() and "Torch-Compiled Region" in diff._repr_html_()
    job = traceq.load_job(JOB)
    assert "4 of 4" in job._repr_html_()


def test_analyze_says_once_what_the_trace_lacks_instead_of_unknown_shapes(unshaped) -> None:
    found = traceq.analyze(traceq.load(unshaped, cache=False))
    (notice,) = found.notices
    assert notice.startswith("no input shapes: fusion rules see the shapes of 0 of 6 GEMMs")
    assert "record_shapes=True" in notice
    assert found and all("[?]" not in f.message for f in found)
    assert all("0.0 KiB" not in f.saving_model for f in found)
    assert all("shape not recorded" in f.message for f in found)
    text = CliRunner().invoke(main, ["analyze", str(unshaped)]).output
    assert text.count("record_shapes=True") == 1 and "note: no input shapes" in text
    doc = json.loads(
        CliRunner().invoke(main, ["analyze", str(unshaped), "--format", "json"]).output
    )
    assert doc["summary"]["notices"] == [notice]
    markdown = CliRunner().invoke(main, ["analyze", str(unshaped), "--format", "markdown"]).output
    assert markdown.count("record_shapes=True") == 1


def test_info_shows_what_the_trace_lacks(unshaped) -> None:
    result = CliRunner().invoke(main, ["info", str(unshaped), "--format", "json"])
    kinds = [n["kind"] for n in json.loads(result.output)["notices"]]
    assert kinds == ["shapes", "execution_trace"]
    text = CliRunner().invoke(main, ["info", str(unshaped)], terminal_width=200).output
    assert "not recorded" in text and "record_shapes=True" in text


def test_a_fully_recorded_trace_has_nothing_to_say(trace) -> None:
    assert traceq.analyze(trace).notices == []
