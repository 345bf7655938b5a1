"""TQ103 unfused-glu: `act(gate) * up` (GeGLU, SwiGLU) with the activation and the multiply
run as separate ops.

Found on data flow, not adjacency: in HF Qwen/Llama the up-projection GEMM runs between
`silu` and `mul`, so "the next kernel" never sees the pair. A GLU is a `mul` with two
tensor inputs, one the output of an activation (an op, or one written out as pointwise
ops) of a GEMM — the gate — and the other the output of a GEMM — the up projection —
where both GEMMs read the same input (same producer; or, for a graph input, the same shape
in the same parent module). A gate and up taken from one GEMM by `chunk` also count: the
GEMMs are merged already, the activation and multiply are not. `glu_patterns` is shared
with TQ102 (a GLU's gate activation is this rule's, not an epilogue finding) and TQ104.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.relations.dataflow.shapes import MULTI_OUTPUT
from traceq.rules.base import Context, rule
from traceq.rules.details import details, located, mib, shape_text
from traceq.rules.finding import Finding
from traceq.rules.idioms import fused_saving
from traceq.rules.op_classes import ATEN_BASE
from traceq.rules.op_groups import (
    first_gemm_reading,
    fusion_edges,
    fusion_ops,
    parent_module,
    written_out_activations,
)

GLU_NAMES = {"silu": "SwiGLU", "gelu": "GeGLU", "relu": "ReGLU", "sigmoid": "GLU", "tanh": "GLU"}


def gemm_activations(
    ops: pl.DataFrame, edges: pl.DataFrame, min_confidence: float = 0.0
) -> pl.DataFrame:
    """Every activation applied to a GEMM's output: `gemm`, `act_ops` (event ids),
    `act_output` (the op whose result is the activated tensor), `activation`, `written_out`
    (spelled as pointwise ops), `generated` (the activation is a compiler-generated kernel),
    `confidence`. Not filtered for GLUs or epilogue fusions; callers decide.

    An activation op must read the GEMM through an edge of at least `min_confidence`. A
    written-out one must be entered that way too, but inside it every edge counts: with
    no tensor ids, which of the region's same-shaped values an op read is often a guess
    (`hidden` edges), while that it read one of them is not — and that is all the region
    test needs.
    """
    trusted = edges.filter(pl.col("confidence") >= min_confidence)
    # forward GEMMs: what backward runs after a GEMM (a dgrad `mm`, then the recomputed
    # activation of a custom Function's backward that reads the saved input) is the
    # gradient of the forward pattern, which the forward finding's fix removes too
    forward = ~pl.col("backward") if "backward" in ops.columns else pl.lit(True)
    gemms = ops.filter((pl.col("role") == "gemm") & ~pl.col("epilogue_act") & forward).select(
        pl.col("event").alias("producer")
    )
    # a compiler's activation kernel may also read the bias it fused (`fused_addmm_gelu`)
    one_input = (pl.col("tensor_inputs") <= 1) | pl.col("generated")
    acts = ops.filter((pl.col("role") == "activation") & ~pl.col("glu_fused") & one_input).select(
        pl.col("event").alias("consumer"), "activation", "generated"
    )
    direct = (
        trusted.join(gemms, on="producer")
        .join(acts, on="consumer")
        .select(
            pl.col("producer").alias("gemm"),
            pl.concat_list(pl.col("consumer")).alias("act_ops"),
            pl.col("consumer").alias("act_output"),
            "activation",
            pl.lit(False).alias("written_out"),
            "generated",
            "confidence",
        )
    )
    entries = (
        trusted.join(gemms, on="producer")
        .group_by(pl.col("producer").alias("gemm"))
        .agg(pl.col("consumer").alias("_entered"), pl.col("confidence").max())
    )
    written = (
        written_out_activations(ops, edges)
        .join(entries, on="gemm")
        .filter(pl.col("ops").list.set_intersection("_entered").list.len() > 0)
        .select(
            "gemm",
            pl.col("ops").alias("act_ops"),
            pl.col("output").alias("act_output"),
            "activation",
            pl.lit(True).alias("written_out"),
            pl.lit(False).alias("generated"),
            "confidence",
        )
    )
    # `h * sigmoid(h)`: the sigmoid is an activation op, but of a larger written-out one
    inside = written.select("gemm", pl.col("act_ops").alias("act_output")).explode("act_output")
    direct = direct.join(inside, on=["gemm", "act_output"], how="anti")
    return pl.concat([direct, written], how="vertical_relaxed").unique(
        ["gemm", "act_output"], keep="first", maintain_order=True
    )


def glu_patterns(
    ops: pl.DataFrame, edges: pl.DataFrame, min_confidence: float = 0.0
) -> pl.DataFrame:
    """One row per unfused GLU: `mul`, `gate`, `up` (GEMM event ids; equal when both halves
    come from one GEMM through views), `act_ops`, `act_output`, `activation`,
    `written_out`, `down` (a GEMM reading the product, or null), `confidence`.
    """
    trusted = edges.filter(pl.col("confidence") >= min_confidence)
    acts = gemm_activations(ops, edges, min_confidence)
    muls = ops.filter(
        (ATEN_BASE == "mul")
        & (pl.col("role") == "elementwise")
        & ~pl.col("generated")
        & (pl.col("tensor_inputs") == 2)
    ).select(pl.col("event").alias("mul"), pl.col("output_shape").alias("mul_shape"))
    gemm_info = ops.filter(pl.col("role") == "gemm").select(
        "event",
        "gemm_x",
        "x_shape",
        "step",
        "tid",
        "ts_ns",
        parent_module(),
    )
    from_act = trusted.join(
        acts.select(
            "gemm", "act_ops", "act_output", "activation", "written_out", "confidence"
        ).rename({"confidence": "act_confidence"}),
        left_on="producer",
        right_on="act_output",
    ).select(
        pl.col("consumer").alias("mul"),
        pl.col("gemm").alias("gate"),
        "act_ops",
        pl.col("producer").alias("act_output"),
        "activation",
        "written_out",
        pl.col("input_index").alias("act_index"),
        pl.min_horizontal("confidence", "act_confidence").alias("confidence"),
    )
    splits = ops.filter(ATEN_BASE.is_in(list(MULTI_OUTPUT)))["event"].to_list()
    from_up = trusted.join(
        gemm_info.select(pl.col("event").alias("producer")), on="producer"
    ).select(
        pl.col("consumer").alias("mul"),
        pl.col("producer").alias("up"),
        pl.col("input_index").alias("up_index"),
        (pl.col("via").list.set_intersection(splits).list.len() > 0).alias("up_split"),
        pl.col("confidence").alias("up_confidence"),
    )
    x_source = trusted.join(
        gemm_info.select("event", "gemm_x"), left_on="consumer", right_on="event"
    ).filter(pl.col("input_index") == pl.col("gemm_x"))
    x_source = x_source.group_by("consumer").agg(pl.col("producer").first().alias("x_src"))
    side = gemm_info.join(x_source, left_on="event", right_on="consumer", how="left")
    pairs = (
        from_act.join(muls, on="mul")
        .join(from_up, on="mul")
        .filter(pl.col("act_index") != pl.col("up_index"))
        .join(side.rename(lambda c: f"gate_{c}"), left_on="gate", right_on="gate_event")
        .join(side.rename(lambda c: f"up_{c}"), left_on="up", right_on="up_event")
    )
    # one GEMM split in two (`gate, up = gate_up(x).chunk(2, -1)`): the up half reaches the
    # mul through the split; the gate half reaches the activation through it, so the edge
    # from the activation to the mul is direct
    one_gemm = (pl.col("gate") == pl.col("up")) & pl.col("up_split")
    same_source = pl.col("gate_x_src") == pl.col("up_x_src")
    same_graph_input = (
        pl.col("gate_x_src").is_null()
        & pl.col("up_x_src").is_null()
        & (pl.col("gate_x_shape") == pl.col("up_x_shape"))
        & (pl.col("gate_step").eq_missing(pl.col("up_step")))
        & (pl.col("gate_tid") == pl.col("up_tid"))
        & pl.col("gate_parent_module").eq_missing(pl.col("up_parent_module"))
    )
    found = pairs.filter(
        one_gemm | ((pl.col("gate") != pl.col("up")) & (same_source | same_graph_input))
    )
    downs = first_gemm_reading(ops, trusted, "down")
    return (
        found.join(downs, left_on="mul", right_on="producer", how="left")
        .select(
            "mul",
            "gate",
            "up",
            "act_ops",
            "act_output",
            "activation",
            "written_out",
            "down",
            pl.min_horizontal("confidence", "up_confidence").alias("confidence"),
        )
        .unique("mul", keep="first", maintain_order=True)
        .sort("mul")
    )


def glu_ops(ctx: Context) -> pl.DataFrame:
    """`glu_patterns` of the analysis at TQ103's default confidence, computed once; TQ102
    and TQ104 leave these ops to TQ103."""
    return ctx.cached(
        "fusion.glu",
        lambda: glu_patterns(fusion_ops(ctx), fusion_edges(ctx), DEFAULTS["min_confidence"]),
    )


DEFAULTS = {"min_confidence": 0.4, "min_saving_us": 0.0}


@rule(
    "TQ103",
    "unfused-glu",
    "warning",
    defaults=DEFAULTS,
    zoo=("glu", "dual_gemm_glu"),
    explains=True,
)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds gated linear units whose activation and multiply run as separate ops. That is
    `act(gate_proj(x)) * up_proj(x)`: GeGLU (Gemma), SwiGLU (Llama, Qwen, Mistral), found by
    data flow: the `mul` reads an activation of one GEMM and the output of another
    GEMM on the same input, wherever those ops sit in the stream. Never fires on kernels
    that already fuse them (`silu_and_mul`, `act_and_mul`, Inductor's
    `triton_poi_fused_..._mul_silu`, Liger's GEGLU/SwiGLU, the zoo's `glu`).

    ## Why is this bad?
    Eagerly, the activation reads the gate tensor and writes `act(gate)`; the multiply reads
    that and `up` and writes the product: five passes over an M×hidden tensor — the widest
    tensor in the block — and two launches. A fused GLU kernel reads `gate` and `up` once and
    writes once: three passes, one launch. The gate and up GEMMs also read the same `x`
    twice; one GEMM over the concatenated weights reads it once (see TQ105).

    Estimated saving: the measured time of the activation and multiply (GPU kernel time on
    a GPU trace, CPU op time on a CPU-only one) scaled by the traffic the fused kernel keeps
    (its bytes / theirs, 3/5 for a one-op activation). The GEMM merge is TQ105's saving.

    ## Example
    ```python
    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
    ```

    ## Use instead
    ```python
    # fused activation * multiply (torch.compile does this too)
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    h = LigerSiLUMulFunction.apply(self.gate_proj(x), self.up_proj(x))
    # and one GEMM for gate and up
    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    ```

    ## Options
    - `min_confidence` (0.4): weakest data-flow edge accepted.
    - `min_saving_us` (0): leave out findings that save less.

    ## References
    - Shazeer, "GLU Variants Improve Transformer" (2020): https://arxiv.org/abs/2002.05202
    - Hugging Face, "Profiling in PyTorch (Part 2): From nn.Linear to a Fused MLP"
    - Liger Kernel, GEGLU / SwiGLU: https://github.com/linkedin/Liger-Kernel
    - vLLM `SiluAndMul`: https://github.com/vllm-project/vllm
    """
    ops = fusion_ops(ctx)
    found = glu_patterns(ops, fusion_edges(ctx), ctx.options["min_confidence"])
    events = (
        found.select(pl.concat_list("mul", "gate", "up", "act_ops").alias("e"))["e"]
        .explode()
        .drop_nulls()
    )
    rows = details(ops, events.to_list())
    for glu in found.iter_rows(named=True):
        act = [rows[e] for e in glu["act_ops"]]
        mul = rows[glu["mul"]]
        gemms = [rows[glu["gate"]]] + ([rows[glu["up"]]] if glu["up"] != glu["gate"] else [])
        removed = [*act, mul]
        removed_us = sum(r["time_ns"] for r in removed) / 1000
        unfused = sum(r["traffic_bytes"] for r in removed)
        fused = mul["traffic_bytes"]  # reads gate and up, writes the product
        removed_events = [r["event"] for r in removed]
        saving, model = fused_saving(ctx, removed_events, removed_us, unfused, fused, len(removed))
        if saving < ctx.options["min_saving_us"]:
            continue
        where = located(ctx, [*gemms, *removed])
        kind = GLU_NAMES.get(glu["activation"], "GLU")
        act_text = (
            f"{glu['activation']} written out as {len(act)} pointwise ops"
            if glu["written_out"]
            else f"`{act[0]['name']}`"
        )
        merged = glu["up"] == glu["gate"]
        where["evidence"].update(
            {
                "glu": kind,
                "gate": glu["gate"],
                "up": glu["up"],
                "activation_ops": glu["act_ops"],
                "mul": glu["mul"],
                "down": glu["down"],
                "removed_us": round(removed_us, 3),
                "unfused_traffic": mib(unfused),
                "fused_traffic": mib(fused),
                "dataflow_confidence": glu["confidence"],
                # the activation and multiply; the gate and up GEMMs stay TQ105's
                "explains": [*glu["act_ops"], glu["mul"]],
            }
        )
        zoo = ["glu"] if merged else ["glu", "dual_gemm_glu"]
        if glu["down"] is not None:
            zoo.append("mlp")
        yield ctx.finding(
            message=(
                f"unfused {kind}: {act_text} and `{mul['name']}` run separately on "
                f"{shape_text(mul['output_shape'])}"
                + ("" if merged else "; gate and up are two GEMMs on the same input")
            ),
            shapes=[s for s in (mul["shapes"] or []) if s],
            est_saving_us=saving,
            saving_model=f"activation + mul fused ({mib(unfused)} → {mib(fused)}): {model}; "
            "the GEMM merge is TQ105's",
            fix=(
                "Fuse the activation and the multiply: torch.compile, Liger's "
                "LigerSiLUMulFunction / LigerGELUMulFunction, vLLM's SiluAndMul, or the zoo's "
                "`glu`"
                + (
                    ""
                    if merged
                    else "; and compute gate and up with one GEMM over the concatenated "
                    "weights (`gate_up_proj(x).chunk(2, -1)`, zoo `dual_gemm_glu`)"
                )
                + "."
            ),
            zoo=zoo,
            **where,
        )


RULE = check
