"""What every report says once about GPU work no ordinary launch explains: the share of GPU
time CUDA/HIP graphs replayed and how much of it has the op that launched it
(`relations.graph_replay`), and the kernels with no launch at all, with why where known.

`facts` computes them (plain JSON types; the `graphs` and `without_launch` of `traceq
info`, `reports.summary`); `lines` words them, as plain text: each renderer escapes them
for its output (`reports.safe_text`, `html.escape`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from traceq.relations.graph_replay import kernels_without_launch, replay_summary

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace


def facts(trace: LoadedTrace) -> dict[str, Any]:
    """`graphs` (`replay_summary`, with `replayed_ops`: the ops copied from the capture
    into `trace.ops`), `without_launch` (`kernels_without_launch`); each empty when there
    is nothing to say."""
    graphs = replay_summary(trace)
    if graphs:
        replayed = "replayed" in trace.ops.columns  # only graph replays attributed have it
        ops = trace.select("ops", "replayed").filter(pl.col("replayed")) if replayed else None
        graphs["replayed_ops"] = ops.height if ops is not None else 0
    return {"graphs": graphs, "without_launch": kernels_without_launch(trace)}


def lines(found: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) pairs: the graph share and its attribution, by method, the captures
    read; the kernels without a launch, by reason. Empty when neither applies."""
    rows = []
    graphs = found.get("graphs") or {}
    if graphs:
        copied = graphs.get("replayed_ops")
        ops = f"; {copied:,} replayed ops from the capture" if copied else ""
        rows.append(
            (
                "graph replays",
                f"{_count(graphs['graph_launches'], 'launch', 'launches')} replayed "
                f"{graphs['replayed_kernels']:,} "
                f"kernels, {graphs['replayed_us']:,.1f} µs ({graphs['replayed_share']:.1%} of "
                f"GPU time); ops attributed to {graphs['attributed_share']:.1%} of it{ops}",
            )
        )
        methods = ", ".join(
            f"{method} {m['share']:.1%} ({m['kernels']:,} kernels"
            + (", replayed, ops unknown)" if method == "launch" else ")")
            for method, m in graphs["by_method"].items()
        )
        rows.append(("  attribution by method", methods))
        captures = ", ".join(
            f"{c['source']} (batch {c['batch_size'] or '?'}, {c['mode'] or '?'})"
            for c in graphs.get("captures") or []
        )
        rows.append(
            ("  capture traces", captures or "none: replayed kernels have no op (--capture)")
        )
    orphans = found.get("without_launch") or {}
    if orphans:
        reasons = "; ".join(
            f"{reason}: {r['kernels']:,} ({r['us']:,.1f} µs)"
            for reason, r in orphans["reasons"].items()
        )
        rows.append(
            (
                "without launch",
                f"{orphans['kernels']:,} kernels, {orphans['us']:,.1f} µs of GPU time have no "
                f"launch (no op, no critical-path edge from the CPU) - {reasons}",
            )
        )
    return rows


def _count(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"
