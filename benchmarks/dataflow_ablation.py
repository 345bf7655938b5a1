"""What each data-flow reader changes on the Execution-Trace corpus: the corpus measured
once with every reader, then once per reader with that reader left out.

    python benchmarks/dataflow_ablation.py [CORPUS_DIR] [--only NAME ...] [--json OUT]

Edges are counted as in `dataflow_accuracy.py` (exact edges from tensor ids, over the ops
the ET pairs with): right = inferred and exact, wrong = inferred only, missed = exact
only. A reader's row says what it adds over the run without it: +N right, -M wrong, -K
missed edges (negative where it costs), the precision and recall without it, and the
entries whose edges it changes. The readers' docstrings quote these rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

import traceq
from traceq.relations.dataflow import inferred
from traceq.relations.dataflow.execution_trace import ground_truth, load_execution_trace
from traceq.relations.dataflow.readers import READERS

DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"


@dataclass
class Entry:
    """One corpus entry, loaded once: the trace, its ops, the exact edges and the ops the
    ET pairs with."""

    name: str
    trace: traceq.Trace
    ops: pl.DataFrame
    exact: set[tuple[int, int]]
    matched: pl.Series


@dataclass
class Counts:
    right: int = 0
    wrong: int = 0
    missed: int = 0
    entries: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def precision(self) -> float:
        return self.right / (self.right + self.wrong) if self.right + self.wrong else 0.0

    def recall(self) -> float:
        return self.right / (self.right + self.missed) if self.right + self.missed else 0.0


def reader_name(reader: object) -> str:
    return getattr(reader, "__module__", str(reader)).rsplit(".", 1)[-1]


def load(corpus: Path) -> list[Entry]:
    entries = []
    for kineto in sorted(corpus.glob("*.pt.trace.json.gz")):
        name = kineto.name.removesuffix(".pt.trace.json.gz")
        et_path = corpus / f"{name}.et.json.gz"
        if not et_path.is_file():
            continue
        trace = traceq.load(kineto)
        ops = trace.dataflow_ops
        exact, matched = ground_truth(trace, load_execution_trace(et_path), ops)
        pairs = set(exact.select("producer", "consumer").unique().iter_rows())
        entries.append(Entry(name, trace, ops, pairs, matched))
    return entries


def measure(entries: list[Entry], readers: tuple) -> Counts:
    """Edge counts over `entries` with `readers` run in place of `READERS`."""
    saved = inferred.READERS
    inferred.READERS = readers
    try:
        counts = Counts()
        for entry in entries:
            edges = inferred.inferred_edges(entry.trace, entry.ops)
            got = set(
                edges.filter(pl.col("consumer").is_in(entry.matched.implode()))
                .select("producer", "consumer")
                .unique()
                .iter_rows()
            )
            right = len(got & entry.exact)
            row = (right, len(got) - right, len(entry.exact) - right)
            counts.entries[entry.name] = row
            counts.right += row[0]
            counts.wrong += row[1]
            counts.missed += row[2]
        return counts
    finally:
        inferred.READERS = saved


def delta_text(full: Counts, without: Counts) -> str:
    """What the reader changes: edges right, wrong and missed with it minus without it."""
    return (
        f"{full.right - without.right:+d} right, {full.wrong - without.wrong:+d} wrong, "
        f"{full.missed - without.missed:+d} missed edges (without it: precision "
        f"{without.precision():.3f}, recall {without.recall():.3f})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--only", nargs="*", help="leave out only these readers (module names)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    entries = load(args.corpus)
    if not entries:
        print(f"traceq: error: no <name>.pt.trace.json.gz + .et.json.gz in {args.corpus}")
        return 2
    full = measure(entries, READERS)
    print(
        f"{'all readers':20} right {full.right}, wrong {full.wrong}, missed {full.missed}: "
        f"precision {full.precision():.3f}, recall {full.recall():.3f}",
        flush=True,
    )
    rows = {"all": {"right": full.right, "wrong": full.wrong, "missed": full.missed}}
    for reader in READERS:
        name = reader_name(reader)
        if args.only and name not in args.only:
            continue
        without = measure(entries, tuple(r for r in READERS if r is not reader))
        changed = sorted(n for n, row in without.entries.items() if row != full.entries[n])
        print(f"{name:20} {delta_text(full, without)}; entries: {', '.join(changed) or '-'}")
        sys.stdout.flush()
        rows[name] = {
            "right": without.right,
            "wrong": without.wrong,
            "missed": without.missed,
            "changed": {n: [full.entries[n], without.entries[n]] for n in changed},
        }
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
