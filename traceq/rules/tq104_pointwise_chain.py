"""TQ104 pointwise-chain: three or more elementwise ops in one data-flow chain over
same-shaped tensors, each its own op/kernel.

A chain is a connected group of elementwise ops (arithmetic, activations, and casts that
launch a kernel) linked by data-flow edges whose producer and consumer have the same
output shape; broadcast operands (a bias, a scale) may join from outside, but a link whose
consumer also waits on a later op from outside the chain is cut (`one_kernel_links`): a
residual stream runs through every layer, yet no one kernel can span a layer. Ops that another
fusion rule reports are left to it, so no time is counted twice: the bias `add` of TQ101,
the activation of TQ102 (written-out GELUs included), the activation and multiply of a
GLU (TQ103) and the optimizer's per-tensor updates (TQ206); so are the `add_`s of autograd's
`AccumulateGrad`, one per parameter. An op that runs a memcpy (`x.to("cpu")`) is a
transfer (TQ203's), never a member, and a chain of casts alone is no chain. Nor is a chain
of integer (and boolean) ops alone: that is index arithmetic (position ids, T5's
relative-position buckets, masks), which depends on positions and lengths rather than on
the activations (the fix is to compute it once per length, not to fuse it), and on its
[q, k] grids every value has one shape and one dtype, so shape matching cannot tell which
it read: in T5's buckets `abs(relative_position)` reads as reading the bucket sum built
just before (`(rel > 0).long() * n + 0`), a chain the Execution Trace does not have.
Nor is an op that returns a 0-d tensor a member (`scalar_arithmetic`): a scheduler's
`(1 - alpha_t) ** 0.5` costs dispatches, not memory traffic.
Nor does a link cross a GEMM, a norm, attention or a custom op whose result its consumer
may have read (`_across_work`), or the forward/backward boundary (`_across_passes`); on a
GPU trace an op that launched no kernel is no member; and the backward of ops another
finding reports (`op_groups.backward_of`) is that finding's problem, not a chain.
What remains of a chain must still have `min_ops` ops.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceq.perf.traffic import ITEMSIZE, input_bytes, numel
from traceq.rules.base import Context, rule
from traceq.rules.details import details, located, mib, shape_text
from traceq.rules.finding import Finding
from traceq.rules.idioms import fused_saving
from traceq.rules.op_groups import backward_of, fusion_edges, fusion_ops, reached_forward
from traceq.rules.tq101_split_matmul_bias import split_bias_adds
from traceq.rules.tq102_split_gemm_activation import split_activations
from traceq.rules.tq103_unfused_glu import glu_ops
from traceq.rules.tq206_unfused_optimizer import per_tensor_updates
from traceq.rules.tq207_zeroed_grads import gradient_accumulation

TRANSFER = r"(?i)\bmem(cpy|set)\b|^Memcpy|^Memset|memcpy"
"""Kernel names of copy-engine transfers and fills (Kineto: `Memcpy DtoH (Device ->
Pageable)`, `Memset (Device)`; HIP: `hipMemcpyWithStream`)."""


def scalar_arithmetic(output_shape: pl.Expr) -> pl.Expr:
    """True for an op that returns a 0-d tensor: arithmetic on scalars held in tensors
    (a diffusion scheduler's `alpha_t = alphas_cumprod[t]; (1 - alpha_t) ** 0.5`).

    Such ops are no chain to fuse. Each moves a few bytes, so the rule's model (time
    follows bytes) does not hold: what they cost is one dispatch each on the host. On a
    GPU trace they mostly run on the CPU with no kernel at all (the scheduler's tables
    stay on the host; a 0-d CPU tensor goes to a GPU kernel as a scalar argument); where
    they do launch kernels, those are latency-bound single-element ones. The fix is
    Python floats or precomputed tables (host overhead, TQ2xx's ground), not one fused
    kernel. Ops that read 0-d values and return a full tensor (`alpha_t ** 0.5 * x`)
    stay members."""
    return output_shape.list.len() == 0


def components(nodes: pl.Series, links: pl.DataFrame) -> pl.DataFrame:
    """Connected components of an undirected graph: `event`, `chain` (smallest member).

    Label propagation with joins: each node takes the smallest label among its neighbours
    until none changes; rounds are bounded by the longest chain, not the number of ops.
    """
    labels = pl.DataFrame({"event": nodes.unique()}).with_columns(pl.col("event").alias("chain"))
    both = pl.concat(
        [
            links.select(pl.col("producer").alias("a"), pl.col("consumer").alias("b")),
            links.select(pl.col("consumer").alias("a"), pl.col("producer").alias("b")),
        ]
    )
    while True:
        nearest = (
            both.join(labels, left_on="a", right_on="event")
            .group_by("b")
            .agg(pl.col("chain").min().alias("_near"))
        )
        updated = labels.join(nearest, left_on="event", right_on="b", how="left").select(
            "event", pl.min_horizontal("chain", "_near").alias("chain")
        )
        if updated.join(labels, on=["event", "chain"], how="anti").height == 0:
            return labels
        labels = updated


def one_kernel_links(ops: pl.DataFrame, edges: pl.DataFrame, links: pl.DataFrame) -> pl.DataFrame:
    """`links` (producer -> consumer between chain candidates) that one kernel can hold.

    A link is cut when its consumer also reads an op from outside the chain that ran after
    the link's producer: that op may depend on the producer (the residual stream: `add` ->
    norm -> attention -> `add`; RMSNorm: `x` -> mean -> rsqrt -> `x * rsqrt`), and then
    the two ends cannot share one kernel without it. Running later is the trace's proxy
    for depending on it (no tensor ids), so an independent later input also cuts: the
    chain found is never longer than the truth.
    """
    start = ops.select("event", "ts_ns")
    outside = (
        edges.join(links, on=["producer", "consumer"], how="anti")
        .join(start.rename({"event": "producer", "ts_ns": "_outside_ts"}), on="producer")
        .group_by("consumer")
        .agg(pl.col("_outside_ts").max())
    )
    # ... or when another chain op the consumer waits on reads an op that depends on the
    # link's producer: in `x + gate * mlp(norm(x))` the add reads x and the mul, and the
    # mul reads the MLP's output, computed from x (a DiT block's residual read back through
    # its gate). "Depends" is reachability along the edges, not time: in RoPE's
    # `q * cos + rotate_half(q) * sin` the rotated q runs later but reads q only.
    into_sibling = (
        edges.join(links, on=["producer", "consumer"], how="anti")
        .select(pl.col("producer").alias("_outside"), pl.col("consumer").alias("_sibling"))
        .join(_upstream(links), on="_sibling")
        .join(links.select("producer", "consumer"), on="consumer")
        .filter(pl.col("_sibling") != pl.col("producer"))
        .join(start.rename({"event": "_outside", "ts_ns": "_o_ts"}), on="_outside")
        .join(start.rename({"event": "producer", "ts_ns": "_p_ts"}), on="producer")
        .filter(pl.col("_o_ts") > pl.col("_p_ts"))
    )
    reached = _reaches(edges, start, into_sibling.select("producer", "_outside", "_o_ts").unique())
    sibling = (
        into_sibling.join(reached, on=["producer", "_outside"], how="semi")
        .group_by("producer", "consumer")
        .agg(pl.col("_o_ts").max().alias("_sibling_ts"))
    )
    later = pl.max_horizontal("_outside_ts", "_sibling_ts")
    kept = (
        links.join(start.rename({"event": "producer", "ts_ns": "_ts"}), on="producer")
        .join(outside, on="consumer", how="left")
        .join(sibling, on=["producer", "consumer"], how="left")
        .filter(later.is_null() | (later < pl.col("_ts")))
        .select("producer", "consumer", "input_index")
    )
    cut = pl.concat(
        [
            _across_calls(ops, kept),
            _zero_dim_reads(ops, kept),
            _across_work(ops, edges, kept),
            _across_passes(ops, kept),
        ]
    )
    return kept.join(cut, on=["producer", "consumer"], how="anti")


def _across_passes(ops: pl.DataFrame, links: pl.DataFrame) -> pl.DataFrame:
    """`producer`, `consumer` of links from the forward pass into the backward
    (`fusion_ops`' `backward`): a backward op reading a saved tensor. The loss, the
    engine and every later layer's backward run in between; no kernel spans the two
    passes (`tp_train`: `x ** 2` and the `pow` of its gradient read as one chain)."""
    if "backward" not in ops.columns:
        return links.select("producer", "consumer").clear()
    side = ops.select("event", "backward")
    return (
        links.join(side.rename({"event": "producer", "backward": "_pb"}), on="producer")
        .join(side.rename({"event": "consumer", "backward": "_cb"}), on="consumer")
        .filter(pl.col("_pb") != pl.col("_cb"))
        .select("producer", "consumer")
    )


BARRIER = r"(?i)(norm|softmax|attention|attn|conv|embedding)"
"""Names of ops no elementwise kernel runs through: normalizations (`layer_norm`,
`aiter::_groupnorm_run`), softmax, attention (`_scaled_dot_product_*`,
`_flash_attention_forward`), convolutions, embedding lookups."""


def barrier(ops: pl.DataFrame) -> pl.Expr:
    """True for an op a pointwise chain cannot run across (`_across_work`): a GEMM, a
    normalization, softmax, attention, a convolution or an embedding (`BARRIER`), or a
    library's custom op (`aiter::`, `vllm::`, `_C::`: a namespace other than aten's)."""
    name = pl.col("name")
    custom = name.str.contains("::") & ~name.str.starts_with("aten::")
    role = pl.col("role") if "role" in ops.columns else pl.lit(None, dtype=pl.String)
    return (
        (role == "gemm") | (role.is_in(["other", "fused"]) & name.str.contains(BARRIER)) | custom
    ).fill_null(False)


def _across_work(ops: pl.DataFrame, edges: pl.DataFrame, links: pl.DataFrame) -> pl.DataFrame:
    """`producer`, `consumer` of links with a GEMM, a norm, attention or a custom op
    (`barrier`) run between them on the producer's thread, where data flow may have
    missed what the consumer read from it: the consumer has a tensor input no edge
    explains, or the op recorded no output (a custom op: `div → aiter::_groupnorm_run →
    silu` read as `div → silu`, the only same-shaped value before the silu).

    Residual adds whose attention or MLP branch reached them through an edge data flow
    missed chained across layers, LayerNorm, attention and GEMMs in between; the later
    outside input that `one_kernel_links` cuts on was the edge missing. A consumer whose
    every input is explained keeps its link across independent work (`x * s` then an
    unrelated projection, then `+ y`)."""
    if not {"name", "tensor_inputs"} <= set(ops.columns) or links.height == 0:
        return links.select("producer", "consumer").clear()
    explained = edges.group_by("consumer").agg(pl.col("input_index").n_unique().alias("_known"))
    unexplained = (
        ops.select(pl.col("event").alias("consumer"), "tensor_inputs")
        .join(explained, on="consumer", how="left")
        .filter(pl.col("_known").fill_null(0) < pl.col("tensor_inputs"))
        .select("consumer")
    )
    spans = _spans(ops, links).sort("_p_ts")
    walls = ops.filter(barrier(ops)).select(
        "pid",
        "tid",
        pl.col("ts_ns").alias("_w_ts"),
        pl.col("output_shape").is_null().alias("_blind"),
    )
    if walls.height == 0 or spans.height == 0:
        return links.select("producer", "consumer").clear()

    def first_after(of: pl.DataFrame, walls: pl.DataFrame) -> pl.DataFrame:
        return (
            of.join_asof(
                walls.sort("_w_ts"),
                left_on="_p_ts",
                right_on="_w_ts",
                by=["pid", "tid"],
                strategy="forward",
                allow_exact_matches=False,
                check_sortedness=False,  # both sides are sorted on time
            )
            .filter(pl.col("_w_ts").is_not_null() & (pl.col("_w_ts") < pl.col("_c_ts")))
            .select("producer", "consumer")
        )

    return pl.concat(
        [
            first_after(spans.join(unexplained, on="consumer", how="semi"), walls.drop("_blind")),
            first_after(spans, walls.filter("_blind").drop("_blind")),
        ]
    ).unique()


def _zero_dim_reads(ops: pl.DataFrame, links: pl.DataFrame) -> pl.DataFrame:
    """`producer`, `consumer` of links whose consumer reads a 0-d tensor (not a Python
    scalar: `Input type` "float", shape []) while an op returning one ran between the two.
    Data flow matches no 0-d values, so that op is the read the rule cannot see, and like
    any later outside input it may depend on the producer: DDIM's
    `(sample - beta_t ** 0.5 * eps) / alpha_t ** 0.5` reads `alpha_t ** 0.5` computed
    after the subtraction (the ET: a `pow` between each pair)."""
    if not {"shapes", "input_types", "output_shape"} <= set(ops.columns):
        return links.select("producer", "consumer").clear()
    index = pl.int_ranges(0, pl.col("shapes").list.len()).alias("_i")
    zero_dim = (
        ops.select("event", "shapes", "input_types", index)
        .explode("_i")
        .filter(
            (pl.col("shapes").list.get(pl.col("_i"), null_on_oob=True).list.len() == 0)
            & pl.col("input_types").list.get(pl.col("_i"), null_on_oob=True).is_in(list(ITEMSIZE))
        )
        .select(pl.col("event").alias("consumer"))
        .unique()
    )
    writers = ops.filter(pl.col("output_shape").list.len() == 0).select(
        "pid", "tid", pl.col("ts_ns").alias("_w_ts")
    )
    spans = _spans(ops, links.join(zero_dim, on="consumer", how="semi"))
    if spans.height == 0 or writers.height == 0:
        return links.select("producer", "consumer").clear()
    return (
        spans.join(writers, on=["pid", "tid"])
        .filter((pl.col("_w_ts") > pl.col("_p_ts")) & (pl.col("_w_ts") < pl.col("_c_ts")))
        .select("producer", "consumer")
        .unique()
    )


def _across_calls(ops: pl.DataFrame, links: pl.DataFrame) -> pl.DataFrame:
    """`producer`, `consumer` of links with a whole forward call (outermost module call,
    fusion_ops' `call`) run between them: a diffusion loop's scheduler step reads the
    latents the previous step wrote, and the denoiser's call on them runs in between (its
    input reaches it through a `cat`, which data flow does not follow). No kernel spans a
    model call."""
    if "call" not in ops.columns:
        return links.select("producer", "consumer").clear()
    calls = (
        ops.drop_nulls("call")
        .group_by("call", "pid", "tid")
        .agg(pl.col("ts_ns").min().alias("_c_start"), pl.col("ts_ns").max().alias("_c_end"))
    )
    spans = _spans(ops, links)
    if calls.height == 0 or spans.height == 0:
        return links.select("producer", "consumer").clear()
    return (
        spans.join(calls, on=["pid", "tid"])
        .filter((pl.col("_c_start") > pl.col("_p_ts")) & (pl.col("_c_end") < pl.col("_c_ts")))
        .select("producer", "consumer")
        .unique()
    )


def _spans(ops: pl.DataFrame, links: pl.DataFrame) -> pl.DataFrame:
    """`links` with the producer's thread (`pid`, `tid`) and start (`_p_ts`) and the
    consumer's start (`_c_ts`): what ran between the two is what `_across_calls` and
    `_zero_dim_reads` look for."""
    where = ops.select("event", "pid", "tid", "ts_ns")
    return links.join(where.rename({"event": "producer", "ts_ns": "_p_ts"}), on="producer").join(
        where.rename({"event": "consumer", "ts_ns": "_c_ts"}).drop("pid", "tid"), on="consumer"
    )


def _upstream(links: pl.DataFrame, max_hops: int = 64) -> pl.DataFrame:
    """`_sibling`, `consumer`: every op each link consumer waits on through links (its
    producers, theirs, ...)."""
    direct = links.select(pl.col("producer").alias("_sibling"), "consumer").unique()
    found = direct
    for _ in range(max_hops):
        further = (
            found.join(direct.rename({"_sibling": "_up", "consumer": "_sibling"}), on="_sibling")
            .select(pl.col("_up").alias("_sibling"), "consumer")
            .join(found, on=["_sibling", "consumer"], how="anti")
            .unique()
        )
        if further.height == 0:
            break
        found = pl.concat([found, further])
    return found


def _reaches(
    edges: pl.DataFrame, start: pl.DataFrame, pairs: pl.DataFrame, max_hops: int = 256
) -> pl.DataFrame:
    """The (`producer`, `_outside`) rows of `pairs` where `_outside` depends on `producer`
    along `edges`: a walk forward from each producer, never past `_o_ts` (an op that
    started later cannot lead to `_outside`)."""
    frontier = pairs.with_columns(pl.col("producer").alias("_at"))
    reached = reached_forward(edges, start, frontier, ["producer", "_outside"], "_o_ts", max_hops)
    return (
        reached.filter(pl.col("_at") == pl.col("_outside")).select("producer", "_outside").unique()
    )


def pointwise_chains(
    ops: pl.DataFrame,
    edges: pl.DataFrame,
    claimed: pl.Series,
    min_ops: int = 3,
    min_confidence: float = 0.0,
    launched: bool = False,
) -> pl.DataFrame:
    """One row per chain: `ops` (event ids, in order), `n`, `shape`, `unfused_bytes` (what
    the ops move one by one) and `fused_bytes` (what one kernel would move: inputs from
    outside the chain, and outputs read outside it or by no one). `claimed` ops (other
    rules' findings) are left out, and with `launched` (a GPU trace) so are ops that
    launched no kernel: arithmetic on CPU tensors (a sampler's bookkeeping, a metric), with
    no device time to save and no kernel to fuse into.
    """
    # an op that runs a copy-engine transfer (`to("cpu")`: Memcpy DtoH; a scalar operand
    # copied to the device) moves data a fused kernel would still move: TQ203's, not a chain's
    transfer = (
        pl.col("kernel_names").list.eval(pl.element().str.contains(TRANSFER)).list.any()
        if "kernel_names" in ops.columns  # frames built without kernels (tests) have none
        else pl.lit(False)
    )
    pointwise = (
        (
            (pl.col("role").is_in(["elementwise", "activation"]) & ~pl.col("generated"))
            | ((pl.col("role") == "cast") & (pl.col("n_kernels") > 0))
        )
        & ~pl.col("glu_fused")
        & ~transfer.fill_null(False)
    )
    if launched and "n_kernels" in ops.columns:
        pointwise = pointwise & (pl.col("n_kernels").fill_null(0) > 0)
    # a 0-d result is host-side scalar arithmetic, no activation to fuse (`scalar_arithmetic`)
    members = ops.filter(
        pointwise
        & pl.col("output_shape").is_not_null()
        & ~scalar_arithmetic(pl.col("output_shape"))
        & ~pl.col("event").is_in(claimed.implode())
    ).select("event", "output_shape", "traffic_bytes", "itemsize", "role", "integral")
    trusted = edges.filter(pl.col("confidence") >= min_confidence)
    shape_of = members.select("event", "output_shape")
    linked = (
        trusted.join(shape_of.rename({"event": "producer", "output_shape": "_p"}), on="producer")
        .join(shape_of.rename({"event": "consumer", "output_shape": "_c"}), on="consumer")
        .filter(pl.col("_p") == pl.col("_c"))
        .select("producer", "consumer", "input_index")
    )
    links = one_kernel_links(ops, trusted, linked)
    if links.height == 0:
        return pl.DataFrame(
            schema={
                "chain": pl.Int64,
                "ops": pl.List(pl.Int64),
                "n": pl.UInt32,
                "shape": pl.List(pl.Int64),
                "unfused_bytes": pl.Int64,
                "fused_bytes": pl.Int64,
            }
        )
    chains = components(pl.concat([links["producer"], links["consumer"]]), links)
    # casts alone (dtype conversions back and forth) are no computation to fuse, and
    # integer arithmetic alone (indices, positions, masks) is no activation to fuse
    computing = chains.join(members.select("event", "role", "integral"), on="event")
    computing = computing.group_by("chain").agg(
        ((pl.col("role") != "cast") & ~pl.col("integral")).any().alias("_c")
    )
    chains = chains.join(computing.filter("_c").select("chain"), on="chain", how="semi").filter(
        pl.len().over("chain") >= min_ops
    )
    inside = chains.select("event", "chain")
    internal = links.join(inside.rename({"event": "producer"}), on="producer").join(
        inside.rename({"event": "consumer"}), on=["consumer", "chain"]
    )
    # inputs a fused kernel still reads: those not produced inside its chain
    outer_in = (
        input_bytes(ops.join(inside, on="event"))
        .join(inside, on="event")
        .join(
            internal.select(pl.col("consumer").alias("event"), "input_index"),
            on=["event", "input_index"],
            how="anti",
        )
        .group_by("chain")
        .agg(pl.col("bytes").sum().alias("_in"))
    )
    # outputs it still writes: read outside the chain, or by no op at all (the result)
    read_inside = internal.select(pl.col("producer").alias("event"), pl.lit(True).alias("_i"))
    read_outside = (
        trusted.join(inside.rename({"event": "producer"}), on="producer")
        .join(inside.rename({"event": "consumer", "chain": "_cc"}), on="consumer", how="left")
        .filter(pl.col("_cc").is_null() | (pl.col("_cc") != pl.col("chain")))
        .select(pl.col("producer").alias("event"), pl.lit(True).alias("_o"))
    )
    outer_out = (
        chains.join(members, on="event")
        .join(read_inside.unique(), on="event", how="left")
        .join(read_outside.unique(), on="event", how="left")
        .filter(pl.col("_o").fill_null(False) | pl.col("_i").is_null())
        .group_by("chain")
        .agg((numel(pl.col("output_shape")) * pl.col("itemsize")).sum().alias("_out"))
    )
    timed = ops.select("event", "ts_ns")
    return (
        chains.join(members, on="event")
        .join(timed, on="event")
        .sort("ts_ns", "event")
        .group_by("chain", maintain_order=True)
        .agg(
            pl.col("event").alias("ops"),
            pl.len().alias("n"),
            pl.col("output_shape").last().alias("shape"),
            pl.col("traffic_bytes").sum().alias("unfused_bytes"),
        )
        .join(outer_in, on="chain", how="left")
        .join(outer_out, on="chain", how="left")
        .with_columns(
            (pl.col("_in").fill_null(0) + pl.col("_out").fill_null(0)).alias("fused_bytes")
        )
        .drop("_in", "_out")
        .sort("chain")
    )


def _member_reads(chains: pl.DataFrame, edges: pl.DataFrame) -> dict[int, int]:
    """Per chain op, how many other ops of its chain it reads."""
    members = chains.select("chain", pl.col("ops").alias("event")).explode("event")
    return dict(
        edges.join(members.rename({"event": "consumer"}), on="consumer")
        .join(members.rename({"event": "producer"}), on=["producer", "chain"])
        .group_by("consumer")
        .agg(pl.col("producer").n_unique())
        .iter_rows()
    )


def claimed_ops(ctx: Context) -> pl.Series:
    """Ops TQ101, TQ102 and TQ103 report (at their default thresholds), and the optimizer's
    per-tensor updates (TQ206's): shape-matched "chains" there run across parameters, and
    the fix is the optimizer's multi-tensor path, not a fused kernel."""
    ops, edges = fusion_ops(ctx), fusion_edges(ctx)
    glus = glu_ops(ctx)
    acts = split_activations(ops, edges, glus, min_confidence=0.4)
    adds = split_bias_adds(ops, edges, min_confidence=0.4)
    return pl.concat(
        [
            glus["act_ops"].explode(),
            glus["mul"],
            acts["act_ops"].explode(),
            adds["add"],
            per_tensor_updates(ctx)["event"],
            gradient_accumulation(ctx)["event"],
        ]
    ).drop_nulls()


DEFAULTS = {"min_ops": 3, "min_confidence": 0.4, "min_saving_us": 0.0}


def chain_computes(names: list[str], reads: list[int]) -> tuple[str | None, str | None]:
    """What a chain of ops (their names, in order; `reads`: how many chain members each
    reads) computes, when it is recognisable, and the one call that does it: a GELU or
    SiLU written out, a residual add of a scaled branch (`x + s * y`: a path of `mul`s
    into an `add` whose other input comes from outside). (None, None) for any other."""
    base = [n.removeprefix("aten::").rstrip("_") for n in names]
    ops = set(base) - {"to", "_to_copy", "type_as"}
    if "tanh" in ops and {"mul", "add"} <= ops:
        return "GELU-tanh written out", "`F.gelu(x, approximate='tanh')` (one kernel)"
    if "erf" in ops and {"mul", "add"} <= ops:
        return "GELU written out", "`F.gelu(x)` (one kernel)"
    if "sigmoid" in ops and "mul" in ops and ops <= {"sigmoid", "mul"}:
        return "SiLU written out", "`F.silu(x)` (one kernel)"
    path = all(r <= 1 for r in reads)  # each op reads one member: no `a * b + c * d`
    if ops == {"mul", "add"} and base[-1] == "add" and base.count("add") == 1 and path:
        return "scaled residual add", (
            "`torch.addcmul(x, gate, y)` or `torch.add(x, y, alpha=s)` (one kernel), or fold "
            "the scale into the GEMM that produced the branch"
        )
    return None, None


@rule("TQ104", "pointwise-chain", "info", defaults=DEFAULTS, defers=True)
def check(ctx: Context) -> Iterator[Finding]:
    """## What it does
    Finds three or more elementwise ops in one data-flow chain, each its own kernel. The
    ops (add, mul, div, pow, exp, activations, dtype casts that launch a kernel, ...) work
    on same-shaped tensors. Ops that TQ101, TQ102 or TQ103 already report (a split bias add, an
    activation after a GEMM, a GLU's activation and multiply) are left to those rules, and
    so is arithmetic on 0-d tensors (a diffusion scheduler's `(1 - alpha_t) ** 0.5`): its
    cost is one host dispatch per op, not memory traffic, and its fix Python floats.

    ## Why is this bad?
    Each elementwise kernel reads its inputs from memory and writes its output back, and
    is far too cheap to hide its launch: a chain of n ops moves about n times the data one
    fused kernel would (which reads the chain's inputs once and writes its result once) and
    pays n launches. Elementwise ops are memory-bound, so time follows bytes.

    Estimated saving: the measured time of the chain (GPU kernel time on a GPU trace, CPU
    op time on a CPU-only one) × (1 − bytes a fused kernel moves / bytes the ops move).

    ## Example
    ```python
    y = ((x * 2 + 1).sigmoid() * x).relu()  # 5 kernels, 5 round trips
    ```

    ## Use instead
    ```python
    @torch.compile
    def f(x):
        return ((x * 2 + 1).sigmoid() * x).relu()  # one fused kernel
    ```
    or a hand-written Triton kernel. A chain that computes a known function is named
    with the one call that does it: "GELU-tanh written out" (`F.gelu(x,
    approximate='tanh')`), "SiLU written out" (`F.silu`), "scaled residual add"
    (`torch.addcmul`). Ops an idiom finding explains (TQ103's GLU, TQ107's written-out
    norm, TQ108's rotary embedding, ...: `traceq.rules.explained`) are never a chain's:
    a chain they cut shrinks to what is left, or goes.

    ## Options
    - `min_ops` (3): fewest ops that make a chain.
    - `min_confidence` (0.4): weakest data-flow edge accepted.
    - `min_saving_us` (0): leave out findings that save less.

    ## References
    - PyTorch, "torch.compile": https://pytorch.org/docs/stable/generated/torch.compile.html
    - Triton tutorial, "Fused Softmax" (why fusion pays for memory-bound ops):
      https://triton-lang.org/main/getting-started/tutorials/02-fused-softmax.html
    """
    ops = fusion_ops(ctx)
    # ops an idiom finding explains (TQ103, TQ107, TQ108, ...): `rules.explained`
    claimed = pl.concat([claimed_ops(ctx), pl.Series(sorted(ctx.explained), dtype=pl.Int64)])
    chains = pointwise_chains(
        ops,
        fusion_edges(ctx),
        # and their backward: the fix that removes the forward ops removes it too
        pl.concat([claimed, backward_of(ctx, claimed)]),
        min_ops=ctx.options["min_ops"],
        min_confidence=ctx.options["min_confidence"],
        # on a GPU trace whose ops are linked to kernels, ops without one ran on the CPU
        launched=ctx.device.kind == "gpu" and ops["n_kernels"].fill_null(0).sum() > 0,
    )
    rows = details(ops, chains["ops"].explode().to_list())
    reads = _member_reads(chains, fusion_edges(ctx))
    for chain in chains.iter_rows(named=True):
        members = [rows[e] for e in chain["ops"]]
        time_us = sum(r["time_ns"] for r in members) / 1000
        saving, model = fused_saving(
            ctx, chain["ops"], time_us, chain["unfused_bytes"], chain["fused_bytes"], len(members)
        )
        if saving < ctx.options["min_saving_us"]:
            continue
        where = located(ctx, members)
        names = " → ".join(r["name"].removeprefix("aten::") for r in members)
        computes, one_call = chain_computes(
            [r["name"] for r in members], [reads.get(e, 0) for e in chain["ops"]]
        )
        where["evidence"].update(
            {
                "unfused_traffic": mib(chain["unfused_bytes"]),
                "fused_traffic": mib(chain["fused_bytes"]),
                "computes": computes,
            }
        )
        fix = (
            "Fuse the chain into one kernel: `torch.compile` the function (Inductor emits "
            "one `triton_poi_fused_*` kernel) or write it in Triton."
        )
        if one_call:
            fix = f"It is {computes}: call {one_call}, or {fix[0].lower()}{fix[1:]}"
        yield ctx.finding(
            message=(
                (f"{computes}: " if computes else "")
                + f"{chain['n']} elementwise ops ({names}) on {shape_text(chain['shape'])} run "
                f"as {chain['n']} kernels; one fused kernel would move "
                f"{mib(chain['fused_bytes'])} instead of {mib(chain['unfused_bytes'])}"
            ),
            shapes=[chain["shape"]],
            est_saving_us=saving,
            saving_model=f"one kernel for the chain: {model}",
            fix=fix,
            **where,
        )


RULE = check
