"""Where a cold load's time and memory go, stage by stage, in one process.

`bench.py` says how long a load takes; this says why. It wraps the loader's stages (by
their names in `traceq.loader` and `traceq.relations.link`, so a renamed stage fails here
loudly) and prints, for one cold load of TRACE:

- each decode stage's wall time and the CPU time of the thread that ran it (the reading
  thread's msgspec half, the caller's C pass or Polars half; Polars' own pool is not in a
  thread's CPU, so a Polars stage shows much more wall than CPU; run with TRACEQ_NATIVE=0
  to see the Python path's stages);
- each link step's start, end and thread, and the highest RSS sampled (every 3 ms) while
  it ran: the load's peak falls in the link, where the steps of two threads overlap;
- with `--threads`, how many of the process's threads were runnable, every quarter second
  (sampled from /proc every 2 ms by a parent process): a mean near 1 is a core idle.

    python benchmarks/loader_profile.py benchmarks/.cache/big10.json
    python benchmarks/loader_profile.py benchmarks/.cache/big10.json --threads

Linux only (/proc). Its sampling thread runs in the measured process, so its times and
peaks sit a little above `bench.py`'s; compare runs of this script with each other.
Round ten's numbers in docs/benchmarks.md come from it.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DECODE_STAGES = {
    "traceq.loader.split": ("compact", "_cut"),
    "traceq.loader.decode": (
        "_read_args",
        "_args_column",
        "_native_frame",
        "_parsed",
        "_concat",
        "_require_valid",
    ),
}
LINK_STEPS = {
    "traceq.loader.frames": (
        "with_category_key",
        "kernels",
        "instants",
        "flow_points",
        "flows",
        "ops",
        "runtime",
        "python",
        "annotations",
        "steps",
        "syncs",
        "threads",
        "other",
    ),
    "traceq.relations.link": (
        "nest_ops",
        "link_runtime",
        "link_kernels",
        "modules",
        "attribute_steps",
        "attribute_modules",
    ),
}


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Recorder:
    """Wraps module functions; records (start, end, thread CPU, thread, name) per call."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.calls: list[tuple[float, float, float, str, str]] = []

    def wrap(self, module: ModuleType, name: str) -> None:
        inner: Callable[..., Any] = getattr(module, name)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start, cpu = time.perf_counter() - self.t0, time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                end = time.perf_counter() - self.t0
                thread = threading.current_thread().name
                self.calls.append((start, end, time.thread_time() - cpu, thread, name))

        setattr(module, name, timed)


def profile(trace: str) -> None:
    sys.path.insert(0, str(REPO))
    import traceq  # noqa: F401  (its allocator settings, before Polars loads)
    from traceq.loader.load import read_events
    from traceq.relations import link

    recorder = Recorder()
    for table in (DECODE_STAGES, LINK_STEPS):
        for module_name, names in table.items():
            module = importlib.import_module(module_name)
            for name in names:
                recorder.wrap(module, name)
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.perf_counter() - recorder.t0, rss_mib()))
            time.sleep(0.003)

    threading.Thread(target=sample, daemon=True).start()
    wall, cpu = time.perf_counter(), time.process_time()
    decoded = read_events(trace, None, lambda _: None)
    decode = (time.perf_counter() - wall, time.process_time() - cpu)
    linked_at = time.perf_counter() - recorder.t0
    link.link_frames(decoded.events)
    total = (time.perf_counter() - wall, time.process_time() - cpu)
    done.set()

    print(f"decode {decode[0]:.2f} s wall, {decode[1]:.2f} CPU s (all threads)")
    stages: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for start, end, thread_cpu, thread, name in recorder.calls:
        if start < linked_at:
            stage = stages[f"{name} ({thread})"]
            stage[0] += 1
            stage[1] += end - start
            stage[2] += thread_cpu
    for label, (count, seconds, thread_cpu) in sorted(stages.items(), key=lambda s: -s[1][1]):
        print(f"  {label:42s} x{count:<4.0f} {seconds:6.2f} s wall {thread_cpu:6.2f} thread CPU s")
    peak_at, peak = max(samples, key=lambda s: s[1])
    decode_peak = max((r for t, r in samples if t < linked_at), default=0.0)
    print(
        f"link {total[0] - decode[0]:.2f} s wall; whole load {total[0]:.2f} s, {total[1]:.2f} CPU s"
    )
    print(
        f"RSS: decode's highest {decode_peak:.0f} MiB; the load's {peak:.0f} MiB at {peak_at:.2f} s"
    )
    for start, end, _, thread, name in sorted(recorder.calls):
        if start >= linked_at and end - start >= 0.005:
            during = [r for t, r in samples if start <= t <= end]
            highest = f"{max(during):5.0f} MiB" if during else "      -"
            print(f"  {start:6.2f}-{end:6.2f} s {thread:22s} {name:18s} highest {highest}")


def runnable_threads(trace: str) -> None:
    """Run the profile in a child and sample its threads' states from /proc."""
    child = subprocess.Popen(
        [sys.executable, __file__, trace], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    start = time.perf_counter()
    quarters: dict[int, list[int]] = collections.defaultdict(list)
    while child.poll() is None:
        running = 0
        try:
            for task in os.listdir(f"/proc/{child.pid}/task"):
                try:
                    with open(f"/proc/{child.pid}/task/{task}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                running += stat[stat.rindex(")") + 2] == "R"
        except OSError:
            break
        quarters[int((time.perf_counter() - start) * 4)].append(running)
        time.sleep(0.002)
    print("seconds  mean runnable threads  share of samples with <= 1")
    for quarter, counts in sorted(quarters.items()):
        alone = sum(c <= 1 for c in counts) / len(counts)
        print(f"{quarter / 4:6.2f}  {sum(counts) / len(counts):5.2f}  {alone:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--threads", action="store_true", help="sample runnable threads")
    args = parser.parse_args()
    if args.threads:
        runnable_threads(args.trace)
    else:
        profile(args.trace)


if __name__ == "__main__":
    main()
