"""What every fusion finding (TQ101-TQ110) must satisfy, on every trace there is.

- A finding never holds ops of two outermost calls of one module (two forward calls of a
  model in a `generate` loop or a denoising loop): no kernel can fuse across them. Calls of
  two modules the script chains itself (`x = layer_1(layer_0(x))`: a residual add ending
  one layer, the norm starting the next) may be fused, as fused add+norm kernels do.
- A TQ104 chain holds no copy-engine transfer (a `to("cpu")` whose kernel is a memcpy is
  TQ203's) and is not made of casts alone.

Checked on the fixtures, the Execution Trace corpus and every Kineto trace in
../shared/traces (`kineto_case`; skipped when it is absent, large ones marked slow).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import TraceCase
from test_rules_fusion import op, ops_frame

import traceq
from traceq.relations.dataflow import module_calls
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.tq104_pointwise_chain import TRANSFER, pointwise_chains

FUSION = tuple(f"TQ1{n:02d}" for n in range(1, 11))
CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"


def check_invariants(trace: traceq.Trace) -> int:
    """Assert the invariants on `trace`; return how many fusion findings were checked."""
    findings = run(trace, Config(select=list(FUSION))).findings
    if not findings:
        return 0
    ops = trace.dataflow_ops
    tops = dict(module_calls(trace, ops).select("event", "_top").iter_rows())
    roots = dict(ops.select("event", pl.col("module").str.split(".").list.first()).iter_rows())
    kernels = dict(ops.select("event", "kernel_names").iter_rows())
    names = dict(ops.select("event", "name").iter_rows())
    for f in findings:
        calls = {tops[e]: roots.get(e) for e in f.ops if tops.get(e) is not None}
        modules = list(calls.values())
        assert len(set(modules)) == len(modules), (
            f"{f.rule} spans calls {sorted(calls)} of one module {modules}: {f.message}"
        )
        if f.rule == "TQ104":
            transfers = [k for e in f.ops for k in kernels.get(e) or [] if _is_transfer(k)]
            assert not transfers, f"TQ104 chain holds transfers {transfers}: {f.message}"
            casts = [names[e].removeprefix("aten::") in ("to", "_to_copy") for e in f.ops]
            assert not all(casts), f"TQ104 chain of casts only: {f.message}"
    return len(findings)


def _is_transfer(kernel: str) -> bool:
    return pl.select(pl.lit(kernel).str.contains(TRANSFER)).item()


def test_invariants_on_every_kineto_trace(kineto_case: TraceCase) -> None:
    check_invariants(kineto_case.trace)


@pytest.mark.parametrize(
    "path",
    sorted(CORPUS.glob("*.pt.trace.json.gz")) or [None],
    ids=lambda p: p.name.removesuffix(".pt.trace.json.gz") if p else "corpus-absent",
)
def test_invariants_on_the_corpus(path: Path | None) -> None:
    if path is None:
        pytest.skip("fixtures/corpus is not recorded")
    check_invariants(traceq.load(path))


def test_the_corpus_has_findings_to_check() -> None:
    """The corpus check above is not vacuous: its traces hold fusion findings, including
    ones in traces with several forward calls."""
    if not (CORPUS / "bert_ensemble.pt.trace.json.gz").is_file():
        pytest.skip("fixtures/corpus is not recorded")
    assert check_invariants(_inferred("bert_ensemble")) >= 10
    # 8: TQ102 and TQ105 per call (generate's integer token bookkeeping is no TQ104 chain)
    assert check_invariants(_inferred("gpt2_generate")) >= 8


# -- class 3: transfers are not compute -----------------------------------------------------


def _chain_frame(rows: list[dict[str, Any]], kernels: dict[int, list[str]]) -> pl.DataFrame:
    frame = ops_frame(rows).with_columns(
        pl.col("event")
        .replace_strict(kernels, default=[], return_dtype=pl.List(pl.String))
        .alias("kernel_names")
    )
    return frame.with_columns(pl.col("kernel_names").list.len().cast(pl.Int64).alias("n_kernels"))


def _edges(links: list[tuple[int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [{"producer": p, "consumer": c, "input_index": 0, "confidence": 0.9} for p, c in links],
        schema={
            "producer": pl.Int64,
            "consumer": pl.Int64,
            "input_index": pl.Int64,
            "confidence": pl.Float64,
        },
    )


def test_memcpy_casts_never_join_a_pointwise_chain() -> None:
    """`x.to("cpu")` three times in a row (each a Memcpy DtoH) was a 3-op TQ104 chain; and
    `mul -> to("cpu") -> add` was one chain of 3 through the copy."""
    shape = [64, 64]
    memcpy = ["Memcpy DtoH (Device -> Pageable)"]
    rows = [op(e, "aten::to", [shape], shape) for e in (1, 2, 3)]
    rows += [
        op(4, "aten::mul", [shape, []], shape),
        op(5, "aten::to", [shape], shape),
        op(6, "aten::add", [shape, []], shape),
    ]
    kernels = {1: memcpy, 2: memcpy, 3: memcpy, 4: ["mul_kernel"], 5: memcpy, 6: ["add_kernel"]}
    frame = _chain_frame(rows, kernels)
    edges = _edges([(1, 2), (2, 3), (4, 5), (5, 6)])
    chains = pointwise_chains(frame, edges, pl.Series([], dtype=pl.Int64))
    assert chains.height == 0


def test_casts_alone_are_no_chain_but_a_cast_inside_one_counts() -> None:
    shape = [64, 64]
    cast = ["void at::native::elementwise_kernel<copy_kernel>"]
    rows = [op(e, "aten::to", [shape], shape) for e in (1, 2, 3)]
    rows += [
        op(4, "aten::mul", [shape, []], shape),
        op(5, "aten::to", [shape], shape),
        op(6, "aten::add", [shape, []], shape),
    ]
    kernels = {1: cast, 2: cast, 3: cast, 4: ["mul_kernel"], 5: cast, 6: ["add_kernel"]}
    frame = _chain_frame(rows, kernels)
    edges = _edges([(1, 2), (2, 3), (4, 5), (5, 6)])
    chains = pointwise_chains(frame, edges, pl.Series([], dtype=pl.Int64))
    assert chains["ops"].to_list() == [[4, 5, 6]]


def _inferred(name: str) -> traceq.Trace:
    """A corpus trace with inferred data flow: its ET beside it would make it exact."""
    return traceq.load(CORPUS / f"{name}.pt.trace.json.gz", execution_trace=False)
