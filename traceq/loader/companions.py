"""Files recorded beside a trace: its Execution Trace, found by name.

`traceq.profile` and the corpus write `rank-0.pt.trace.json.gz` beside `rank-0.et.json.gz`;
`traceq.load` reads that ET for exact data flow and `rules.recorded` says whether one was
there. Finding the file is a loader's job (a path in, a path out), so both the pipeline and
the rules can ask without the one importing the other.
"""

from __future__ import annotations

from pathlib import Path

TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json")
ET_SUFFIXES = (".et.json.gz", ".et.json")


def trace_stem(source: str) -> str | None:
    """`rank-0` for `.../rank-0.pt.trace.json.gz` (or `.json`); None for another name."""
    name = Path(source).name
    for suffix in TRACE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def execution_trace_beside(source: str) -> Path | None:
    """The Execution Trace recorded with a trace file, named as `traceq.profile` and the
    corpus name them (`rank-0.pt.trace.json.gz` beside `rank-0.et.json.gz`), if it exists."""
    stem = trace_stem(source)
    if stem is None:
        return None
    path = Path(source)
    for suffix in ET_SUFFIXES:
        candidate = path.with_name(stem + suffix)
        if candidate.is_file():
            return candidate
    return None
