"""TQ110 conv-bias-batchnorm: a convolution with a bias whose output goes straight into batch
norm, which subtracts the per-channel mean and so cancels the bias.

PyTorch's pattern matcher (`Conv2dBiasFollowedByBatchNorm2dPattern`) looks for an
`nn.Module: Conv2d` whose `aten::conv2d` has a bias and whose next sibling module is a
`BatchNorm2d`; traceq follows the data instead (`fusion_edges`): the batch norm reads the
convolution's output, so a `Conv2d` applied through a functional call, or followed by the
norm in another module, is found too, and a biased conv whose output goes elsewhere is not.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.perf.traffic import numel
from traceq.rules.base import Context, rule
from traceq.rules.details import details, located, mib, shape_text
from traceq.rules.finding import Finding
from traceq.rules.op_classes import ATEN_BASE
from traceq.rules.op_groups import fusion_edges, fusion_ops

CONVS = ("conv1d", "conv2d", "conv3d", "convolution", "_convolution", "cudnn_convolution")
NORMS = ("batch_norm", "native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm")
BIAS_INDEX = 2

DEFAULTS = {"min_confidence": 0.4}


def _has_bias() -> pl.Expr:
    shape = pl.col("shapes").list.get(BIAS_INDEX, null_on_oob=True)
    kind = pl.col("input_types").list.get(BIAS_INDEX, null_on_oob=True)
    return (shape.list.len() > 0).fill_null(False) & kind.is_not_null() & (kind != "")


@rule("TQ110", "conv-bias-batchnorm", "info", defaults=DEFAULTS)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds convolutions with a bias (`nn.Conv2d(..., bias=True)`, the default) whose output
    is read by a batch norm. The same pattern as PyTorch's profiler pattern matcher's
    `Conv2dBiasFollowedByBatchNorm2dPattern`, found on data flow rather than module order.

    ## Why is this bad?
    Batch norm subtracts each channel's mean, so a per-channel bias added before it cancels
    out: the bias is a parameter that learns nothing, an extra read of the conv's output
    where the library applies it separately, and optimizer work in training.

    Estimated saving: one read and write of the conv's output at the device's bandwidth
    (the bias add, where it is not fused into the conv), capped at the conv's measured time.

    ## Example
    ```python
    self.conv = nn.Conv2d(64, 128, 3, padding=1)
    self.bn = nn.BatchNorm2d(128)
    ```

    ## Use instead
    ```python
    self.conv = nn.Conv2d(64, 128, 3, padding=1, bias=False)
    self.bn = nn.BatchNorm2d(128)
    # for inference, fold the norm into the conv:
    # torch.fx.experimental.optimization.fuse(model) or torch.compile (freezing)
    ```

    ## Options
    - `min_confidence` (0.4): weakest data-flow edge accepted.

    ## References
    - PyTorch performance tuning guide, "Disable bias for convolutions directly followed by
      a batch norm": https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    - `torch/profiler/_pattern_matcher.py`, `Conv2dBiasFollowedByBatchNorm2dPattern`
    """
    ops = fusion_ops(ctx)
    edges = fusion_edges(ctx).filter(
        (pl.col("confidence") >= ctx.options["min_confidence"]) & (pl.col("input_index") == 0)
    )
    convs = ops.filter(ATEN_BASE.is_in(list(CONVS)) & _has_bias()).select(
        pl.col("event").alias("producer"), numel(pl.col("output_shape")).alias("_numel")
    )
    norms = ops.filter(ATEN_BASE.is_in(list(NORMS))).select(pl.col("event").alias("consumer"))
    pairs = edges.join(convs, on="producer").join(norms, on="consumer").sort("producer")
    pairs = pairs.unique("producer", keep="first", maintain_order=True)
    rows = details(ops, [*pairs["producer"].to_list(), *pairs["consumer"].to_list()])
    for pair in pairs.iter_rows(named=True):
        conv, norm = rows[pair["producer"]], rows[pair["consumer"]]
        out_bytes = (pair["_numel"] or 0) * (conv["itemsize"] or 4)
        saving = min(ctx.device.transfer_us(2 * out_bytes), conv["time_ns"] / 1000)
        where = located(ctx, [conv, norm])
        where["module"] = conv["module"] or where["module"]
        where["evidence"].update(
            {
                "conv": conv["event"],
                "norm": norm["event"],
                "bias_shape": (conv["shapes"] or [[]])[BIAS_INDEX],
                "output_bytes": out_bytes,
            }
        )
        yield ctx.finding(
            message=(
                f"`{conv['name']}` adds a bias that `{norm['name']}` cancels "
                f"(output {shape_text(conv['output_shape'])})"
            ),
            shapes=[s for s in (conv["shapes"] or []) if s],
            est_saving_us=saving,
            saving_model=(
                f"one pass over the conv output ({mib(2 * out_bytes)} read + written) at "
                f"{ctx.device.bandwidth_text}, capped at the conv's {conv['time_ns'] / 1000:.2f} µs"
            ),
            fix=(
                "Create the convolution with `bias=False`: the batch norm's mean subtraction "
                "cancels it (PyTorch tuning guide). For inference, fold the norm into the conv "
                "(`torch.fx.experimental.optimization.fuse`, or torch.compile with freezing)."
            ),
            **where,
        )


RULE = check
