"""`traceq.profile` and the `Trainer` callback record what every rule reads, on the CPU:
shapes, modules, Python stacks, and an Execution Trace that pairs with its trace; and a
finding names the source line that issued its ops (text, JSON, SARIF)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from traceq.cli.main import main

import traceq
from traceq.relations.dataflow.execution_trace import load_execution_trace, match_ops
from traceq.rules.recorded import notices

SCRIPT = textwrap.dedent(
    """\
    import torch
    from torch import nn

    import traceq


    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(64, 256)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(256, 64)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))


    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Mlp().eval()
    x = torch.randn(32, 64)
    with torch.no_grad(), traceq.profile("out", wait=1, warmup=1, active=2) as prof:
        for _ in range(4):
            model(x)
            prof.step()
    """
)
FORWARD_LINE = SCRIPT.splitlines().index("    def forward(self, x):") + 1


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The script run as a user runs it (`python script.py`), in its own folder."""
    folder = tmp_path_factory.mktemp("recorded")
    (folder / "script.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "script.py"], cwd=folder, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return folder, done.stderr


def test_profile_writes_a_gzipped_trace_per_rank_and_says_how_to_analyze_it(
    recorded: tuple[Path, str],
) -> None:
    folder, stderr = recorded
    assert sorted(p.name for p in (folder / "out").iterdir()) == [
        "rank-0.et.json.gz",
        "rank-0.pt.trace.json.gz",
    ]
    assert (
        "traceq: wrote 1 trace to out; analyze with: traceq analyze out/rank-0.pt.trace.json.gz"
        in stderr
    )


def test_profile_records_shapes_stacks_modules_and_steps(recorded: tuple[Path, str]) -> None:
    folder, _ = recorded
    trace = traceq.load(folder / "out" / "rank-0.pt.trace.json.gz", cache=False)
    assert trace.steps["step"].to_list() == [2, 3]  # wait 1, warmup 1, active 2
    assert notices(trace) == []  # shapes, stacks, modules, and the ET beside it
    assert trace.python.height and trace.ops["module"].drop_nulls().len()


def test_the_execution_trace_pairs_with_the_trace_it_was_recorded_with(
    recorded: tuple[Path, str],
) -> None:
    folder, _ = recorded
    trace = traceq.load(folder / "out" / "rank-0.pt.trace.json.gz", cache=False)
    et = load_execution_trace(folder / "out" / "rank-0.et.json.gz")
    paired = match_ops(trace, et)
    assert paired.height >= 0.8 * et.filter(et["rf_id"].is_not_null()).height
    gemms = trace.ops.filter(trace.ops["name"] == "aten::addmm")["event"].cast(int).to_list()
    assert set(gemms) <= set(paired["event"].to_list())  # the same window, op for op
    exact = trace.with_execution_trace(folder / "out" / "rank-0.et.json.gz")
    assert exact.height


def test_a_finding_names_the_source_line_that_issued_its_ops(recorded: tuple[Path, str]) -> None:
    folder, _ = recorded
    trace = traceq.load(folder / "out" / "rank-0.pt.trace.json.gz", cache=False)
    found = traceq.analyze(trace, select="TQ102")
    assert len(found) == 2  # one per active step
    for finding in found:
        # the profiler names a frame by the line its function starts on
        assert finding.source == {"file": "script.py", "line": FORWARD_LINE, "function": "forward"}


def test_text_json_and_sarif_show_the_source_line(
    recorded: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, _ = recorded
    monkeypatch.chdir(folder)
    path = "out/rank-0.pt.trace.json.gz"
    text = CliRunner().invoke(main, ["analyze", path, "--select", "TQ102"]).output
    assert f"at script.py:{FORWARD_LINE} in forward" in text
    doc = json.loads(CliRunner().invoke(main, ["analyze", path, "--format", "json"]).output)
    assert {f["source"]["line"] for f in doc["findings"] if f["rule"] == "TQ102"} == {FORWARD_LINE}
    sarif = json.loads(
        CliRunner()
        .invoke(main, ["analyze", path, "--format", "sarif", "--source-root", str(folder)])
        .output
    )
    run = sarif["runs"][0]
    (result,) = [r for r in run["results"] if r["ruleId"] == "TQ102"]
    physical = result["locations"][0]["physicalLocation"]
    assert physical == {
        "artifactLocation": {"uri": "script.py"},
        "region": {"startLine": FORWARD_LINE},
    }
    (said,) = run["invocations"][0]["toolExecutionNotifications"]  # nothing lacking, only:
    assert said["message"]["text"].startswith("data flow: exact from rank-0.et.json.gz (")


def test_sarif_without_stacks_says_once_how_to_get_lines(tmp_path: Path) -> None:
    import gzip

    source = Path(__file__).parent.parent / "fixtures" / "mlp_gelu-eager.pt.trace.json.gz"
    data = json.loads(gzip.decompress(source.read_bytes()))
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") != "python_function"]
    path = tmp_path / "nostack.json"
    path.write_text(json.dumps(data))
    sarif = json.loads(CliRunner().invoke(main, ["analyze", str(path), "--format", "sarif"]).output)
    run = sarif["runs"][0]
    assert run["results"]
    for result in run["results"]:
        assert "region" not in result["locations"][0]["physicalLocation"]
    texts = [n["message"]["text"] for n in run["invocations"][0]["toolExecutionNotifications"]]
    assert sum("with_stack=True" in t for t in texts) == 1  # once, for the whole run


def test_profile_names_files_by_the_rank_it_runs_as(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setenv("RANK", "3")
    with traceq.profile(tmp_path, wait=0, warmup=1, active=1, quiet=True) as prof:
        for _ in range(2):
            torch.relu(torch.randn(4, 4))
            prof.step()
    assert [p.name for p in prof.recording.traces] == ["rank-3.pt.trace.json.gz"]
    assert [p.name for p in prof.recording.execution_traces] == ["rank-3.et.json.gz"]
    assert not list(tmp_path.glob(".*"))  # no scratch file left behind


def test_importing_traceq_does_not_import_torch() -> None:
    code = "import sys, traceq; traceq.profile; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers is not installed"
)
def test_trainer_callback_records_a_real_transformers_model(tmp_path: Path) -> None:
    """The callback's hooks, driven as `Trainer` drives them, over a tiny GPT-2 built from
    its config (random weights, no download)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from traceq.integrations.transformers import TraceqCallback

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 64, (2, 8))
    callback = TraceqCallback(str(tmp_path), wait=1, warmup=1, active=1, quiet=True)
    callback.on_train_begin(None, None, None)
    for _ in range(3):
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        callback.on_step_end(None, None, None)
    callback.on_train_end(None, None, None)
    (path,) = callback.recording.traces
    trace = traceq.load(path, cache=False)
    assert trace.steps["step"].to_list() == [2]
    assert [n.kind for n in notices(trace)] == []
    assert trace.ops["module"].drop_nulls().str.contains("GPT2").any()


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None
    or importlib.util.find_spec("accelerate") is None,
    reason="Trainer needs transformers and accelerate",
)
def test_trainer_callback_records_a_real_trainer_train(tmp_path: Path) -> None:
    """`Trainer.train()` itself drives the callback (its own loop, optimizer and step
    counting) over a tiny GPT-2 built from its config: the trace and its Execution Trace
    are written, the trace holds the recorded step, and the ET pairs with it."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from traceq.integrations.transformers import TraceqCallback

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
    rows = torch.randint(0, 64, (8, 8))
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"),
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=0.1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    callback = TraceqCallback(str(tmp_path / "traces"), wait=1, warmup=1, active=1, quiet=True)
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=[{"input_ids": row, "labels": row} for row in rows],
        callbacks=[callback],
    )
    trainer.train()
    assert trainer.state.global_step == 3
    (path,) = callback.recording.traces
    (et_path,) = callback.recording.execution_traces
    assert path.name == "rank-0.pt.trace.json.gz" and et_path.name == "rank-0.et.json.gz"
    trace = traceq.load(path, cache=False)
    assert trace.steps["step"].to_list() == [2]  # wait 1, warmup 1, active 1
    assert [n.kind for n in notices(trace)] == []
    et = load_execution_trace(et_path)
    paired = match_ops(trace, et)
    assert paired.height >= 0.8 * et.filter(et["rf_id"].is_not_null()).height
    gemms = trace.ops.filter(trace.ops["name"].is_in(["aten::addmm", "aten::mm"]))
    assert gemms.height and set(gemms["event"].cast(int)) <= set(paired["event"].to_list())
