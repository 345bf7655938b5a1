"""TQ303 unaligned-half-gemm: fp16/bf16 GEMMs with a dimension that is not a multiple of 8.

Mirrors PyTorch's pattern matcher (`MatMulDimInFP16Pattern`): an `aten::mm`, `aten::bmm` or
`aten::addmm` whose first input is fp16 or bf16 and where the last two dimensions of some
input are not all multiples of 8. Calls with the same shapes in the same step are one
finding.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.rules.base import Context, rule
from traceq.rules.finding import Finding

GEMMS = ("aten::mm", "aten::bmm", "aten::addmm")
HALF = ("c10::Half", "c10::BFloat16")
MULTIPLE = 8

DEFAULTS = {"multiple": MULTIPLE}


@rule("TQ303", "unaligned-half-gemm", "info", defaults=DEFAULTS)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds fp16 / bf16 matrix multiplications (`mm`, `bmm`, `addmm`) where an input's last two
    dimensions are not all multiples of 8: what PyTorch's profiler pattern matcher reports
    as `MatMulDimInFP16Pattern`.

    ## Why is this bad?
    Tensor cores take fp16/bf16 tiles whose dimensions are multiples of 8 (16 bytes);
    cuBLAS runs other sizes on slower kernels or pads them itself. A vocabulary of 50257,
    a hidden size of 1000 or a head of 60 each leave that speed unused.

    Estimated saving: not estimated (0). The speed-up depends on the kernel the GEMM
    library picks for the padded shape; PyTorch's matcher measures it by benchmarking the
    padded GEMM on the device, which a saved trace cannot do.

    ## Example
    ```python
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50257)).half()
    ```

    ## Use instead
    ```python
    # pad the dimension to a multiple of 8 (64 is better for vocabularies)
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
    # or choose layer sizes that are multiples of 8
    ```

    ## Options
    - `multiple` (8): the alignment required of each of the last two dimensions.

    ## References
    - NVIDIA, "Matrix Multiplication Background User's Guide", tensor core requirements:
      https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/
    - `torch/profiler/_pattern_matcher.py`, `MatMulDimInFP16Pattern`
    """
    multiple = int(ctx.options["multiple"])
    ops = ctx.trace.ops.filter(
        pl.col("name").is_in(list(GEMMS)) & pl.col("input_types").list.first().is_in(list(HALF))
    )
    if ops.height == 0:
        return
    last_two = pl.element().list.tail(2)
    aligned = pl.col("shapes").list.eval(
        last_two.list.eval((pl.element() % multiple) == 0).list.all()
    )
    ops = ops.with_columns(aligned.list.all().alias("_aligned")).filter(~pl.col("_aligned"))
    groups = (
        ops.with_columns(pl.col("event").cast(pl.Int64))
        .group_by("name", "shapes", "step", maintain_order=True)
        .agg(
            pl.col("event"),
            pl.col("dur_ns").sum().alias("_dur"),
            pl.col("module").first(),
            pl.col("input_types").first(),
        )
    )
    for group in groups.iter_rows(named=True):
        shapes = [s for s in group["shapes"] if s]
        odd = sorted({d for s in shapes for d in s[-2:] if d % multiple})
        yield ctx.finding(
            message=(
                f"{len(group['event'])} × `{group['name']}` in "
                f"{group['input_types'][0].removeprefix('c10::')} on "
                + " × ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
                + f": {', '.join(map(str, odd))} not a multiple of {multiple}"
            ),
            step=group["step"],
            module=group["module"],
            ops=group["event"],
            shapes=shapes,
            dtype=group["input_types"][0],
            time_us=group["_dur"] / 1000,
            est_saving_us=0.0,
            saving_model="not estimated: depends on the kernel chosen for the padded shape",
            fix=(
                f"Pad {', '.join(map(str, odd))} to a multiple of {multiple} (64 for a "
                "vocabulary: `resize_token_embeddings(..., pad_to_multiple_of=64)`), or pick "
                "layer sizes that are multiples of 8, so cuBLAS runs tensor-core tiles."
            ),
            evidence={"unaligned_dims": odd, "calls": len(group["event"])},
        )


RULE = check
