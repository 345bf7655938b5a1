"""TQ107 unfused-norm: RMSNorm and LayerNorm written out as pointwise ops and reductions,
and a residual `add` run as its own kernel right before a norm.

Matched on data flow with casts stepped over (`idioms.through_casts`):

- the statistic: `pow(d, 2)` (or `square`) read by a `mean` over the last dim with
  `keepdim` ([..., H] -> [..., 1]);
- the inverse: `rsqrt` (or `sqrt`) of it, through an optional `add` of a scalar (eps);
- the normalization: a `mul` by the rsqrt (or `div` by the sqrt) whose other input is `d`
  itself, on `d`'s shape;
- LayerNorm when `d` is `sub(x, mean(x))` of a last-dim, keepdim `mean` of the same `x`;
  RMSNorm otherwise (`x` is `d`);
- the affine tail, optional: a `mul` by a 1-D [H] weight, then an `add` of a 1-D [H] bias;
  casts before or after (HF's `.to(torch.float32)` ... `.to(input_dtype)`) belong to it.

A residual `add` (two full-shape tensor inputs) whose output is the norm's `x` joins the
finding (a fused add+norm reads both, writes the sum and the norm). So does one before a
norm op that is already fused (`layer_norm`, `rms_norm`): that is the finding's second
variant, "add + norm as two kernels".

Every op the finding holds is explained (`traceq.rules.explained`): TQ104 no longer reports
the norm's fragments (`add → to → pow`, `mul → to → mul`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.details import details, located, mib, shape_text
from traceq.rules.finding import Finding
from traceq.rules.idioms import (
    byte_rows,
    dtype_text,
    op_bytes,
    output_itemsize,
    site_saving,
    tensor_bytes,
    through_casts,
)
from traceq.rules.op_classes import ATEN_BASE
from traceq.rules.op_groups import fusion_edges, fusion_ops

#: Ops that are a whole norm already (one kernel, or one op the rule does not look into).
FUSED_NORMS = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm"}

SCHEMA = {
    "norm": pl.String,
    "variant": pl.String,
    "x": pl.Int64,
    "residual_add": pl.Int64,
    "residual_read_later": pl.Boolean,
    "ops": pl.List(pl.Int64),
    "out": pl.Int64,
    "weight": pl.Boolean,
    "bias": pl.Boolean,
    "confidence": pl.Float64,
}


def _last_dim_mean(ops: pl.DataFrame) -> pl.DataFrame:
    """`mean` ops over the last dim with keepdim: [..., H] -> [..., 1]."""
    first = pl.col("shapes").list.first()
    out = pl.col("output_shape")
    keep = (
        (ATEN_BASE == "mean")
        & (out.list.last() == 1)
        & (out.list.len() == first.list.len())
        & (out.list.len() >= 1)
        & (first.list.last() > 1)
        & (out.list.head(out.list.len() - 1) == first.list.head(first.list.len() - 1))
    )
    return ops.filter(keep.fill_null(False)).select("event")


def _scalar_is(values: pl.Expr, index: int, targets: tuple[str, ...]) -> pl.Expr:
    return values.list.get(index, null_on_oob=True).is_in(list(targets)).fill_null(False)


def written_out_norms(
    ops: pl.DataFrame, edges: pl.DataFrame, min_confidence: float = 0.0
) -> pl.DataFrame:
    """One row per written-out norm (`SCHEMA`): `norm` ("RMSNorm" / "LayerNorm"), `x` (the
    op whose output is normalized, casts stepped over; null for a graph input), `ops` (the
    norm's ops and casts, in event order), `out` (the op whose result leaves it),
    `weight` / `bias` (an affine tail), `confidence` (weakest edge used)."""
    trusted = edges.filter(pl.col("confidence") >= min_confidence)
    flow = through_casts(ops, trusted)
    base = ATEN_BASE
    concrete = pl.col("concrete_inputs")
    two_inputs = pl.col("tensor_inputs") == 2

    means = _last_dim_mean(ops)
    squares = ops.filter(
        ((base == "pow") & _scalar_is(concrete, 1, ("2", "2.0"))) | (base == "square")
    ).select("event")
    eps_adds = ops.filter((base == "add") & (pl.col("tensor_inputs") == 1)).select("event")
    inverses = ops.filter(base.is_in(["rsqrt", "sqrt"])).select(
        "event", (base == "rsqrt").alias("_rsqrt")
    )
    scales = ops.filter(base.is_in(["mul", "div"]) & two_inputs).select(
        "event", (base == "mul").alias("_mul"), pl.col("output_shape").alias("_d_shape")
    )

    def step(frame: pl.DataFrame, at: str, targets: pl.DataFrame, to: str) -> pl.DataFrame:
        """Rows of `frame` extended by each `targets` op reading `at` (casts stepped over)."""
        hop = flow.join(targets.select(pl.col("event").alias("consumer")), on="consumer").select(
            pl.col("producer").alias(at),
            pl.col("consumer").alias(to),
            pl.col("casts").alias(f"_{to}_casts"),
            pl.col("input_index").alias(f"_{to}_index"),
            pl.col("confidence").alias(f"_{to}_conf"),
        )
        return frame.join(hop, on=at)

    # d -> pow -> mean -> [add eps] -> rsqrt|sqrt
    stats = step(squares.select(pl.col("event").alias("sq")), "sq", means, "mean")
    with_eps = step(stats, "mean", eps_adds, "eps")
    no_eps = stats.with_columns(
        pl.col("mean").alias("eps"),
        pl.lit([], dtype=pl.List(pl.Int64)).alias("_eps_casts"),
        pl.lit(0, dtype=pl.Int64).alias("_eps_index"),
        pl.lit(1.0).alias("_eps_conf"),
    )
    inv_from_eps = step(with_eps, "eps", inverses, "inv")
    inv_from_mean = step(no_eps, "eps", inverses, "inv").with_columns(
        pl.lit(None, dtype=pl.Int64).alias("eps")
    )
    chains = pl.concat(
        [inv_from_eps, inv_from_mean.select(inv_from_eps.columns)], how="vertical_relaxed"
    ).join(inverses.rename({"event": "inv"}), on="inv")
    # rsqrt -> mul(d, rsqrt) or sqrt -> div(d, sqrt)
    scaled = step(chains, "inv", scales, "scale").join(
        scales.rename({"event": "scale"}), on="scale"
    )
    scaled = scaled.filter(
        pl.col("_rsqrt").eq(pl.col("_mul")) & (pl.col("_mul") | (pl.col("_scale_index") == 1))
    )
    # what pow squared, and what the scale multiplies: the same value (casts stepped over).
    # A graph input has no producer: no edge into pow, none into the scale's data input.
    sq_shape = ops.select(
        pl.col("event").alias("sq"), pl.col("shapes").list.first().alias("_sq_shape")
    )
    sq_input = flow.filter(pl.col("input_index") == 0).select(
        pl.col("consumer").alias("sq"),
        pl.col("producer").alias("d"),
        pl.col("casts").alias("_d_casts"),
        pl.col("confidence").alias("_d_conf"),
    )
    based = (
        scaled.join(sq_shape, on="sq")
        .filter(pl.col("_d_shape") == pl.col("_sq_shape"))
        .join(sq_input, on="sq", how="left")
    )
    others = (
        flow.join(
            based.select("scale", "_scale_index").unique(), left_on="consumer", right_on="scale"
        )
        .filter(pl.col("input_index") != pl.col("_scale_index"))
        .select(
            pl.col("consumer").alias("scale"),
            pl.col("producer").alias("d"),
            pl.col("casts").alias("_n_casts"),
            pl.col("confidence").alias("_n_conf"),
        )
    )
    matched = based.join(others, on=["scale", "d"])
    # no edge into the scale's data input (data flow missed it, or a graph input): the
    # statistic chain read into it is evidence enough
    unlinked = based.join(others.select("scale").unique(), on="scale", how="anti").with_columns(
        pl.lit([], dtype=pl.List(pl.Int64)).alias("_n_casts"),
        pl.lit(1.0).alias("_n_conf"),
    )
    found = pl.concat([matched, unlinked.select(matched.columns)], how="vertical_relaxed")
    if found.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    conf = pl.min_horizontal(
        "_mean_conf", "_eps_conf", "_inv_conf", "_scale_conf", "_d_conf", "_n_conf"
    )
    # x -> to(fp32) -> pow reads both as x and as the cast: x is the value, the cast the norm's
    found = (
        found.with_columns(conf.alias("confidence"))
        .sort(pl.col("_d_casts").list.len().fill_null(0), descending=True, maintain_order=True)
        .unique("scale", keep="first", maintain_order=True)
    )

    # LayerNorm: d = sub(x, mean(x)) (x a graph input: no edge into either)
    subs = ops.filter((base == "sub") & two_inputs).select(pl.col("event").alias("sub"))
    sub_x = flow.filter(pl.col("input_index") == 0).select(
        pl.col("consumer").alias("sub"),
        pl.col("producer").alias("x"),
        pl.col("casts").alias("_x_casts"),
    )
    sub_mean = flow.filter(pl.col("input_index") == 1).select(
        pl.col("consumer").alias("sub"),
        pl.col("producer").alias("mean0"),
        pl.col("casts").alias("_m_casts"),
    )
    mean_x = flow.filter(pl.col("input_index") == 0).select(
        pl.col("consumer").alias("mean0"), pl.col("producer").alias("_mean_x")
    )
    centred = (
        subs.join(sub_x, on="sub", how="left")
        .join(sub_mean, on="sub")
        .join(means.rename({"event": "mean0"}), on="mean0")
        .join(mean_x, on="mean0", how="left")
        .filter(pl.col("x").eq_missing(pl.col("_mean_x")))
        .drop("_mean_x")
        .unique("sub", keep="first")
    )
    # pow and the scale read the sub ...
    direct = (
        found.select("scale", "d")
        .join(centred, left_on="d", right_on="sub")
        .with_columns(pl.col("d").alias("sub"))
    )
    # ... or data flow linked them past it, to the sub's own input: the latest such sub
    # before pow is the one
    past = (
        found.select("scale", "d", "sq")
        .drop_nulls("d")
        .join(centred, left_on="d", right_on="x")
        .filter(pl.col("sub") < pl.col("sq"))
        .sort("sub")
        .unique("scale", keep="last")
        .with_columns(pl.col("d").alias("x"))
    )
    cols = ["scale", "sub", "mean0", "x", "_x_casts", "_m_casts"]
    layer = pl.concat([direct.select(cols), past.select(cols)]).unique("scale", keep="first")
    found = found.join(layer, on="scale", how="left").with_columns(
        pl.when(pl.col("mean0").is_not_null())
        .then(pl.lit("LayerNorm"))
        .otherwise(pl.lit("RMSNorm"))
        .alias("norm"),
    )
    # a cast with nothing before it (a graph input upcast: `x.to(torch.float32)`) is the
    # norm's own op, and the norm's input is the graph input
    cast_ops = ops.filter(pl.col("role") == "cast").select(pl.col("event").alias("d"))
    input_cast = pl.col("d").is_in(cast_ops["d"].implode()) & (pl.col("norm") == "RMSNorm")
    found = found.with_columns(
        pl.when(input_cast).then(pl.col("d")).alias("_input_cast"),
        pl.when(pl.col("norm") == "LayerNorm")
        .then(pl.col("x"))
        .when(input_cast)
        .then(pl.lit(None, dtype=pl.Int64))
        .otherwise(pl.col("d"))
        .alias("x"),
    )

    # the affine tail: * weight[H], then + bias[H] (casts before or between)
    found = _affine(found, ops, flow, "scale", "wmul", base == "mul")
    found = _affine(found, ops, flow, "wmul", "badd", base == "add")

    parts = [
        "mean0",
        "sq",
        "mean",
        "eps",
        "inv",
        "scale",
        "wmul",
        "badd",
        "sub",
        "_input_cast",
    ]
    cast_lists = ["_d_casts", "_n_casts", "_x_casts", "_m_casts", "_scale_casts", "_wmul_casts"]
    cast_lists += ["_badd_casts", "_mean_casts", "_eps_casts", "_inv_casts"]
    for name in cast_lists:
        if name not in found.columns:
            found = found.with_columns(pl.lit([], dtype=pl.List(pl.Int64)).alias(name))
    members = pl.concat_list(
        *[pl.col(c).fill_null(pl.lit([], dtype=pl.List(pl.Int64))) for c in cast_lists],
        *[pl.concat_list(p) for p in parts],
    ).list.drop_nulls()
    out = pl.coalesce("badd", "wmul", "scale")
    return found.select(
        "norm",
        pl.lit("written out").alias("variant"),
        "x",
        pl.lit(None, dtype=pl.Int64).alias("residual_add"),
        pl.lit(None, dtype=pl.Boolean).alias("residual_read_later"),
        members.list.unique().list.sort().alias("ops"),
        out.alias("out"),
        pl.col("wmul").is_not_null().alias("weight"),
        pl.col("badd").is_not_null().alias("bias"),
        "confidence",
    )


def _affine(
    found: pl.DataFrame,
    ops: pl.DataFrame,
    flow: pl.DataFrame,
    at: str,
    to: str,
    kind: pl.Expr,
) -> pl.DataFrame:
    """`found` with `to`: an op of `kind` reading `at` and a 1-D [H] tensor (a weight or a
    bias over the last dim), and `_{to}_casts`; null where there is none."""
    affine = ops.filter(kind & (pl.col("tensor_inputs") == 2)).select(
        pl.col("event").alias(to), "shapes", "output_shape"
    )
    hop = (
        flow.join(affine, left_on="consumer", right_on=to)
        .with_columns(
            pl.col("shapes")
            .list.get(1 - pl.col("input_index"), null_on_oob=True)
            .alias("_other_shape")
        )
        .filter(
            (pl.col("_other_shape").list.len() == 1)
            & (pl.col("_other_shape").list.first() == pl.col("output_shape").list.last())
            & (pl.col("input_index") <= 1)
        )
        .select(
            pl.col("producer").alias(at),
            pl.col("consumer").alias(to),
            pl.col("casts").alias(f"_{to}_casts"),
            pl.col("output_shape").alias(f"_{to}_shape"),
        )
        .unique(at, keep="first")
    )
    shape_col = "_d_shape"
    return (
        found.join(hop, on=at, how="left")
        .with_columns(
            pl.when(pl.col(f"_{to}_shape") == pl.col(shape_col)).then(pl.col(to)).alias(to),
            pl.when(pl.col(f"_{to}_shape") == pl.col(shape_col))
            .then(pl.col(f"_{to}_casts"))
            .alias(f"_{to}_casts"),
        )
        .drop(f"_{to}_shape")
    )


def residual_adds(ops: pl.DataFrame, edges: pl.DataFrame) -> pl.DataFrame:
    """`add` ops of two full-shape tensors (a residual stream's `x + sublayer(x)`, not a
    bias): `add`, `add_shape`."""
    shapes = pl.col("shapes")
    full = (
        (ATEN_BASE == "add")
        & (pl.col("tensor_inputs") == 2)
        & (shapes.list.get(0, null_on_oob=True) == pl.col("output_shape"))
        & (shapes.list.get(1, null_on_oob=True) == pl.col("output_shape"))
    )
    return ops.filter(full.fill_null(False) & ~pl.col("generated")).select(
        pl.col("event").alias("add"), pl.col("output_shape").alias("add_shape")
    )


def fused_norms_after_add(
    ops: pl.DataFrame, edges: pl.DataFrame, min_confidence: float = 0.0
) -> pl.DataFrame:
    """Norm ops that are one op already (`layer_norm`, `rms_norm`) reading a residual add:
    `SCHEMA` rows, variant "add + norm"."""
    trusted = edges.filter(pl.col("confidence") >= min_confidence)
    flow = through_casts(ops, trusted)
    norms = ops.filter(ATEN_BASE.is_in(list(FUSED_NORMS))).select(
        pl.col("event").alias("norm_op"),
        "shapes",
        ATEN_BASE.replace_strict(FUSED_NORMS, default=None).alias("norm"),
    )
    reads = flow.filter(pl.col("input_index") == 0).select(
        pl.col("producer").alias("add"),
        pl.col("consumer").alias("norm_op"),
        "casts",
        "confidence",
    )
    found = (
        norms.join(reads, on="norm_op")
        .join(residual_adds(ops, edges), on="add")
        .unique("norm_op", keep="first")
    )
    return found.select(
        "norm",
        pl.lit("add + norm").alias("variant"),
        pl.col("add").alias("x"),
        pl.col("add").alias("residual_add"),
        pl.lit(None, dtype=pl.Boolean).alias("residual_read_later"),
        pl.concat_list("add", "casts", "norm_op").list.sort().alias("ops"),
        pl.col("norm_op").alias("out"),
        _has_input(2).alias("weight"),
        ((pl.col("norm") == "LayerNorm") & _has_input(3)).alias("bias"),
        "confidence",
    ).cast(SCHEMA)  # type: ignore[arg-type]


def _has_input(index: int) -> pl.Expr:
    """The op recorded a tensor at argument `index` (a norm's weight, bias)."""
    shape = pl.col("shapes").list.get(index, null_on_oob=True)
    return (shape.list.len() > 0).fill_null(False)


def unfused_norms(
    ops: pl.DataFrame, edges: pl.DataFrame, min_confidence: float = 0.0
) -> pl.DataFrame:
    """Every TQ107 pattern (`SCHEMA`): written-out norms, with the residual add before them
    when there is one, and fused norm ops after a residual add. `residual_read_later`: the
    add's sum is also read outside the norm (the residual stream goes on), so a fused
    add+norm writes it too."""
    written = written_out_norms(ops, edges, min_confidence)
    adds = residual_adds(ops, edges)
    written = (
        written.drop("residual_add")
        .join(
            adds.select(pl.col("add").alias("x"), pl.col("add").alias("residual_add")),
            on="x",
            how="left",
        )
        .with_columns(
            pl.when(pl.col("residual_add").is_not_null())
            .then(pl.concat_list("ops", pl.col("residual_add")).list.unique().list.sort())
            .otherwise(pl.col("ops"))
            .alias("ops")
        )
        .select(list(SCHEMA))
    )
    fused = fused_norms_after_add(ops, edges, min_confidence)
    found = pl.concat([written.cast(SCHEMA), fused], how="vertical_relaxed")  # type: ignore[arg-type]
    trusted = edges.filter(pl.col("confidence") >= min_confidence)
    members = found.select("residual_add", pl.col("ops").alias("_members")).drop_nulls(
        "residual_add"
    )
    read_outside = (
        trusted.join(members, left_on="producer", right_on="residual_add")
        .filter(~pl.col("_members").list.contains(pl.col("consumer")))
        .select(pl.col("producer").alias("residual_add"))
        .unique()
        .with_columns(pl.lit(True).alias("_later"))
    )
    return (
        found.join(read_outside, on="residual_add", how="left")
        .with_columns(
            pl.when(pl.col("residual_add").is_not_null())
            .then(pl.col("_later").fill_null(False))
            .alias("residual_read_later")
        )
        .drop("_later")
        .sort("out")
    )


def norm_ops(ctx: Context) -> pl.DataFrame:
    """`unfused_norms` of the analysis at TQ107's default confidence, computed once."""
    return ctx.cached(
        "fusion.norms",
        lambda: unfused_norms(fusion_ops(ctx), fusion_edges(ctx), DEFAULTS["min_confidence"]),
    )


DEFAULTS = {"min_confidence": 0.4, "min_saving_us": 0.0, "add_norm": True}

FIXES = {
    "RMSNorm": (
        "Call the fused op: `torch.nn.functional.rms_norm(x, (H,), weight, eps)` or "
        "`torch.nn.RMSNorm(H, eps)` (PyTorch ≥ 2.4; one `_fused_rms_norm` kernel on CUDA "
        "from 2.8), Liger's `LigerRMSNorm` (liger-kernel ≥ 0.3, "
        "`liger_kernel.transformers.apply_liger_kernel_to_llama()` / `..._to_qwen2()` "
        "patch HF models), `torch.compile` the module (Inductor emits one "
        "`triton_red_fused_*` reduction kernel), or the zoo's `rms_norm` Triton kernel "
        "(`traceq zoo verify rms_norm` proves it)"
    ),
    "LayerNorm": (
        "Call the fused op: `torch.nn.functional.layer_norm(x, (H,), weight, bias, eps)` "
        "(`nn.LayerNorm`, one kernel), Liger's `LigerLayerNorm`, or `torch.compile` the "
        "module (one `triton_per_fused_*` / `triton_red_fused_*` kernel)"
    ),
}

ADD_FIXES = {
    "RMSNorm": (
        "; fuse the residual add into it too: vLLM's `fused_add_rms_norm(x, residual, "
        "weight, eps)` (`RMSNorm.forward(x, residual)`, updates the residual in place), "
        "FlashInfer's `fused_add_rmsnorm`, `torch.compile` of add + norm together, or the "
        "zoo's `add_rms_norm` Triton kernel"
    ),
    "LayerNorm": (
        "; fuse the residual add into it too: Apex's `FusedLayerNorm` does not, but "
        "`torch.compile` of add + norm emits one kernel, as do Triton's layer-norm tutorial "
        "kernel with a residual input and FlashAttention's `layer_norm` "
        "(`flash_attn.ops.triton.layer_norm.layer_norm_fn(x, w, b, residual=...)`)"
    ),
}


@rule(
    "TQ107",
    "unfused-norm",
    "warning",
    defaults=DEFAULTS,
    zoo=("rms_norm", "add_rms_norm"),
    explains=True,
)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds RMSNorm and LayerNorm written out as separate ops (`pow → mean → add(eps) →
    rsqrt → mul → mul(weight)`, LayerNorm's `mean → sub → ...  → add(bias)`, with the casts
    HF's implementations put between), and a residual `add` that runs as its own kernel
    right before a norm (written out, or an `F.layer_norm` / `F.rms_norm` op). Found on
    data flow, whatever runs in between, and reported once per norm: TQ104 no longer
    reports its fragments.

    ## Why is this bad?
    A norm is one pass over the [rows, H] activations: read x, reduce each row, write
    `x * rsqrt(mean(x²) + eps) * w`. Written out, each of its 6–9 ops is a kernel that
    reads and writes a full tensor (the fp32 upcast doubles some of them) and pays a
    launch. A residual add before it writes the sum and the norm reads it straight back;
    fused, the add+norm kernel reads both inputs once and writes the sum (when the residual
    stream goes on) and the normalized output.

    Estimated saving: the bytes the fused kernel no longer moves (the ops' recorded inputs
    and outputs − one read of the inputs, the weight and bias, one write of the outputs) at
    the bandwidth the ops' own kernels achieved (their modelled bytes over their time,
    `traceq.perf.savings.fusion_saving`), plus one launch per op removed, never more than
    the ops' measured time (GPU kernel time on a GPU trace, CPU op time on a CPU-only one).

    ## Example
    ```python
    class RMSNorm(nn.Module):  # HF Llama / Qwen2 / T5
        def forward(self, x):
            dtype = x.dtype
            x = x.to(torch.float32)
            variance = x.pow(2).mean(-1, keepdim=True)
            x = x * torch.rsqrt(variance + self.eps)
            return self.weight * x.to(dtype)

    h = residual + attn_out  # then h = norm(h): two kernels
    ```

    ## Use instead
    ```python
    y = F.rms_norm(x, (H,), weight, eps)          # nn.RMSNorm; PyTorch >= 2.4
    y = F.layer_norm(x, (H,), weight, bias, eps)  # nn.LayerNorm
    # or Liger's LigerRMSNorm, vLLM's fused_add_rms_norm(x, residual, w, eps) for the
    # residual add + norm, or torch.compile (one reduction kernel)
    ```
    ## Options
    - `min_confidence` (0.4): weakest data-flow edge accepted.
    - `min_saving_us` (0): leave out findings that save less.
    - `add_norm` (true): also report a residual add before a norm op that is already fused.

    ## References
    - Zhang & Sennrich, "Root Mean Square Layer Normalization" (2019):
      https://arxiv.org/abs/1910.07467
    - PyTorch `F.rms_norm`: https://pytorch.org/docs/stable/generated/torch.nn.functional.rms_norm.html
    - Liger Kernel `LigerRMSNorm`: https://github.com/linkedin/Liger-Kernel
    - vLLM `fused_add_rms_norm`: https://github.com/vllm-project/vllm
    """
    ops = fusion_ops(ctx)
    found = unfused_norms(ops, fusion_edges(ctx), ctx.options["min_confidence"])
    if not ctx.options["add_norm"]:
        found = found.filter(pl.col("variant") != "add + norm")
    events = found["ops"].explode().drop_nulls().to_list()
    rows = details(ops, events)
    raw = byte_rows(ops, events)
    for norm in found.iter_rows(named=True):
        yield from _finding(ctx, norm, rows, raw)


def _finding(
    ctx: Context,
    norm: dict[str, Any],
    rows: dict[int, dict[str, Any]],
    raw: dict[int, dict[str, Any]],
) -> Iterator[Finding]:
    members = [rows[e] for e in norm["ops"] if e in rows]
    if not members:
        return
    members.sort(key=lambda r: (r["ts_ns"], r["event"]))
    kind, residual = norm["norm"], norm["residual_add"] is not None
    measured_us = sum(r["time_ns"] for r in members) / 1000
    unfused = sum(op_bytes(raw[r["event"]]) for r in members)
    fused, inputs = _fused_bytes(norm, raw)
    cpu_launches = sum(max(1, len(r["kernel_events"])) for r in members)
    saved = site_saving(ctx, members, measured_us, unfused, fused, cpu_launches)
    if saved is None:
        return
    saving, model, launches = saved
    where = located(ctx, members)
    out_row = rows.get(norm["out"]) or members[-1]
    shape = out_row["output_shape"]
    norm_only = [r for r in members if r["event"] != norm["residual_add"]]
    names = " → ".join(r["name"].removeprefix("aten::") for r in norm_only)
    # the site is the norm's module (the residual add runs in the layer around it)
    where["module"] = out_row["module"] or where["module"]
    dtype = dtype_text(inputs["dtype"])
    # a written-out norm is one problem with or without the add before it (one group);
    # an add before a norm op that is fused already is another
    idiom = f"add+{kind}" if norm["variant"] == "add + norm" else kind
    where["evidence"].update(
        {
            "idiom": idiom,
            "variant": norm["variant"],
            "norm": kind,
            "residual_add": norm["residual_add"],
            "residual_read_later": norm["residual_read_later"],
            "weight": norm["weight"],
            "bias": norm["bias"],
            "unfused_bytes": unfused,
            "fused_bytes": fused,
            "unfused_traffic": mib(unfused),
            "fused_traffic": mib(fused),
            "launches": launches,
            "measured_us": round(measured_us, 3),
            "dataflow_confidence": norm["confidence"],
        }
    )
    if norm["variant"] == "add + norm":
        what = f"residual `add` and `{out_row['name']}` run as two ops"
    else:
        what = f"{kind} written out as {len(norm_only)} ops ({names})"
        if residual:
            what = f"residual `add` + {what}"
    fix = FIXES[kind] + (ADD_FIXES[kind] if residual else "")
    yield ctx.finding(
        message=(
            f"{what} on {shape_text(shape)} {dtype}: one fused "
            f"{'add+' if residual else ''}{kind} kernel would move {mib(fused)} instead of "
            f"{mib(unfused)} in 1 launch instead of {launches}"
        ),
        shapes=[shape] if shape else [],
        est_saving_us=saving,
        saving_model=f"unfused − fused bytes ({unfused} − {fused}): {model}",
        fix=fix + f". Saves about {saving:.1f} µs per call here.",
        **where,
    )


def _fused_bytes(norm: dict[str, Any], raw: dict[int, dict[str, Any]]) -> tuple[int, dict]:
    """Bytes one fused kernel moves: the norm's input read once (both addends when a
    residual add is fused in), the weight and bias, the output written once (and the sum,
    when the residual stream reads it later)."""
    ops = [raw[e] for e in norm["ops"] if e in raw]
    first = raw.get(norm["residual_add"]) if norm["residual_add"] is not None else None
    if first is None:
        first = min(ops, key=lambda r: r["event"])
        # the norm's input: the first op's first tensor input (the cast, or pow / mean)
    shapes, types = first["shapes"] or [], first["input_types"] or []
    n_read = 2 if norm["residual_add"] is not None else 1
    reads = sum(tensor_bytes(shapes[i], types[i]) for i in range(min(n_read, len(shapes))))
    dtype = types[0] if types else None
    out = raw.get(norm["out"])
    written = 0
    if out is not None and out["output_shape"] is not None:
        count = 1
        for d in out["output_shape"]:
            count *= d
        written = count * output_itemsize(out)
        hidden = out["output_shape"][-1] if out["output_shape"] else 0
        reads += hidden * output_itemsize(out) * (int(norm["weight"]) + int(norm["bias"]))
    if norm["residual_add"] is not None and norm["residual_read_later"]:
        written += tensor_bytes(shapes[0] if shapes else None, dtype)
    return reads + written, {"dtype": dtype}


RULE = check
