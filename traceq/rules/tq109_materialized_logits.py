"""TQ109 materialized-logits: a GEMM writes [tokens, vocab] logits, a cast may copy them to
fp32, and a separate `cross_entropy` / `log_softmax` / `nll_loss` reads them.

Found on data flow (`idioms.walk`, as TQ106): from each loss op's input back through casts
(views bypassed) to the GEMM that wrote the logits, whose last dimension is a vocabulary:
at least `min_vocab`, or the row count of an embedding table the trace looks up (a tied
LM head of a small vocabulary). The backward ops of the same loss (`nll_loss_backward`,
`_log_softmax_backward_data` writing a [tokens, vocab] gradient in the same step) belong to
the finding when the step holds one such loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceq.perf.traffic import ITEMSIZE, numel
from traceq.rules.base import Context, rule
from traceq.rules.details import details, located, mib, shape_text
from traceq.rules.finding import Finding
from traceq.rules.idioms import computes, model_saving, walk
from traceq.rules.op_classes import ATEN_BASE
from traceq.rules.op_groups import fusion_edges, fusion_ops

LOSSES = (
    "cross_entropy_loss",
    "cross_entropy",
    "log_softmax",
    "_log_softmax",
    "nll_loss",
    "nll_loss_nd",
)
#: Losses that compute log-probabilities of the logits (`nll_loss` reads them).
LOG_PROBS = ("cross_entropy_loss", "cross_entropy", "log_softmax", "_log_softmax")
LOSS_BACKWARD = ("nll_loss_backward", "_log_softmax_backward_data")
CASTS = ("to", "_to_copy", "type_as", "float", "contiguous", "clone")
MAY_ALIAS = ("to", "type_as", "float", "contiguous")

DEFAULTS = {"min_vocab": 8192, "min_confidence": 0.4, "min_saving_us": 0.0}


def logits_sites(
    ops: pl.DataFrame, edges: pl.DataFrame, min_vocab: int, min_confidence: float = 0.0
) -> pl.DataFrame:
    """One row per loss reading materialized logits: `loss`, `gemm`, `casts` (data order),
    `reads` (input index per hop, loss side first), `logits_shape`, `vocab`."""
    trusted = edges.filter(pl.col("confidence") >= min_confidence)
    base = ATEN_BASE
    losses = ops.filter(base.is_in(list(LOSSES))).select(
        pl.col("event").alias("start"),
        numel(pl.col("shapes").list.first()).alias("size"),
    )
    tables = ops.filter(base == "embedding").select(
        pl.col("shapes").list.first().list.first().alias("rows")
    )
    rows = set(tables["rows"].drop_nulls().to_list())
    vocab = pl.col("output_shape").list.last()
    gemms = ops.filter(
        (pl.col("role") == "gemm") & ((vocab >= min_vocab) | vocab.is_in(list(rows)))
    ).select("event", pl.col("output_shape").alias("logits_shape"), vocab.alias("vocab"))
    found = walk(losses, ops, trusted, CASTS, gemms.select("event"), 3)
    return (
        found.join(gemms, left_on="target", right_on="event")
        .select(
            pl.col("start").alias("loss"),
            pl.col("target").alias("gemm"),
            pl.col("path").list.reverse().alias("casts"),
            "reads",
            "logits_shape",
            "vocab",
        )
        .sort("loss")
    )


def _itemsize(row: dict[str, Any], index: int) -> int:
    types = row.get("input_types") or []
    dtype = types[index] if 0 <= index < len(types) else row["dtype"]
    return ITEMSIZE.get(dtype or "", 4)


@rule("TQ109", "materialized-logits", "warning", defaults=DEFAULTS, explains=True)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds a language-model loss computed on materialized logits: a GEMM (the LM head)
    writes a [tokens, vocab] tensor, a cast may copy it to fp32, and a separate
    `cross_entropy` / `log_softmax` / `nll_loss` reads it, and in training writes a
    gradient of the same size. The vocabulary is the GEMM's last dimension: at least
    `min_vocab`, or the row count of an embedding table in the trace.

    ## Why is this bad?
    The logits are the largest activation of an LM step: 8 k tokens × 128 k vocabulary is
    2 GiB in bf16, 4 GiB more as the fp32 copy the loss upcasts to, and again for the
    log-probabilities and the gradient. They bound the batch size, and each pass over them
    is pure memory traffic. A fused linear + cross-entropy kernel computes the loss and
    the gradient chunk by chunk and never holds them.

    Estimated saving: the bytes of the logits, their fp32 copy, the log-probabilities and
    the logits' gradient (from the ops' shapes and dtypes), each written and read once, at
    the bandwidth the removed ops' own kernels achieved
    (`traceq.perf.savings.fusion_saving`), plus one launch per removed op, capped at the measured
    time of the cast, loss and loss-backward ops. The memory they hold is in
    `evidence.logits_bytes` / `evidence.materialized_bytes`.

    ## Example
    ```python
    logits = self.lm_head(hidden)                # [tokens, vocab], bf16
    loss = F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))
    ```

    ## Use instead
    ```python
    # liger-kernel >= 0.3
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    fused = LigerFusedLinearCrossEntropyLoss()
    loss = fused(self.lm_head.weight, hidden.view(-1, d), labels.view(-1))
    # transformers models: liger_kernel.transformers.apply_liger_kernel_to_llama(
    #     fused_linear_cross_entropy=True)  (or AutoLigerKernelForCausalLM)
    ```
    Without Liger, compute the head and the loss over chunks of tokens under
    `torch.utils.checkpoint` (chunked cross-entropy), or `torch.compile` the head and the
    loss: Inductor fuses the upcast into `log_softmax`, so the fp32 copy goes (the logits
    stay).

    ## Options
    - `min_vocab` (8192): smallest last dimension taken for a vocabulary.
    - `min_confidence` (0.4): weakest data-flow edge accepted.
    - `min_saving_us` (0): leave out findings that save less.

    ## References
    - Hsu et al., "Liger Kernel: Efficient Triton Kernels for LLM Training" (2024):
      https://arxiv.org/abs/2410.10989
    - Wijmans et al., "Cut Your Losses in Large-Vocabulary Language Models" (2024):
      https://arxiv.org/abs/2411.09009
    """
    ops = fusion_ops(ctx)
    sites = logits_sites(
        ops, fusion_edges(ctx), ctx.options["min_vocab"], ctx.options["min_confidence"]
    )
    if sites.height == 0:
        return
    base = ATEN_BASE
    backward = ops.filter(base.is_in(list(LOSS_BACKWARD))).select(
        "event", "step", numel(pl.col("output_shape")).alias("_numel")
    )
    events = sites.select(pl.concat_list("loss", "gemm", "casts").alias("e"))["e"].explode()
    events = [*events.to_list(), *backward["event"].to_list()]
    rows = details(ops, events)
    for r in (
        ops.filter(pl.col("event").is_in(events))
        .select("event", "input_types")
        .iter_rows(named=True)
    ):
        rows[r["event"]]["input_types"] = r["input_types"]
    computing = computes(ctx, events, MAY_ALIAS)
    per_step: dict[Any, int] = {}
    for site in sites.iter_rows(named=True):
        step = rows[site["loss"]]["step"]
        per_step[step] = per_step.get(step, 0) + 1
    for site in sites.iter_rows(named=True):
        gemm, loss = rows[site["gemm"]], rows[site["loss"]]
        casts = [rows[e] for e in site["casts"] if e in computing]
        size = 1
        for d in site["logits_shape"]:
            size *= d
        reads = site["reads"][::-1]  # data order: the first cast (or the loss) reads the GEMM
        readers = [*(rows[e] for e in site["casts"]), loss]
        logits_bytes = size * _itemsize(readers[0], reads[0])
        # cast i's output is read by the next op of the chain
        copies = [
            size * _itemsize(readers[i + 1], reads[i + 1])
            for i, cast in enumerate(site["casts"])
            if cast in computing and i + 1 < len(reads)
        ]
        writes_log_probs = loss["name"].removeprefix("aten::") in LOG_PROBS
        log_probs = size * 4 if writes_log_probs else 0
        grads = []
        if per_step[loss["step"]] == 1:
            grads = [
                rows[e]
                for e in backward.filter(
                    (pl.col("step").eq_missing(loss["step"])) & (pl.col("_numel") == size)
                )["event"].to_list()
            ]
        grad_bytes = sum(size * 4 for _ in grads)
        materialized = logits_bytes + sum(copies) + log_probs + grad_bytes
        removed = [*casts, loss, *grads]
        removed_us = sum(r["time_ns"] for r in removed) / 1000
        launches = len(removed)
        saving, model = model_saving(
            ctx, [r["event"] for r in removed], removed_us, 2 * materialized, launches
        )
        if saving < ctx.options["min_saving_us"]:
            continue
        where = located(ctx, [gemm, *casts, loss, *grads])
        where["module"] = loss["module"] or gemm["module"]
        where["evidence"].update(
            {
                "gemm": site["gemm"],
                "loss": site["loss"],
                "casts": [r["event"] for r in casts],
                "backward_ops": [r["event"] for r in grads],
                "logits_shape": site["logits_shape"],
                "vocab": site["vocab"],
                "logits_bytes": logits_bytes,
                "fp32_copy_bytes": sum(copies),
                "materialized_bytes": materialized,
                "removed_us": round(removed_us, 3),
                "removed_launches": launches,
            }
        )
        upcast = f", an fp32 copy ({mib(sum(copies))})" if copies else ""
        yield ctx.finding(
            message=(
                f"`{gemm['name']}` materializes {shape_text(site['logits_shape'])} logits "
                f"({mib(logits_bytes)}){upcast} for `{loss['name']}`"
                + (f" and its backward ({mib(grad_bytes)})" if grads else "")
                + f": {mib(materialized)} held for the loss"
            ),
            shapes=[list(site["logits_shape"])],
            est_saving_us=saving,
            saving_model=f"{mib(materialized)} written + read by the cast/loss ops: {model}",
            fix=(
                "Fuse the LM head with the loss: liger-kernel ≥ 0.3 "
                "`LigerFusedLinearCrossEntropyLoss()(lm_head.weight, hidden.view(-1, d), "
                "labels.view(-1))` (for transformers models "
                "`apply_liger_kernel_to_<model>(fused_linear_cross_entropy=True)`); or "
                "compute head + loss over chunks of tokens (chunked cross-entropy under "
                "`torch.utils.checkpoint`); or `torch.compile` the head and loss, which fuses "
                f"the upcast into log_softmax. Saves holding {mib(materialized)} of logits, "
                "copies and gradients."
            ),
            **where,
        )


RULE = check
