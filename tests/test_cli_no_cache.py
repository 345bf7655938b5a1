"""`--no-cache`: every load a command makes skips the columnar cache, and nothing global changes.

The flag is noted on the command's click context and handed to each load as `cache=False`
(the library's own loads too: a job's ranks, `check`'s baseline, the HTML report), so
`TRACEQ_CACHE` is never set behind the user's back: a library load running in the same
process at the same time keeps the cache, and `TRACEQ_CACHE=0` still turns it off alone.
Each case is checked both ways: with the flag the cache folder stays empty, without it
the same command fills it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import cache_entries
from traceq.cli.main import main

import traceq
from traceq.loader import cache as C

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "fixtures" / "mlp_gelu-train.pt.trace.json.gz"
JOB = REPO / "fixtures" / "jobs" / "ddp_gloo_slow2"


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool | None, str | None]]:
    """(the `cache` a load asked for, `TRACEQ_CACHE` at that moment), one per load that
    consults the cache in this process."""
    calls: list[tuple[bool | None, str | None]] = []
    real = C.enabled

    def spy(requested: bool | None = None) -> bool:
        calls.append((requested, os.environ.get("TRACEQ_CACHE")))
        return real(requested)

    monkeypatch.setattr(C, "enabled", spy)
    return calls


def _trace(tmp: Path) -> str:
    path = tmp / "trace.json.gz"
    if not path.exists():
        shutil.copyfile(FIXTURE, path)
    return str(path)


def _other(tmp: Path) -> str:
    path = tmp / "other.json.gz"
    if not path.exists():
        shutil.copyfile(FIXTURE, path)
    return str(path)


# command line (without --no-cache) from a scratch folder; how many files it loads
COMMANDS: dict[str, tuple[Callable[[Path], list[str]], int]] = {
    "info": (lambda t: ["info", _trace(t)], 1),
    "query": (lambda t: ["query", _trace(t), "SELECT count(*) AS n FROM ops"], 1),
    "analyze": (lambda t: ["analyze", _trace(t)], 1),
    "critical-path": (lambda t: ["critical-path", _trace(t)], 1),
    "annotate": (lambda t: ["annotate", _trace(t), "-o", str(t / "a.json")], 1),
    "baseline save": (lambda t: ["baseline", "save", _trace(t), "-o", str(t / "b.json")], 1),
    "check": (lambda t: ["check", _trace(t), "--baseline", _other(t)], 2),
    "report": (lambda t: ["report", _trace(t), "-o", str(t / "r.html")], 1),
    "info job": (lambda t: ["info", str(JOB), "--engine", "serial"], 4),
    "analyze job": (lambda t: ["analyze", str(JOB), "--engine", "serial"], 4),
    "critical-path job": (lambda t: ["critical-path", str(JOB), "--engine", "serial"], 4),
    "report job": (
        lambda t: ["report", str(JOB), "--engine", "serial", "-o", str(t / "j.html")],
        4,
    ),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_cache_reaches_every_load_and_leaves_the_environment_alone(
    name: str, tmp_path: Path, cache_dir: Path, asked: list[tuple[bool | None, str | None]]
) -> None:
    build, files = COMMANDS[name]
    args = build(tmp_path)
    result = CliRunner().invoke(main, [*args, "--no-cache"])
    assert result.exit_code in (0, 1), result.output  # 1: a finding or a regression
    assert cache_entries(cache_dir) == []
    assert asked and all(call == (False, "1") for call in asked), asked  # told; env as it was
    assert os.environ["TRACEQ_CACHE"] == "1"

    asked.clear()
    result = CliRunner().invoke(main, args)
    assert result.exit_code in (0, 1), result.output
    assert len(cache_entries(cache_dir)) == files  # the same command, cache on: it fills
    assert all(requested is None for requested, _ in asked)


def test_a_library_load_during_a_no_cache_command_keeps_the_cache(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two things at once in one process: a `--no-cache` command, and a library load made
    while it runs (another thread of the same program). The library load is cached."""
    other = _other(tmp_path)
    real = C.enabled
    during: list[int] = []

    def load_the_other_meanwhile(requested: bool | None = None) -> bool:
        if not during:
            during.append(1)
            traceq.load(other)  # the library's default: the cache, as TRACEQ_CACHE=1 says
        return real(requested)

    monkeypatch.setattr(C, "enabled", load_the_other_meanwhile)
    result = CliRunner().invoke(main, ["info", "--no-cache", _trace(tmp_path)])
    assert result.exit_code == 0, result.output
    entry = C.entry_for(other)
    assert during and entry is not None
    assert cache_entries(cache_dir) == [entry.path]  # the other file's, and only it


def test_two_commands_in_one_process_each_keep_their_own_choice(
    tmp_path: Path, cache_dir: Path
) -> None:
    runner = CliRunner()
    trace = _trace(tmp_path)
    assert runner.invoke(main, ["info", "--no-cache", trace]).exit_code == 0
    assert cache_entries(cache_dir) == []
    assert runner.invoke(main, ["info", trace]).exit_code == 0
    assert len(cache_entries(cache_dir)) == 1


TWO_JOB_COMMANDS = """
import sys
from pathlib import Path
from click.testing import CliRunner
from traceq.cli.main import main
from traceq.loader.cache import SUFFIX

job, folder = sys.argv[1], Path(sys.argv[2])
for flags in (["--no-cache"], []):
    result = CliRunner().invoke(main, ["analyze", job, "--workers", "2", *flags])
    assert result.exit_code in (0, 1), result.output
    print(len(list(folder.glob(f"*{SUFFIX}"))) if folder.is_dir() else 0)
"""


def test_a_job_command_after_a_no_cache_one_in_the_same_process_uses_the_cache(
    tmp_path: Path, cache_dir: Path
) -> None:
    """The ranks load in worker processes forked from one server that the first job command
    of a process starts, with that moment's environment: had `--no-cache` set
    `TRACEQ_CACHE=0` for its command, every later job of the process would skip the cache.
    Run in a fresh process, so that its first command is the one that starts the server."""
    env = {**os.environ, "TRACEQ_CACHE": "1", "TRACEQ_CACHE_DIR": str(cache_dir)}
    script = [sys.executable, "-c", TWO_JOB_COMMANDS, str(JOB), str(cache_dir)]
    done = subprocess.run(script, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "4"]  # none under --no-cache; then one per rank


def test_traceq_cache_0_still_turns_the_cache_off_alone(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACEQ_CACHE", "0")
    for args in (["info", _trace(tmp_path)], ["info", str(JOB), "--engine", "serial"]):
        assert CliRunner().invoke(main, args).exit_code == 0
    assert cache_entries(cache_dir) == []


def test_load_job_takes_cache_false(cache_dir: Path) -> None:
    """The library side of `--no-cache` for a job: `load_job(..., cache=False)`."""
    job = traceq.load_job(str(JOB), engine="serial", cache=False)
    assert job.frames.ranks.height == 4 and job.trace(0).ops.height > 0
    assert cache_entries(cache_dir) == []
    job = traceq.load_job(str(JOB), engine="serial")
    assert job.frames.ranks.height == 4
    assert len(cache_entries(cache_dir)) == 4
