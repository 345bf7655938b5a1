"""`traceq info|analyze|critical-path` on a job: a directory, a glob, or several files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

REPO = Path(__file__).resolve().parent.parent
SLOW_JOB = REPO / "fixtures" / "jobs" / "ddp_gloo_slow2"


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def test_info_on_a_directory_lists_ranks_groups_and_breakdown():
    code, out, _ = invoke("info", SLOW_JOB, "--format", "json", "--engine", "serial")
    assert code == 0
    data = json.loads(out)
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    assert data["world_size"] == 4 and data["missing_ranks"] == []
    assert data["process_groups"][0]["ranks"] == [0, 1, 2, 3]
    assert data["collectives"] == 8 and data["collective_calls"] == 32
    assert {r["rank"] for r in data["breakdown_per_step"]} == {0, 1, 2, 3}
    code, out, _ = invoke("info", SLOW_JOB)
    assert code == 0 and "4 ranks of 4" in out and "ranks 0..3" in out


def test_analyze_a_directory_names_the_straggler_and_fails_on_warning():
    code, out, _ = invoke("analyze", SLOW_JOB, "--select", "TQ401", "--fail-on", "warning")
    assert code == 1
    assert "TQ401 straggler" in out and "rank 2 is the last to arrive in 4 of 4 steps" in out
    code, out, _ = invoke(
        "analyze", SLOW_JOB, "--select", "TQ401", "--format", "json", "--engine", "serial"
    )
    data = json.loads(out)
    assert code == 0 and [f["evidence"]["rank"] for f in data["findings"]] == [2]
    assert data["summary"]["rules_run"] == ["TQ401"]


def test_several_files_and_a_glob_are_jobs_too():
    files = sorted(SLOW_JOB.glob("rank-*.json.gz"))
    code, out, _ = invoke("info", *files[:2], "--format", "json", "--engine", "serial")
    assert code == 0 and [r["rank"] for r in json.loads(out)["ranks"]] == [0, 1]
    code, out, _ = invoke("info", SLOW_JOB / "rank-[23]*", "--format", "json")
    assert code == 0 and [r["rank"] for r in json.loads(out)["ranks"]] == [2, 3]


def test_critical_path_per_rank():
    code, out, _ = invoke("critical-path", SLOW_JOB, "--step", "3", "--format", "json")
    assert code == 0
    ranks = json.loads(out)["ranks"]
    assert sorted(ranks) == ["0", "1", "2", "3"]
    assert all(r["length_us"] > 0 for r in ranks.values())


def test_a_corrupt_rank_is_a_note_not_a_traceback(tmp_path):
    for rank in (0, 1):
        shutil.copy(SLOW_JOB / f"rank-{rank}.pt.trace.json.gz", tmp_path)
    (tmp_path / "rank-2.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    code, out, err = invoke("analyze", tmp_path, "--select", "TQ4")
    assert code == 0 and "Traceback" not in out + err
    assert "rank 2: " in out and "truncated gzip stream" in out


def test_an_empty_directory_is_one_error_line(tmp_path):
    code, _, err = invoke("info", tmp_path)
    assert code == 2 and err.startswith("traceq: error: ") and len(err.splitlines()) == 1


def test_check_fixes_on_a_job_is_one_error_line():
    code, _, err = invoke("analyze", SLOW_JOB, "--check-fixes")
    assert code == 2 and err == "traceq: error: --check-fixes takes one trace, not a job\n"


def test_an_unwritable_output_is_one_error_line(tmp_path):
    target = tmp_path / "missing" / "out.txt"
    code, _, err = invoke("analyze", SLOW_JOB, "--select", "TQ401", "-o", target)
    assert code == 2 and err.startswith(f"traceq: error: cannot write {target}: ")
    assert len(err.splitlines()) == 1


def test_a_job_renders_as_the_html_report(tmp_path):
    """`traceq.report` takes any object with `traces`: a `Job` gives its ranks in order."""
    pytest.importorskip("plotly", reason="the report extra is not installed")
    import traceq

    job = traceq.load_job(SLOW_JOB)
    assert [t.rank for t in job.traces] == [0, 1, 2, 3]
    text = traceq.report(job, tmp_path / "job.html").read_text()
    assert all(f"rank {r}" in text for r in range(4))


STACKS = "4 of 4 ranks: no Python stacks: findings cannot name the source line"
MODULES = "4 of 4 ranks: no module hierarchy: findings cannot name their layer"


def test_analyze_a_job_says_once_what_its_ranks_lack():
    """The recorded DDP job has shapes but neither stacks nor modules, on every rank: one
    line each for the job, in every format, not one per rank."""
    args = ("analyze", SLOW_JOB, "--no-config", "--engine", "serial")
    code, out, _ = invoke(*args)
    assert code == 0
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert [n.split(":")[1].strip() for n in notes] == ["4 of 4 ranks"] * 2
    assert STACKS in notes[0] and MODULES in notes[1]
    assert out.count("no Python stacks") == 1
    code, out, _ = invoke(*args, "--format", "json")
    notices = json.loads(out)["summary"]["notices"]
    assert len(notices) == 2 and notices[0].startswith(STACKS) and notices[1].startswith(MODULES)
    code, out, _ = invoke(*args, "--format", "markdown")
    assert out.count("> **Note:** 4 of 4 ranks: ") == 2


def test_a_rank_recorded_without_shapes_is_counted_and_named(tmp_path):
    """Rank 2's trace rewritten without its input shapes: the job's analysis says which
    rank lacks them, beside what all four lack."""
    import gzip

    import traceq

    job = tmp_path / "job"
    shutil.copytree(REPO / "fixtures" / "jobs" / "ddp_gloo_balanced", job)
    path = job / "rank-2.pt.trace.json.gz"
    document = json.loads(gzip.decompress(path.read_bytes()))
    for event in document["traceEvents"]:
        event.get("args", {}).pop("Input Dims", None)
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    result = traceq.analyze_job(traceq.load_job(job, engine="serial", cache=False))
    shapes, stacks, modules = result.notices
    assert shapes.startswith("1 of 4 ranks (rank 2): no input shapes: fusion rules see")
    assert "record with `record_shapes=True`" in shapes
    assert stacks.startswith(STACKS) and modules.startswith(MODULES)
    code, out, _ = invoke("analyze", job, "--no-config", "--engine", "serial", "--no-cache")
    assert code == 0 and "note: 1 of 4 ranks (rank 2): no input shapes" in out
