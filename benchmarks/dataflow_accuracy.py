"""How right is inferred data flow? Measured against Execution Traces (exact tensor ids).

    python benchmarks/dataflow_accuracy.py [CORPUS_DIR] [--json OUT] [--markdown]

For each `<name>.pt.trace.json.gz` + `<name>.et.json.gz` pair of the corpus
(`fixtures/record_corpus.py`):

- **edges**: the exact producer -> consumer edges between semantic ops, from tensor ids
  (`execution_trace.tensor_edges`), against the inferred ones (`trace.dataflow`), over the
  ops the ET pairs with (the others have no ground truth). An edge is a (producer,
  consumer) pair: precision = inferred edges that are exact / inferred edges, recall =
  exact edges inferred / exact edges.
- **findings**: the fusion rules (TQ101-TQ110) run once on inferred and once
  on exact data flow (edges into ET-paired ops replaced by tensor-id ones, `dataflow(...,
  execution_trace=...)`). A finding is its rule and its set of ops; precision = inferred
  findings the exact run also makes / inferred findings, recall = exact findings the
  inferred run also makes / exact findings.

Prints one row per entry and the totals (micro-averaged: counts summed over the corpus),
then one row per fusion rule (its findings' precision and recall over the corpus).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

import traceq
from traceq.relations.dataflow import dataflow
from traceq.relations.dataflow.execution_trace import ground_truth, load_execution_trace
from traceq.rules.config import Config
from traceq.rules.engine import run

FUSION_RULES = (
    "TQ101", "TQ102", "TQ103", "TQ104", "TQ105", "TQ106", "TQ107", "TQ108", "TQ109", "TQ110"
)  # fmt: skip
DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"


@dataclass
class Score:
    """Counts for one entry (or the corpus): true positives, inferred, exact."""

    name: str
    edges_tp: int = 0
    edges_inferred: int = 0
    edges_exact: int = 0
    findings_tp_inferred: int = 0  # inferred findings the exact run also makes
    findings_tp_exact: int = 0  # exact findings the inferred run also makes
    findings_inferred: int = 0
    findings_exact: int = 0

    def add(self, other: Score) -> None:
        for field in self.__dataclass_fields__:
            if field != "name":
                setattr(self, field, getattr(self, field) + getattr(other, field))

    @staticmethod
    def ratio(num: int, den: int) -> float | None:
        return num / den if den else None

    def row(self) -> dict[str, float | int | str | None]:
        return {
            **asdict(self),
            "edge_precision": self.ratio(self.edges_tp, self.edges_inferred),
            "edge_recall": self.ratio(self.edges_tp, self.edges_exact),
            "finding_precision": self.ratio(self.findings_tp_inferred, self.findings_inferred),
            "finding_recall": self.ratio(self.findings_tp_exact, self.findings_exact),
        }


def pairs(corpus: Path) -> list[tuple[str, Path, Path]]:
    """(name, kineto, et) for every entry with both files, by name."""
    found = []
    for kineto in sorted(corpus.glob("*.pt.trace.json.gz")):
        name = kineto.name.removesuffix(".pt.trace.json.gz")
        et = corpus / f"{name}.et.json.gz"
        if et.is_file():
            found.append((name, kineto, et))
    return found


def edge_sets(trace: traceq.Trace, et: pl.DataFrame) -> tuple[set, set]:
    """(inferred, exact) (producer, consumer) pairs into the ops the ET pairs with."""
    exact, matched = ground_truth(trace, et, trace.dataflow_ops)
    inferred = trace.dataflow.filter(pl.col("consumer").is_in(matched.implode()))
    key = ["producer", "consumer"]
    return (
        set(inferred.select(key).unique().iter_rows()),
        set(exact.select(key).unique().iter_rows()),
    )


def findings(trace: traceq.Trace) -> set[tuple[str, frozenset[int]]]:
    """The fusion rules' findings on `trace`'s data flow, as (rule, ops)."""
    analysis = run(trace, Config(select=list(FUSION_RULES)))
    return {(f.rule, frozenset(f.ops)) for f in analysis.findings}


def exact_findings(kineto: Path, et: pl.DataFrame) -> set[tuple[str, frozenset[int]]]:
    """`findings` on a fresh load of the trace whose data flow is the ET's."""
    trace = traceq.load(kineto)
    trace.__dict__["dataflow"] = dataflow(trace, trace.dataflow_ops, execution_trace=et)
    return findings(trace)


def score(name: str, kineto: Path, et_path: Path) -> tuple[Score, dict]:
    trace = traceq.load(kineto, execution_trace=False)  # inferred: what is measured
    et = load_execution_trace(et_path)
    inferred, exact = edge_sets(trace, et)
    got, truth = findings(trace), exact_findings(kineto, et)
    result = Score(
        name,
        edges_tp=len(inferred & exact),
        edges_inferred=len(inferred),
        edges_exact=len(exact),
        findings_tp_inferred=len(got & truth),
        findings_tp_exact=len(truth & got),
        findings_inferred=len(got),
        findings_exact=len(truth),
    )
    by_rule = {
        rule: {
            "inferred": sum(r == rule for r, _ in got),
            "exact": sum(r == rule for r, _ in truth),
            "agree": sum(r == rule for r, _ in got & truth),
        }
        for rule in FUSION_RULES
    }
    return result, by_rule


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def markdown(rows: list[dict]) -> str:
    lines = [
        "| entry | exact edges | inferred | edge precision | edge recall "
        "| findings (exact / inferred) | finding precision | finding recall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['edges_exact']} | {r['edges_inferred']} "
            f"| {_pct(r['edge_precision'])} | {_pct(r['edge_recall'])} "
            f"| {r['findings_exact']} / {r['findings_inferred']} "
            f"| {_pct(r['finding_precision'])} | {_pct(r['finding_recall'])} |"
        )
    return "\n".join(lines)


def rule_rows(rules: dict[str, dict[str, dict[str, int]]]) -> list[dict]:
    """Per fusion rule over the corpus: findings on exact and on inferred data flow, those
    both make, and precision / recall (micro-averaged like the totals)."""
    rows = []
    for rule in FUSION_RULES:
        counts = {
            k: sum(entry[rule][k] for entry in rules.values())
            for k in ("exact", "inferred", "agree")
        }
        rows.append(
            {
                "rule": rule,
                **counts,
                "precision": Score.ratio(counts["agree"], counts["inferred"]),
                "recall": Score.ratio(counts["agree"], counts["exact"]),
            }
        )
    return rows


def rule_markdown(rows: list[dict]) -> str:
    lines = [
        "| rule | findings on ET data flow | inferred | agree | precision | recall |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rule']} | {r['exact']} | {r['inferred']} | {r['agree']} "
            f"| {_pct(r['precision'])} | {_pct(r['recall'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    entries = pairs(args.corpus)
    if not entries:
        print(
            f"traceq: error: no <name>.pt.trace.json.gz + .et.json.gz in {args.corpus}",
            file=sys.stderr,
        )
        return 2
    total = Score("all")
    rows, rules = [], {}
    for name, kineto, et in entries:
        result, by_rule = score(name, kineto, et)
        total.add(result)
        rows.append(result.row())
        rules[name] = by_rule
    rows.append(total.row())
    per_rule = rule_rows(rules)
    if args.json:
        args.json.write_text(
            json.dumps({"rows": rows, "rules": rules, "per_rule": per_rule}, indent=1) + "\n"
        )
    if args.markdown:
        print(markdown(rows))
        print()
        print(rule_markdown(per_rule))
    else:
        for r in rows:
            print(
                f"{r['name']:16} edges {r['edges_tp']:5}/{r['edges_inferred']:5} inferred, "
                f"{r['edges_exact']:5} exact: P {_pct(r['edge_precision'])} "
                f"R {_pct(r['edge_recall'])} | findings {r['findings_inferred']:3} inferred, "
                f"{r['findings_exact']:3} exact: P {_pct(r['finding_precision'])} "
                f"R {_pct(r['finding_recall'])}"
            )
        for r in per_rule:
            print(
                f"{r['rule']:16} findings {r['inferred']:3} inferred, {r['exact']:3} exact, "
                f"{r['agree']:3} agree: P {_pct(r['precision'])} R {_pct(r['recall'])}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
