"""Job baselines, `check` and `diff` on jobs: per-rank metrics and the job's step time
(the slowest rank's step), on the recorded jobs with and without a slowed rank."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

import traceq
from traceq.regression.jobs import check_job, diff_jobs, load_job_baseline, save_job_baseline

REPO = Path(__file__).resolve().parent.parent
SLOW = REPO / "fixtures" / "jobs" / "ddp_gloo_slow2"
BALANCED = REPO / "fixtures" / "jobs" / "ddp_gloo_balanced"


def raw_step_ns(folder: Path) -> dict[int, dict[int, int]]:
    """rank -> step -> ProfilerStep wall ns, from the raw JSON."""
    out: dict[int, dict[int, int]] = {}
    for rank in range(4):
        with gzip.open(folder / f"rank-{rank}.pt.trace.json.gz") as f:
            events = json.loads(f.read())["traceEvents"]
        for e in events:
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"):
                step = int(e["name"].split("#")[1])
                out.setdefault(rank, {})[step] = round(float(e["dur"]) * 1000)
    return out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "job.json"
    save_job_baseline(traceq.load_job(BALANCED, engine="serial"), path, findings=False)
    return path


def test_job_baseline_holds_every_rank_and_the_job_step_time(baseline):
    document = json.loads(baseline.read_text())
    assert sorted(document["ranks"]) == ["0", "1", "2", "3"]
    raw = raw_step_ns(BALANCED)
    steps = document["job_steps"]["ids"]
    expect = [max(raw[r][s] for r in raw) for s in steps]
    assert document["job_steps"]["step_ns"] == pytest.approx(expect, abs=1)
    loaded = load_job_baseline(baseline)
    assert sorted(loaded.ranks) == [0, 1, 2, 3] and loaded.world_size == 4


def test_check_fails_the_slowed_job_and_passes_the_same_job(baseline):
    slowed = check_job(traceq.load_job(SLOW, engine="serial"), baseline, 0.05, ["step"])
    assert slowed.failed and slowed.job_step["verdict"] == "regressed"
    same = check_job(traceq.load_job(BALANCED, engine="serial"), baseline, 0.05, ["step"])
    assert not same.failed and same.job_step["verdict"] in ("no change", "within limit")


def test_diff_rank_by_rank_and_the_job():
    result = diff_jobs(traceq.load_job(BALANCED, engine="serial"), SLOW)
    raw_b, raw_n = raw_step_ns(BALANCED), raw_step_ns(SLOW)
    for row in result.rows:
        b = sorted(raw_b[row["rank"]].values())
        n = sorted(raw_n[row["rank"]].values())
        assert row["base_step_ns"] == pytest.approx((b[1] + b[2]) / 2, abs=1)
        assert row["new_step_ns"] == pytest.approx((n[1] + n[2]) / 2, abs=1)
    worst = max(result.rows, key=lambda r: r["change"])
    assert result.worst_rank == worst["rank"]
    assert result.job["change"] > 0.3  # every rank waits ~40 ms more per ~35 ms step


def test_cli_baseline_check_and_diff_on_jobs(tmp_path):
    runner = CliRunner()
    out = tmp_path / "b.json"
    saved = runner.invoke(main, ["baseline", "save", str(BALANCED), "-o", str(out)])
    assert saved.exit_code == 0 and "job baseline of 4 ranks" in saved.stdout
    failed = runner.invoke(main, ["check", str(SLOW), "--baseline", str(out), "--metric", "step"])
    assert failed.exit_code == 1 and "job step time: regressed" in failed.stdout
    diffed = runner.invoke(main, ["diff", str(out), str(SLOW), "--format", "json"])
    data = json.loads(diffed.stdout)
    assert diffed.exit_code == 0 and [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    assert data["worst_rank"] in (0, 1, 2, 3)


def _corrupt_past_its_head(tmp_path: Path) -> Path:
    """A real trace, gzipped, with its compressed bytes broken a third of the way in: its
    head inflates, the rest does not."""
    raw = gzip.decompress((REPO / "fixtures" / "linear-eager.pt.trace.json.gz").read_bytes())
    packed = bytearray(gzip.compress(raw))
    at = len(packed) // 3
    packed[at : at + 16] = b"\xff" * 16
    path = tmp_path / "corrupt.pt.trace.json.gz"
    path.write_bytes(bytes(packed))
    return path


def test_a_gzipped_file_is_told_from_a_job_baseline_by_its_head_alone(tmp_path, baseline):
    from traceq.regression.jobs import is_job_baseline

    # the whole file was inflated to look at its first bytes: here that raised zlib.error
    assert not is_job_baseline(_corrupt_past_its_head(tmp_path))
    packed = tmp_path / "job.json.gz"
    packed.write_bytes(gzip.compress(baseline.read_bytes()))
    assert is_job_baseline(packed) and is_job_baseline(baseline)
    assert not is_job_baseline(REPO / "fixtures" / "linear-eager.pt.trace.json.gz")


@pytest.mark.parametrize("command", ["diff", "check"])
def test_diff_and_check_say_a_corrupt_gzip_in_one_line(tmp_path, baseline, command):
    corrupt = str(_corrupt_past_its_head(tmp_path))
    good = str(REPO / "fixtures" / "linear-eager.pt.trace.json.gz")
    args = [corrupt, good] if command == "diff" else [corrupt, "--baseline", good]
    result = CliRunner().invoke(main, [command, *args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "corrupt gzip data" in lines[0], result.output


@pytest.mark.parametrize("command", ["diff", "check"])
def test_a_gzip_corrupt_in_its_head_is_one_line_too(tmp_path, command):
    """The baseline sniffing of single traces (`is_baseline_file`) read the head through the
    same inflater: a gzip broken in its first bytes raised zlib's error there."""
    raw = gzip.decompress((REPO / "fixtures" / "linear-eager.pt.trace.json.gz").read_bytes())
    packed = bytearray(gzip.compress(raw))
    packed[30:46] = b"\xff" * 16
    corrupt = tmp_path / "head.pt.trace.json.gz"
    corrupt.write_bytes(bytes(packed))
    good = str(REPO / "fixtures" / "linear-eager.pt.trace.json.gz")
    args = [str(corrupt), good] if command == "diff" else [str(corrupt), "--baseline", good]
    result = CliRunner().invoke(main, [command, *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "corrupt gzip data" in lines[0], result.output


def test_a_job_baseline_cut_short_is_a_baseline_error(tmp_path, baseline):
    """Its head still names the job key, so it is read as a baseline; gzip's EOFError for
    the missing end escaped as a traceback."""
    from traceq.regression.errors import BaselineError
    from traceq.regression.jobs import is_job_baseline

    path = tmp_path / "job.json.gz"
    path.write_bytes(gzip.compress(baseline.read_bytes())[:-20])
    assert is_job_baseline(path)
    with pytest.raises(BaselineError, match="cannot read the job baseline"):
        load_job_baseline(path)
