"""Edges past a reshape whose size the profiler did not record (PyTorch before 2.2).

Kineto records an int-list argument as `[]` in `Input Dims`, and older PyTorch adds no
`Concrete Inputs`: `view(x, size)` has an unknown result shape, so its consumer was
matched past it to an older value of the exact shape. The views are found here in the
raw JSON alone (stdlib `json`): a top-level `view`/`reshape`/`flatten` whose size
argument is recorded as `[]` with no concrete value, on the consumer's thread, after
the producer ends and before the consumer starts, holding as many elements as the
edge's value.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import polars as pl
import pytest
from conftest import SHARED_TRACES, Raw, gpu_fixture

import traceq
from traceq.rules.config import Config
from traceq.rules.engine import run

RANK = gpu_fixture("hta-rank_non_gpu")
METRICS = SHARED_TRACES / "hta/tests/data/negative_queue_length_values_check/rank0.json.gz"
RESHAPES = {"aten::view", "aten::reshape", "aten::_unsafe_view", "aten::_reshape_alias"}
RESHAPES |= {"aten::flatten"}


def _top_level(raw: Raw) -> set[int]:
    """CPU ops no other CPU op on their thread encloses (a view inside `index` or
    `flatten` is that op's own work, not a value handed on)."""
    top, open_until = set(), {}
    ops = raw.where(lambda e: e.get("ph") == "X" and e.get("cat") == "cpu_op")
    for i in sorted(ops, key=lambda i: (raw.start(i), -raw.end(i))):
        tid = raw.events[i]["tid"]
        if raw.start(i) >= open_until.get(tid, -1):
            top.add(i)
            open_until[tid] = raw.end(i)
    return top


def _unsized_views(raw: Raw) -> dict[int, list[tuple[int, int]]]:
    """Per thread, (start ns, element count) of each top-level reshape with no size."""
    views = defaultdict(list)
    for i in _top_level(raw):
        event = raw.events[i]
        if event["name"] not in RESHAPES:
            continue
        args = event.get("args", {})
        dims = args.get("Input Dims") or []
        concrete = args.get("Concrete Inputs") or []
        sized = len(concrete) > 1 and concrete[1] not in ("", "[]")
        if len(dims) >= 2 and dims[1] == [] and dims[0] and not sized:
            views[event["tid"]].append((raw.start(i), math.prod(dims[0])))
    return views


@pytest.mark.parametrize("path", [RANK, METRICS], ids=lambda p: p.name)
def test_no_shape_matched_edge_passes_a_reshape_of_unknown_size(path) -> None:
    if not path.exists():
        pytest.skip(f"{path} is not here (../shared is only on the workplace's machines)")
    raw = Raw(path)
    views = _unsized_views(raw)
    assert sum(map(len, views.values())) >= 30  # the trace has them
    trace = traceq.load(path, cache=False)
    shaped = trace.dataflow.filter(pl.col("input_index").is_not_null())
    passing = []
    for producer, consumer, shape in shaped.select("producer", "consumer", "shape").iter_rows():
        tid = raw.events[consumer]["tid"]
        lo, hi = raw.end(producer), raw.start(consumer)
        numel = math.prod(shape)
        if any(lo < start < hi and n == numel for start, n in views[tid]):
            passing.append((producer, consumer))
    assert not passing


def test_a_towers_heads_are_no_one_chain() -> None:
    """Each task head's `linear → sigmoid`, then its loss: the data flow read every
    reshape-separated step as the next one's input and made TQ102 one 11-op finding
    (`linear → sigmoid → sub → sigmoid → sub → div → log → ...`); now no TQ102 finding
    holds more ops than a GEMM and its activation chain before a reshape of its value."""
    raw = Raw(RANK)
    views = _unsized_views(raw)
    trace = traceq.load(RANK, cache=False)
    for finding in run(trace, Config(select=["TQ102", "TQ104"])).findings:
        ops = sorted(finding.ops, key=raw.start)
        tid = raw.events[ops[0]]["tid"]
        for a, b in itertools.pairwise(ops):
            shape = raw.events[b]["args"]["Input Dims"][0]
            numel = math.prod(shape) if shape else None
            assert not any(raw.end(a) < s < raw.start(b) and n == numel for s, n in views[tid]), (
                finding.rule,
                ops,
            )
