"""TQ106 unfused-attention: attention run as separate ops, `GEMM -> [scale] -> [mask] ->
softmax -> [dropout] -> GEMM`, each writing and re-reading the [.., L, S] score matrix.

Found on data flow (`fusion_edges`: views bypassed), never on names in a row: the softmax's
input is walked back through same-sized scale, mask and cast ops to the GEMM that wrote
the scores, and its output forward through casts and dropout to a GEMM that reads the
probabilities. The backward pass has the same shape around `_softmax_backward_data`: a
GEMM writes dP, dropout's backward and casts pass it on, the softmax backward writes dS,
the scale's backward reads it, and GEMMs read dS. Sites that repeat across layers (same
module path less layer indices, same ops and shapes, same model call and step) are one
finding: "N sites in M layers". `idioms.walk` follows the data flow (shared with TQ109).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import polars as pl

from traceq.perf.traffic import ITEMSIZE
from traceq.rules.base import Context, rule
from traceq.rules.common import common_module
from traceq.rules.details import details, located, mib, shape_text
from traceq.rules.finding import Finding, normalize_module
from traceq.rules.idioms import chain_ops, computes, model_saving, walk
from traceq.rules.op_groups import fusion_edges, fusion_ops

SOFTMAX = ("softmax", "_softmax")
SOFTMAX_BACKWARD = ("_softmax_backward_data",)
#: GEMMs of two activations (`q @ k.transpose(-1, -2)`, `probs @ v`); never a Linear.
SCORE_GEMMS = ("matmul", "bmm", "baddbmm")
#: Ops between the score GEMM and the softmax (scale, mask, casts), and between the
#: softmax and the value GEMM (casts, dropout); in the backward pass the same ops'
#: gradients (`grad * mask / (1 - p)`, `grad * scale`).
SCORE_OPS = (
    "mul",
    "div",
    "true_divide",
    "add",
    "sub",
    "masked_fill",
    "where",
    "to",
    "_to_copy",
    "type_as",
    "contiguous",
    "clone",
    "dropout",
    "native_dropout",
    "feature_dropout",
    "native_dropout_backward",
)
MASKS = ("add", "sub", "masked_fill", "where")
SCALES = ("mul", "div", "true_divide")
DROPOUTS = ("dropout", "native_dropout", "feature_dropout", "native_dropout_backward")
#: Ops that may return their input unchanged (a cast to its own dtype, dropout in eval):
#: they computed something only when they ran a child op.
MAY_ALIAS = ("to", "type_as", "contiguous", "dropout", "feature_dropout")
HF_CLASS = re.compile(
    r"(?:^|\.)(?:Bert|Roberta|XLMRoberta|DistilBert|Albert|Electra|Deberta\w*|MPNet|ViT|DeiT|"
    r"Beit|Dinov2|Swin\w*|CLIP|Siglip\w*|Blip\w*|GPT2|GPTNeoX?|GPTJ|OPT|Bloom|Falcon|Llama|"
    r"Mistral|Mixtral|Qwen\d*\w*|Gemma\d*|Phi\d*|T5|Whisper|Bart|MBart|Pegasus|Marian|"
    r"Wav2Vec2|Hubert)[A-Za-z0-9]*(?:Attention|Model|Layer|Block)[A-Za-z0-9]*(?:_\d+)?(?:\.|$)"
)
HF_STACK = "transformers/models/"

DEFAULTS = {"min_confidence": 0.4, "min_saving_us": 0.0, "max_hops": 4}


def attention_sites(
    ops: pl.DataFrame, edges: pl.DataFrame, min_confidence: float = 0.0, max_hops: int = 4
) -> pl.DataFrame:
    """One row per unfused attention site: `softmax` (the `softmax` or, backward,
    `_softmax_backward_data` op), `backward`, `gemm_in` (wrote the scores, or dP),
    `pre` (ops between it and the softmax, in data order), `post` (ops after the softmax,
    in data order), `gemm_out` (reads the probabilities, or dS), `score_shape`.
    """
    trusted = edges.filter(pl.col("confidence") >= min_confidence)
    info = chain_ops(ops)
    softmaxes = info.filter(
        pl.col("_base").is_in([*SOFTMAX, *SOFTMAX_BACKWARD]) & (pl.col("_rank") >= 3)
    ).select(
        pl.col("event").alias("start"),
        pl.col("_numel").alias("size"),
        pl.col("_base").is_in(list(SOFTMAX_BACKWARD)).alias("backward"),
    )
    gemms = info.filter(pl.col("_base").is_in(list(SCORE_GEMMS))).select("event")
    back = walk(softmaxes, ops, trusted, SCORE_OPS, gemms, max_hops, "back")
    forward = walk(softmaxes, ops, trusted, SCORE_OPS, gemms, max_hops, "forward")
    shapes = ops.select(pl.col("event").alias("softmax"), pl.col("output_shape").alias("score"))
    return (
        softmaxes.join(
            back.select(
                "start",
                pl.col("target").alias("gemm_in"),
                pl.col("path").list.reverse().alias("pre"),
                pl.col("reads").alias("pre_reads"),
            ),
            on="start",
        )
        .join(
            forward.select(
                "start",
                pl.col("target").alias("gemm_out"),
                pl.col("path").alias("post"),
                pl.col("reads").alias("post_reads"),
            ),
            on="start",
        )
        .rename({"start": "softmax"})
        .join(shapes, on="softmax")
        .select(
            "softmax",
            "backward",
            "gemm_in",
            "pre",
            "pre_reads",
            "post",
            "post_reads",
            "gemm_out",
            pl.col("score").alias("score_shape"),
        )
        .sort("softmax")
    )


def _input_itemsize(row: dict[str, Any], index: int) -> int:
    types = row.get("input_types") or []
    dtype = types[index] if 0 <= index < len(types) else row["dtype"]
    return ITEMSIZE.get(dtype or "", row["itemsize"] or 4)


def _base(name: str) -> str:
    return re.sub(r"([a-z0-9])_$", r"\1", name.removeprefix("aten::"))


def _is_transformers(ctx: Context, modules: list[str | None]) -> bool:
    if any(m and HF_CLASS.search(m) for m in modules):
        return True
    return ctx.cached(
        "tq106.hf_stack",
        lambda: (
            ctx.trace.events.filter(pl.col("name").str.contains(HF_STACK, literal=True)).height > 0
        ),
    )


@rule("TQ106", "unfused-attention", "warning", defaults=DEFAULTS, zoo=(), explains=True)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds attention computed as separate ops: a GEMM writes the scores `q @ kᵀ`, optional
    ops scale and mask them, `softmax` turns them into probabilities, optional dropout, and
    a second GEMM reads them (`probs @ v`) — eager attention in transformers
    (`attn_implementation="eager"`), CLIP, ViT and video transformers, or written out by
    hand. Found on data flow, in the forward pass and in the backward pass (the GEMM
    writing dP, `_softmax_backward_data`, the GEMMs reading dS). Sites that repeat across
    layers are one finding ("N sites in M layers").

    ## Why is this bad?
    Every op between the two GEMMs writes and re-reads a [batch, heads, L, S] matrix:
    `L × S` per head, quadratic in the sequence, hundreds of MB at L = 4096. A fused
    attention kernel (FlashAttention, PyTorch's SDPA) keeps the scores in on-chip memory
    one tile at a time and never writes them: the time and the memory of those matrices
    go, and so do the launches of the ops in between.

    Estimated saving: the bytes of the score and probability matrices the chain writes and
    reads (each intermediate written once and read once, from the ops' shapes and dtypes;
    casts to their own dtype and dropout in eval write nothing) at the bandwidth the removed
    ops' own kernels achieved (`traceq.perf.savings.fusion_saving`), plus one launch per
    removed op and one for the GEMMs fused into one call
    (the device model's launch cost; on a CPU trace its dispatch cost), capped at the
    measured time of the removed ops (those between the GEMMs).

    ## Example
    ```python
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores + mask
    probs = F.dropout(scores.softmax(-1), p=0.1, training=self.training)
    out = probs @ v
    ```

    ## Use instead
    ```python
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=0.1 if self.training else 0.0, is_causal=False
    )
    # transformers models: AutoModel.from_pretrained(..., attn_implementation="sdpa")
    # (or "flash_attention_2" with fp16/bf16 on a GPU)
    ```
    A causal mask should be `is_causal=True`, not a mask tensor: an arbitrary float
    `attn_mask`, or dropout while training, keeps SDPA off the FlashAttention kernel (it
    runs the memory-efficient or the math kernel). `flash_attn.flash_attn_func(q, k, v,
    dropout_p, causal=True)` (flash-attn ≥ 2) takes fp16/bf16 on a GPU. `torch.compile`
    also rewrites this pattern into SDPA (Inductor's attention pattern matcher).

    ## Options
    - `min_confidence` (0.4): weakest data-flow edge accepted.
    - `min_saving_us` (0): leave out findings that save less.
    - `max_hops` (4): most ops followed between a GEMM and the softmax, on either side.

    ## References
    - Dao et al., "FlashAttention" (2022): https://arxiv.org/abs/2205.14135
    - PyTorch, `torch.nn.functional.scaled_dot_product_attention`:
      https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html
    - Hugging Face, attention interface (`attn_implementation`):
      https://huggingface.co/docs/transformers/main/en/attention_interface
    """
    ops = fusion_ops(ctx)
    sites = attention_sites(
        ops, fusion_edges(ctx), ctx.options["min_confidence"], ctx.options["max_hops"]
    )
    if sites.height == 0:
        return
    events = (
        sites.select(pl.concat_list("softmax", "gemm_in", "gemm_out", "pre", "post").alias("e"))[
            "e"
        ]
        .explode()
        .drop_nulls()
        .to_list()
    )
    rows = details(ops, events)
    extra = {
        r["event"]: r
        for r in ops.filter(pl.col("event").is_in(events))
        .select("event", "input_types", "call")
        .iter_rows(named=True)
    }
    for e, r in extra.items():
        rows[e] = {**rows[e], **r}
    computing = computes(ctx, events, MAY_ALIAS)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for site in sites.iter_rows(named=True):
        # an op that returned its input (a cast to its own dtype, dropout in eval) is no part
        # of the site: data flow may or may not route the next read through it
        site["kept"] = [e for e in (*site["pre"], site["softmax"], *site["post"]) if e in computing]
        chain = [site["gemm_in"], *site["kept"], site["gemm_out"]]
        first = rows[chain[0]]
        key = (
            site["backward"],
            first["call"],
            first["step"],
            normalize_module(first["module"]),
            tuple(rows[e]["name"] for e in chain),
            tuple(site["score_shape"] or ()),
        )
        groups.setdefault(key, []).append(site)
    launch_us = ctx.device.launch_overhead_us
    for (backward, _call, _step, _module, names, _shape), members in groups.items():
        all_rows, removed_rows, modules = [], [], []
        written = 0.0
        launches = 0
        masked = dropped = False
        score_bytes = 0
        for site in members:
            middle = [*site["pre"], site["softmax"], *site["post"]]
            kept = site["kept"]
            all_rows += [rows[e] for e in (site["gemm_in"], *kept, site["gemm_out"])]
            removed_rows += [rows[e] for e in kept]
            modules.append(rows[site["softmax"]]["module"])
            n = 1
            for d in site["score_shape"] or []:
                n *= d
            # each computed intermediate is written once and read once, at the dtype the
            # next op of the chain reads it in (`reads`: input index per hop)
            producers = [site["gemm_in"], *middle]
            readers = [*middle, site["gemm_out"]]
            reads = [*site["pre_reads"][::-1], *site["post_reads"]]
            for producer, reader, index in zip(producers, readers, reads, strict=False):
                if producer != site["gemm_in"] and producer not in computing:
                    continue
                size = n * _input_itemsize(rows[reader], index)
                written += 2 * size
                if producer == site["gemm_in"]:
                    score_bytes = size
            launches += 1 + len(kept)
            before = [rows[e]["name"] for e in site["pre"] if e in computing]
            after = [rows[e]["name"] for e in site["post"] if e in computing]
            masked |= any(_base(b) in MASKS for b in before)
            dropped |= any(_base(b) in DROPOUTS for b in after) or (
                backward and any(_base(b) in DROPOUTS for b in before)
            )
        removed_us = sum(r["time_ns"] for r in removed_rows) / 1000
        saving, model = model_saving(
            ctx, [r["event"] for r in removed_rows], removed_us, written, launches
        )
        if saving < ctx.options["min_saving_us"]:
            continue
        where = located(ctx, all_rows)
        # the first site's module (`encoder.layer.0.attention`): reports group by it with
        # layer indices replaced by `*`; the common module of all layers says less
        first = members[0]
        where["module"] = common_module(
            [rows[e]["module"] for e in (first["gemm_in"], *first["kept"], first["gemm_out"])]
        )
        where["evidence"]["modules"] = sorted({m for m in modules if m})
        layers = len({m for m in modules})
        shape = shape_text(members[0]["score_shape"])
        transformers_model = _is_transformers(ctx, modules)
        half = where["dtype"] in ("c10::Half", "c10::BFloat16")
        where["evidence"].update(
            {
                "direction": "backward" if backward else "forward",
                "sites": len(members),
                "layers": layers,
                "score_shape": members[0]["score_shape"],
                "score_bytes": score_bytes,
                "materialized_bytes": int(written),
                "removed_launches": launches,
                "removed_us": round(removed_us, 3),
                "chain": list(names),
                "mask": masked,
                "dropout": dropped,
                "transformers": transformers_model,
                "bandwidth": ctx.device.bandwidth_text,
                "launch_us": launch_us,
            }
        )
        pass_text = "backward of " if backward else ""
        message = (
            f"unfused {pass_text}attention: {len(members)} site"
            f"{'s' if len(members) != 1 else ''} in {layers} layer{'s' if layers != 1 else ''} "
            f"write and re-read {shape} scores ({mib(score_bytes)} each) through "
            + " → ".join(n.removeprefix("aten::") for n in names)
        )
        fix = (
            "Call `F.scaled_dot_product_attention(q, k, v, attn_mask=..., dropout_p=..., "
            "is_causal=...)` (PyTorch ≥ 2.0) instead of the matmul/softmax/matmul chain"
        )
        if transformers_model:
            fix += (
                "; for a transformers model load it with `from_pretrained(..., "
                'attn_implementation="sdpa")`' + (' (or "flash_attention_2")' if half else "")
            )
        if half and ctx.device.kind == "gpu":
            fix += (
                "; FlashAttention (`flash_attn.flash_attn_func(q, k, v, causal=...)`, "
                "flash-attn ≥ 2)"
            )
        else:
            fix += "; on a GPU with fp16/bf16, FlashAttention (`flash_attn_func`, flash-attn ≥ 2)"
        caveats = []
        if masked:
            caveats.append(
                "pass a causal mask as `is_causal=True`: an arbitrary float `attn_mask` keeps "
                "SDPA on the memory-efficient or math kernel, not flash"
            )
        if dropped:
            caveats.append("dropout while training also rules out SDPA's flash kernel on some GPUs")
        if caveats:
            fix += "; " + "; ".join(caveats)
        fix += (
            f". torch.compile also maps this chain to SDPA. Saves the {mib(written)} of score "
            f"and probability matrices written and read and {launches} launches."
        )
        yield ctx.finding(
            message=message,
            shapes=[list(members[0]["score_shape"] or [])],
            est_saving_us=saving,
            saving_model=f"score and probability matrices written + read: {model}",
            fix=fix,
            **where,
        )


RULE = check
