"""The per-rank map gives identical results in this process, in a pool of local processes
and on a real local Ray cluster; the pool is sized by cores and free memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

import traceq
from traceq.job.engine import PEAK_PER_BYTE, Task, free_memory_bytes, map_ranks, pool_size
from traceq.job.job import summarize_task

REPO = Path(__file__).resolve().parent.parent
SLOW_JOB = REPO / "fixtures" / "jobs" / "ddp_gloo_slow2"
FRAMES = ("ranks", "breakdown", "kernel_types", "collectives", "alignment", "ranges", "step_ns")


def analysis(engine: str, **options):
    job = traceq.load_job(SLOW_JOB, engine=engine, **options)
    return job, traceq.analyze_job(job)


def assert_same(a, b) -> None:
    (_, left), (_, right) = a, b
    for name in FRAMES:
        assert_frame_equal(getattr(left.frames, name), getattr(right.frames, name))
    assert [f.to_dict() for f in left.findings] == [f.to_dict() for f in right.findings]


@pytest.fixture(scope="module")
def serial():
    return analysis("serial")


def test_local_processes_match_serial(serial):
    assert_same(serial, analysis("local", workers=2))


AFTER_THREADS = """
import sys
import polars as pl
import traceq
big = pl.DataFrame({"k": pl.int_range(2_000_000, eager=True) % 97})
assert big.group_by("k").len().height == 97  # polars' thread pool is up in the driver
job = traceq.load_job(sys.argv[1], workers=2)
print(traceq.analyze_job(job, select=["TQ4"]).frames.ranks.height, len(job.failed))
"""


def test_local_pool_starts_clean_after_the_driver_used_polars_threads():
    """The local pool's start method is forkserver: a worker forked from a driver whose
    Polars thread pool is running may hang on a lock held by a thread that fork did not
    copy; forked from the server, whose Polars threads never ran, it starts clean."""
    import subprocess
    import sys

    from traceq.job.engine import MP_CONTEXT

    assert MP_CONTEXT == "forkserver"
    done = subprocess.run(
        [sys.executable, "-c", AFTER_THREADS, str(SLOW_JOB)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["4", "0"]


def test_pool_is_sized_by_cores_ranks_and_memory():
    tasks = [Task(str(i), i, "order", size_bytes=1 << 20) for i in range(64)]
    cores = len(os.sched_getaffinity(0))
    assert pool_size(tasks) == min(cores, 64)
    huge = [Task("x", 0, "order", size_bytes=free_memory_bytes() // PEAK_PER_BYTE * 2)] * 4
    assert pool_size(huge) == 1  # two of them would not fit in memory
    assert pool_size(tasks, workers=3) == 3


def _fail_on_odd(task: Task) -> int:
    if task.rank % 2:
        raise traceq.TraceFormatError("not a trace", source=task.path)
    return task.rank


def test_a_failing_rank_is_its_own_error_line():
    tasks = [Task(f"r{i}.json", i, "order") for i in range(4)]
    outcomes = map_ranks(_fail_on_odd, tasks, engine="local", workers=2)
    assert [o.value for o in outcomes] == [0, None, 2, None]
    assert [o.error for o in outcomes] == [
        None, "rank 1: r1.json: not a trace", None, "rank 3: r3.json: not a trace"
    ]  # fmt: skip


def test_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="engine must be one of"):
        map_ranks(_fail_on_odd, [], engine="dask")


@pytest.mark.slow
def test_ray_local_cluster_matches_serial(serial):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'traceq[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        ray_run = analysis("ray")
        assert_same(serial, ray_run)
        tasks = [Task(str(SLOW_JOB / "rank-0.pt.trace.json.gz"), 0, "o"), Task("gone.json", 1, "o")]
        outcomes = map_ranks(summarize_task, tasks, engine="ray")
        assert outcomes[0].error is None and outcomes[0].value.rank == 0
        assert outcomes[1].error == "rank 1: gone.json: no such file"
    finally:
        ray.shutdown()


UNGUARDED = """
import traceq
job = traceq.load_job({job!r}, workers=2)
print(len(traceq.analyze_job(job, select=["TQ4"]).findings))
"""


def test_a_script_without_a_main_guard_maps_its_job(tmp_path):
    """Each local worker imported the driver's script; one that maps its job at import
    ran the job again in every worker, and each failed with multiprocessing's traceback
    ("An attempt has been made to start a new process before ...") under the driver's
    `BrokenProcessPool`. Now its workers start without importing it, and the job maps
    (`engine.unguarded_script`; tests/test_job_plain_script.py)."""
    import subprocess
    import sys

    script = tmp_path / "job_script.py"
    script.write_text(UNGUARDED.format(job=str(SLOW_JOB)))
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    assert int(run.stdout.split()[-1]) >= 1  # the slowed rank's straggler, at least
    assert "An attempt has been made to start a new process" not in run.stderr
    assert "BrokenProcessPool" not in run.stderr

    guarded = tmp_path / "guarded.py"
    body = "".join(f"    {line}\n" for line in UNGUARDED.format(job=str(SLOW_JOB)).splitlines())
    guarded.write_text(f'if __name__ == "__main__":\n{body}')
    ok = subprocess.run([sys.executable, str(guarded)], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert int(ok.stdout.split()[-1]) >= 1  # the slowed rank's straggler, at least


def _die(task: Task) -> None:
    os._exit(3)  # a worker killed mid-rank, as the kernel's OOM killer would


def test_a_worker_that_dies_is_one_line_not_a_traceback():
    tasks = [Task(str(SLOW_JOB / f"rank{r}.json.gz"), r, "file name") for r in range(2)]
    with pytest.raises(traceq.TraceError, match=r"^a worker process of the local engine died"):
        map_ranks(_die, tasks, engine="local", workers=2)


PROBE = """
import polars as pl


def threads(task):
    return pl.thread_pool_size()
"""
THREADS = """
import sys
sys.path.insert(0, sys.argv[1])
import polars as pl
from probe import threads
from traceq.job.engine import Task, map_ranks, worker_threads
tasks = [Task("unused", rank, "file name") for rank in range(4)]
seen = {outcome.value for outcome in map_ranks(threads, tasks, workers=2)}
print(pl.thread_pool_size(), sorted(seen), worker_threads(2), sep="|")
"""


@pytest.mark.parametrize("user", [None, "3"])
def test_local_workers_share_the_cores_among_their_polars_threads(tmp_path, user):
    """Two workers on the machine's cores each get cores // 2 Polars threads (one each on
    2 cores: each worker's own pool of a thread per core only made a rank's small queries
    contend, 64-rank bench job 7.82 -> 7.01 s); a `POLARS_MAX_THREADS` the user set wins,
    and the driver's own Polars is untouched."""
    import subprocess
    import sys

    (tmp_path / "probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"}
    if user:
        env["POLARS_MAX_THREADS"] = user
    run = subprocess.run(
        [sys.executable, "-c", THREADS, str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    driver, seen, expected = run.stdout.strip().split("|")
    cores = len(os.sched_getaffinity(0))
    assert int(driver) == (int(user) if user else cores)
    assert seen == f"[{user or max(1, cores // 2)}]"
    assert int(expected) == max(1, cores // 2)
