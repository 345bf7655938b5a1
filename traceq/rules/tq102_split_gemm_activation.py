"""TQ102 split-gemm-activation: an activation run as its own op on a GEMM's output.

GEMMs are recognised by op (`linear`, `addmm`, `mm`, `matmul`, `bmm`, `baddbmm`), never
by kernel name: cuBLAS picks kernels named `..._gemm_relu_...` for plain Linear layers
with no activation at all. The activation is an op (`gelu`, `relu`, `silu`, `tanh`,
`sigmoid`; `clamp(min=0)` / `threshold(0, 0)` as ReLU — on CUDA `relu` itself runs as
`launch_clamp_scalar`) or pointwise ops that spell one out (GPT-2's `gelu_new`,
`x * sigmoid(x)`, CLIP's QuickGELU `x * sigmoid(1.702 * x)`), reading the GEMM's output
directly, through views, or through a split bias add (TQ101). A GLU's gate activation is
TQ103's finding, not this one.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.details import (
    DETAIL_COLUMNS,
    decode_kernels,
    details,
    located,
    mib,
    shape_text,
)
from traceq.rules.finding import Finding
from traceq.rules.idioms import model_saving
from traceq.rules.kernel_patterns import kernel_activation_splits
from traceq.rules.op_groups import first_gemm_reading, fusion_edges, fusion_ops, inner_activations
from traceq.rules.tq101_split_matmul_bias import split_bias_adds
from traceq.rules.tq103_unfused_glu import gemm_activations, glu_ops


def split_activations(
    ops: pl.DataFrame,
    edges: pl.DataFrame,
    glus: pl.DataFrame,
    min_confidence: float = 0.0,
    include_compiled: bool = False,
) -> pl.DataFrame:
    """One row per GEMM whose output an activation reads as its own op: `gemm`, `act_ops`,
    `act_output`, `activation`, `written_out`, `bias_add` (the TQ101 add in between, or
    null), `consumer_gemm` (a GEMM reading the activation: the Linear→act→Linear MLP).

    Leaves out GLU gates (`glus`, TQ103's) and, unless `include_compiled`, activations a
    compiler already emitted as their own kernel next to an extern GEMM.
    """
    trusted = edges.filter(pl.col("confidence") >= min_confidence)
    bias_adds = split_bias_adds(ops, trusted)
    # an activation of `GEMM -> add(bias)` is an activation of the GEMM
    through_bias = edges.join(
        bias_adds.select(pl.col("add").alias("producer"), pl.col("gemm").alias("_gemm")),
        on="producer",
    ).with_columns(pl.col("producer").alias("bias_add"), pl.col("_gemm").alias("producer"))
    direct = edges.with_columns(pl.lit(None, dtype=pl.Int64).alias("bias_add"))
    widened = pl.concat([direct, through_bias.drop("_gemm")], how="diagonal_relaxed")
    acts = gemm_activations(ops, widened, min_confidence)
    via_bias = widened.select(
        pl.col("producer").alias("gemm"), pl.col("consumer").alias("act_output"), "bias_add"
    ).drop_nulls("bias_add")
    acts = acts.join(via_bias, on=["gemm", "act_output"], how="left")
    if not include_compiled:
        acts = acts.filter(~pl.col("generated"))
    acts = one_gemm_per_activation(ops, acts)
    next_gemm = first_gemm_reading(ops, trusted, "consumer_gemm")
    return (
        acts.join(glus.select(pl.col("act_output")), on="act_output", how="anti")
        .join(next_gemm, left_on="act_output", right_on="producer", how="left")
        .select(
            "gemm",
            "act_ops",
            "act_output",
            "activation",
            "written_out",
            "bias_add",
            "consumer_gemm",
            "confidence",
            "generated",
        )
        .sort("gemm", "act_output")
    )


def one_gemm_per_activation(ops: pl.DataFrame, acts: pl.DataFrame) -> pl.DataFrame:
    """`acts` with each activation (`act_output`) paired with one GEMM: the last one to run
    before it on its thread.

    A compiler's activation kernel reads more than one tensor (`triton_poi_fused_addmm_gelu`
    reads the GEMM's output and the bias; a residual add fused in reads the stream), and
    with shape-matched data flow a second GEMM of the same output shape that ran earlier —
    whose output feeds something else (another projection, attention) — reads as one of
    its producers too. Inductor emits the extern GEMM and then the kernel that finishes
    its output, so the GEMM that ran last is the one; the earlier one made a second
    finding for the same kernel and counted its saving twice.
    """
    when = ops.select(pl.col("event").alias("gemm"), pl.col("ts_ns").alias("_gemm_ts"))
    return (
        acts.join(when, on="gemm", how="left")
        .sort(["_gemm_ts", "gemm"], descending=True, nulls_last=True)
        .unique("act_output", keep="first", maintain_order=True)
        .drop("_gemm_ts")
    )


def inner_splits(inner: pl.DataFrame, ops: pl.DataFrame, edges: pl.DataFrame) -> pl.DataFrame:
    """`split_activations` rows for activations a GEMM op runs as its own child op
    (`inner_activations`: `_addmm_activation` on the CPU). The GEMM's output is the
    activated tensor, so a GEMM reading it is the MLP's next layer; the pairing is certain
    (confidence 1), not inferred from data flow."""
    next_gemm = first_gemm_reading(ops, edges, "consumer_gemm")
    return (
        inner.join(next_gemm, left_on="gemm", right_on="producer", how="left")
        .select(
            "gemm",
            pl.concat_list("event").alias("act_ops"),
            pl.col("gemm").alias("act_output"),
            "activation",
            pl.lit(False).alias("written_out"),
            pl.lit(None, dtype=pl.Int64).alias("bias_add"),
            "consumer_gemm",
            pl.lit(1.0).alias("confidence"),
            pl.lit(False).alias("generated"),
        )
        .sort("gemm")
    )


#: Activations cuBLASLt's GEMM epilogues apply (`torch._addmm_activation`: `use_gelu`
#: picks GELU, the tanh approximation, else ReLU), and the dtypes they take.
CUBLASLT_EPILOGUE = {"relu": "ReLU", "gelu": "GELU"}
CUBLASLT_DTYPES = ("float", "c10::Half", "c10::BFloat16")

#: Activations the zoo's `gemm_bias_act` applies in its epilogue.
ZOO_ACTIVATIONS = ("relu", "gelu", "silu")


def epilogue_fix(
    activation: str,
    gemm: str,
    dtype: str | None,
    device: str,
    generated: bool = False,
    written_out: bool = False,
) -> str:
    """The remedy for one split, naming only calls that apply to its activation, dtype and
    device: `torch._addmm_activation` for ReLU and GELU on a GPU in a float dtype (the
    cuBLASLt epilogue; its GELU is the tanh approximation), never for sigmoid, tanh or
    SiLU, and never on the CPU, where it runs `addmm`, then the activation; the zoo's
    `gemm_bias_act` only for the activations it has (`ZOO_ACTIVATIONS`)."""
    compile_ = "`torch.compile(mode='max-autotune')`"
    zoo = activation in ZOO_ACTIVATIONS
    if generated:
        return (
            "The compiler kept the GEMM an extern call and runs the activation as a kernel "
            f"of its own: compile with {compile_} so Inductor benchmarks GEMM templates "
            "that apply bias and activation in their epilogue"
            + (", or call the zoo's `gemm_bias_act` inside the compiled region" if zoo else "")
            + "."
        )
    prefix = ""
    if activation == "quick_gelu":
        prefix = (
            "QuickGELU (`x * sigmoid(1.702 * x)`) has no single eager op, and `F.silu` would "
            "change the model's numerics: "
        )
    elif written_out:
        one_op = {"gelu": "`F.gelu(x, approximate='tanh')`", "silu": "`F.silu(x)`"}
        prefix = (
            f"Replace the written-out {activation} with one op "
            f"({one_op.get(activation, 'the fused op')}), then: "
        )
    if device != "gpu":
        text = (
            "`torch._addmm_activation` fuses only on CUDA (cuBLASLt epilogue); on the CPU it "
            "runs `addmm`, then the activation, and no eager call applies the activation in "
            f"the GEMM: compile the block with {compile_}, whose C++ GEMM template can apply "
            "it in the epilogue"
        )
    elif activation in CUBLASLT_EPILOGUE and (dtype in CUBLASLT_DTYPES or dtype is None):
        how = (
            ", use_gelu=True)` (cuBLASLt's GELU epilogue, the tanh approximation: check the "
            "numerics against an erf `F.gelu`)"
            if activation == "gelu"
            else ")` (cuBLASLt's ReLU epilogue)"
        )
        text = (
            f"apply the activation in the GEMM epilogue: `torch._addmm_activation(b, x, w.t(){how}"
            f", {compile_}, or the zoo's `gemm_bias_act`"
        )
    else:
        name = {"quick_gelu": "QuickGELU"}.get(activation, activation)
        text = (
            f"no cuBLASLt epilogue applies {name} (`torch._addmm_activation` does ReLU and "
            f"GELU only): fuse it with the GEMM through {compile_} (epilogue fusion into a "
            "Triton GEMM template)"
            + (", the zoo's `gemm_bias_act`," if zoo else "")
            + " or a Triton GEMM with the activation in its epilogue"
        )
    text = prefix + text if prefix else text[0].upper() + text[1:]
    return text + "."


DEFAULTS = {"include_compiled": True, "min_confidence": 0.4, "min_saving_us": 0.0}


@rule(
    "TQ102",
    "split-gemm-activation",
    "warning",
    defaults=DEFAULTS,
    zoo=("gemm_bias_act", "mlp"),
    defers=True,
)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds an activation run as its own op on a GEMM's output. The GEMM is `nn.Linear`,
    `addmm`, `mm`, `matmul` or `bmm`; the activation GELU (erf or tanh), ReLU (`relu`,
    `clamp(min=0)`; on CUDA it runs as `launch_clamp_scalar`), SiLU, tanh, sigmoid, or one
    written out as pointwise ops (GPT-2's `gelu_new`, `x * torch.sigmoid(x)`). GEMMs are classified
    by op, not kernel name: cuBLAS runs plain Linear layers with kernels named
    `..._gemm_relu_...`. The gate activation of a GLU is TQ103's.

    ## Why is this bad?
    The GEMM writes its M×N output, and the activation kernel reads it back and writes M×N
    again: two passes over memory and a launch for a function the GEMM could apply to each
    tile in its epilogue, while the values are still in registers (cuBLASLt's `RELU` /
    `GELU` epilogues, `torch._addmm_activation`, Triton GEMMs in `torch.compile`'s
    max-autotune mode). A written-out activation costs a kernel per pointwise op.

    Estimated saving: the measured time of the activation op(s) (GPU kernel time on a GPU
    trace, CPU op time on a CPU-only one): folded into the epilogue they move no extra data.

    ## Example
    ```python
    h = F.gelu(self.fc1(x))
    h = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    ```

    ## Use instead
    ```python
    h = torch._addmm_activation(self.fc1.bias, x2d, self.fc1.weight.t(), use_gelu=True)
    h = torch.compile(mlp, mode="max-autotune")(x)  # Triton GEMM with the epilogue fused
    ```
    or the zoo's `gemm_bias_act` (one kernel for x @ W.T + b, then the activation); for a
    written-out GELU at least `F.gelu(x, approximate="tanh")`, one kernel instead of many.

    A compiled graph splits too: Inductor keeps the GEMM an extern call (`aten::mm`,
    `aten::addmm`) and applies the bias and activation in a kernel of their own
    (`triton_poi_fused_addmm_gelu_view_0`, `cpp_fused_gelu_0`). Kernels that already fuse
    the activation with the next op (`..._mul_silu`, `silu_and_mul`, Liger, the zoo) or
    with the GEMM (a `triton_tem_fused_addmm_gelu` template) are not splits. Where the
    kernels have no op of their own (a GPU compiled region's launches; an anonymous Triton
    kernel an `autograd.Function` such as Megatron's `GeLUFunction` launches), a GEMM
    kernel followed on its stream by the activation kernel is the split
    (`kernel_patterns.kernel_activation_splits`).

    ## Options
    - `include_compiled` (true): also report activations that a compiler (Inductor)
      emitted as their own kernel after an extern GEMM — the remedy there is max-autotune's
      epilogue fusion, not a code change.
    - `min_confidence` (0.4): weakest data-flow edge accepted (0.4 = program order only).
    - `min_saving_us` (0): leave out findings that save less.

    ## References
    - Hugging Face, "Profiling in PyTorch (Part 2): From nn.Linear to a Fused MLP"
    - NVIDIA cuBLASLt epilogues: https://docs.nvidia.com/cuda/cublas/#cublasltepilogue-t
    - PyTorch, `torch.compile` modes: https://pytorch.org/docs/stable/generated/torch.compile.html
    """
    ops = fusion_ops(ctx)
    edges = fusion_edges(ctx)
    inner = inner_activations(ctx)
    found = pl.concat(
        [
            split_activations(
                ops,
                edges,
                glu_ops(ctx),
                min_confidence=ctx.options["min_confidence"],
                include_compiled=ctx.options["include_compiled"],
            ),
            inner_splits(inner, ops, edges),
        ],
        how="vertical_relaxed",
    )
    events = found.select(pl.concat_list("gemm", "act_ops").alias("e"))["e"].explode()
    described = pl.concat(
        [ops.select(DETAIL_COLUMNS), inner.select(DETAIL_COLUMNS)], how="vertical_relaxed"
    )
    rows = details(described, events.drop_nulls().to_list())
    for split in found.iter_rows(named=True):
        gemm = rows[split["gemm"]]
        act = [rows[e] for e in split["act_ops"]]
        removed_us = sum(r["time_ns"] for r in act) / 1000
        traffic = sum(r["traffic_bytes"] for r in act)
        saving, model = model_saving(ctx, [r["event"] for r in act], removed_us, traffic, len(act))
        if saving < ctx.options["min_saving_us"]:
            continue
        where = located(ctx, [gemm, *act])
        if split["written_out"]:
            act_text = f"{split['activation']} written out as {len(act)} pointwise ops"
        else:
            act_text = f"`{act[0]['name']}` ({split['activation']})"
        out = act[-1]["output_shape"] or gemm["output_shape"]
        where["evidence"].update(
            {
                "activation": split["activation"],
                "written_out": split["written_out"],
                "bias_add": split["bias_add"],
                "next_gemm": split["consumer_gemm"],
                "removed_us": round(removed_us, 3),
                "activation_traffic": mib(traffic),
                "round_trip_floor_us": round(ctx.device.transfer_us(traffic), 3),
                "dataflow_confidence": split["confidence"],
                "compiled": split["generated"],
            }
        )
        zoo = (["gemm_bias_act"] if split["activation"] in ZOO_ACTIVATIONS else []) + (
            ["mlp"] if split["consumer_gemm"] is not None else []
        )
        fix = epilogue_fix(
            split["activation"],
            gemm["name"],
            gemm["dtype"],
            ctx.device.kind,
            generated=split["generated"],
            written_out=split["written_out"],
        )
        yield ctx.finding(
            message=(
                f"`{gemm['name']}` → {act_text} on {shape_text(out)}: the activation "
                f"re-reads the GEMM output instead of running in its epilogue"
            ),
            shapes=[s for s in (gemm["shapes"] or []) if s],
            est_saving_us=saving,
            saving_model=f"in the epilogue the activation moves no data of its own: {model}",
            fix=fix,
            zoo=zoo,
            **where,
        )
    yield from kernel_splits(ctx)


def kernel_splits(ctx: Context) -> Iterator[Finding]:
    """Splits seen only on the stream (`kernel_activation_splits`): a GEMM kernel, then an
    activation kernel that no op launched — an Inductor kernel of a compiled region, or an
    anonymous Triton kernel of an `autograd.Function` (Megatron's `GeLUFunction`). No
    shapes exist for them: the saving is the activation kernel's time."""
    splits = kernel_activation_splits(ctx, include_compiled=ctx.options["include_compiled"])
    for split in splits.iter_rows(named=True):
        removed_us = split["act_ns"] / 1000
        if removed_us < ctx.options["min_saving_us"]:
            continue
        ops = [split["gemm_op"]] if split["gemm_op"] is not None else []
        kernel_names = [split["gemm_name"], split["act_name"]]
        where = (
            f"a compiled region (`{split['launcher']}`)"
            if split["generated"]
            else f"`{split['launcher']}`"
        )
        yield ctx.finding(
            message=(
                f"GEMM kernel → `{split['act_name']}` ({split['activation']}) launched by "
                f"{where} with no op of its own: the activation re-reads the GEMM output "
                "instead of running in its epilogue"
            ),
            step=split["step"],
            module=split["module"],
            ops=ops,
            kernels=[split["gemm_kernel"], split["act_kernel"]],
            time_us=(split["gemm_ns"] + split["act_ns"]) / 1000,
            est_saving_us=removed_us,
            saving_model=(
                "in the epilogue the activation moves no data of its own: the activation "
                f"kernel's time ({removed_us:.3f} µs); no shapes recorded for kernels without "
                "an op, so no traffic model"
            ),
            fix=epilogue_fix(
                split["activation"], "", None, ctx.device.kind, generated=split["generated"]
            ),
            zoo=["gemm_bias_act"] if split["activation"] in ZOO_ACTIVATIONS else [],
            evidence={
                "op_names": [],
                "kernel_names": kernel_names,
                "decoded": decode_kernels(kernel_names),
                "activation": split["activation"],
                "launched_by": split["launcher"],
                "removed_us": round(removed_us, 3),
                "compiled": split["generated"],
                "matched_on": "stream order and kernel names (the kernels have no op: no "
                "shapes, no data flow)",
                "time_basis": "gpu kernels",
            },
        )


RULE = check
