"""An Execution Trace beside a trace makes its data flow exact: `traceq.load` finds
`<stem>.et.json.gz` beside `<stem>.pt.trace.json.gz` (as `traceq.profile` writes them and
the corpus holds them), reads it when data flow is first asked for, and says which data
flow the rules saw; `execution_trace=False` (`--no-et`) infers it, and an ET that cannot be
read leaves the inferred edges and one notice, never a traceback."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CORPUS, corpus_et, corpus_paths, corpus_trace
from traceq.cli.main import main as cli

import traceq
from traceq.relations.dataflow import dataflow
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.recorded import notices

FUSION = ("TQ101", "TQ102", "TQ103", "TQ104", "TQ105")
ENTRIES = sorted(
    p.name.removesuffix(".pt.trace.json.gz") for p in CORPUS.glob("*.pt.trace.json.gz")
)
ENTRY = "gpt2"  # small, with fusion findings


def _keys(trace: traceq.Trace) -> set[tuple[str, frozenset[int]]]:
    return {(f.rule, frozenset(f.ops)) for f in run(trace, Config(select=list(FUSION))).findings}


def _copy_without_et(tmp_path: Path, name: str = ENTRY) -> Path:
    copy = tmp_path / "copy.pt.trace.json.gz"
    shutil.copyfile(corpus_paths(name)[0], copy)
    return copy


def _analyze_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["analyze", *args, "--format", "json", "--no-config"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.output)


@pytest.mark.skipif(not ENTRIES, reason="the Execution Trace corpus is not recorded")
@pytest.mark.parametrize("name", ENTRIES)
def test_load_makes_data_flow_exact_from_the_et_beside_the_trace(name: str) -> None:
    kineto, et = corpus_paths(name)
    trace = traceq.load(kineto)
    assert trace.execution_trace_file == et
    assert trace.dataflow.equals(trace.with_execution_trace(et))
    assert trace.dataflow_source is not None and trace.dataflow_source.exact


def test_execution_trace_false_gives_the_inferred_edges() -> None:
    trace = traceq.load(corpus_paths(ENTRY)[0], execution_trace=False)
    assert trace.execution_trace_file is None
    assert trace.dataflow.equals(dataflow(trace, trace.dataflow_ops))
    assert not trace.dataflow.equals(traceq.load(corpus_paths(ENTRY)[0]).dataflow)
    assert trace.dataflow_source is not None and not trace.dataflow_source.exact


def test_the_et_is_read_only_when_data_flow_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from traceq.relations.dataflow import execution_trace as E

    reads: list[Path] = []
    real = E.load_execution_trace
    monkeypatch.setattr(E, "load_execution_trace", lambda p: reads.append(p) or real(p))
    trace = traceq.load(corpus_paths(ENTRY)[0])
    assert trace.ops.height and trace.dataflow_ops.height and reads == []
    assert trace.dataflow_source is None
    assert trace.dataflow.height
    assert reads == [corpus_paths(ENTRY)[1]]


def test_analyze_with_the_et_beside_gives_the_exact_data_flow_findings() -> None:
    """As `tests/test_rules_corpus.py` computes the ET's findings: data flow set from it."""
    exact = traceq.load(corpus_paths(ENTRY)[0], execution_trace=False)
    exact.__dict__["dataflow"] = dataflow(
        exact, exact.dataflow_ops, execution_trace=corpus_et(ENTRY)
    )
    truth = _keys(exact)
    assert truth
    assert _keys(traceq.load(corpus_paths(ENTRY)[0])) == truth
    report = _analyze_json(str(corpus_paths(ENTRY)[0]), "--select", ",".join(FUSION))
    assert {(f["rule"], frozenset(f["ops"])) for f in report["findings"]} == truth
    used = report["summary"]["dataflow"]
    assert used["kind"] == "exact" and used["execution_trace"] == f"{ENTRY}.et.json.gz"
    assert 0 < used["paired_ops"] <= used["ops"]
    assert any(
        n.startswith(f"data flow: exact from {ENTRY}.et.json.gz (")
        for n in report["summary"]["notices"]
    )


def test_no_et_and_et_choose_the_data_flow_on_the_command_line(tmp_path: Path) -> None:
    kineto, et = corpus_paths(ENTRY)
    inferred = _analyze_json(str(kineto), "--select", "TQ1", "--no-et")["summary"]["dataflow"]
    assert inferred["kind"] == "inferred" and inferred["execution_trace"] is None
    copy = _copy_without_et(tmp_path)
    alone = _analyze_json(str(copy), "--select", "TQ1")["summary"]["dataflow"]
    assert alone["kind"] == "inferred"
    given = _analyze_json(str(copy), "--select", "TQ1", "--et", str(et))["summary"]["dataflow"]
    assert given["kind"] == "exact" and given["execution_trace"] == et.name


def test_a_truncated_et_leaves_the_inferred_edges_and_says_so(tmp_path: Path) -> None:
    copy = _copy_without_et(tmp_path)
    whole = gzip.decompress(corpus_paths(ENTRY)[1].read_bytes())
    (tmp_path / "copy.et.json.gz").write_bytes(gzip.compress(whole[: len(whole) // 2]))
    trace = traceq.load(copy)
    assert trace.dataflow.equals(corpus_trace(ENTRY).dataflow)
    said = [n.message for n in notices(trace) if n.kind == "execution_trace"]
    assert len(said) == 1 and said[0].startswith("data flow: inferred: copy.et.json.gz unusable (")
    assert "\n" not in said[0]
    result = CliRunner().invoke(cli, ["analyze", str(copy), "--no-config"])
    assert result.exit_code in (0, 1) and "Traceback" not in result.output
    assert "copy.et.json.gz unusable" in result.output


def test_an_et_of_another_run_pairs_nothing_and_leaves_the_inferred_edges(tmp_path: Path) -> None:
    copy = _copy_without_et(tmp_path)
    shutil.copyfile(corpus_paths("resnet")[1], tmp_path / "copy.et.json.gz")  # no op in common
    trace = traceq.load(copy)
    assert trace.dataflow.equals(corpus_trace(ENTRY).dataflow)
    assert str(trace.dataflow_source) == "inferred: copy.et.json.gz pairs none of the trace's ops"


def test_a_missing_et_named_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(traceq.TraceError, match="no Execution Trace at"):
        traceq.load(corpus_paths(ENTRY)[0], execution_trace=tmp_path / "none.et.json.gz")


SCRIPT = textwrap.dedent(
    """
    import torch, traceq

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)

        def forward(self, x):
            return self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, x = Mlp().eval(), torch.randn(32, 64)
    with torch.no_grad(), traceq.profile("out", wait=1, warmup=1, active=2, quiet=True) as prof:
        for _ in range(4):
            model(x)
            prof.step()
    """
)


def test_analyze_uses_the_et_traceq_profile_wrote(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "script.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    trace = tmp_path / "out" / "rank-0.pt.trace.json.gz"
    assert (tmp_path / "out" / "rank-0.et.json.gz").is_file()
    result = CliRunner().invoke(cli, ["analyze", str(trace), "--no-config"])
    assert result.exit_code in (0, 1), result.output
    assert "data flow: exact from rank-0.et.json.gz (" in result.output
    assert "ops paired)" in result.output


def test_another_runs_execution_trace_leaves_the_inferred_edges(tmp_path: Path) -> None:
    """`inplace`'s ET beside `gpt2`'s trace pairs 9 of 107 ops by name: not its own."""
    corpus = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"
    trace_path = tmp_path / "gpt2.pt.trace.json.gz"
    shutil.copy(corpus / "gpt2.pt.trace.json.gz", trace_path)
    shutil.copy(corpus / "inplace.et.json.gz", tmp_path / "gpt2.et.json.gz")
    trace = traceq.load(trace_path, cache=False)
    inferred = traceq.load(trace_path, cache=False, execution_trace=False)
    assert trace.dataflow.equals(inferred.dataflow)
    assert "pairs only" in trace.dataflow_source.problem
