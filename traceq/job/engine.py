"""Where the per-rank map runs: in this process, in a pool of local processes, or on Ray.

Every engine runs the same picklable function on `(path, rank, rank_source, *args)` and
returns, per rank, either its result or the one-line error of the rank that failed, in
rank order — so a serial run, a local pool and a Ray cluster give identical results.
The local pool is sized by cores and by free memory over the largest rank's expected peak
(about 4× its uncompressed JSON, the loader's measured ratio), as HTA sizes its pool by
measured peak.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import current_process, get_context
from typing import Any

from traceq.errors import TraceError

ENGINES = ("local", "serial", "ray")
# The local pool's start method. Not fork: a worker forked from a driver whose Polars
# thread pool is running can hang on a lock some thread held at the fork. Not spawn:
# each worker would start a fresh interpreter of its own. forkserver forks each worker
# from one server process (started at the process's first local pool, and kept), whose
# Polars threads never ran; each worker then imports what the map function needs
# (tests/test_job_engines.py).
MP_CONTEXT = "forkserver"
THREADS_VARIABLE = "POLARS_MAX_THREADS"  # read by Polars when it is imported
PEAK_PER_BYTE = 4  # a rank's load peaks near 4x its uncompressed JSON (docs/benchmarks.md)


@dataclass
class Task:
    """One rank's map input: which file, which rank, and how the rank was found."""

    path: str
    rank: int
    rank_source: str
    size_bytes: int = 0
    cache: bool | None = None  # the job's `cache`: False skips the columnar cache in the map


@dataclass
class Outcome:
    """One rank's map output: its value, or the one-line error it failed with."""

    rank: int
    value: Any = None
    error: str | None = None
    peak_rss_mb: float = 0.0  # the process's peak RSS after this rank (workers report theirs)
    cpu_s: float = 0.0  # CPU seconds this rank's map took in its process (load-independent)


def run_task(fn: Callable[..., Any], task: Task, args: tuple[Any, ...]) -> Outcome:
    """Run `fn` for one rank; bad input becomes that rank's error line, never a crash."""
    start = time.process_time()
    try:
        outcome = Outcome(task.rank, fn(task, *args))
    except TraceError as exc:
        outcome = Outcome(task.rank, error=f"rank {task.rank}: {exc}")
    except MemoryError:
        outcome = Outcome(task.rank, error=f"rank {task.rank}: {task.path}: out of memory")
    outcome.peak_rss_mb = _peak_rss_mb()
    outcome.cpu_s = time.process_time() - start
    return outcome


def _peak_rss_mb() -> float:
    try:
        import resource
    except ImportError:  # not on Windows
        return 0.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def free_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else 4 GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def pool_size(tasks: Sequence[Task], workers: int | None = None) -> int:
    """Processes for a local map: `workers` if given, else min(cores, ranks, free memory /
    the largest rank's expected peak), at least 1."""
    if workers:
        return max(1, workers)
    peak = max((t.size_bytes for t in tasks), default=0) * PEAK_PER_BYTE or 1
    by_memory = int(free_memory_bytes() * 0.8 // peak)
    return max(1, min(_cores(), len(tasks), by_memory))


def _cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def map_ranks(
    fn: Callable[..., Any],
    tasks: Sequence[Task],
    args: tuple[Any, ...] = (),
    *,
    engine: str = "local",
    workers: int | None = None,
    address: str | None = None,
) -> list[Outcome]:
    """`fn(task, *args)` for every task on `engine`, outcomes in task order."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == "ray":
        return _ray_map(fn, tasks, args, address=address, workers=workers)
    size = pool_size(tasks, workers)
    if engine == "serial" or size == 1 or len(tasks) <= 1:
        return [run_task(fn, t, args) for t in tasks]
    if _rerunning_a_script():
        raise SystemExit(1)  # quietly: the driver's `BrokenProcessPool` says why, once
    script = unguarded_script()
    try:
        with (
            _main_not_reimported(script is not None),
            ProcessPoolExecutor(size, mp_context=get_context(MP_CONTEXT)) as pool,
        ):
            with _polars_threads(worker_threads(size)):  # each submit starts a worker
                futures = [pool.submit(run_task, fn, task, args) for task in tasks]
            return [future.result() for future in futures]
    except BrokenProcessPool:
        if script is None:
            raise TraceError(_broken_pool_problem()) from None
    # the workers could not start beside a script that maps at import: map here instead
    print(
        f"traceq: warning: {script} maps its job at import (no `if __name__ == "
        '"__main__":` guard) and its workers failed to start; mapping the ranks serially',
        file=sys.stderr,
    )
    return [run_task(fn, t, args) for t in tasks]


def unguarded_script() -> str | None:
    """The path of the script being run when the map was called from its top level outside
    an `if __name__ == "__main__":` block (a plain script, as people write one), else None.

    A forkserver (or spawn) worker imports the driver's `__main__` file before it runs
    anything: such a script would run its job again in every worker."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or getattr(main, "__spec__", None) is not None:
        return None  # an interactive session, a notebook, `python -m`: nothing re-runs
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            break
        frame = frame.f_back
    if frame is None:
        return None
    guarded = _guarded_lines(path)
    if guarded is None or any(lo <= frame.f_lineno <= hi for lo, hi in guarded):
        return None
    return str(path)


def _guarded_lines(path: str) -> list[tuple[int, int]] | None:
    """Line ranges of a script's top-level `if __name__ == "__main__":` blocks (None when
    its source cannot be read)."""
    import ast

    try:
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    ranges = []
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            ranges.append((node.lineno, node.end_lineno or node.lineno))
    return ranges


def _is_main_test(test: Any) -> bool:
    import ast

    if not isinstance(test, ast.Compare) or len(test.comparators) != 1:
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    values = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names and values)


@contextmanager
def _main_not_reimported(active: bool) -> Iterator[None]:
    """While the pool starts its workers: have multiprocessing treat `__main__` as a module
    it need not import (`__spec__` named `__main__`, which its workers skip), so a script
    that maps at import is not run again by the forkserver and each worker. The map's
    functions are traceq's, never the script's, so the workers need nothing from it."""
    main = sys.modules.get("__main__")
    if not active or main is None:
        yield
        return
    from importlib.machinery import ModuleSpec

    before = main.__spec__
    main.__spec__ = ModuleSpec("__main__", None)
    try:
        yield
    finally:
        main.__spec__ = before


def worker_threads(size: int) -> int:
    """Polars threads for each of `size` local workers: the cores shared among them. The
    workers already are the map's parallelism, one per core; a Polars pool of a thread per
    core in every one of them only adds contention to a rank's many small queries (the
    64-rank bench job: 7.82 -> 7.01 s with one thread each on 2 cores, docs/benchmarks.md)."""
    return max(1, _cores() // size)


@contextmanager
def _polars_threads(threads: int) -> Iterator[None]:
    """`POLARS_MAX_THREADS` for the workers started inside, unless the user set it. Polars
    reads it once, when imported, and a worker has Polars from the forkserver it is forked
    from (which imports the driver's script) or imports it first thing; the forkserver
    takes the driver's environment when it starts, at the process's first local pool, so
    that pool's count holds for the process's later pools too."""
    if THREADS_VARIABLE in os.environ:
        yield
        return
    os.environ[THREADS_VARIABLE] = str(threads)
    try:
        yield
    finally:
        os.environ.pop(THREADS_VARIABLE, None)


def _rerunning_a_script() -> bool:
    """Whether this is a local worker running the user's script again: a starting worker
    imports the driver's `__main__` file as `__mp_main__` (forkserver does, as spawn), so a script
    whose job is not under `if __name__ == "__main__":` maps its job again in every worker,
    while it is still starting (`_inheriting`), and multiprocessing fails there with a
    traceback per worker."""
    return bool(getattr(current_process(), "_inheriting", False))  # multiprocessing's test


def _broken_pool_problem() -> str:
    """One line for a local worker that died: the likely causes, what to do about each."""
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    guard = (
        f"{script} may run its job at import: each worker imports it, so put the job under "
        '`if __name__ == "__main__":`; or '
        if script
        else ""
    )
    return (
        f"a worker process of the local engine died before its ranks were mapped: {guard}"
        "it was killed (out of memory?): use fewer workers (workers=N, --workers N) or the "
        "serial engine"
    )


def _ray_map(
    fn: Callable[..., Any],
    tasks: Sequence[Task],
    args: tuple[Any, ...],
    *,
    address: str | None,
    workers: int | None,
) -> list[Outcome]:
    """The same map as Ray tasks next to the traces (paths must be on shared storage), at
    most `workers` (default: the cluster's CPUs) in flight at once: back-pressure, so a
    1,000-rank job never has 1,000 results waiting in the object store."""
    try:
        import ray
    except ImportError:
        raise TraceError("--engine ray needs Ray: pip install 'traceq[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(run_task)
    limit = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    pending: dict[Any, int] = {}
    done: dict[int, Outcome] = {}
    for i, task in enumerate(tasks):
        if len(pending) >= limit:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                index = pending.pop(ref)
                done[index] = _ray_get(ray, ref, tasks, index)
        pending[remote.remote(fn, task, args)] = i
    for ref, i in pending.items():
        done[i] = _ray_get(ray, ref, tasks, i)
    return [done[i] for i in range(len(tasks))]


def _ray_get(ray: Any, ref: Any, tasks: Sequence[Task], index: int) -> Outcome:
    try:
        return ray.get(ref)
    except Exception as exc:  # a worker died: name the rank, in one line
        rank = tasks[index].rank
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        return Outcome(rank, error=f"rank {rank}: Ray task failed: {first}")
