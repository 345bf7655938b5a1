"""`traceq.profile(dir)`: record a trace traceq can read in full, and say how to analyze it.

A context manager over `torch.profiler.profile` with what every rule needs switched on:
input shapes (`record_shapes`: the fusion rules size ops and match GEMM operands by
them), the module tree (`with_modules`: findings name their layer), the Python stack
(`with_stack`: findings name their source line), optionally memory, and an Execution
Trace (`torch.profiler.ExecutionTraceObserver`) recorded over the same active window, so
the data flow between ops is exact rather than inferred (`Trace.with_execution_trace`).

Files are named per rank (`torch.distributed`'s rank when it is initialized, else the
`RANK` environment variable, else 0), gzipped, in `dir`:
`rank-0.pt.trace.json.gz` and beside it `rank-0.et.json.gz`; with `repeat > 1`, one pair
per cycle (`rank-0.cycle-1.pt.trace.json.gz`). When the window closes it prints one line
saying what it wrote and the command that analyzes it.

    with traceq.profile("traces/") as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

torch is imported when a recording starts, never by `import traceq`.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACE_SUFFIX = ".pt.trace.json.gz"
ET_SUFFIX = ".et.json.gz"


@dataclass
class Recording:
    """What one `traceq.profile` window wrote: trace files and their Execution Traces."""

    dir: Path
    rank: int
    traces: list[Path] = field(default_factory=list)
    execution_traces: list[Path] = field(default_factory=list)

    def message(self) -> str:
        """The line printed when the window closes."""
        count = len(self.traces)
        if not count:
            return (
                f"traceq: wrote no trace to {self.dir}: the schedule's active steps never "
                "ran (call prof.step() once per step)"
            )
        first = self.traces[0]
        target = first.parent if count > 1 and _one_per_rank(self.traces) else first
        noun = "trace" if count == 1 else "traces"
        return f"traceq: wrote {count} {noun} to {self.dir}; analyze with: traceq analyze {target}"


def rank() -> int:
    """This process's rank: `torch.distributed`'s when initialized, else `RANK`, else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def profiler_options(
    *,
    record_shapes: bool = True,
    with_modules: bool = True,
    with_stack: bool = True,
    profile_memory: bool = False,
) -> dict[str, Any]:
    """The `torch.profiler.profile` keyword arguments traceq reads everything from."""
    return {
        "record_shapes": record_shapes,
        "with_modules": with_modules,
        "with_stack": with_stack,
        "profile_memory": profile_memory,
    }


@contextmanager
def profile(
    dir: str | os.PathLike[str],
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 5,
    repeat: int = 1,
    record_shapes: bool = True,
    with_modules: bool = True,
    with_stack: bool = True,
    profile_memory: bool = False,
    execution_trace: bool = True,
    activities: list[Any] | None = None,
    quiet: bool = False,
) -> Iterator[Any]:
    """Profile the steps run inside the block (call `prof.step()` after each) into `dir`.

    `wait`, `warmup`, `active`, `repeat`: `torch.profiler.schedule`'s (steps skipped, run
    but not kept, recorded; cycles, 0 for as long as the block runs); 5 active steps, as
    `traceq check` needs at least 4 a side to judge noise. `execution_trace`:
    record an Execution Trace over the same active steps, beside each trace. `activities`:
    default CPU, and CUDA when it is available. Yields the `torch.profiler.profile`; its
    `recording` attribute (a `Recording`) lists the files once the block ends."""
    import torch
    from torch.profiler import ProfilerActivity, schedule

    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    recording = Recording(out, rank())
    if activities is None:
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
    observer = _Observer(out, recording) if execution_trace else None
    handler = _handler(recording, observer)
    prof = torch.profiler.profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
        on_trace_ready=handler,
        execution_trace_observer=observer.observer if observer else None,
        **profiler_options(
            record_shapes=record_shapes,
            with_modules=with_modules,
            with_stack=with_stack,
            profile_memory=profile_memory,
        ),
    )
    prof.recording = recording  # type: ignore[attr-defined]
    try:
        with prof:
            yield prof
    finally:
        if observer is not None:
            observer.close()
    if not quiet:
        print(recording.message(), file=sys.stderr)


def _handler(recording: Recording, observer: _Observer | None) -> Callable[[Any], None]:
    """`on_trace_ready`: export the cycle's trace gzipped under its rank's name, and move
    the Execution Trace of the same window beside it."""

    def ready(prof: Any) -> None:
        cycle = len(recording.traces)
        stem = f"rank-{recording.rank}" + (f".cycle-{cycle}" if cycle else "")
        raw = recording.dir / f"{stem}.pt.trace.json"
        prof.export_chrome_trace(str(raw))
        recording.traces.append(_gzip(raw, recording.dir / f"{stem}{TRACE_SUFFIX}"))
        if observer is not None:
            et = observer.take(recording.dir / f"{stem}{ET_SUFFIX}")
            if et is not None:
                recording.execution_traces.append(et)
        if cycle == 1:  # a second cycle: the first is renamed so every cycle says its number
            first = recording.traces[0]
            renamed = first.with_name(f"rank-{recording.rank}.cycle-0{TRACE_SUFFIX}")
            first.replace(renamed)
            recording.traces[0] = renamed
            if recording.execution_traces and len(recording.execution_traces) == 2:
                et0 = recording.execution_traces[0]
                et_renamed = et0.with_name(f"rank-{recording.rank}.cycle-0{ET_SUFFIX}")
                et0.replace(et_renamed)
                recording.execution_traces[0] = et_renamed

    return ready


class _Observer:
    """One `ExecutionTraceObserver` for the whole block: the profiler starts it with each
    active window and stops it when the window closes; `take` then finishes the window's
    file, moves it beside that window's trace, and registers the observer again for the
    next cycle."""

    def __init__(self, out: Path, recording: Recording) -> None:
        from torch.profiler import ExecutionTraceObserver

        self.scratch = out / f".rank-{recording.rank}.et.json"
        self.observer = ExecutionTraceObserver().register_callback(str(self.scratch))

    def take(self, target: Path) -> Path | None:
        """The ET of the window just ended, gzipped to `target` (None: nothing recorded)."""
        self.observer.unregister_callback()  # stops it and completes the JSON
        done = _gzip(self.scratch, target) if self.scratch.exists() else None
        self.observer.register_callback(str(self.scratch))
        return done

    def close(self) -> None:
        self.observer.unregister_callback()
        if self.scratch.exists():  # the unused file of a cycle that never recorded
            self.scratch.unlink()


def _gzip(src: Path, dst: Path) -> Path:
    """Gzip `src` to `dst` (no name or mtime in the header) and remove `src`."""
    with (
        src.open("rb") as raw,
        dst.open("wb") as out,
        gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz,
    ):
        shutil.copyfileobj(raw, gz)
    src.unlink()
    return dst


def _one_per_rank(paths: list[Path]) -> bool:
    """Whether the files are one cycle each of several ranks (a job) rather than cycles."""
    return not any(".cycle-" in p.name for p in paths)
